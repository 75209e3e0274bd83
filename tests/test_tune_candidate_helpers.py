"""The pure parts of measuring one tune candidate (profiles/tune/candidate.py): which stacks it builds, how a
pipeline's memory composes, when readings are steady, and how the ranks' outcomes become one result."""
import torch

from sp_plan.planner.plan import Plan
from sp_plan.profiles import load_model
from sp_plan.profiles.tune.candidate import _pipeline_memory, agree, classify, layer_counts, stage_depth, steady
from sp_plan.planner.model import Workload


def test_two_stacks_give_a_per_layer_slope_unless_a_stage_holds_one_layer():
    assert layer_counts(8, 1) == [1, 2] and layer_counts(8, 2) == [1, 2] and layer_counts(8, 4) == [1, 4]
    assert layer_counts(3, 8) == [1, 3] and layer_counts(1, 2) == [1]


def test_a_pipeline_stage_holds_its_share_of_the_layers():
    model = load_model("tiny-llama")
    plan = lambda pp: Plan(algorithm="ring", degrees={"ring": 1, "pp": pp}, order=[])  # noqa: E731
    assert stage_depth(model, plan(2)) == model.layers // 2 and stage_depth(model, plan(1)) == model.layers
    assert stage_depth(model, plan(model.layers * 2)) == 1


def test_readings_agree_within_a_share_of_the_faster():
    assert not steady([1.0, 1.1], 0.095) and steady([1.0, 1.1], 0.11)


def test_a_pipeline_keeps_the_activations_of_the_micro_batches_1f1b_holds_in_flight():
    """Peak 8 of which static 6: activations 2 a micro-batch; p stages, m micro-batches: min(p, m) - 1 more."""
    assert _pipeline_memory({}, 2, 4, 4, (1.0, 0.1, 0.0, 0.2), 8.0, 6.0) == 8.0 + 1 * 2.0
    assert _pipeline_memory({}, 8, 4, 4, (1.0, 0.1, 0.0, 0.2), 8.0, 6.0) == 8.0 + 3 * 2.0
    assert _pipeline_memory({}, 8, 1, 4, (1.0, 0.1, 0.0, 0.2), 8.0, 6.0) == 8.0


def test_an_out_of_memory_rank_names_the_candidates_failure_before_another_ranks_error():
    model, work = load_model("tiny-llama"), Workload(seq_len=64, batch=1)
    plan = Plan(algorithm="ring", degrees={"ring": 2}, order=[])
    got = agree(plan, model, work, [(0, "error", "ValueError: x"), (1, "oom", "OutOfMemoryError: y"), (2, "ok", {})])
    assert (got.status, got.rank, got.reason) == ("oom", 1, "OutOfMemoryError: y")


def test_out_of_memory_is_told_by_its_type_or_its_message():
    assert classify(RuntimeError("CUDA error: out of memory")) == "oom"
    assert classify(torch.OutOfMemoryError("x")) == "oom" and classify(ValueError("shape")) == "error"


def test_the_stage_boundary_message_timed_is_the_one_the_pipeline_is_priced_with():
    from math import prod

    from sp_plan.planner.candidate import Candidate
    from sp_plan.planner.estimate import Estimator
    from sp_plan.planner.schedules import pipeline_p2p
    from sp_plan.profiles import load_cluster
    from sp_plan.profiles.tune.candidate import stage_message

    model, work = load_model("llama3-8b"), Workload(seq_len=16384, batch=8)
    est = Estimator(load_cluster("dgx-h100", 2), model, work)
    for degrees, mbs in (({"pp": 2, "tp": 2, "ring": 2}, 1), ({"pp": 4, "ulysses": 2}, 2), ({"pp": 2, "dp": 8}, 1)):
        plan = Plan(algorithm="usp" if "ulysses" in degrees else "ring", degrees=degrees, order=[],
                    micro_batch_size=mbs)
        send = pipeline_p2p(est.shape(Candidate.from_plan(plan), mbs), True)[0].phases[0]
        assert prod(stage_message(plan, model, work)) * model.dtype_bytes == send.nbytes, degrees


def test_a_step_waits_for_the_slowest_ranks_readings_and_sends():
    from sp_plan.profiles.tune.candidate import QUANTITIES, slowest

    def readings(base):
        return {n: {q: base * n + i for i, q in enumerate(QUANTITIES)} for n in (1, 2)}

    worst, sends = slowest([(readings(1.0), 0.3, None), (readings(2.0), 0.1, None)], [1, 2])
    assert worst == readings(2.0) and sends == 0.3
