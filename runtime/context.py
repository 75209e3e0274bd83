"""`init(plan)`: the process groups, token sharding and attention of a plan, for the calling rank.

    import torch.distributed as dist
    from sp_plan.runtime import init
    dist.init_process_group("nccl")          # or gloo; torchrun sets the environment
    ctx = init("plan.yaml")
    x_local = ctx.shard(x, dim=1)            # this rank's tokens in the plan's token layout
    q, k, v = project(x_local)               # (batch, local seq, heads, head dim)
    out = ctx.attention(q, k, v, causal=True)
    ctx.attention_backend                    # the block kernel it ran on (runtime.choice)
    out_full = ctx.gather(out, dim=1)

Groups are built once, from the shared layout module, and passed explicitly (no global state).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from sp_plan.planner.documents import check_cu_seqlens
from sp_plan.planner.errors import PlanError, of_type, whole_number
from sp_plan.planner.layout import Layout, mesh_dims
from sp_plan.planner.model import masking_window
from sp_plan.planner.plan import Plan, one_placement_problem
from sp_plan.planner.yamlio import model_from_data

from .agree import MaskAgreement, check_mode, plain
from .attention import check_inputs, checked_attention
from .choice import BackendChoice
from .placement import Placements, remember


@dataclass
class Context:
    """The calling rank's view of a plan: DeviceMesh, groups by name, rank lists, shard/gather, attention."""

    plan: Plan
    layout: Layout
    rank: int
    mesh: DeviceMesh
    _groups: dict = field(default_factory=dict)
    #: the block-kernel choice of this process (SP_PLAN_ATTN_BACKEND or measured once per block kind)
    backends: BackendChoice = field(default_factory=BackendChoice.from_env)
    #: when ``attention`` compares a call over the sequence group: "new" (each distinct call once) or "every"
    #: (SP_PLAN_CHECK_CALLS, ``agree.check_mode``)
    check_calls: str = field(default_factory=check_mode)

    @property
    def attention_backend(self) -> str | None:
        """The block kernel the last ``attention`` call ran on (None before the first)."""
        return self.backends.backend

    def group(self, name: str):
        """The process group of dimension ``name`` (or "sp" = ulysses x ring) holding this rank; None if degree 1."""
        if name not in self._groups:
            raise PlanError("group", f"unknown group {name!r}", f"use one of {sorted(self._groups)}")
        return self._groups[name]

    def ranks(self, name: str) -> list[int]:
        """Global ranks of this rank's group of ``name``, in the dimension's order (layout module)."""
        if name not in self._groups:
            raise PlanError("group", f"unknown group {name!r}", f"use one of {sorted(self._groups)}")
        return self.layout.group_of("sp" if name == "sp" else name, self.rank)

    def shard(self, x: torch.Tensor, dim: int = 1, cu_seqlens=None, window: int | None = None,
              causal: bool | None = None) -> torch.Tensor:
        """This rank's tokens of a full-sequence tensor, in the plan's token layout (layout.tokens); with packed
        documents (``cu_seqlens``, and the ``window`` and ``causal`` the attention will use; None: the plan's) laid
        out per document as ``ctx.attention`` expects them (``ring.member_pieces``: ranks may hold different numbers
        of tokens). A ``balanced`` layout places by the mask, which is remembered (``placement.Placements``). Rows
        of a batch with ``cu_seqlens`` over all of them, laid end to end, become one row (``_end_to_end``)."""
        check_dim(x, dim)
        if cu_seqlens is None:
            tokens = self.layout.tokens(self.rank, x.size(dim))
            self._placements().record_whole(x.size(dim))
        else:
            cu, c, w = self._mask(None, cu_seqlens, window, causal)
            x = self._end_to_end(x, dim, cu)
            check_cu_seqlens(cu, x.size(dim))
            self._placements().record(cu, c, w)
            tokens = self._pieces(cu, c, w)[self.rank]
        return x.index_select(dim, torch.tensor(tokens, device=x.device))

    def _end_to_end(self, x: torch.Tensor, dim: int, cu: tuple) -> torch.Tensor:
        """``x``'s B rows of S tokens as one row of B x S where the checked ``cu`` covers them laid end to end
        (flash-attn's varlen convention; every row's end is a document's, as no document crosses a sequence), and
        remembered so that ``gather`` hands back B rows; ``x`` as it is where ``cu`` covers one row."""
        rows, n = (x.size(0), x.size(1)) if dim == 1 and x.dim() >= 2 else (1, 0)  # token ids are (B, S)
        kept = self.__dict__.setdefault("_rows", OrderedDict())
        if rows == 1 or cu[-1] != rows * n:  # not laid end to end: gather hands it back as it is
            remember(kept, cu, 1)
            return x
        crossing = sorted(set(range(n, rows * n, n)) - set(cu))
        if crossing:
            raise PlanError("cu_seqlens", f"cu_seqlens covers the batch's {rows} rows of {n:,} tokens end to end, and "
                            f"a document crosses the end of row {crossing[0] // n - 1} (token {crossing[0]:,})",
                            "end every row's last document at the row's end: a document never crosses a sequence")
        remember(kept, cu, rows)  # as many batches as placements keep
        return x.reshape(1, rows * n, *x.shape[2:])

    def _rows_back(self, x: torch.Tensor, dim: int, cu_seqlens) -> torch.Tensor:
        """A gathered row of a batch ``shard`` laid end to end (``_end_to_end``) as its B rows again."""
        from .variants.ring import check_masks  # the registry imports no variant until one runs

        if cu_seqlens is None or dim != 1 or x.size(0) != 1:
            return x
        rows = self.__dict__.get("_rows", {}).get(check_masks(cu_seqlens, None, None)[0])
        return x.reshape(rows, x.size(1) // rows, *x.shape[2:]) if rows else x

    def window(self, window: int | None = None) -> int | None:
        """``window``, or where None the plan's window on every layer (a local:global pattern has none: its caller
        passes each layer's, as transformers does); a window below 1 token is a PlanError."""
        return checked_window(self._planned_window(window))

    def _planned_window(self, window):
        """``window``, or where None the plan's on every layer, unchecked (``attention`` compares it first)."""
        planned = self.plan.workload.window if self.plan.workload else None
        if window is None and planned is not None and planned.pattern is None:
            return planned.size
        return window

    def causal(self, causal: bool | None = None) -> bool:
        """``causal``, or where None the plan's (causal without a workload); anything but a bool is a PlanError."""
        return checked_causal(self._planned_causal(causal))

    def _planned_causal(self, causal):
        """``causal``, or where None the plan's, unchecked (``attention`` compares it first)."""
        if causal is None:
            return self.plan.workload.causal if self.plan.workload else True
        return bool(causal) if isinstance(causal, np.bool_) else causal

    def _mask(self, seq_len: int | None, cu_seqlens, window, causal) -> tuple[tuple, bool, int | None]:
        """(cu_seqlens, causal, window) of a call, checked (against ``seq_len`` where given), the plan's where None,
        the window cut to the documents (``ring.check_masks``)."""
        from .variants.ring import check_masks

        cu, w = check_masks(cu_seqlens, self.window(window), seq_len)
        return cu, self.causal(causal), w

    def _pieces(self, cu: tuple, causal: bool, window: int | None) -> dict:
        """Global tokens each rank of this rank's sequence group holds, with packed documents ``cu`` placed by the
        mask (causal, window) (``member_pieces``)."""
        from .variants.ring import member_pieces

        pieces = member_pieces(self.plan.token_layout, self.plan.degrees["ulysses"], self.plan.degrees["ring"],
                               cu[-1], causal, cu, window)
        coords = {m: self.layout.coords(m) for m in self.ranks("sp")}
        return {m: pieces[c.get("ring", 0)][c.get("ulysses", 0)] for m, c in coords.items()}

    def _placements(self) -> Placements:
        """The masks ``shard`` placed recent batches by (made once)."""
        if "_placed" not in self.__dict__:
            whole = lambda n: {m: self.layout.tokens(m, n) for m in self.ranks("sp")}  # noqa: E731
            self.__dict__["_placed"] = Placements(self.plan.token_layout, self._pieces, self.causal(), whole)
        return self.__dict__["_placed"]

    def _check_placement(self, caller: str, cu: tuple, causal: bool, window: int | None) -> None:
        """``caller``'s mask places ``cu``'s tokens as ``shard`` did (``Placements.check``)."""
        placements = self._placements()
        if placements.wants(cu[-1]):
            planned = self._mask(None, cu, None, None)[2]
            placements.check(cu, causal, window, caller, planned)

    def _check_read(self, cu_seqlens: tuple, causal: bool, window: int | None) -> None:
        """``_check_placement`` of an attention call, once per batch's shards: a model's layers repeat the call."""
        read = (cu_seqlens, causal, window, self._placements().version)
        if self.__dict__.get("_read") != read:
            self._check_placement("ctx.attention", *self._mask(None, cu_seqlens, window, causal))
            self.__dict__["_read"] = read

    def _check_share(self, n_local: int, cu_seqlens) -> None:
        """This rank's ``n_local`` tokens against what the plan's layout gives a rank of ``cu_seqlens``'s sequence
        (``ring.check_share``), before any per-token array of it is built."""
        from .variants.ring import check_masks, check_share

        cu, _ = check_masks(cu_seqlens, None, None)
        check_share(n_local, self.plan.token_layout, self.plan.degrees["ring"], self.plan.degrees["ulysses"], cu[-1])

    def gather(self, x: torch.Tensor, dim: int = 1, cu_seqlens=None, window: int | None = None,
               causal: bool | None = None) -> torch.Tensor:
        """Inverse of ``shard`` (with the same ``cu_seqlens``, ``window`` and ``causal``): all-gather the local shards
        over the sequence group and put every token back at its place; shards of different lengths travel padded.
        Differentiable: the gradient of the full sequence comes back as this rank's tokens of it (``_Gathered``)."""
        members = self.ranks("sp")
        check_dim(x, dim)
        if cu_seqlens is not None:
            self._check_share(x.size(dim), cu_seqlens)
        if len(members) == 1:
            return self._rows_back(x, dim, cu_seqlens)
        if cu_seqlens is None:
            seq_len = x.size(dim) * len(members)
            self._placements().check_length(x.size(dim), len(members), "ctx.gather", "x")
            self._placements().check_whole(seq_len, "ctx.gather")
            perm = self.layout.sequence_permutation(seq_len)
            lengths = [x.size(dim)] * len(members)
        else:
            cu, c, w = self._mask(None, cu_seqlens, window, causal)
            self._check_placement("ctx.gather", cu, c, w)
            seq_len, held = cu[-1], self._pieces(cu, c, w)
            if len(held[self.rank]) != x.size(dim):  # a balanced layout, which local_token_range leaves open
                raise PlanError("cu_seqlens", f"the {self.plan.token_layout} layout gives this rank "
                                f"{len(held[self.rank]):,} tokens of {seq_len:,}, and it holds {x.size(dim):,}",
                                "pass the cu_seqlens the shard was made with")
            perm = np.concatenate([held[m] for m in members])
            lengths = [len(held[m]) for m in members]
        me = members.index(self.rank)
        own = perm[sum(lengths[:me]):sum(lengths[:me + 1])]  # this rank's tokens, as shard selects them

        def assemble(t: torch.Tensor) -> torch.Tensor:
            parts = self._all_gather(t, dim, max(lengths))
            by_group_rank = sorted(members)  # all_gather fills in group-rank order (sorted global ranks)
            ordered = torch.cat([parts[by_group_rank.index(m)].narrow(dim, 0, n) for m, n in zip(members, lengths)],
                                dim)
            out = torch.empty_like(ordered)
            return out.index_copy_(dim, torch.tensor(perm, device=t.device), ordered)

        if x.requires_grad and torch.is_grad_enabled():
            out = _Gathered.apply(x, dim, torch.tensor(own, device=x.device), assemble)  # a copy: own may be read-only
        else:
            out = assemble(x)
        return self._rows_back(out, dim, cu_seqlens)

    def _all_gather(self, x: torch.Tensor, dim: int, n: int) -> list[torch.Tensor]:
        """Every sequence-group member's ``x`` padded along ``dim`` to ``n``, in group-rank order."""
        if x.size(dim) < n:
            pad = list(x.shape)
            pad[dim] = n - x.size(dim)
            x = torch.cat([x, x.new_zeros(pad)], dim=dim)
        parts = [torch.empty_like(x) for _ in self.ranks("sp")]
        dist.all_gather(parts, x.contiguous(), group=self.group("sp"))
        return parts

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool | None = None,
                  scale: float | None = None, cu_seqlens=None, window: int | None = None,
                  kv_chunks: int | None = None) -> torch.Tensor:
        """The plan's attention on local (batch, local seq, heads, head dim) tensors in the token layout;
        ``cu_seqlens`` (0, ..., global length) packs documents, ``window`` is a sliding window (None: the plan's,
        ``window``) for ring, Ulysses, USP and all-gather plans (``attention.MASKED``; the others refuse them);
        ``kv_chunks``: all-gather's chunks of KV heads (None: the plan's, ``kv_chunks``)."""
        causal, window, kv_chunks = self._planned_causal(causal), self._planned_window(window), \
            self._planned_kv_chunks(kv_chunks)
        groups, ranks = self._attention_groups()
        cu_seqlens = plain(cu_seqlens)
        whole = isinstance(window, (int, np.integer)) and not isinstance(window, bool)  # else refused below
        if cu_seqlens is None and whole and isinstance(q, torch.Tensor):  # equal shards of S tokens
            window = masking_window(window, q.shape[1] * len(self.ranks("sp")))
        device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
        # compared before the runtime checks the call: a rank whose call is wrong then fails with its peers
        self._agreement().check(device, q, k, v, causal=causal, window=window, scale=scale, kv_chunks=kv_chunks,
                                cu_seqlens=cu_seqlens)
        causal, window, kv_chunks = checked_causal(causal), checked_window(window), checked_kv_chunks(kv_chunks)
        from .variants.ring import check_masks

        check_inputs(q, k, v, scale)  # before the shards' lengths are read from them
        if cu_seqlens is not None:  # checked before its last entry keys the placements
            check_masks(cu_seqlens, None, None)
        if cu_seqlens is None and isinstance(q, torch.Tensor):
            sp = self.plan.degrees["ulysses"] * self.plan.degrees["ring"]  # equal shards of the whole sequence
            self._placements().check_length(q.shape[1], sp, "ctx.attention")
            self._placements().check_whole(q.shape[1] * sp, "ctx.attention")
        elif cu_seqlens and self._placements().wants(cu_seqlens[-1]):
            self._check_read(cu_seqlens, causal, window)
        backend = self.backends.choose(q, k, causal)  # keyed by the local block: device, dtype, head dim, length
        return checked_attention(q, k, v, algorithm=self.plan.algorithm, groups=groups, ranks=ranks, causal=causal,
                                 token_layout=self.plan.token_layout, scale=scale, backend=backend,
                                 cu_seqlens=cu_seqlens, window=window, kv_chunks=kv_chunks)

    def _agreement(self):
        """The sequence group's ``agree.MaskAgreement`` (made once)."""
        if "_agreed" not in self.__dict__:
            self.__dict__["_agreed"] = MaskAgreement(self._groups.get("sp"), every=self.check_calls == "every")
        return self.__dict__["_agreed"]

    def _attention_groups(self) -> tuple[dict, dict]:
        """The groups and ranks ``attention`` passes the plan's algorithm, by name (made once: a plan's groups do
        not change, and ``attention`` is called every layer)."""
        if "_attention" not in self.__dict__:
            names = ("ring", "ulysses") + (("team", "sub_ring") if self.plan.algorithm == "wallfacer" else ())
            groups = {n: self._groups.get(n) for n in names}
            ranks = {n: self.ranks(n) for n in names}
            if self.plan.algorithm == "tokenring_ring":  # the inner TokenRing: the plan's team, not the hostnames
                ranks["team"] = self.layout.group_of("team", self.rank)
            self.__dict__["_attention"] = (groups, ranks)
        return self.__dict__["_attention"]

    def kv_chunks(self, kv_chunks: int | None = None) -> int:
        """``kv_chunks``, or where None the plan's (1: one gather); ``runtime.attention`` refuses a count over 1
        for a plan that is not all-gather's, as the plan file does."""
        return checked_kv_chunks(self._planned_kv_chunks(kv_chunks))

    def _planned_kv_chunks(self, kv_chunks):
        """``kv_chunks``, or where None the plan's, unchecked (``attention`` compares it first)."""
        return (self.plan.kv_chunks or 1) if kv_chunks is None else kv_chunks


def checked_causal(causal) -> bool:
    """``causal`` where it is a bool, else a PlanError: bool("no") is True, and a word is no mask."""
    if not isinstance(causal, (bool, np.bool_)):
        raise PlanError("causal", f"must be True or False, got {causal!r}", "pass causal=True, False or None "
                        "(the plan's)")
    return bool(causal)


def checked_window(window) -> int | None:
    """``window`` (None: full attention) where it is a whole number of at least 1 token, else a PlanError."""
    if window is None:
        return None
    return whole_number("window", window, 1, "pass a window of W >= 1 tokens, or None for the plan's")


def checked_kv_chunks(kv_chunks) -> int:
    """``kv_chunks`` where it is a whole number of at least 1, else a PlanError."""
    return whole_number("kv_chunks", kv_chunks, 1, "pass kv_chunks=1 or more, or None for the plan's")


class _Gathered(torch.autograd.Function):
    """``ctx.gather`` under autograd. What follows a gather runs alike on every rank of the group, so the gradient
    of a rank's shard is its own tokens' part of the full sequence's gradient, as Megatron's gather from the
    sequence-parallel region splits it; summing the replicated parameters' gradients over the group (the
    transformers integration's ``all_reduce_grads``) then counts each token once."""

    @staticmethod
    def forward(fctx, x, dim, own, assemble):
        fctx.dim = dim
        fctx.save_for_backward(own)
        return assemble(x.detach())

    @staticmethod
    def backward(fctx, grad):
        (own,) = fctx.saved_tensors
        return grad.index_select(fctx.dim, own), None, None, None


def _as_plan(plan_or_path: Plan | str | Path | dict) -> Plan:
    """``init``'s plan: a Plan, a plan file's path or a plan's mapping (``Plan.model_dump()``)."""
    if isinstance(plan_or_path, (str, os.PathLike)):
        return Plan.load(plan_or_path)
    if isinstance(plan_or_path, dict):
        return model_from_data(Plan, plan_or_path, "plan")
    return of_type("plan", plan_or_path, Plan, "a Plan, a plan file's path or a plan's mapping")


def require_world() -> None:
    """The default process group is initialized: what every collective of a plan runs in."""
    if not dist.is_available() or not dist.is_initialized():
        raise PlanError("torch.distributed", "the default process group is not initialized",
                        "call torch.distributed.init_process_group first (torchrun sets the environment)")


def check_device_type(device_type) -> str:
    """``device_type`` where torch knows it and this host has such a device, else PlanError("device_type"): torch
    would build the mesh and fail at the first use of a missing device (or never, for an unknown name)."""
    fix = "pass cpu with gloo, cuda with nccl, or None (the backend's)"
    if not isinstance(device_type, str):
        raise PlanError("device_type", f"{type(device_type).__name__} is no device type", fix)
    try:
        torch.device(device_type)
    except (RuntimeError, ValueError):
        raise PlanError("device_type", f"{device_type!r} is no device type torch knows", fix) from None
    module = getattr(torch, device_type, None)  # torch.cuda, torch.xpu, an accelerator plug-in's module
    if device_type != "cpu" and callable(getattr(module, "is_available", None)) and not module.is_available():
        raise PlanError("device_type", f"this host has no {device_type} device available to torch", fix)
    return device_type


def check_one_placement(plan: Plan) -> None:
    """A plan whose layout cannot serve its layers (``plan.one_placement_problem``) is refused before it runs:
    ``placement.Placements`` would refuse its first windowed or global layer."""
    problem = one_placement_problem(plan.token_layout, plan.workload)
    if problem:
        raise PlanError("token_layout", problem, "make the plan again (sp-plan plan chooses zigzag, striped or "
                        "contiguous for mixed layers), or set token_layout: zigzag")


def check_dim(x: torch.Tensor, dim: int) -> None:
    """``x`` is a tensor and ``dim`` names one of its dimensions (the token dimension shard and gather move)."""
    of_type("x", x, torch.Tensor, "a torch.Tensor of the full sequence (shard) or of this rank's tokens (gather)")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise PlanError("dim", f"{dim!r} is no dimension of a {x.dim()}-dimensional tensor",
                        "pass the token dimension, e.g. dim=1 for (batch, seq, ...)")


def plan_key(plan: Plan) -> str:
    """What every rank must agree on to run one plan: its layout and the mask its attention takes by default."""
    w = plan.workload
    mask = "" if w is None else f", causal {w.causal}, window {w.window.size if w.window else None}"
    return f"{plan.summary()}, kv_chunks {plan.kv_chunks or 1}{mask}"


def check_same_plan(plan: Plan, world: int) -> None:
    """Every rank was given the same plan (``plan_key``): ranks of different plans would each pass their own checks
    and then wait forever in different collectives (a ring's sends against an all-to-all)."""
    from .agree import first_difference

    found = first_difference({"plan": plan_key(plan)}, world)
    if found is not None:
        _, other, theirs, first = found
        raise PlanError("plan", f"rank {other} was given '{theirs}', rank 0 '{first}'",
                        "give every rank the same plan file")


def init(plan_or_path: Plan | str | Path, device_type: str | None = None) -> Context:
    """Build the plan's DeviceMesh and groups inside an initialized torch.distributed world (all ranks call it);
    the plan is a Plan, a plan file's path or its mapping, ``device_type`` the mesh's (None: cuda under nccl, else
    cpu)."""
    plan = _as_plan(plan_or_path)
    require_world()
    world, rank = dist.get_world_size(), dist.get_rank()
    nccl = dist.get_backend() == "nccl"
    if not nccl:  # first: a rank given another plan, of another world, fails with its peers, not alone
        check_same_plan(plan, world)
    plan.check_world(world)
    check_one_placement(plan)
    layout = plan.layout()
    device_type = check_device_type(device_type or ("cuda" if nccl else "cpu"))
    dims = mesh_dims(plan.degrees, plan.order)  # innermost first
    shape = [s for _, s in reversed(dims)]
    names = tuple(n for n, _ in reversed(dims))
    mesh = DeviceMesh(device_type, torch.arange(world).reshape(shape), mesh_dim_names=names)
    if nccl:  # after the mesh: it has set this rank's device, which NCCL's gather uses
        check_same_plan(plan, world)
    groups: dict = {n: mesh.get_group(n) if s > 1 else None for n, s in zip(names, shape)}  # degree 1: no group
    sp_groups = layout.groups("sp")
    if len(sp_groups[0]) == 1:
        groups["sp"] = None
    elif plan.degrees["ulysses"] == 1:
        groups["sp"] = groups["ring"]
    elif plan.degrees["ring"] == 1:
        groups["sp"] = groups["ulysses"]
    else:  # every rank creates every sp group, in the same order
        for g in sp_groups:
            pg = dist.new_group(sorted(g))
            if rank in g:
                groups["sp"] = pg
    if plan.algorithm == "wallfacer":  # WallFacer's teams and sub-rings inside the ring (layout module)
        for n in ("team", "sub_ring"):
            all_n = layout.groups(n)
            if len(all_n[0]) == 1:
                groups[n] = None
            elif sorted(all_n[0]) in [sorted(g) for g in layout.groups("ring")]:
                groups[n] = groups.get("ring")  # a sub-ring of C = 1 is the ring
            else:  # every rank creates every group, in the same order
                for g in all_n:
                    pg = dist.new_group(sorted(g))
                    if rank in g:
                        groups[n] = pg
    for n in ("tp", "ulysses", "ring", "team", "sub_ring", "dp", "pp"):
        groups.setdefault(n, None)
    return Context(plan=plan, layout=layout, rank=rank, mesh=mesh, _groups=groups)
