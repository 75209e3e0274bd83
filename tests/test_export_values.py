"""Values the exporters write that their frameworks read as the plan was priced: levels in the framework's order,
buckets, resharding, batch sizes, and the plans a target must refuse or accept."""
import pytest

from sp_plan.integrations.export import target
from sp_plan.planner import Plan
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_model

MODEL = load_model("llama3-8b")  # 32 query heads, 8 KV heads


def plan(algorithm, order, token_layout="zigzag", work=Workload(seq_len=131072, batch=2), model=MODEL, **kw) -> Plan:
    degrees = {k: kw.pop(k) for k in ("tp", "pp", "dp", "ulysses", "ring", "team") if k in kw}
    return Plan(algorithm=algorithm, degrees=degrees, order=order, token_layout=token_layout, model=model,
                workload=work, **kw)


def _flag(text: str, name: str) -> list[str]:
    words = text.replace("\\\n", " ").split()
    i = words.index(name)
    return [w for w in words[i + 1:i + 3] if not w.startswith("--")]


def test_megatrons_hierarchical_sizes_list_the_all_to_all_level_first():
    text = target("megatron").export(plan("usp", ["ulysses", "ring"], ulysses=2, ring=4))
    assert _flag(text, "--hierarchical-context-parallel-sizes") == ["2", "4"]


def test_megatron_buckets_a_small_models_zero0_sync_at_ddps_25_mib():
    text = target("megatron").export(plan("ulysses", ["ulysses", "dp"], "contiguous", ulysses=2, dp=4, zero_stage=0,
                                          model=load_model("bert-large"), work=Workload(seq_len=16384, batch=8)))
    assert _flag(text, "--ddp-bucket-size") == [str(25 * 2 ** 20 // 2)]  # bf16: two bytes a parameter


def test_a_bidirectional_ring_plan_exports_its_contiguous_tokens():
    p = plan("ring", ["ring", "dp"], "contiguous", ring=8, dp=2, work=Workload(seq_len=16384, batch=8, causal=False))
    assert _flag(target("megatron").export(p), "--context-parallel-size") == ["8"]


def test_a_ulysses_degree_that_splits_no_query_heads_evenly_is_refused():
    """64 ranks over 32 query heads: a multiple of the 8 KV heads, but DeepSpeed's Ulysses splits query heads."""
    with pytest.raises(PlanError):
        target("deepspeed").export(plan("ulysses", ["ulysses"], "contiguous", ulysses=64,
                                        work=Workload(seq_len=16384, batch=1)))


@pytest.mark.parametrize("zero, reshard", [(2, False), (3, True)])
def test_accelerate_reshards_after_forward_under_zero_3_only(zero, reshard):
    text = target("accelerate").export(plan("ring", ["ring", "dp"], ring=4, dp=2, zero_stage=zero))
    assert f"reshard_after_forward={reshard}" in text


def test_torchtitans_local_batch_under_a_pipeline_is_the_replicas_batch():
    p = plan("allgather", ["ring", "dp", "pp"], ring=2, pp=2, dp=2, zero_stage=2, micro_batch_size=1,
             work=Workload(seq_len=16384, batch=8))
    words = target("torchtitan").export(p).split()
    assert words[words.index("--training.local_batch_size") + 1] == "4"


def test_the_largest_extra_cost_names_a_phase_the_winner_does_not_have():
    from types import SimpleNamespace as NS

    from sp_plan.planner.ranking import largest_extra_cost

    def priced(**phases):
        return NS(predicted=NS(breakdown=[NS(name=n.replace("_", " "), exposed_seconds=t) for n, t in phases.items()]))

    winner = priced(attention_fwd=1.0, ulysses_a2a=0.2)
    assert largest_extra_cost(priced(attention_fwd=1.01, ring_kv=0.3), winner) == ("ring kv", 0.3)
