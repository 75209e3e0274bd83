"""The search's compute-only bound and memory fits read values shared across degrees choices, variants and token
layouts: each shared value must be what the candidate's own Shape gives."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sp_plan.planner import Workload
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.search import Space, degree_groups
from sp_plan.planner.stages import busiest_stage, pipeline_time
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.kernels import default_params


def _own_compute_bound(est: Estimator, base: Candidate, ckpt: str, mbs: int) -> float:
    """The compute-only pipeline of ``base`` read from its own Shape (dp and pp as they are), part by part."""
    c = est.shape(base, mbs)
    busy, att = est.busy, est.bounds.attention_busy
    fwd = busy("fwd-linear", c) + att("fwd", c)
    layer = fwd
    layer += busy("bwd-linear", c) + att("bwd", c)  # the bound's order of sums: the same float
    if ckpt == "full":
        layer += fwd
    elif ckpt == "attention_boundary":
        layer += busy("fwd-linear", c)
    stage = (c.layers_per_stage * layer + busy("head", c) if c.stage_layers is None
             else float(busiest_stage(c.stage_layers, layer, busy("head", c))))
    return pipeline_time(c.micro_batches, base.pp, base.virtual_stages, stage) * (1 - 1e-9)


def _groups(nodes: int, batch: int, model: str = "llama3-70b"):
    cluster = load_cluster("dgx-h100", nodes)
    work = Workload(seq_len="1m", batch=batch, causal=True, training=True)
    m = load_model(model)
    est = Estimator(cluster, m, work, params=default_params(cluster))
    space = Space(cluster.world_size, m, work)
    return est, space


@pytest.mark.parametrize("nodes,batch", [(16, 8), (64, 16)])
def test_compute_bound_equals_each_candidates_own_shape(nodes, batch):
    est, space = _groups(nodes, batch)
    fresh, _ = _groups(nodes, batch)  # no value shared with an earlier degrees choice
    checked = 0
    for d in list(space.degrees())[::7]:
        for base, _, fitting in degree_groups(est, space, d)[0]:
            for _, ckpt, mbs in fitting[:4]:
                assert min(est.bounds.compute_bounds(base, [(0, ckpt, mbs)])) == _own_compute_bound(fresh, base, ckpt, mbs)
                checked += 1
    assert checked > 50


def test_fits_are_shared_only_where_memory_reads_neither_token_layout_nor_placement():
    est, space = _groups(64, 16)
    fresh, _ = _groups(64, 16)
    checked = 0
    for d in list(space.degrees())[::5]:
        pols = space.policies(d)
        for base, _, _ in degree_groups(est, space, d)[0]:
            fits = est.fitting(base, pols)
            assert fits == [p for p in pols if fresh.fits(base.with_memory(*p))]
            assert fits == fresh.fitting(replace(base, token_layout="contiguous", placement=None), pols)
            checked += 1
    assert checked > 20


def test_but_is_replace():
    c = Candidate("usp", 2, 1, 1, 4, 8, order=("ring", "dp"))
    b = c.but(token_layout="zigzag", zero_stage=2)
    assert b == replace(c, token_layout="zigzag", zero_stage=2)
    assert hash(b) == hash(replace(c, token_layout="zigzag", zero_stage=2))
    assert c.token_layout == "contiguous"
    with pytest.raises(TypeError, match="no field 'tokens'"):
        c.but(tokens=1)
