"""Hugging Face transformers on a plan: the runtime's attention as an attn_implementation, inputs in its token layout.

    ctx = sp_plan.runtime.init("plan.yaml")                  # inside torch.distributed
    name = register(ctx)                                      # "sp_plan"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name)
    ids, pos, labels = shard_inputs(ctx, input_ids, labels)  # full sequences in, this rank's tokens out
    logits = model(input_ids=ids, position_ids=pos).logits
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / count_loss_tokens(labels_full)
    loss.backward(); all_reduce_grads(ctx, model)            # sum over the sequence and data ranks

transformers' own loss gives the same: ``model(input_ids=ids, position_ids=pos, labels=labels,
shift_labels=labels, num_items_in_batch=count_loss_tokens(labels_full)).loss`` (labels already shifted).
The attention call follows transformers 4.53 to 5.23 (tested): ``fn(module, query, key, value,
attention_mask, dropout=, scaling=, **kwargs)`` on (b, heads, s, d), returning ((b, s, heads, d), None).

Rotary embeddings see global positions (``position_ids`` in the token layout); labels are shifted on
the full sequence before sharding, so each rank's summed loss is an exact part of the global one and
dividing by the global count of loss tokens makes the sum over ranks the single-process mean.

transformers would silently drop the mask of an attention name its mask interface does not know
(masking_utils' ``_preprocess_mask_arguments`` returns None), so ``register`` also registers a mask
function that checks the user's 2D ``attention_mask`` and builds nothing; a 4D mask reaches the
attention as is. None or all ones is honoured (the runtime builds the causal mask from global token
indices); anything else (padding, a custom 4D mask) is a PlanError. Right padding needs no mask in a
causal model: give the padding labels -100.

Packed documents follow transformers' padding-free convention: ``position_ids`` restart at each document (a
new document wherever a position is not the previous one plus one, as ``masking_utils.find_packed_sequence_indices``
reads them). ``shard_inputs`` turns them into ``cu_seqlens`` over the batch's sequences laid end to end, shards the
tokens per document (ranks may hold different numbers of them, so the batch comes back as one row) and attaches
the documents to the position_ids it returns; the attention reads them there and passes them to ``ctx.attention``.
Sliding-window layers (Mistral's ``config.sliding_window``, Gemma 3's, Qwen 2's and gpt-oss's per-layer
``layer_types``) pass each layer's ``sliding_window`` on as that layer's ``window``. Algorithms that cannot honour
documents or windows refuse them with the runtime's error; gpt-oss's attention sinks (``s_aux``) stay refused.
Packing and windows are tested with transformers 5.24.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from sp_plan.planner.documents import batch_cu_seqlens
from sp_plan.planner.errors import PlanError, of_type, whole_number
from sp_plan.planner.plan import Plan
from sp_plan.runtime.context import Context

NAME = "sp_plan"
IGNORE_INDEX = -100
#: keyword arguments of transformers' attention call that change the result and the runtime cannot honour
_UNSUPPORTED = ("softcap", "s_aux", "position_bias", "head_mask")
#: attribute of shard_inputs' position_ids holding their packed documents (cu_seqlens)
DOCUMENTS_ATTR = "_sp_plan_documents"


class ShardedInputs(NamedTuple):
    """This rank's input_ids, global position_ids and shifted labels, (batch, local seq) in the token layout; packed
    inputs come back as one row (1, local tokens) whose position_ids carry the documents (``documents_of``)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor | None


def check_plan(plan: Plan) -> None:
    """The integration shards the sequence (ulysses, ring) and the batch (dp); weights stay whole."""
    if plan.algorithm == "metp":
        raise PlanError("algorithm", "METP shards the attention and MLP weights (it replaces the whole layer)",
                        "use sp_plan.runtime.variants.metp's modules, or a ring/ulysses/usp/wallfacer/tokenring plan")
    for dim in ("tp", "pp"):
        if plan.degrees.get(dim, 1) > 1:
            raise PlanError(f"degrees.{dim}", f"the transformers integration keeps every weight whole; the plan has "
                            f"{dim} {plan.degrees[dim]}", "use a plan with tp 1 and pp 1 (sequence and data "
                            "parallelism only), or export the plan to Megatron for tensor/pipeline parallelism")


def register(ctx) -> str:
    """Register ``ctx.attention`` with transformers' AttentionInterface as "sp_plan" and return that name.

    The name is global in transformers: a later ``register`` replaces the context of an earlier one.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    check_plan(checked_ctx(ctx).plan)
    checked = [None]  # the position_ids tensor of the current forward, checked at its first layer only

    def sp_plan_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                          scaling: float | None = None, is_causal: bool | None = None, **kwargs):
        """transformers' attention call: (b, heads, local s, d) in, ((b, local s, heads, d), None) out."""
        return attention_forward(ctx, module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                 is_causal=is_causal, checked=checked, **kwargs)

    AttentionInterface.register(NAME, sp_plan_attention)
    AttentionMaskInterface.register(NAME, mask_forward)
    return NAME


def checked_ctx(ctx) -> Context:
    """``ctx`` where it is a runtime Context, else a PlanError naming it."""
    return of_type("ctx", ctx, Context, "the Context sp_plan.init(plan) returns on this rank")


def _tensor(field: str, x, what: str, ndim: int = 1) -> torch.Tensor:
    """``x`` where it is a tensor of at least ``ndim`` dimensions, else a PlanError naming ``field``."""
    of_type(field, x, torch.Tensor, f"{what} as a torch.Tensor")
    if x.ndim < ndim:
        raise PlanError(field, f"a tensor of {x.ndim} dimension(s)", f"pass {what}")
    return x


def mask_forward(*args, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """transformers' mask call for "sp_plan": refuse a padding mask, build none (the runtime masks causally)."""
    check_mask(attention_mask)
    return None


def attention_forward(ctx, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, checked: list | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """The plan's attention on transformers' (b, h, s, d) tensors; GQA K, V go to the runtime unrepeated.

    ``checked``: a one-item list holding the position_ids tensor already checked (one check per forward).
    """
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise PlanError(name, f"the sp_plan attention cannot honour {name}",
                            "use a model without it, or transformers' own attention on one device "
                            "(attn_implementation='eager')")
    if kwargs.get("output_attentions"):
        raise PlanError("output_attentions", "the sp_plan attention never forms the attention matrix",
                        "call the model with output_attentions=False")
    if dropout:
        raise PlanError("attention_dropout", f"the sp_plan attention has no dropout, got {dropout}",
                        "set the config's attention_dropout to 0.0")
    if key.shape[2] != query.shape[2]:
        raise PlanError("past_key_values", f"{query.shape[2]} local queries against {key.shape[2]} keys: a KV cache "
                        "or cross attention", "train or prefill over whole sequences without a cache "
                        "(use_cache=False); generate with attn_implementation='sdpa'")
    check_mask(attention_mask)
    cu, window = check_documents(ctx, kwargs.get("position_ids"), query.shape[2], kwargs.get("sliding_window"),
                                 checked)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", None)
    q, k, v = (_tokens_first(ctx, x) for x in (query, key, value))
    out = ctx.attention(q, k, v, causal=is_causal, scale=scaling, cu_seqlens=cu, window=window)
    return out, None


def _tokens_first(ctx, x: torch.Tensor) -> torch.Tensor:
    """transformers' (b, h, s, d) as the runtime's (b, s, h, d): a view where the plan's attention is local (degree-1
    attention turns it back into SDPA's layout, so the model's tensor reaches the kernel uncopied), a contiguous copy
    where the sequence group exchanges it."""
    t = x.transpose(1, 2)
    return t if ctx.plan.degrees.get("ring", 1) * ctx.plan.degrees.get("ulysses", 1) == 1 else t.contiguous()


def documents_of(position_ids) -> tuple[int, ...] | None:
    """The cu_seqlens that ``shard_inputs`` attached; None if unpacked."""
    return getattr(position_ids, DOCUMENTS_ATTR, None)


def check_documents(ctx, position_ids, local_len: int, window: int | None, checked: list | None
                    ) -> tuple[tuple[int, ...] | None, int | None]:
    """The layer's (cu_seqlens, window) for ``ctx.attention``, after checking the position ids once per forward. A
    layer whose window places a balanced batch otherwise than ``shard_inputs`` did is ``ctx.attention``'s error
    (runtime/placement.py)."""
    cu = documents_of(position_ids)
    check_layer_window(ctx, window)
    if cu is None and position_ids is not None and (checked is None or position_ids is not checked[0]):
        check_layout_positions(ctx, position_ids, local_len)
        if checked is not None:
            checked[0] = position_ids
    return cu, window


def check_layer_window(ctx, window: int | None) -> None:
    """A layer the model gives no window (``sliding_window`` None: a global layer, or a model without windows)
    attends its whole context; ``ctx.attention`` would read None as the plan's window on every layer, so a plan
    whose window masks every layer (no pattern) is refused here rather than windowing that layer."""
    planned = ctx.plan.workload.mask_window if ctx.plan.workload else None
    if window is None and planned is not None and planned.pattern is None:
        raise PlanError("sliding_window", f"the plan's window {planned.size} applies to every layer, and this layer "
                        "of the model attends without a window (its sliding_window is None)",
                        "make the plan for the model's layers: without --window for a model without sliding "
                        "windows, with --window-pattern for one that mixes windowed and global layers (Gemma 3: 5:1)")


def check_mask(attention_mask) -> None:
    """None or an all-ones 2D mask is honoured; padding, packing or custom masks are a clear error."""
    if attention_mask is None:
        return
    if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 2 and bool(attention_mask.bool().all()):
        return
    what = (f"a {attention_mask.ndim}D mask" if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim != 2
            else "a padding mask (zeros in attention_mask)" if isinstance(attention_mask, torch.Tensor)
            else f"a {type(attention_mask).__name__} mask")
    raise PlanError("attention_mask", f"the sp_plan attention applies only the plan's causal mask, got {what}",
                    "pass attention_mask=None: pad on the right and give the padding labels -100 (a causal model never "
                    "attends forward), pack documents with position_ids that restart at each one, or trim the batch "
                    "to sequences of equal length")


def check_layout_positions(ctx, position_ids: torch.Tensor, local_len: int) -> None:
    """The model's position ids must be the global positions of this rank's tokens (plus one offset >= 0).

    transformers defaults to local positions 0..n-1, which give rotary embeddings wrong relative
    distances on every rank but the first: forgetting shard_inputs' position_ids is an error.
    """
    ok = position_ids.shape[-1] == local_len
    if ok:
        tokens = torch.tensor(ctx.layout.tokens(ctx.rank, local_len * ctx.plan.sp), device=position_ids.device)
        offset = position_ids.reshape(-1, position_ids.shape[-1]) - tokens
        ok = bool(((offset == offset[:, :1]) & (offset >= 0)).all())
    wrong = ranks_without(ctx, ok, position_ids.device)
    if wrong:
        raise PlanError("position_ids", f"rank(s) {wrong}: the position ids are not the global positions of their "
                        f"tokens in the plan's {ctx.plan.token_layout} layout (transformers' default is local 0..n-1)",
                        "pass the position_ids that shard_inputs returns: model(input_ids=ids, position_ids=pos)")


def ranks_without(ctx, ok: bool, device: torch.device) -> list[int]:
    """The ranks of this rank's sequence group whose check failed (``ok`` False), known on every rank of it: a
    rank whose positions happen to be global (the first, under local positions) raises with its peers instead of
    waiting for them in the attention's collectives."""
    group = ctx.group("sp")
    if group is None:
        return [] if ok else [ctx.rank]
    flags = [torch.empty(1, dtype=torch.int32, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(flags, torch.tensor([int(ok)], dtype=torch.int32, device=device), group=group)
    return [dist.get_global_rank(group, i) for i, f in enumerate(torch.cat(flags).tolist()) if not f]


def check_positions(position_ids: torch.Tensor, seq_len: int) -> None:
    """One whole position per token of the full sequence, each the previous one plus one or 0 (a packed document
    starts): what ``packed_cu_seqlens`` reads as documents. Left padding (negative or repeated positions) or any
    other jump would be read as documents the data never had."""
    if position_ids.shape[-1] != seq_len:
        raise PlanError("position_ids", f"{position_ids.shape[-1]} positions for {seq_len} tokens",
                        "give one position per token of the full sequence")
    if position_ids.is_floating_point() or position_ids.is_complex():
        raise PlanError("position_ids", f"positions of dtype {position_ids.dtype}", "give integer positions (long)")
    steps = position_ids.diff(dim=-1)
    bad = (position_ids < 0).any(dim=-1) | ((steps != 1) & (position_ids[..., 1:] != 0)).any(dim=-1)
    if bool(bad.any()):
        row = int(torch.nonzero(bad.reshape(-1))[0])
        raise PlanError("position_ids", f"row {row} is neither one run of positions nor packed documents that each "
                        "restart at 0 (negative, repeated or jumping positions: left padding?)",
                        "pad on the right (labels -100), or pack documents with positions 0, 1, ... each")


def packed_cu_seqlens(position_ids: torch.Tensor) -> list[np.ndarray] | None:
    """Each row's document ends (a document starts wherever a position is not the previous one plus one, as
    transformers reads packed position_ids); None if every row is one document."""
    starts = position_ids.diff(dim=-1) != 1
    if not bool(starts.any()):
        return None
    s = position_ids.shape[-1]
    return [np.concatenate([[0], np.flatnonzero(row.cpu().numpy()) + 1, [s]]) for row in starts]


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels of next-token prediction on the full sequence: token t predicts labels[t + 1]; the last gets -100."""
    out = torch.full_like(labels, IGNORE_INDEX)
    out[..., :-1] = labels[..., 1:]
    return out


def count_loss_tokens(labels: torch.Tensor) -> int:
    """Tokens the shifted full-sequence labels score (the global divisor of a mean loss)."""
    _tensor("labels", labels, "the full sequences' unshifted labels, (batch, seq)")
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def shard_inputs(ctx, input_ids: torch.Tensor, labels: torch.Tensor | None,
                 position_ids: torch.Tensor | None = None, window: int | None = None) -> ShardedInputs:
    """This rank's input_ids, global position_ids and already shifted labels, in the plan's token layout.

    Inputs are full sequences (batch, seq); labels are unshifted (HF convention, usually input_ids)
    and are shifted on the full sequence first, then sharded (``ctx.shard``: planner.layout's tokens).
    ``position_ids`` that restart at each document pack documents (``shard_packed``); ``window`` is the sliding
    window a ``balanced`` plan weighs their work by (the one every layer uses; None for global layers).
    """
    checked_ctx(ctx)
    _tensor("input_ids", input_ids, "a 2D tensor of token ids")
    if labels is not None:
        _tensor("labels", labels, "unshifted labels of the full sequences, or None")
    if position_ids is not None:
        _tensor("position_ids", position_ids, "positions of the full sequences, or None")
    if window is not None:
        window = whole_number("window", window, 1, "pass the sliding window W >= 1 every layer uses, or None")
    if input_ids.ndim != 2:
        raise PlanError("input_ids", f"expected (batch, seq), got shape {tuple(input_ids.shape)}",
                        "pass a 2D tensor of token ids")
    b, s = input_ids.shape
    if labels is not None and labels.shape != input_ids.shape:
        raise PlanError("labels", f"shape {tuple(labels.shape)} differs from input_ids {tuple(input_ids.shape)}",
                        "pass unshifted labels of the full sequences, one per token")
    packs = None
    if position_ids is None:
        position_ids = torch.arange(s, device=input_ids.device).expand(b, s)
    else:
        check_positions(position_ids, s)
        position_ids = position_ids.expand(b, s)
        packs = packed_cu_seqlens(position_ids)
    if packs is None and ctx.plan.token_layout == "balanced":  # it places documents: here each row is one
        packs = [np.array([0, s])] * b
    if packs is not None:
        return shard_packed(ctx, input_ids, labels, position_ids, packs, window)
    return ShardedInputs(ctx.shard(input_ids, dim=1), ctx.shard(position_ids, dim=1),
                         None if labels is None else ctx.shard(shift_labels(labels), dim=1))


def shard_packed(ctx, input_ids: torch.Tensor, labels: torch.Tensor | None, position_ids: torch.Tensor,
                 packs: list[np.ndarray], window: int | None) -> ShardedInputs:
    """Packed rows laid end to end as one row, sharded per document; the position_ids carry the documents."""
    cu = tuple(int(x) for x in batch_cu_seqlens(packs))
    row = lambda x: ctx.shard(x.reshape(1, -1), dim=1, cu_seqlens=cu, window=window)  # noqa: E731
    pos = row(position_ids)
    setattr(pos, DOCUMENTS_ATTR, cu)
    return ShardedInputs(row(input_ids), pos, None if labels is None else row(shift_labels(labels)))


def all_reduce_grads(ctx, model: torch.nn.Module) -> None:
    """Sum every gradient over the world (sequence x data ranks; tp = pp = 1): one flat all-reduce; first, that the
    model ran the plan's attention (``check_attention``)."""
    check_plan(checked_ctx(ctx).plan)
    of_type("model", model, torch.nn.Module, "the torch.nn.Module whose gradients to sum")
    if ctx.plan.degrees.get("ulysses", 1) * ctx.plan.degrees.get("ring", 1) > 1:
        check_attention(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params or dist.get_world_size() == 1:
        return
    for p in params:  # a parameter unused on this rank still joins the sum
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel or FSDP (``module``) and ``torch.compile`` (``_orig_mod``) wrappers,
    whose config says which attention it runs."""
    while not hasattr(model, "config"):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
    return model


def check_attention(model: torch.nn.Module) -> None:
    """The model runs the "sp_plan" attention (``register``'s name). One switched to another attends to each rank's
    own tokens only, a wrong result without an error: loaded with attn_implementation="sdpa", or from a config
    another model was made from since (transformers writes a model's implementation into the config it is given)."""
    impl = getattr(getattr(unwrapped(model), "config", None), "_attn_implementation", NAME)
    if impl != NAME:
        raise PlanError("attn_implementation", f"the model runs the {impl!r} attention, which sees this rank's tokens "
                        f"only", f"make it with attn_implementation={NAME!r} from a config no other model is made from "
                        "(copy.deepcopy(config) for a reference model)")
