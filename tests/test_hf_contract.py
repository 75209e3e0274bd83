"""The transformers integration's contract, in process or on worlds of one and two ranks: packed position_ids read
as documents (one-token documents, every row, one row of positions for the batch), packed labels shifted per row, the
refusals that name the field and the fix, what one layer's attention call hands ctx.attention (causal, scale, window,
window patterns), and the gradient sum over ranks."""
from types import SimpleNamespace

import pytest
import torch

from harness.worlds import run_world
from sp_plan.integrations.transformers import (
    attention_forward, check_layer_window, check_mask, check_positions, documents_of, packed_cu_seqlens)
from sp_plan.planner import Plan, PlanError
from sp_plan.planner.model import Workload


def _plan(workload=None):
    return Plan(algorithm="ring", degrees={"ring": 1}, order=["ring"], workload=workload)


def _one_rank(rank, world):
    """shard_inputs and the position check on a world of one rank: what each returns or the PlanError it raises."""
    from sp_plan.integrations.transformers import check_layout_positions, shard_inputs
    from sp_plan.runtime import init

    def outcome(fn):
        try:
            return fn()
        except PlanError as e:
            return f"{e.field}: {e.problem}"

    ctx = init(_plan())
    ids = torch.arange(16).view(2, 8)
    one_row = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    return {
        "broadcast": outcome(lambda: documents_of(shard_inputs(ctx, ids, ids, position_ids=one_row).position_ids)),
        "labels": shard_inputs(ctx, ids, ids, position_ids=one_row.expand(2, 8)).labels.tolist(),
        "short": outcome(lambda: shard_inputs(ctx, ids, ids, position_ids=torch.tensor([[0, 1, 2, 0, 1]]))),
        "window0": outcome(lambda: shard_inputs(ctx, ids, ids, window=0)),
        "jump": outcome(lambda: check_layout_positions(ctx, torch.tensor([[0, 1, 2, 5, 6, 7, 8, 9]]), 8)),
    }


@pytest.fixture(scope="module")
def one_rank():
    return run_world(_one_rank, 1, timeout=120)[0]


def test_a_one_token_document_is_a_document():
    """A document of one token (position 0 followed by another 0) ends where the next one starts."""
    assert [c.tolist() for c in packed_cu_seqlens(torch.tensor([[0, 0, 1, 2]]))] == [[0, 1, 4]]


def test_every_row_is_read_for_documents():
    """A batch whose first row is one document and whose second is packed keeps the second row's documents."""
    cus = packed_cu_seqlens(torch.tensor([[0, 1, 2, 3], [0, 1, 0, 1]]))
    assert [c.tolist() for c in cus] == [[0, 4], [0, 2, 4]]


def test_one_row_of_positions_packs_every_row_of_the_batch(one_rank):
    """position_ids of shape (1, seq) apply to each row: the documents of both rows, laid end to end."""
    assert one_rank["broadcast"] == (0, 3, 8, 11, 16)


def test_packed_labels_are_shifted_within_each_row(one_rank):
    """Packed rows' labels are next-token labels, the last token of each row scoring nothing (-100)."""
    assert one_rank["labels"] == [[1, 2, 3, 4, 5, 6, 7, -100, 9, 10, 11, 12, 13, 14, 15, -100]]


def test_too_few_positions_are_refused_by_name(one_rank):
    """Fewer position_ids than tokens is a PlanError naming position_ids, not a tensor broadcast error."""
    assert one_rank["short"] == "position_ids: 5 positions for 8 tokens"


def test_a_window_of_zero_tokens_is_refused(one_rank):
    """shard_inputs' window must be at least one token."""
    assert one_rank["window0"].startswith("window: must be at least 1")


def test_positions_with_a_jump_are_not_the_global_positions(one_rank):
    """Positions that jump inside a rank's tokens are refused at the model, even where every offset is >= 0."""
    assert one_rank["jump"].startswith("position_ids: rank(s) [0]: the position ids are not the global positions")


def test_the_refusal_names_the_row_with_bad_positions():
    """Left padding in the second row is refused naming row 1 and saying how to pad or pack instead."""
    with pytest.raises(PlanError) as e:
        check_positions(torch.tensor([[0, 1, 2, 3], [-1, 0, 1, 2]]), 4)
    assert e.value.field == "position_ids" and e.value.problem.startswith("row 1 ")
    assert "pad on the right" in str(e.value) and "pack documents" in str(e.value)


def test_a_4d_mask_is_refused_even_when_all_ones():
    """Only None or an all-ones 2D attention_mask is honoured; a 4D mask, all ones or not, is refused."""
    with pytest.raises(PlanError, match="^attention_mask: .*a 4D mask"):
        check_mask(torch.ones(1, 1, 4, 4, dtype=torch.bool))
    check_mask(torch.ones(2, 4, dtype=torch.long))


def test_global_layers_of_a_window_pattern_attend_unwindowed():
    """A plan whose window has a layer pattern lets the model's global layers (sliding_window None) through; a plan
    windowing every layer refuses them, naming sliding_window."""
    check_layer_window(SimpleNamespace(plan=_plan(Workload(seq_len=64, window={"size": 8, "pattern": "1:1"}))), None)
    with pytest.raises(PlanError, match="^sliding_window: the plan's window 8 applies to every layer"):
        check_layer_window(SimpleNamespace(plan=_plan(Workload(seq_len=64, window=8))), None)


@pytest.mark.parametrize("kwargs, field", [(dict(s_aux=torch.zeros(4)), "s_aux"), (dict(softcap=0.0), "softcap")])
def test_attention_sinks_and_softcap_are_refused(kwargs, field):
    """gpt-oss's attention sinks (a tensor) and any given softcap are refused by name before any communication."""
    q = torch.zeros(1, 4, 8, 16)
    with pytest.raises(PlanError, match=f"^{field}: "):
        attention_forward(None, None, q, q, q, None, **kwargs)


def _call(module, **kwargs):
    """The keyword arguments one layer's attention call hands ctx.attention."""
    seen = {}
    ctx = SimpleNamespace(plan=_plan(), attention=lambda q, k, v, **kw: seen.update(kw) or q)
    q = torch.zeros(1, 4, 8, 16)
    attention_forward(ctx, module, q, q[:, :2], q[:, :2], None, **kwargs)
    return seen


def test_the_layer_passes_its_scale_window_and_causality_on():
    """The module's scaling, the layer's sliding_window argument and the module's is_causal reach ctx.attention; a
    module without is_causal leaves causality to the plan (None)."""
    seen = _call(SimpleNamespace(is_causal=False, sliding_window=4), scaling=0.2, sliding_window=8)
    assert (seen["causal"], seen["scale"], seen["window"]) == (False, 0.2, 8)
    assert _call(SimpleNamespace(sliding_window=4))["window"] is None  # a global layer of a windowed model
    assert _call(SimpleNamespace())["causal"] is None


def _two_ranks(rank, world):
    """all_reduce_grads on 2 ranks: a parameter only rank 0 uses still joins the sum; a model whose config names
    another attention is refused under a ulysses plan as under a ring one."""
    from sp_plan.integrations.transformers import all_reduce_grads
    from sp_plan.runtime import init

    ring = init(Plan(algorithm="ring", degrees={"ring": 2}, order=["ring"]))
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2), "b": torch.nn.Linear(2, 2)})
    x = torch.ones(1, 2)
    (model["a"](x).sum() + (model["b"](x).sum() if rank == 0 else 0)).backward()
    all_reduce_grads(ring, model)
    summed = model["b"].weight.grad.tolist()
    sdpa = torch.nn.Linear(2, 2)
    sdpa.config = SimpleNamespace(_attn_implementation="sdpa")
    try:
        all_reduce_grads(init(Plan(algorithm="ulysses", degrees={"ulysses": 2}, order=["ulysses"])), sdpa)
        refused = None
    except PlanError as e:
        refused = e.field
    return summed, refused


def test_gradients_are_summed_over_ranks_and_other_attentions_refused():
    """A parameter unused on one rank still gets the other rank's gradient; under a ulysses plan, a model running
    another attention than "sp_plan" is refused at the gradient sum."""
    (summed0, refused0), (summed1, refused1) = run_world(_two_ranks, 2, timeout=60)
    assert summed0 == summed1 == [[1.0, 1.0], [1.0, 1.0]]
    assert refused0 == refused1 == "attn_implementation"
