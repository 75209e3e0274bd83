"""Exporters, each checked by its target's own parser or config class where that installs on CPU
(Megatron-Core 0.16.1, DeepSpeed 0.19.8, yunchang 0.6.4 in a 4-rank gloo world, accelerate 1.15.0), else by
a recorded fixture of its flags: Megatron-LM's argument parser (recorded by running it,
fixtures/export/record_megatron_flags.py), torchtitan's config dataclasses (torchtitan wants its own torch
and datasets/wandb) and xDiT's flags (xfuser pulls diffusers); inexpressible plans and the nearest plan."""
import argparse
import json
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from sp_plan.integrations.export import TARGETS, target
from sp_plan.integrations.export.nearest import nearest
from sp_plan.integrations.export.torchtitan import stage_split
from sp_plan.planner import Plan
from sp_plan.planner.errors import PlanError
from sp_plan.planner.estimate import Estimator
from sp_plan.planner.model import Workload
from sp_plan.planner.search import Space, grid_search
from sp_plan.profiles import load_model, preset_cluster
from harness.worlds import run_world

FIX = Path(__file__).parent / "fixtures" / "export"
SP = [sys.executable, "-m", "sp_plan.cli.app"]
MODEL = load_model("llama3-8b")
TRAIN = Workload(seq_len=131072, batch=2)
PACKED = Workload(seq_len=131072, batch=2, documents=[3000, 20000, 500])


def plan(algorithm, order, token_layout="zigzag", work=TRAIN, **kw) -> Plan:
    degrees = {k: kw.pop(k) for k in ("tp", "pp", "dp", "ulysses", "ring", "team") if k in kw}
    return Plan(algorithm=algorithm, degrees=degrees, order=order, token_layout=token_layout, model=MODEL,
                workload=work, **kw)


def argv(text: str) -> list[str]:
    """The words of an exported command line (comments dropped, backslash continuations joined)."""
    return shlex.split("\n".join(l for l in text.splitlines() if not l.startswith("#")).replace("\\\n", " "))


def recorded_parser(path: Path) -> argparse.ArgumentParser:
    """An argparse parser rebuilt from a recorded fixture of a target's flags (types, nargs, choices, switches)."""
    flags = json.loads(path.read_text())["flags"]
    ap = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    types = {"int": int, "str": str, "float": float}
    for name, f in flags.items():
        if f.get("nargs") == 0 or f.get("action") in ("store_true", "store_false"):
            ap.add_argument(name, action="store_true", dest=name)
        else:
            ap.add_argument(name, dest=name, nargs=f.get("nargs"), type=types.get(f.get("type"), str),
                            choices=[types.get(f.get("type"), str)(c) for c in f["choices"]] if f.get("choices") else None)
    return ap


# ---------------------------------------------------------------- Megatron

MEGATRON = [
    (plan("ring", ["ring", "dp"], ring=8, dp=2, zero_stage=1), {"--context-parallel-size": 8, "--cp-comm-type": ["p2p"]}),
    (plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2), {"--cp-comm-type": ["a2a"]}),
    (plan("usp", ["ulysses", "ring"], ulysses=4, ring=4, zero_stage=2),
     {"--cp-comm-type": ["a2a+p2p"], "--hierarchical-context-parallel-sizes": [4, 4],
      "--data-parallel-sharding-strategy": "optim_grads"}),
    (plan("usp", ["tp", "ulysses", "ring", "pp", "dp"], tp=2, ulysses=2, ring=2, pp=2, dp=2, checkpointing="full",
          zero_stage=3),
     {"--tensor-model-parallel-size": 2, "--sequence-parallel": True, "--use-tp-pp-dp-mapping": True,
      "--recompute-granularity": "full", "--global-batch-size": 2}),
    (plan("allgather", ["tp", "ring", "pp", "dp"], tp=2, ring=2, pp=4, dp=2, stage_layers=[7, 9, 9, 7]),
     {"--cp-comm-type": ["all_gather"], "--decoder-first-pipeline-num-layers": 7,
      "--decoder-last-pipeline-num-layers": 7, "--reset-position-ids": False}),
    (plan("ulysses", ["ulysses", "pp", "dp"], "contiguous", ulysses=8, pp=2, work=PACKED),
     {"--cp-comm-type": ["a2a"], "--reset-position-ids": True, "--reset-attention-mask": True,
      "--dataloader-inter-document-masking": True}),
]


#: checks that build a target's own config class from the export: importing Megatron-Core or DeepSpeed takes
#: seconds of CPU, so they run in the whole suite rather than the inner loop
imports_the_target = pytest.mark.slow


def megatron_args(p: Plan) -> dict:
    """The Megatron export of ``p`` through Megatron-LM's argument parser, rebuilt from its recorded fixture."""
    return vars(recorded_parser(FIX / "megatron_flags.json").parse_args(argv(target("megatron").export(p))))


@pytest.mark.parametrize("p,want", MEGATRON, ids=lambda x: x.summary() if isinstance(x, Plan) else "")
def test_megatron_args_parse_with_megatron_lm_parser(p, want):
    ns = megatron_args(p)
    for k, v in want.items():
        assert ns[k] == v, k
    d = p.degrees
    assert ns["--context-parallel-size"] == d["ulysses"] * d["ring"]
    assert ns["--tensor-model-parallel-size"] * ns["--pipeline-model-parallel-size"] * ns["--context-parallel-size"] \
        * d["dp"] == p.world_size
    # validate_args: Megatron-FSDP (ZeRO-2/3) only with the fsdp_dtensor checkpoint format
    assert (ns["--ckpt-format"] == "fsdp_dtensor") == ns["--use-megatron-fsdp"] == (p.zero_stage >= 2)
    env = "CUDA_DEVICE_MAX_CONNECTIONS unset or above 1" if p.zero_stage >= 2 else \
        "CUDA_DEVICE_MAX_CONNECTIONS=1" if d["tp"] * d["ulysses"] * d["ring"] > 1 else None
    assert env is None or f"# environment: {env}" in target("megatron").export(p)


@imports_the_target
@pytest.mark.parametrize("p", [p for p, _ in MEGATRON], ids=lambda p: p.summary())
def test_megatron_args_build_megatron_core_config(p):
    ns, d = megatron_args(p), p.degrees
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig
    cfg = TransformerConfig(
        num_layers=MODEL.layers, hidden_size=MODEL.hidden, num_attention_heads=MODEL.heads,
        tensor_model_parallel_size=ns["--tensor-model-parallel-size"],
        pipeline_model_parallel_size=ns["--pipeline-model-parallel-size"],
        context_parallel_size=ns["--context-parallel-size"],
        hierarchical_context_parallel_sizes=ns["--hierarchical-context-parallel-sizes"],
        cp_comm_type=(ns["--cp-comm-type"] or [None])[0], sequence_parallel=ns["--sequence-parallel"],
        recompute_granularity=ns["--recompute-granularity"], recompute_method=ns["--recompute-method"],
        recompute_num_layers=ns["--recompute-num-layers"], pipeline_dtype=__import__("torch").bfloat16,
        num_layers_in_first_pipeline_stage=ns["--decoder-first-pipeline-num-layers"],
        num_layers_in_last_pipeline_stage=ns["--decoder-last-pipeline-num-layers"])
    assert cfg.context_parallel_size == d["ulysses"] * d["ring"]
    if p.stage_layers:  # Megatron's split: the first and last as given, the rest even
        middle = (MODEL.layers - p.stage_layers[0] - p.stage_layers[-1]) // (d["pp"] - 2)
        assert [cfg.num_layers_in_first_pipeline_stage, *[middle] * (d["pp"] - 2),
                cfg.num_layers_in_last_pipeline_stage] == p.stage_layers


def test_megatron_notes_how_it_splits_packed_documents_and_runs_them_under_ulysses_only():
    """--dataloader-inter-document-masking splits the packed sequence (not each document) into 2 x cp chunks: a ring
    would hold other tokens than the plan's per-document zigzag, Ulysses gathers the sequence whole."""
    text = target("megatron").export(plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2, work=PACKED))
    assert "each packed sequence (not each document) into 16 equal chunks" in text and "pads" not in text
    assert "check a pack of several documents against cp 1" in text  # TransformerEngine's THD split is per document
    assert "--dataloader-inter-document-masking" in text
    assert "--reset-attention-mask" not in target("megatron").export(plan("ring", ["ring", "dp"], ring=8, dp=2))
    for p in (plan("ring", ["ring", "dp"], ring=8, dp=2, work=PACKED),
              plan("usp", ["ulysses", "ring"], ulysses=4, ring=4, work=PACKED)):
        assert dict(target("megatron").problems(p))["documents"].startswith("megatron splits a packed sequence")


# ---------------------------------------------------------------- torchtitan (recorded config fields)

@pytest.mark.parametrize("p", [plan("allgather", ["tp", "ring", "dp"], tp=2, ring=4, dp=2, zero_stage=3),
                               plan("allgather", ["ring", "pp"], "contiguous", ring=8, pp=2, zero_stage=2,
                                    checkpointing="full"),
                               plan("allgather", ["ring", "pp"], ring=4, pp=4, zero_stage=3,
                                    stage_layers=[7, 9, 9, 7])], ids=lambda p: p.summary())
def test_torchtitan_overrides_name_its_config_fields_with_valid_values(p):
    rec = json.loads((FIX / "torchtitan_config.json").read_text())
    words, sections, ac = argv(target("torchtitan").export(p)), {}, None
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("activation_checkpoint:"):
            ac, i = w.split(":", 1)[1], i + 1
            continue
        section, name = w[2:].split(".", 1)
        f = rec[section][name]  # KeyError: a field torchtitan does not have
        if f["type"] == "bool":  # a flag: set, no value
            sections[name], i = True, i + 1
            continue
        value = words[i + 1]
        if f["choices"]:
            assert value in f["choices"], (name, value)
        elif f["type"] == "int":
            value = int(value)
        sections[name] = value
        i += 2
    assert ac in rec["activation_checkpoint"] and ac == ("full" if p.checkpointing == "full" else "none")
    d = p.degrees
    assert sections["data_parallel_shard_degree"] * sections["context_parallel_degree"] * \
        sections["tensor_parallel_degree"] * sections["pipeline_parallel_degree"] == p.world_size
    assert sections["context_parallel_load_balancer"] == ("headtail" if p.token_layout == "zigzag" else "None")
    assert sections["fsdp_reshard_after_forward"] == ("never" if p.zero_stage == 2 else "always")
    assert sections.get("disable_cuda_graphs", False) == (d["pp"] > 1)  # torchtitan refuses CUDA graphs with pp
    assert sections.get("pipeline_parallel_schedule") == ("1F1B" if d["pp"] > 1 else None)
    assert sections["global_batch_size"] == 2 and d["ring"] == sections["context_parallel_degree"]
    if d["pp"] > 1:  # torchtitan's split of the layers with these weights is the plan's
        split = stage_split(MODEL.layers, d["pp"], sections["pipeline_parallel_first_stage_less_layers"],
                            sections["pipeline_parallel_last_stage_less_layers"])
        assert split == (p.stage_layers or [MODEL.layers // d["pp"]] * d["pp"])


def test_torchtitan_stage_split_mirrors_its_generator():
    """generate_llm_fqn_per_model_part: layers + the embedding's and output's weights split evenly, the remainder on
    the first stages; its defaults (1, 1) would leave an even plan uneven, so the export writes (0, 0)."""
    assert stage_split(126, 16, 1, 1) == [7] + [8] * 14 + [7]  # Llama 3 405B
    assert stage_split(32, 4, 1, 1) == [8, 9, 8, 7] and stage_split(32, 4, 0, 0) == [8] * 4
    assert stage_split(6, 3, 1, 1) == [2, 3, 1]  # torchtitan's own test: embed + 2, 3, 1 + output

# ---------------------------------------------------------------- DeepSpeed (its own config class)

class _World:
    """deepspeed.comm as DeepSpeedConfig asks it (rank, world size), for a world of ``size`` ranks."""

    def __init__(self, size):
        self.size = size

    def get_rank(self):
        return 0

    def get_world_size(self, group=None):
        return self.size


@pytest.mark.parametrize("p", [plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2, zero_stage=3),
                               plan("ulysses", ["ulysses"], "contiguous", ulysses=16, zero_stage=1,
                                    work=Workload(seq_len=131072, batch=4))], ids=lambda p: p.summary())
@imports_the_target
def test_deepspeed_config_is_read_by_deepspeed(p, monkeypatch):
    """DeepSpeedConfig as in a Hugging Face run without an mpu: data parallel = world / sequence_parallel_size."""
    import deepspeed.runtime.config as ds_config

    cfg = json.loads(target("deepspeed").export(p))
    assert cfg["sequence_parallel_size"] == p.degrees["ulysses"]
    monkeypatch.setattr(ds_config, "dist", _World(p.world_size))
    c = ds_config.DeepSpeedConfig(cfg)
    assert c.world_size == p.degrees["dp"] and c.zero_optimization_stage == p.zero_stage
    assert c.train_batch_size == p.workload.batch
    assert c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * p.degrees["dp"] == p.workload.batch


# ---------------------------------------------------------------- yunchang (its groups in a 4-rank gloo world)

def _yunchang_world(rank, world, code, seq_len):
    import torch
    import torch.distributed as dist
    from yunchang.globals import PROCESS_GROUP

    ns: dict = {}
    exec(compile(code, "export.py", "exec"), ns)
    ns["make_attention"]()
    x = torch.arange(seq_len).reshape(1, seq_len, 1)
    return (dist.get_process_group_ranks(PROCESS_GROUP.ULYSSES_PG), dist.get_process_group_ranks(PROCESS_GROUP.RING_PG),
            ns["local_tokens"](x).flatten().tolist())


@pytest.mark.parametrize("p", [
    plan("usp", ["ulysses", "ring"], "zigzag", ulysses=2, ring=2),
    plan("usp", ["ring", "ulysses"], "zigzag", ulysses=2, ring=2),
    plan("usp", ["ulysses", "ring"], "striped", ulysses=2, ring=2),
    plan("ring", ["ring"], "contiguous", ring=4),
    plan("ring", ["ring", "dp"], "zigzag", ring=2, dp=2),
], ids=lambda p: p.summary())
def test_yunchang_groups_and_tokens_match_the_plan_layout(p):
    seq = 64
    code = target("yunchang").export(p)
    got = run_world(_yunchang_world, 4, code, seq, timeout=120)
    lay = p.layout()
    for rank, (uly, ring, tokens) in enumerate(got):
        assert uly == lay.group_of("ulysses", rank) and ring == lay.group_of("ring", rank), rank
        assert tokens == lay.tokens(rank, seq).tolist(), rank


# ---------------------------------------------------------------- xDiT (recorded flags), accelerate (its class)

@pytest.mark.parametrize("degrees,want", [({"ulysses": 2, "ring": 2, "dp": 4}, (2, 2, 4, None)),
                                          ({"tp": 2, "dp": 8}, (1, 1, 8, 2))], ids=["usp-dp", "tp-dp"])
def test_xdit_args_parse_with_recorded_xfuser_flags(degrees, want):
    order = [d for d in ("tp", "ulysses", "ring", "dp") if d in degrees]
    p = plan("usp" if "ring" in degrees else "ring", order, "contiguous",
             work=Workload(seq_len=4096, batch=8, causal=False, training=False), **degrees)
    ns = vars(recorded_parser(FIX / "xdit_flags.json").parse_args(argv(target("xdit").export(p))))
    assert (ns["--ulysses_degree"], ns["--ring_degree"], ns["--data_parallel_degree"],
            ns["--tensor_parallel_degree"]) == want


@pytest.mark.parametrize("p,mesh", [
    (plan("ring", ["tp", "ring", "dp"], tp=2, ring=4, dp=2, zero_stage=3), (("dp_shard", "cp", "tp"), (2, 4, 2))),
    (plan("allgather", ["ring", "dp"], ring=8, dp=2, zero_stage=3), (("dp_shard", "cp"), (2, 8))),
    (plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2, zero_stage=2, checkpointing="full"),
     (("sp",), (8,))),
    (plan("ring", ["dp"], dp=16, zero_stage=0, work=Workload(seq_len=8192, batch=16)), (("dp_replicate",), (16,))),
], ids=lambda x: x.summary() if isinstance(x, Plan) else "")
def test_accelerate_snippet_builds_its_parallelism_config(p, mesh):
    ns: dict = {}
    exec(compile(target("accelerate").export(p), "export.py", "exec"), ns)
    pc = ns["parallelism_config"]
    assert pc._get_mesh() == (mesh[1], mesh[0]) or tuple(pc._get_mesh()) == (mesh[0], mesh[1])
    assert callable(ns["make_accelerator"])
    if p.degrees["ring"] > 1:  # torch's rotate methods: all-to-all passes K, V round by round (a ring)
        assert pc.cp_handler.cp_comm_strategy == {"ring": "alltoall", "allgather": "allgather"}[p.algorithm]


@pytest.mark.parametrize("p", [
    plan("ring", ["tp", "ring", "dp"], tp=2, ring=4, dp=2, zero_stage=3),
    plan("allgather", ["ring"], ring=8, zero_stage=2),
    plan("ring", ["tp"], tp=8, zero_stage=3),  # tp alone: nothing for FSDP2 to shard over
    plan("ring", ["tp"], tp=8, zero_stage=0, checkpointing="full"),
    plan("ring", ["dp"], dp=16, zero_stage=0, work=Workload(seq_len=8192, batch=16)),
], ids=lambda x: x.summary())
def test_accelerate_accepts_the_snippets_accelerator(p):
    """ParallelismConfig._validate_accelerator, which Accelerator runs on the snippet's config and plugin: the world
    size matches, and an FSDP2 plugin comes only with a dimension it can shard over (dp_shard or cp)."""
    import types

    from accelerate.utils import DistributedType

    ns: dict = {}
    exec(compile(target("accelerate").export(p), "export.py", "exec"), ns)
    fsdp = type(ns.get("plugin")).__name__ == "FullyShardedDataParallelPlugin"
    assert fsdp == (p.degrees["dp"] * p.degrees["ring"] > 1 and (p.zero_stage >= 2 or p.sp * p.degrees["tp"] > 1))
    kind = DistributedType.FSDP if fsdp else DistributedType.MULTI_GPU
    ns["parallelism_config"]._validate_accelerator(types.SimpleNamespace(
        multi_device=True, num_processes=p.world_size, is_fsdp2=fsdp, distributed_type=kind))


# ---------------------------------------------------------------- what a target cannot express

INEXPRESSIBLE = [
    ("megatron", plan("wallfacer", ["ring"], ring=16, team=2, placement="collective_intra"), "algorithm",
     "megatron has no WallFacer"),
    ("megatron", plan("tokenring", ["ring"], ring=16), "algorithm", "megatron has no TokenRing"),
    ("megatron", plan("metp", ["tp", "pp"], tp=8, pp=2), "algorithm", "megatron has no METP"),
    ("megatron", plan("ring", ["ring"], "striped", ring=16), "token_layout", "megatron has no striped token layout"),
    ("megatron", plan("usp", ["ring", "ulysses"], ulysses=4, ring=4), "order",
     "megatron cannot place the mesh order ring<ulysses (it places ulysses<ring)"),  # its two orders alike here
    ("megatron", plan("ring", ["ring"], ring=16, checkpointing="attention_boundary"), "checkpointing",
     "megatron has no attention_boundary checkpointing"),
    ("torchtitan", plan("ulysses", ["ulysses"], "contiguous", ulysses=16, zero_stage=3), "algorithm",
     "torchtitan has no Ulysses"),
    ("torchtitan", plan("allgather", ["ring"], "striped", ring=16, zero_stage=3), "token_layout", "has no striped"),
    ("torchtitan", plan("allgather", ["dp", "ring"], ring=8, dp=2, zero_stage=3), "order",
     "cannot place the mesh order dp<ring"),
    ("torchtitan", plan("ring", ["ring"], ring=16, zero_stage=3), "algorithm", "it runs allgather, not a ring"),
    ("torchtitan", plan("allgather", ["ring"], ring=16, zero_stage=3, work=PACKED), "documents", "torchtitan#2536"),
    ("torchtitan", plan("allgather", ["ring", "pp"], ring=4, pp=4, zero_stage=3, stage_layers=[8, 8, 9, 7]),
     "stage_layers", "first stages taking the remainder"),
    ("megatron", plan("allgather", ["ulysses", "ring"], ulysses=2, ring=8), "ulysses",
     "no all-gather x Ulysses hierarchy"),
    ("megatron", plan("ring", ["ring", "pp"], ring=4, pp=4, stage_layers=[7, 8, 10, 7]), "stage_layers",
     "stages between hold equal counts"),
    ("megatron", plan("ring", ["ring"], ring=16, work=Workload(seq_len=131072, window=4096)), "window",
     "TransformerEngine runs a sliding window under cp_comm_type a2a or all_gather only"),
    ("torchtitan", plan("allgather", ["ring"], ring=16, zero_stage=3, work=Workload(seq_len=131072, window=4096)),
     "window", "carries no sliding window"),
    ("accelerate", plan("ring", ["ring"], ring=16, zero_stage=3, work=PACKED), "documents", "no packed documents"),
    ("yunchang", plan("allgather", ["ring"], ring=16), "algorithm", "yunchang has no all-gather K/V"),
    ("deepspeed", plan("ring", ["ring"], ring=16), "algorithm", "deepspeed has no Ring attention"),
    ("yunchang", plan("usp", ["tp", "ulysses", "ring"], tp=2, ulysses=2, ring=4), "tp", "yunchang has no tp"),
    ("yunchang", plan("usp", ["ring", "ulysses"], "striped", ulysses=2, ring=2), "order", "assumes use_ulysses_low"),
    ("accelerate", plan("usp", ["ulysses", "ring"], ulysses=4, ring=4), "algorithm", "accelerate has no USP"),
    ("accelerate", plan("ring", ["tp", "ring", "dp"], tp=2, ring=4, dp=2, zero_stage=0), "zero_stage", "FSDP2"),
    ("xdit", plan("usp", ["ulysses", "ring"], "zigzag", ulysses=4, ring=4, work=Workload(seq_len=131072, training=False)),
     "token_layout", "xdit has no zigzag token layout"),
]


@pytest.mark.parametrize("name,p,key,reason", INEXPRESSIBLE, ids=[f"{t}-{k}" for t, _, k, _ in INEXPRESSIBLE])
def test_a_plan_the_target_cannot_express_names_why(name, p, key, reason):
    t = target(name)
    assert t.problems(p)[0][0] == key and reason in t.problems(p)[0][1]
    with pytest.raises(PlanError, match=re.escape(reason)):
        t.export(p)


def test_xdit_refuses_a_training_plan_and_unknown_targets_are_named():
    with pytest.raises(PlanError, match="xdit runs inference only"):
        target("xdit").export(plan("ulysses", ["ulysses"], "contiguous", ulysses=16))
    with pytest.raises(PlanError, match="megatron|torchtitan|deepspeed|yunchang|xdit|accelerate"):
        target("colossalai")
    assert set(TARGETS) == {"megatron", "torchtitan", "deepspeed", "yunchang", "xdit", "accelerate"}


@pytest.mark.parametrize("name", ["megatron", "deepspeed", "torchtitan"])
def test_nearest_is_the_best_expressible_plan_of_the_full_ranking(name):
    """Against an unpruned grid ranking of every layout, filtered by what the target expresses."""
    c = preset_cluster("dgx-h100", 1)
    w = Workload(seq_len=65536, batch=1)
    t = target(name)
    original = plan("wallfacer", ["ring"], ring=8, team=2, placement="collective_intra", work=w, zero_stage=2)
    near = nearest(t, original, c, MODEL, w)
    assert not t.problems(near.plan)
    full = grid_search(c, MODEL, w, Space(c.world_size, MODEL, w), keep=None)
    best = next(tc for tc in full.ranked if not t.problems(tc[1].to_plan(model=MODEL, workload=w)))
    assert near.plan.predicted.step_time_s == pytest.approx(best[0], rel=1e-9)
    est = Estimator(c, MODEL, w)
    assert near.change == pytest.approx(est(near.plan).step_time_s / est(original).step_time_s - 1, rel=1e-9)


@pytest.mark.parametrize("name", ["torchtitan", "yunchang", "deepspeed"])
def test_no_nearest_plan_carries_a_window_and_the_error_says_so(name):
    """A sliding window no export carries: the nearest search names the window (and searches nothing), not "no
    layout fits"."""
    c = preset_cluster("dgx-h100", 1)
    w = Workload(seq_len=65536, batch=1, window=4096)
    with pytest.raises(PlanError) as e:
        nearest(target(name), plan("ring", ["ring"], ring=8, work=w), c, MODEL, w)
    assert e.value.field == "window" and "--window" in e.value.fix and "no layout" not in str(e.value)


def test_packed_documents_a_target_cannot_split_are_named_when_no_layout_carries_them():
    c = preset_cluster("dgx-h100", 1)
    w = Workload(seq_len=65536, batch=1, documents=[3000, 20000, 500])
    original = plan("allgather", ["ring"], ring=8, work=w)
    t = target("yunchang")
    assert "documents" in [k for k, _ in t.problems(original)]
    with pytest.raises(PlanError) as e:
        nearest(t, original, c, MODEL, w)
    assert e.value.field == "documents" and "--documents" in e.value.fix
    assert "context parallelism context parallelism" not in e.value.problem


@pytest.mark.parametrize("name", ["megatron", "torchtitan", "accelerate"])
def test_chunks_of_kv_heads_no_target_takes_are_a_problem_and_the_nearest_gathers_whole(name):
    c = preset_cluster("dgx-h100", 1)
    w = Workload(seq_len=65536, batch=1)
    chunked = plan("allgather", ["ring"], ring=8, work=w, kv_chunks=2)
    t = target(name)
    assert ("kv_chunks" in [k for k, _ in t.problems(chunked)]
            and "kv_chunks" not in [k for k, _ in t.problems(chunked.model_copy(update={"kv_chunks": None}))])
    with pytest.raises(PlanError) as e:
        t.export(chunked)
    assert e.value.field in {k for k, _ in t.problems(chunked)}
    assert (nearest(t, chunked, c, MODEL, w).plan.kv_chunks or 1) == 1


# ---------------------------------------------------------------- the command

def run(*args):
    return subprocess.run(SP + list(args), capture_output=True, text=True, timeout=300)


def test_export_command_exits_2_naming_the_nearest_and_exports_it_with_nearest(tmp_path):
    src = plan("wallfacer", ["ring"], ring=8, team=2, placement="collective_intra",
               work=Workload(seq_len=65536), zero_stage=2)
    c = preset_cluster("dgx-h100", 1)
    src = src.model_copy(update={"cluster": c.name, "cluster_fingerprint": c.fingerprint()})
    src.save(tmp_path / "wf.yaml")
    r = run("export", str(tmp_path / "wf.yaml"), "--to", "megatron", "--no-profile")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "megatron has no WallFacer; nearest: " in lines[0] and "% step time" in lines[0]
    near = lines[0].split("nearest: ")[1].split(",")[0]
    from sp_plan.profiles.kernels import default_params

    best = nearest(target("megatron"), src, c, src.model, src.workload, params=default_params(c))
    assert best.plan.summary() == near and f", {best.change * 100:+.1f} % step time" in lines[0]
    r = run("export", str(tmp_path / "wf.yaml"), "--to", "megatron", "--no-profile", "--nearest",
            "-o", str(tmp_path / "m.args"))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "m.args").read_text()
    assert f"sp-plan export: {near}" in text and "--context-parallel-size" in text
    ns = vars(recorded_parser(FIX / "megatron_flags.json").parse_args(argv(text)))
    assert ns["--context-parallel-size"] > 1


def test_export_command_prints_an_expressible_plan_and_rejects_bad_input(tmp_path):
    p = plan("usp", ["ulysses", "ring"], ulysses=4, ring=2)
    p.save(tmp_path / "p.yaml")
    r = run("export", str(tmp_path / "p.yaml"), "--to", "yunchang")
    assert r.returncode == 0 and "set_seq_parallel_pg(ULYSSES_DEGREE, RING_DEGREE" in r.stdout
    assert "ULYSSES_DEGREE, RING_DEGREE = 4, 2" in r.stdout
    bare = Plan(algorithm="wallfacer", degrees={"ring": 16, "team": 2}, order=["ring"], placement="collective_intra")
    bare.save(tmp_path / "bare.yaml")
    r = run("export", str(tmp_path / "bare.yaml"), "--to", "megatron")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "megatron has no WallFacer" in r.stderr and "names no model" in r.stderr
