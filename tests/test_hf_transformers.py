"""The transformers integration: a 2-layer Llama under 4 gloo ranks, every runtime algorithm, against one process;
packed documents and sliding-window layers (Mistral, Qwen 2's per-layer types) for every algorithm that takes them."""
import pytest
import torch
import torch.nn.functional as F
import transformers  # the `test` extra installs it

from sp_plan.integrations.transformers import (
    NAME, all_reduce_grads, count_loss_tokens, register, shard_inputs, shift_labels)
from sp_plan.planner import Plan, PlanError
from sp_plan.planner.model import Workload
from sp_plan.runtime.variants import load_all
from sp_plan.runtime import init
from harness.worlds import run_world

SEQ, BATCH, VOCAB = 64, 2, 256
SCALING = 0.2  # head_dim 16: the default would be 0.25
CONFIG = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                  num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=256)


def _p(algorithm, degrees, order, token_layout="contiguous", placement=None):
    return Plan(algorithm=algorithm, degrees=degrees, order=order, token_layout=token_layout, placement=placement)


PLANS = [
    _p("ring", {"ring": 4}, ["ring"], "contiguous"),
    _p("ring", {"ring": 4}, ["ring"], "zigzag"),
    _p("ring", {"ring": 4}, ["ring"], "striped"),
    _p("ulysses", {"ulysses": 4}, ["ulysses"]),
    _p("usp", {"ulysses": 2, "ring": 2}, ["ulysses", "ring"], "zigzag"),
    _p("usp", {"ulysses": 2, "ring": 2}, ["ring", "ulysses"], "striped"),
    _p("wallfacer", {"ring": 4, "team": 2}, ["ring"], "zigzag", "collective_intra"),
    _p("wallfacer", {"ring": 4, "team": 2}, ["ring"], "striped", "p2p_intra"),
    _p("tokenring", {"ring": 4}, ["ring"], "contiguous"),
    _p("tokenring", {"ring": 4}, ["ring"], "zigzag"),
    _p("tokenring_ring", {"ring": 4, "team": 2}, ["ring"], "zigzag"),
    _p("ring", {"ring": 2, "dp": 2}, ["ring", "dp"], "zigzag"),  # data parallel beside the ring
    _p("allgather", {"ring": 4}, ["ring"], "zigzag"),
]
#: METP shards the layer's weights; the integration refuses it (test below)
REFUSED = {"metp"}


def _batch():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def _model(attn, causal=True, config=CONFIG):
    """The 2-layer model; a scaling other than head_dim^-0.5 checks that the module's reaches the runtime."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    for layer in model.model.layers:
        layer.self_attn.scaling, layer.self_attn.is_causal = SCALING, causal
    return model


def _train_step(rank, world, plans, causal=True):
    """One forward and backward of every plan; the summed loss and the all-reduced gradients."""
    out = []
    for plan in plans:
        ctx = init(plan)
        model = _model(register(ctx), causal)
        ids = _batch()
        mine = ids.chunk(plan.degrees["dp"])[ctx.layout.coords(rank).get("dp", 0)]  # this data-parallel rank's rows
        x, pos, labels = shard_inputs(ctx, mine, mine)
        logits = model(input_ids=x, position_ids=pos).logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / count_loss_tokens(ids)
        loss.backward()
        all_reduce_grads(ctx, model)
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        out.append((total.item(), {n: p.grad for n, p in model.named_parameters()}))
    return out


def _reference(causal=True):
    """Loss and gradients of the same model and batch in one process (transformers' own sdpa and loss)."""
    model = _model("sdpa", causal)
    ids = _batch()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def _compare(plans, results, reference):
    ref_loss, ref_grads = reference
    for plan, (loss, grads) in zip(plans, results[0]):
        assert loss == pytest.approx(ref_loss, abs=1e-5), plan.summary()
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=f"{plan.summary()}: {name}")
    for other in results[1:]:  # every rank holds the same summed loss and gradients
        for (l0, g0), (l1, g1) in zip(results[0], other):
            assert l0 == l1
            assert all(torch.equal(g0[n], g1[n]) for n in g0)


def test_every_runtime_algorithm_is_tested_or_refused():
    assert set(load_all()) == {p.algorithm for p in PLANS} | REFUSED


def test_loss_and_gradients_match_one_process():
    _compare(PLANS, run_world(_train_step, 4, PLANS, timeout=120), _reference())


def test_a_non_causal_module_attends_both_ways():
    """module.is_causal = False (an encoder) overrides the plan's causal default."""
    plans = [PLANS[1], PLANS[3], PLANS[5], PLANS[6]]
    reference = _reference(causal=False)
    assert abs(reference[0] - _reference()[0]) > 1e-3  # the reference is really bidirectional
    _compare(plans, run_world(_train_step, 4, plans, False, timeout=120), reference)


def test_shift_then_shard():
    labels = torch.arange(8).view(1, 8)
    assert shift_labels(labels).tolist() == [[1, 2, 3, 4, 5, 6, 7, -100]]
    assert count_loss_tokens(torch.tensor([[5, 6, -100, 7]])) == 2


def _errors(rank, world):
    """transformers' own loss and all-ones masks agree; the clear errors: padding and custom masks, packed or local
    positions, tp/METP plans, a KV cache, a sequence the layout cannot split."""
    msgs = {}
    for key, plan in {"tp": _p("ring", {"ring": 2, "tp": 2}, ["tp", "ring"]),
                      "metp": _p("metp", {"tp": 4}, ["tp"])}.items():
        try:
            register(init(plan))
        except PlanError as e:
            msgs[key] = str(e)
    ctx = init(_p("ring", {"ring": 4}, ["ring"], "zigzag"))
    model = _model(register(ctx))
    ids = _batch()
    x, pos, labels = shard_inputs(ctx, ids, ids)
    # transformers' own loss on the already shifted labels, normalized by the global count, is the same sum
    n = count_loss_tokens(ids)
    out = model(input_ids=x, position_ids=pos, labels=labels, shift_labels=labels, num_items_in_batch=n)
    own = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), reduction="sum") / n
    hf_loss_agrees = torch.allclose(out.loss, own, rtol=1e-6, atol=0)
    # an all-ones mask is honoured: same logits as no mask
    same = torch.equal(model(input_ids=x, position_ids=pos).logits,
                       model(input_ids=x, position_ids=pos, attention_mask=torch.ones_like(x)).logits)
    padding = torch.ones_like(x)
    padding[0, :3] = 0
    for key, kw in {"padding": dict(attention_mask=padding),
                    "mask4d": dict(attention_mask=torch.ones(BATCH, 1, x.shape[1], x.shape[1], dtype=torch.bool)),
                    "cache": dict(use_cache=True), "local_positions": dict(position_ids=None)}.items():
        try:
            model(input_ids=x, **{"position_ids": pos, **kw})
            if key == "cache":  # a cache is fine for one pass; the second sees more keys than queries
                out = model(input_ids=x, position_ids=pos, use_cache=True)
                model(input_ids=x[:, :1], position_ids=pos[:, :1] + SEQ, past_key_values=out.past_key_values)
        except PlanError as e:
            msgs[key] = str(e)
    local = torch.arange(x.shape[1]).expand_as(pos).clone()
    try:  # right on rank 0 alone: rank 0 raises with its peers, not left waiting for them in a collective
        model(input_ids=x, position_ids=pos.clone() if ctx.rank == 0 else local)
    except PlanError as e:
        msgs["one_right"] = str(e)
    packed = torch.cat([torch.arange(SEQ // 2), torch.arange(SEQ // 2)]).view(1, SEQ)
    px, ppos, _ = shard_inputs(ctx, ids, ids, position_ids=packed)
    try:  # packed positions that lost shard_inputs' documents
        model(input_ids=px, position_ids=ppos.clone())
    except PlanError as e:
        msgs["packed"] = str(e)
    try:
        shard_inputs(ctx, ids[:, :60], ids[:, :60])
    except PlanError as e:
        msgs["seq_len"] = str(e)
    registered = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS.get(NAME) is not None
    return same, registered, hf_loss_agrees, msgs


def test_unsupported_inputs_are_clear_errors():
    same, registered, hf_loss_agrees, msgs = run_world(_errors, 4, timeout=120)[0]
    assert same and registered and hf_loss_agrees
    assert msgs["tp"].startswith("degrees.tp: the transformers integration keeps every weight whole")
    assert msgs["metp"].startswith("algorithm: METP shards")
    assert msgs["padding"].startswith("attention_mask:") and "padding mask" in msgs["padding"]
    assert "pad on the right" in msgs["padding"]
    assert msgs["mask4d"].startswith("attention_mask:") and "4D mask" in msgs["mask4d"]
    assert msgs["cache"].startswith("past_key_values:")
    assert msgs["local_positions"].startswith("position_ids: rank(s) [0, 1, 2, 3]: the position ids are not the "
                                              "global positions")
    assert msgs["one_right"].startswith("position_ids: rank(s) [1, 2, 3]: the position ids are not")
    assert msgs["packed"].startswith("position_ids: rank(s) [0, 1, 2, 3]: the position ids are not the global")
    assert msgs["seq_len"].startswith("seq_len: 60 is not divisible by 8")



@pytest.mark.parametrize("kwargs, field", [
    (dict(softcap=30.0), "softcap"),
    (dict(dropout=0.1), "attention_dropout"),
    (dict(output_attentions=True), "output_attentions"),
])
def test_attention_call_refuses_what_it_cannot_honour(kwargs, field):
    from sp_plan.integrations.transformers import attention_forward

    q = torch.zeros(1, 4, 8, 16)
    with pytest.raises(PlanError, match=f"^{field}: "):
        attention_forward(None, None, q, q, q, None, **kwargs)  # refused before any communication


WINDOW = 8
#: a window on every layer (Mistral) and a sliding then a global layer (Qwen 2's layer_types, as Gemma 3 and gpt-oss)
MODELS = {
    "llama": CONFIG,
    "mistral": transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, num_hidden_layers=2, vocab_size=VOCAB,
                                          max_position_embeddings=256, sliding_window=WINDOW),
    "qwen2": transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, vocab_size=VOCAB,
                                      max_position_embeddings=256, use_sliding_window=True, sliding_window=WINDOW,
                                      layer_types=["sliding_attention", "full_attention"]),
}
#: documents per row: shorter than a rank's share (32 tokens of the 128), spanning ranks, and one whole row
DOCUMENTS = ([5, 20, 3, 36], [SEQ])
MASKED_PLANS = [
    _p("ring", {"ring": 4}, ["ring"], "contiguous"),
    _p("ring", {"ring": 4}, ["ring"], "zigzag"),
    _p("ring", {"ring": 4}, ["ring"], "striped"),
    _p("allgather", {"ring": 4}, ["ring"], "striped"),
    _p("ulysses", {"ulysses": 4}, ["ulysses"]),
    _p("usp", {"ulysses": 2, "ring": 2}, ["ring", "ulysses"], "zigzag"),
]
#: a plan whose window is on every layer: right for Mistral, refused at a layer the model leaves unwindowed
PLANNED_WINDOW = Plan(algorithm="ring", degrees={"ring": 4}, order=["ring"], token_layout="zigzag",
                      workload=Workload(seq_len=SEQ, window=WINDOW))
BALANCED = Plan(algorithm="ring", degrees={"ring": 4}, order=["ring"], token_layout="balanced",
                workload=Workload(seq_len=SEQ, documents=DOCUMENTS[0]))  # balanced needs a workload of documents


def _packed_positions():
    """Positions that restart at each document (transformers' padding-free packing), (BATCH, SEQ)."""
    return torch.stack([torch.cat([torch.arange(n) for n in row]) for row in DOCUMENTS])


def _packed_step(plan, config, window=None):
    """One packed forward and backward under ``plan``: the summed loss and the all-reduced gradients."""
    ctx = init(plan)
    model = _model(register(ctx), config=config)
    ids = _batch()
    x, pos, labels = shard_inputs(ctx, ids, ids, position_ids=_packed_positions(), window=window)
    logits = model(input_ids=x, position_ids=pos).logits
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / count_loss_tokens(ids)
    loss.backward()
    all_reduce_grads(ctx, model)
    torch.distributed.all_reduce(total := loss.detach().clone())
    return total.item(), {n: p.grad for n, p in model.named_parameters()}, tuple(x.shape)


def _packed_world(rank, world):
    """Every masked plan on every model, balanced where every layer has one window; then the refusals."""
    out = {(name, plan.summary()): _packed_step(plan, cfg) for name, cfg in MODELS.items() for plan in MASKED_PLANS}
    out[("llama", BALANCED.summary())] = _packed_step(BALANCED, CONFIG)
    out[("mistral", BALANCED.summary())] = _packed_step(BALANCED, MODELS["mistral"], WINDOW)
    out[("mistral", "planned window")] = _packed_step(PLANNED_WINDOW, MODELS["mistral"])  # the plan's = the layers'
    errors = {}
    for key, plan, cfg in [("wallfacer", _p("wallfacer", {"ring": 4, "team": 2}, ["ring"], "zigzag",
                                             "collective_intra"), CONFIG),
                           ("tokenring", _p("tokenring", {"ring": 4}, ["ring"], "zigzag"), MODELS["mistral"]),
                           ("balanced_mixed", BALANCED, MODELS["qwen2"]),
                           ("window_llama", PLANNED_WINDOW, CONFIG), ("window_qwen2", PLANNED_WINDOW, MODELS["qwen2"])]:
        try:
            if key == "tokenring":  # one document per row: only the window is refused
                ctx = init(plan)
                x, pos, _ = shard_inputs(ctx, _batch(), None)
                _model(register(ctx), config=cfg)(input_ids=x, position_ids=pos)
            else:
                _packed_step(plan, cfg)
        except PlanError as e:
            errors[key] = str(e)
    return out, errors


def _packed_reference(config):
    """transformers' own sdpa on the packed rows in one process (no cache: it reads packing from position_ids)."""
    model = _model("sdpa", config=config)
    ids = _batch()
    loss = model(input_ids=ids, position_ids=_packed_positions(), labels=ids, use_cache=False).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def test_packed_documents_and_sliding_windows_match_one_process():
    results, errors = run_world(_packed_world, 4, timeout=300)[0]
    refs = {name: _packed_reference(cfg) for name, cfg in MODELS.items()}
    assert abs(refs["llama"][0] - _reference()[0]) > 1e-3  # the reference really masks the documents
    assert abs(refs["mistral"][0] - refs["llama"][0]) > 1e-3 and abs(refs["qwen2"][0] - refs["mistral"][0]) > 1e-3
    for (name, summary), (loss, grads, shape) in results.items():
        assert shape[0] == 1, summary  # packed rows come back as one row
        assert loss == pytest.approx(refs[name][0], abs=1e-5), (name, summary)
        for n, g in refs[name][1].items():
            torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=f"{name} {summary}: {n}")
    assert errors["wallfacer"].startswith("cu_seqlens: algorithm wallfacer does not honour cu_seqlens")
    assert errors["tokenring"].startswith("window: algorithm tokenring does not honour window")
    for model in ("llama", "qwen2"):  # a global layer (every Llama layer, Qwen 2's second) is not windowed silently
        assert errors[f"window_{model}"].startswith("sliding_window: the plan's window 8 applies to every layer, and "
                                                    "this layer of the model attends without a window"), errors
    assert errors["balanced_mixed"].startswith("window: ctx.attention with a causal, window 8 mask lays the balanced "
                                               "layout's tokens out as that mask places them, and ctx.shard placed "
                                               "this batch's documents by a causal, no window mask")


def test_packed_positions_become_cu_seqlens_of_rows_end_to_end():
    from sp_plan.integrations.transformers import packed_cu_seqlens

    cus = packed_cu_seqlens(_packed_positions())
    assert [c.tolist() for c in cus] == [[0, 5, 25, 28, 64], [0, 64]]
    assert packed_cu_seqlens(torch.arange(10).view(1, 10) + 3) is None  # one document with an offset


@pytest.mark.parametrize("positions", [
    list(range(15, -1, -1)),                 # decreasing
    [p - 5 for p in range(16)],              # negative
    [-1, -1, -1] + list(range(13)),          # left padding
    [1, 1, 1] + list(range(13)),             # repeated
    [float(p) for p in range(16)],           # not whole positions
])
def test_positions_that_are_neither_one_run_nor_packed_documents_are_refused(positions):
    """Any step but +1 is read as a new document: only a restart at 0 may be one (packing), so left padding or a
    jump is refused by name instead of being read as documents the data never had."""
    from sp_plan.integrations.transformers import check_positions

    with pytest.raises(PlanError) as e:
        check_positions(torch.tensor([positions]), 16)
    assert e.value.field == "position_ids"
    check_positions(_packed_positions(), 64)  # packed rows restarting at 0
    check_positions(torch.arange(16).view(1, 16) + 10**6, 16)  # one document at an offset


@pytest.mark.parametrize("algorithm, degrees, copied", [("ring", {"ring": 1}, False), ("ring", {"dp": 2}, False),
                                                        ("ring", {"ring": 2}, True), ("ulysses", {"ulysses": 2}, True)])
def test_local_attention_gets_the_models_tensors_uncopied(algorithm, degrees, copied):
    """Where the plan's attention is local, transformers' q, k, v reach ctx.attention as views (degree-1 attention
    hands SDPA the model's own tensors); where the sequence group exchanges them, as contiguous copies."""
    from types import SimpleNamespace

    from sp_plan.integrations.transformers import attention_forward

    seen = []
    ctx = SimpleNamespace(plan=_p(algorithm, degrees, list(degrees)),
                          attention=lambda q, k, v, **kw: seen.extend((q, k, v)) or q)
    query, key = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    attention_forward(ctx, None, query, key, key, None, is_causal=True)
    assert [x.shape for x in seen] == [(1, 8, 4, 16), (1, 8, 2, 16), (1, 8, 2, 16)]
    assert all(x.is_contiguous() == copied for x in seen)
    assert (seen[0].data_ptr() == query.data_ptr()) != copied


def _switched(rank, world):
    """all_reduce_grads' error on a model made with sdpa, and on an sp_plan model whose config a reference model was
    made from afterwards; then that a model from a copied config steps."""
    import copy

    ctx = init(_p("ring", {"ring": 2}, ["ring"], "zigzag"))
    name, out = register(ctx), []
    cfg = copy.deepcopy(CONFIG)
    shared = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=name)
    transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")  # writes "sdpa" into cfg
    ids = _batch()
    x, pos, labels = shard_inputs(ctx, ids, ids)
    # a model's attention is the one its config names at each forward: each made from a config of its own here
    for model in (_model("sdpa", config=copy.deepcopy(CONFIG)), shared, _model(name, config=copy.deepcopy(CONFIG))):
        model(input_ids=x, position_ids=pos).logits.sum().backward()
        try:
            all_reduce_grads(ctx, model)
            out.append(None)
        except PlanError as e:
            out.append((e.field, e.problem))
    return out


def test_a_model_not_running_the_plans_attention_is_an_error_at_the_gradient_sum():
    """A model whose attention is another than "sp_plan" attends to each rank's own tokens: all_reduce_grads says so
    on every rank instead of summing wrong gradients."""
    for out in run_world(_switched, 2, timeout=120):
        assert out[0] == ("attn_implementation", "the model runs the 'sdpa' attention, which sees this rank's tokens "
                          "only"), out
        assert out[1] == out[0] and out[2] is None, out


class _Wrapper(torch.nn.Module):
    """What DistributedDataParallel and FSDP are to the model they hold: ``module``, and no config."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_a_wrapped_model_is_checked_through_its_wrappers():
    """check_attention reads the config of the model inside DDP/FSDP (``module``) and torch.compile (``_orig_mod``)
    wrappers: a wrapped sdpa model is refused, a wrapped sp_plan one passes."""
    import copy

    from sp_plan.integrations.transformers import NAME, check_attention, unwrapped

    sdpa = _model("sdpa", config=copy.deepcopy(CONFIG))
    for wrapped in (_Wrapper(sdpa), torch.compile(_Wrapper(sdpa)), _Wrapper(_Wrapper(sdpa))):
        assert unwrapped(wrapped) is sdpa
        with pytest.raises(PlanError, match="the model runs the 'sdpa' attention"):
            check_attention(wrapped)
    sdpa.config._attn_implementation = NAME
    check_attention(torch.compile(_Wrapper(sdpa)))
    assert unwrapped(torch.nn.Linear(2, 2)).__class__ is torch.nn.Linear  # nothing inside: the module itself


def test_a_balanced_plan_trains_rows_of_one_document_each():
    """A balanced plan (what `plan` picks for packed workloads) places documents; a batch whose rows each hold one
    (position_ids one run, or None) is sharded as one document a row, not refused for lacking cu_seqlens, and
    matches one process."""
    _compare([BALANCED], run_world(_train_step, 4, [BALANCED], timeout=120), _reference())
