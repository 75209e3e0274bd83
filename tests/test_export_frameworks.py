"""What each framework runs, checked against its own code where it installs on CPU: the Ulysses head split (DeepSpeed's
UlyssesSPAttentionHF checks, yunchang's all-to-all reshape; TransformerEngine's a2a assertion for Megatron), packed
documents under DeepSpeed's Ulysses, xDiT's world-rank groups beside tp, the batch every framework asserts, a plan
without context parallelism, accelerate's ZeRO stage under FSDP2, Megatron's sliding window (Megatron-Core's
is_layer_window_attention), the gradient sync's overlap Megatron and DeepSpeed turn on as the planner prices it, and
the nearest plan avoiding what each cannot run."""
import ast
import json

import pytest

from sp_plan.integrations.export import TARGETS, target
from sp_plan.integrations.export.nearest import TargetSpace, nearest
from sp_plan.planner import Plan
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_model, preset_cluster

MODEL = load_model("llama3-8b")  # 32 query heads, 8 KV heads
TRAIN = Workload(seq_len=131072, batch=2)
PACKED = Workload(seq_len=131072, batch=1, documents=[3000, 20000, 500])
INFER = Workload(seq_len=4096, batch=8, causal=False, training=False)


def plan(algorithm, order, token_layout="zigzag", work=TRAIN, model=MODEL, **kw) -> Plan:
    degrees = {k: kw.pop(k) for k in ("tp", "pp", "dp", "ulysses", "ring") if k in kw}
    return Plan(algorithm=algorithm, degrees=degrees, order=order, token_layout=token_layout, model=model,
                workload=work, **kw)


def heads(q: int, kv: int):
    """A model of ``q`` query and ``kv`` KV heads (the head split reads nothing else)."""
    return MODEL.model_copy(update={"heads": q, "kv_heads": kv})


# ---------------------------------------------------------------- the Ulysses head split

@pytest.mark.parametrize("name,p", [
    ("megatron", plan("ulysses", ["ulysses"], "contiguous", ulysses=16)),  # a2a: 8 KV heads over 16
    ("megatron", plan("ulysses", ["tp", "ulysses"], "contiguous", tp=2, ulysses=8)),  # 4 KV heads a tp rank
    ("megatron", plan("usp", ["ulysses", "ring"], ulysses=16, ring=2, work=Workload(seq_len=131072))),  # a2a+p2p
    ("yunchang", plan("ulysses", ["ulysses"], "contiguous", ulysses=16)),
    ("xdit", plan("ulysses", ["ulysses"], "contiguous", ulysses=16, work=INFER.model_copy(update={"batch": 1}))),
], ids=lambda x: x if isinstance(x, str) else x.summary())
def test_ulysses_degrees_the_kv_heads_of_a_tp_rank_do_not_take_are_refused(name, p):
    """TransformerEngine's a2a asserts num_heads % cp_size == 0 for q, k and v (context_parallel.py); yunchang's
    all-to-all reshapes the heads to (ulysses, heads // ulysses); neither repeats a KV head."""
    t = target(name)
    assert dict(t.problems(p))["ulysses"].endswith(f"ulysses {p.degrees['ulysses']} must divide both")
    with pytest.raises(PlanError) as e:
        t.export(p)
    assert e.value.field == "ulysses"
    divides = p.model_copy(update={"model": heads(32, 32)})  # as many KV heads as query heads
    assert "ulysses" not in dict(t.problems(divides))


def test_deepspeed_replicates_kv_heads_where_ulysses_is_a_multiple_of_them():
    p = plan("ulysses", ["ulysses"], "contiguous", ulysses=16)  # 8 KV heads, each on two ranks
    assert json.loads(target("deepspeed").export(p))["sequence_parallel_size"] == 16
    odd = plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=4, dp=4, model=heads(24, 6),
               work=Workload(seq_len=131072, batch=4))
    assert "neither" in dict(target("deepspeed").problems(odd))["ulysses"]
    assert "neither" in dict(target("accelerate").problems(odd))["ulysses"]  # its Ulysses is DeepSpeed's


SPLITS = [(q, kv, u) for q, kv in [(32, 8), (24, 6), (32, 32), (12, 4)] for u in (2, 3, 4, 8, 16) if q % u == 0]


@pytest.mark.slow  # imports DeepSpeed
def test_deepspeeds_head_rule_is_ulysses_sp_attention_hfs(monkeypatch):
    """UlyssesSPAttentionHF's own checks, with its process group's size set to the Ulysses degree."""
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    monkeypatch.setattr(ulysses_sp, "register_all_to_all_group", lambda group: None)
    monkeypatch.setattr(ulysses_sp.dist, "get_rank", lambda group=None: 0)
    t = target("deepspeed")
    for q, kv, u in SPLITS:
        monkeypatch.setattr(ulysses_sp.dist, "get_world_size", lambda group=None, u=u: u)
        try:
            ulysses_sp.UlyssesSPAttentionHF(None, 1, q, 64, kv, 2, None, seq_length_is_variable=True)
            runs = True
        except ValueError:
            runs = False
        assert runs == (t.head_split({"ulysses": u}, heads(q, kv)) is None), (q, kv, u)


def test_yunchangs_head_rule_is_its_all_to_all_reshape(monkeypatch):
    """yunchang's all_to_all_4D on q and on k of this many heads, its group's size set to the Ulysses degree."""
    import torch
    from yunchang.comm import all_to_all

    monkeypatch.setattr(all_to_all.dist, "all_to_all_single", lambda out, inp, group=None: out.copy_(inp))
    for name in ("yunchang", "xdit"):
        for q, kv, u in SPLITS:
            monkeypatch.setattr(all_to_all.dist, "get_world_size", lambda group=None, u=u: u)
            try:
                for n in (q, kv):
                    all_to_all.all_to_all_4D(torch.zeros(1, 2, n, 4), scatter_idx=2, gather_idx=1)
                runs = True
            except RuntimeError:
                runs = False
            assert runs == (target(name).head_split({"ulysses": u}, heads(q, kv)) is None), (name, q, kv, u)


@pytest.mark.parametrize("name,work", [("megatron", PACKED), ("yunchang", Workload(seq_len=131072, batch=1))])
def test_the_nearest_plan_takes_only_ulysses_degrees_the_kv_heads_divide(name, work):
    """16 ranks, 8 KV heads: the search skips Ulysses 16, so the nearest plan is one the target runs."""
    c = preset_cluster("dgx-h100", 2)
    t = target(name)
    space = TargetSpace(c.world_size, MODEL, work, target=t)
    assert all(d.ulysses <= 8 for d in space.degrees()) and any(d.ulysses == 8 for d in space.degrees())
    if work.documents is not None:  # Megatron's ring splits packed documents unlike any plan's token layout
        assert all(d.ring == 1 for d in space.degrees())
    original = plan("ulysses", ["ulysses"], "contiguous", ulysses=16, work=work)
    near = nearest(t, original, c, MODEL, work).plan
    assert not t.problems(near) and near.degrees["ulysses"] <= 8


# ---------------------------------------------------------------- packed documents

def test_deepspeed_and_accelerate_run_packed_documents_under_ulysses_through_position_ids():
    p = plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=1, work=PACKED)
    assert json.loads(target("deepspeed").export(p))["sequence_parallel_size"] == 8
    text = target("accelerate").export(p)
    assert "position_ids must restart at each document" in text
    ns: dict = {}
    exec(compile(text, "export.py", "exec"), ns)  # accelerate's own handler takes the attention it names
    assert ns["parallelism_config"].sp_handler.sp_attn_implementation == "flash_attention_2"
    assert "position_ids" not in target("accelerate").export(p.model_copy(update={"workload": TRAIN}))
    ring = plan("ring", ["ring"], ring=16, zero_stage=3, work=PACKED)
    assert "context_parallel) takes no packed documents" in dict(target("accelerate").problems(ring))["documents"]


# ---------------------------------------------------------------- xDiT beside tp

def test_xdit_refuses_tp_beside_ulysses_or_ring_and_its_nearest_plan_has_neither_together():
    p = plan("usp", ["tp", "ulysses", "ring", "dp"], "contiguous", tp=2, ulysses=4, ring=2, work=INFER)
    t = target("xdit")
    assert "xfuser builds yunchang's Ulysses and ring groups over consecutive world ranks" in dict(t.problems(p))["tp"]
    assert not t.problems(plan("ring", ["tp", "dp"], "contiguous", tp=2, dp=8, work=INFER))
    c = preset_cluster("dgx-h100", 2)
    space = TargetSpace(c.world_size, MODEL, INFER, target=t)
    assert not [d for d in space.degrees() if d.tp > 1 and d.ulysses * d.ring > 1]
    near = nearest(t, p, c, MODEL, INFER).plan
    assert not t.problems(near)


# ---------------------------------------------------------------- the batch

@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_batch_the_replicas_micro_batches_do_not_divide_is_refused_by_every_target(name):
    work = Workload(seq_len=4096, batch=3, training=name != "xdit", causal=name != "xdit")
    p = plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2, work=work) if name != "torchtitan" else \
        plan("allgather", ["ring", "dp"], ring=8, dp=2, zero_stage=3, work=work)
    assert not target(name).problems(p)  # expressible, but the batch of 3 splits over no 2 replicas
    with pytest.raises(PlanError) as e:
        target(name).export(p)
    assert e.value.field == "workload.batch" and "multiple of 2" in e.value.fix


def test_the_batch_splits_into_replicas_micro_batches_and_accumulation_steps():
    p = plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2, micro_batch_size=2,
             work=Workload(seq_len=4096, batch=8))
    cfg = json.loads(target("deepspeed").export(p))
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == \
        (8, 2, 2)
    odd = p.model_copy(update={"workload": Workload(seq_len=4096, batch=6)})  # 6 is no multiple of 2 x 2
    with pytest.raises(PlanError, match="no multiple of dp 2 x micro_batch_size 2"):
        target("megatron").export(odd)


# ---------------------------------------------------------------- no context parallelism

@pytest.mark.parametrize("name", ["torchtitan", "deepspeed", "accelerate", "yunchang"])
def test_a_plan_without_context_parallelism_is_not_refused_for_its_algorithm(name):
    p = plan("ring", ["dp"], dp=16, zero_stage=2, work=Workload(seq_len=8192, batch=16))
    assert not target(name).problems(p)
    assert target(name).export(p)
    metp = plan("metp", ["tp", "pp"], tp=8, pp=2)  # METP is tensor parallelism's own algorithm
    assert "algorithm" in dict(target(name).problems(metp))


# ---------------------------------------------------------------- accelerate's ZeRO under FSDP2

@pytest.mark.parametrize("zero", [0, 1])
def test_accelerate_refuses_a_zero_stage_below_fsdp2_under_context_parallelism(zero):
    p = plan("allgather", ["ring"], ring=16, zero_stage=zero)
    why = dict(target("accelerate").problems(p))["zero_stage"]
    assert "under FSDP2" in why and f"no ZeRO-{zero} with cp" in why
    code = target("accelerate").export(p.model_copy(update={"zero_stage": 2}))
    plugin = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)
              and getattr(n.func, "id", "") == "FullyShardedDataParallelPlugin"]
    assert len(plugin) == 1  # ZeRO-2: FSDP2, as priced


def test_accelerates_nearest_plan_of_a_zero0_ring_runs_a_stage_it_has():
    c = preset_cluster("dgx-h100", 1)
    w = Workload(seq_len=65536, batch=1)
    t = target("accelerate")
    space = TargetSpace(c.world_size, MODEL, w, target=t)
    ring = next(d for d in space.degrees() if d.ring > 1)
    assert {z for z, _, _ in space.policies(ring)} <= {2, 3}
    near = nearest(t, plan("allgather", ["ring"], ring=8, zero_stage=0, work=w), c, MODEL, w).plan
    assert not t.problems(near)


# ---------------------------------------------------------------- Megatron's sliding window

def megatron_window(p: Plan) -> tuple:
    """(--window-size, --window-attn-skip-freq) of the export, read as Megatron-LM's tuple_type and moe_freq_type do
    (arguments.py: "4095,0" -> (4095, 0); an integer, or a list expression of digits, brackets, + and *)."""
    import re
    import shlex

    words = shlex.split(" ".join(l for l in target("megatron").export(p).splitlines() if not l.startswith("#"))
                        .replace("\\", " "))
    size = tuple(int(x) for x in words[words.index("--window-size") + 1].strip("()").split(","))
    freq = words[words.index("--window-attn-skip-freq") + 1] if "--window-attn-skip-freq" in words else None
    if freq is not None:
        assert not re.search(r"[^,\d\[\]\(\)\+\*]", freq), freq  # arguments.py _eval_pattern's check
        freq = eval(freq) if "[" in freq else int(freq)
    return size, freq


@pytest.mark.parametrize("pattern", [None, "5:1", "3:2", "1:3"])
def test_megatron_windows_the_layers_the_plan_windows_under_ulysses_and_all_gather(pattern):
    """TransformerEngine's window (left, right) takes keys i - left..i + right: the plan's W keys are (W - 1, 0);
    Megatron's layer_number (1-based) is windowed as core/transformer/utils.py is_layer_window_attention says."""
    work = Workload(seq_len=131072, batch=1, window={"size": 4096, "pattern": pattern} if pattern else 4096)
    for p in (plan("ulysses", ["ulysses"], "contiguous", ulysses=8, work=work),
              plan("allgather", ["ring"], ring=8, work=work)):
        size, freq = megatron_window(p)
        assert size == (4095, 0)
        for layer in range(MODEL.layers):
            n = layer + 1
            megatron = True if freq is None else (n % freq != 0 if isinstance(freq, int) else bool(freq[n - 1]))
            assert megatron == (work.window.layer_window(layer) is not None), (pattern, layer)
        assert not isinstance(freq, list) or len(freq) == MODEL.layers


@pytest.mark.slow  # imports Megatron-Core
def test_megatrons_window_layers_are_megatron_cores():
    from megatron.core.transformer.utils import is_layer_window_attention

    for pattern in ("5:1", "3:2"):
        work = Workload(seq_len=131072, batch=1, window={"size": 4096, "pattern": pattern})
        size, freq = megatron_window(plan("ulysses", ["ulysses"], "contiguous", ulysses=8, work=work))
        got = [is_layer_window_attention(size, freq, n) for n in range(1, MODEL.layers + 1)]
        assert got == [work.window.layer_window(i) is not None for i in range(MODEL.layers)]


def test_megatron_refuses_a_window_under_a_ring_and_its_nearest_plan_carries_it():
    c = preset_cluster("dgx-h100", 1)
    w = Workload(seq_len=65536, batch=1, window=4096)
    t = target("megatron")
    ring = plan("ring", ["ring"], ring=8, work=w)
    assert "a2a or all_gather only" in dict(t.problems(ring))["window"]
    near = nearest(t, ring, c, MODEL, w).plan
    assert not t.problems(near) and (near.sp == 1 or near.algorithm in ("ulysses", "allgather"))
    assert megatron_window(near)[0] == (4095, 0)
    assert "--window-size" not in target("megatron").export(plan("ulysses", ["ulysses"], "contiguous", ulysses=8))


def test_accelerates_zero_rule_leaves_inference_alone():
    """An inference plan keeps no gradients or optimizer state: its ZeRO-0 is what FSDP2 without resharding holds."""
    w = Workload(seq_len=131072, batch=1, training=False)
    p = plan("allgather", ["ring"], ring=16, zero_stage=0, work=w)
    assert not target("accelerate").problems(p)
    space = TargetSpace(16, MODEL, w, target=target("accelerate"))
    assert any(d.ring > 1 for d in space.degrees())


# ---------------------------------------------------------------- the gradient sync's overlap

@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_megatron_and_deepspeed_overlap_the_gradient_sync_as_the_planner_prices_it(zero):
    """Megatron's grad-reduce and param-gather overlaps (both off by default) where there is a sync to overlap, the
    second only beside the distributed optimizer or Megatron-FSDP, as validate_args asks; DeepSpeed's overlap_comm
    for ZeRO 1-3."""
    p = plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2, zero_stage=zero)
    args = target("megatron").export(p).split()
    assert ("--overlap-grad-reduce" in args) and (("--overlap-param-gather" in args) == (zero >= 1))
    alone = plan("ulysses", ["ulysses"], "contiguous", ulysses=1, zero_stage=zero, work=Workload(seq_len=4096))
    assert "--overlap-grad-reduce" not in target("megatron").export(alone)  # one rank: no sync
    ds = json.loads(_json(target("deepspeed").export(p)))
    assert ds["zero_optimization"].get("overlap_comm", False) == (zero >= 1)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_sync_buckets_the_exports_write_are_the_priced_ones(zero):
    """The planner's sync buckets (Estimator.sync_bucket): a layer's gradients for ZeRO 1-3, for ZeRO-0 DDP's 25 MiB
    where that is more (llama3-8b's layers hold more: a layer's). Megatron's default bucket is max(40e6, 1e6 x dp x cp) parameters for ZeRO-0 and 1 alike (training.py
    resolve_ddp_bucket_size), DeepSpeed's 5e8 elements (runtime/zero/config.py): both are written."""
    p = plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=8, dp=2, zero_stage=zero)
    args = target("megatron").export(p).split()
    size = {0: MODEL.layer_params(), 1: MODEL.layer_params()}.get(zero)  # Megatron-FSDP buckets by module
    assert (int(args[args.index("--ddp-bucket-size") + 1]) if size else "--ddp-bucket-size" not in args) == \
        (size or True)
    zo = json.loads(_json(target("deepspeed").export(p)))["zero_optimization"]
    if zero:
        assert zo["reduce_bucket_size"] == MODEL.layer_params()
        assert zo.get("allgather_bucket_size") == (MODEL.layer_params() if zero < 3 else None)


def test_accelerates_fsdp2_reduce_scatters_every_micro_batch_as_zero_2_and_3_are_priced():
    """accelerate's accumulate holds FSDP2's sync to the last micro-batch (whole gradients until then): the snippet
    passes GradientAccumulationPlugin(sync_each_batch=True) where a step has several micro-batches."""
    many = plan("ring", ["tp", "ring", "dp"], ring=4, dp=2, zero_stage=2, work=Workload(seq_len=131072, batch=8))
    text = target("accelerate").export(many)
    call = "GradientAccumulationPlugin(num_steps=4, sync_each_batch=True)"
    assert call in text
    ns: dict = {}
    exec(compile(text, "export.py", "exec"), ns)  # its imports, accelerate's own classes
    assert eval(call, ns).sync_each_batch is True  # noqa: S307 - the snippet's own expression
    one = plan("ring", ["tp", "ring", "dp"], ring=4, dp=2, zero_stage=2, work=Workload(seq_len=131072, batch=2))
    assert "sync_each_batch" not in target("accelerate").export(one)


def _json(text: str) -> str:
    """The JSON of an export (after its comment lines, if any)."""
    return "\n".join(x for x in text.splitlines() if not x.startswith(("#", "//")))
