"""Packed documents on gloo ranks: each algorithm x balancing policy's attention time, work balance and bytes moved,
and the planner's ranking against the measured one (a script, not a test).

    python benchmarks/bench_masks.py [--world 8] [--batches magi-short:16384,megatron-dcp:16384,magi-short:32768:key]
                                     [--candidates all|key|none|LABEL,...] [--repeats 3] [--warmup 0] [--head-dim 16]
                                     [--profile ID|FILE [--profile-cluster FILE]] [--single 4096] [--json out.json]
                                     [--rank-cpu SHARE] [--quick]

Each batch is one sequence packed with documents drawn from a named distribution (profiles/documents.yaml, seed
``--seed``), causal, llama3-8b's heads (32 query, 8 KV) with the head dim cut to ``--head-dim`` for the CPU, fp32.
Each batch runs two worlds:

- **counted**: every candidate (ring and all-gather under each balancing policy, Ulysses, USP) runs one attention
  forward + backward through ``runtime.init(plan).attention`` with the block kernels answering zeros of their
  shapes. Which blocks run and which bytes move follow from the masks and the layout alone, so the counts are the
  real run's (the timed world counts again and must agree) at a fraction of its time;
- **timed**: the candidates ``--candidates`` names (a batch's ``:WHICH`` suffix overrides it) run forward +
  backward on the real kernels between barriers, ``--repeats`` rounds in which they take turns (the order
  rotating), so a slow spell of the shared machine falls on all of them. Before the readings, a pass on zero
  kernels builds each candidate's groups, masks and layout (what a first call pays once), one real call warms the
  kernels, and ``--warmup`` real passes follow (0 by default: the first readings run on built candidates).
  ``key`` times contiguous ring (the baseline), each algorithm's policy with the fewest blocks and its least
  imbalanced one, and each pricing's fastest candidate of every algorithm; ``none`` times nothing.

Per candidate it prints:

- where timed: the median wall time over the repeats and their spread (min-max), and **cpu s**, the median over
  the repeats of the CPU seconds the ranks spent in the call, summed over ranks: what the call costs the host's
  cores whatever else runs on them (on a quiet host of C cores shared by the ranks, the wall time is about cpu s
  / C plus the waits);
- where timed: **busiest cpu s**, the median over the repeats of the largest per-rank CPU seconds in the call
  (``time.process_time`` of that rank's process during the call, all its threads), and **cpu max/mean**, the
  median over the repeats of the largest per-rank CPU seconds over their mean (the measured imbalance). A rank's
  CPU seconds are its work whatever the other ranks do, so on dedicated cores a call cannot finish before its
  busiest rank's CPU seconds; for a ring (lock-step rounds) that is a lower bound that understates the contiguous
  ring's time, so comparing the contiguous ring's busiest-rank CPU to the best layout's is conservative for the
  1.3x target. Under each batch's targets the bench prints the candidate with the least busiest cpu s, its
  imbalance, and the contiguous ring's busiest cpu s over it;
- the work imbalance, max / mean over ranks of the score entries of the blocks each rank runs (``planner.masks``);
  a ring waits on its busiest rank every round, so its figure is the sum over rounds of the busiest rank's
  entries over the mean rank's; the blocks run (``runtime.variants.ring.BLOCKS``, counted in each rank), all ranks
  together and the busiest over the mean; and the tiles, the kernel calls those blocks made in the counted world (a
  block under a document mask runs one call per piece of a document it holds, so tiles / blocks says how finely a
  policy cuts the documents: small calls run far below a kernel's large-block speed), and whether the planner's
  count of them (``planner.masks.pack_tiles``, which prices each tile's length and call) is the same;
- the bytes each rank received (counted in the collectives and point-to-point batches it posted; gloo has no
  reduce-scatter, so the all-gather's backward all-reduces: counted as a ring all-reduce, 2 (P-1)/P of the buffer)
  against the needed-KV lower bound: the K, V of keys a rank's queries see and it does not hold, there and (dK, dV)
  back;
- the planner's predicted attention seconds (compute and exposed communication of one layer, ``estimate``) on the
  cpu-local preset stretched to ``--world`` rank slots, uncalibrated, and on ``--profile`` (a tuned profile, priced
  on the cluster file it was tuned on: ``--profile-cluster``, else the ``cluster.yaml`` beside the profile file);
  for each pricing its order of every candidate, the Spearman rank correlation of predicted and measured over the
  timed ones, and the top-1 regret (how much slower its pick measured than the measured best).

A last batch checks that one document costs what no documents cost: the same blocks and bytes, counted, and the
time within the readings' spread, for ring and all-gather with ``cu_seqlens = [0, S]`` against ``None``.

Ranks that outnumber the cores take turns on them, so the wall time measures the work of all ranks. ``--rank-cpu
SHARE`` caps each timed rank at that share of one core (``harness.cpu_share``, a CPU cgroup each; needs root): the
ranks then run side by side like dedicated devices, a rank that waits leaves its share idle, and a call takes as
long as its busiest rank, as on a cluster. ``0.24`` for 8 ranks on 2 cores leaves the parent a little.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADS, KV_HEADS = 32, 8
POLICIES = ("contiguous", "zigzag", "striped", "balanced")
BATCHES = "magi-short:16384,megatron-dcp:16384,magi-short:32768:key"
WHICH = ("all", "key", "none")
QUICK = dict(batches="megatron-dcp:2048", repeats=1, head_dim=8, single=512)
BASELINE = "ring contiguous"


@dataclass(frozen=True)
class Candidate:
    """One algorithm x balancing policy, and whether it gets the documents (False: today's unmasked path)."""

    algorithm: str
    ulysses: int
    ring: int
    token_layout: str
    masked: bool = True

    @property
    def label(self) -> str:
        degrees = f"u{self.ulysses}r{self.ring}" if self.algorithm == "usp" else ""
        return f"{self.algorithm}{degrees} {self.token_layout}" + ("" if self.masked else " (no cu_seqlens)")


@dataclass(frozen=True)
class Pricing:
    """What the planner prices with: a name for the output, the cluster, and the profile (False: none)."""

    name: str
    cluster: object
    profile: object = False


def candidates(world: int) -> list[Candidate]:
    """Ring and all-gather under every policy, Ulysses, and USP (ulysses 2) under zigzag and balanced."""
    out = [Candidate(a, 1, world, p) for a in ("ring", "allgather") for p in POLICIES]
    out.append(Candidate("ulysses", world, 1, "contiguous"))
    if world >= 4:
        out += [Candidate("usp", 2, world // 2, p) for p in ("zigzag", "balanced")]
    return out


def single_candidates(world: int) -> list[Candidate]:
    """Today's unmasked ring and all-gather beside the same with one document."""
    return [Candidate(a, 1, world, p, masked) for a, p in (("ring", "zigzag"), ("ring", "contiguous"),
                                                           ("allgather", "zigzag")) for masked in (False, True)]


def plan_of(c: Candidate, work):
    """The candidate's Plan over ``work`` (a balanced plan needs its documents)."""
    from sp_plan.planner.plan import Plan

    degrees = {"ulysses": c.ulysses, "ring": c.ring}
    order = [d for d in ("ring", "ulysses") if degrees[d] > 1] or ["ring"]
    return Plan(algorithm=c.algorithm, degrees={k: v for k, v in degrees.items() if v > 1} or {"ring": 1},
                order=order, token_layout=c.token_layout, workload=work)


def workload(name: str, tokens: int, seed: int):
    """One causal sequence of ``tokens`` packed from the named distribution (None: one document)."""
    from sp_plan.planner.model import Workload
    from sp_plan.profiles.documents import resolve_documents

    if name == "single":
        return Workload(seq_len=tokens)
    return Workload(seq_len=tokens, documents=resolve_documents(name), seed=seed)


def pack(work) -> tuple[int, ...]:
    """The workload's first pack as cu_seqlens."""
    from sp_plan.planner.documents import workload_packs

    return tuple(int(x) for x in workload_packs(work, 1)[0])


# ---- counted in each rank -------------------------------------------------------------------------------------------

RECEIVED = [0]


def _count(fn, bytes_of):
    """``fn`` that adds the bytes its call brings this rank to RECEIVED."""
    def wrapper(*args, **kwargs):
        RECEIVED[0] += int(bytes_of(*args, **kwargs))
        return fn(*args, **kwargs)
    return wrapper


def _a2a_bytes(output, input, output_split_sizes=None, input_split_sizes=None, group=None, **_):
    import torch.distributed as dist

    me, n = dist.get_rank(group), dist.get_world_size(group)
    rows = output_split_sizes or [output.shape[0] // n] * n
    return output.nbytes - rows[me] * (output.nbytes // max(output.shape[0], 1))


def count_bytes() -> None:
    """Wrap the collectives and point-to-point batches the runtime posts so that they count received bytes."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    n = lambda group: dist.get_world_size(group)  # noqa: E731
    dist.batch_isend_irecv = _count(dist.batch_isend_irecv,
                                    lambda ops: sum(o.tensor.nbytes for o in ops if o.op is c10d.irecv))
    dist.all_gather = _count(dist.all_gather, lambda outs, t, group=None, **_: sum(o.nbytes for o in outs) - t.nbytes)
    dist.all_to_all_single = _count(dist.all_to_all_single, _a2a_bytes)
    dist.reduce_scatter = _count(dist.reduce_scatter,
                                 lambda out, ins, group=None, **_: out.nbytes * (n(group) - 1))
    dist.all_reduce = _count(dist.all_reduce,
                             lambda t, op=None, group=None, **_: 2 * t.nbytes * (n(group) - 1) / n(group))


def full_inputs(S: int, head_dim: int, seed: int) -> list:
    """The global seeded q, k, v and dout (made once in the parent: the forked ranks share them)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, S, h, head_dim, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS, HEADS)]


def _inputs(ctx, full: list, cu) -> list:
    """This rank's q, k, v (requiring grad) and dout: the global tensors sharded by the plan."""
    local = [ctx.shard(x, dim=1, cu_seqlens=cu) for x in full]
    return [x.detach().clone().requires_grad_() for x in local[:3]] + [local[3]]


def _once(ctx, tensors, cu) -> tuple[float, int, int, float]:
    """One forward + backward between barriers: (seconds, blocks run, bytes received, this rank's CPU seconds in
    it) on this rank."""
    import torch.distributed as dist

    from sp_plan.runtime.variants.ring import BLOCKS

    q, k, v, dout = tensors
    blocks, received = sum(BLOCKS.values()), RECEIVED[0]
    dist.barrier()
    t, cpu = time.perf_counter(), time.process_time()
    ctx.attention(q, k, v, causal=True, cu_seqlens=cu).backward(dout)
    cpu = time.process_time() - cpu
    dist.barrier()
    return time.perf_counter() - t, sum(BLOCKS.values()) - blocks, RECEIVED[0] - received, cpu


#: kernel calls (tiles) the zero kernels answered in this rank: a block under a document mask runs one per piece
TILES = [0]


def _zero_forward(q, k, v, **_):
    """A block's (out, lse) as zeros of their shapes: what the counted world runs instead of a kernel."""
    import torch

    TILES[0] += 1
    from sp_plan.runtime.kernels import lse_dtype

    b, n, h, _ = q.shape
    return q.new_zeros(b, n, h, v.shape[-1]), torch.zeros(b, h, n, dtype=lse_dtype(q.dtype))


def _zero_backward(dout, q, k, v, out, lse, **_):
    """A block's (dq, dk, dv) as zeros of their shapes."""
    import torch

    TILES[0] += 1
    return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


#: the real block kernels, kept while the zero ones stand in (``zero_kernels``)
_REAL_KERNELS: list = []


def zero_kernels(zero: bool = True) -> None:
    """Replace the block kernels the variants call with ``_zero_forward`` / ``_zero_backward`` in this rank, or put
    the real ones back (``zero`` False): the blocks that run and the bytes that move follow from the masks and the
    layout, not from the values."""
    from sp_plan.runtime import kernels
    from sp_plan.runtime.variants import ring

    if not _REAL_KERNELS:
        _REAL_KERNELS.extend((kernels.block_attention, kernels.block_attention_backward))
    pair = (_zero_forward, _zero_backward) if zero else tuple(_REAL_KERNELS)
    for mod in (kernels, ring):
        mod.block_attention, mod.block_attention_backward = pair


def _setup(cands: list[Candidate], work, cu, full: list, backend: str) -> tuple[list, list, list]:
    """This rank's contexts, inputs and cu_seqlens (None where unmasked) of every candidate, bytes counted."""
    import torch

    from sp_plan.runtime import init
    from sp_plan.runtime.choice import ENV

    torch.set_num_threads(1)
    os.environ[ENV] = backend  # one kernel for every candidate: no per-context measuring, no choice noise
    count_bytes()
    ctxs = [init(plan_of(c, work)) for c in cands]
    data = [_inputs(ctx, full, cu) for ctx in ctxs]
    return ctxs, data, [cu if c.masked else None for c in cands]


def count_rank(rank: int, world: int, cands: list[Candidate], work, cu, full: list,
               backend: str) -> list[tuple[int, int, int]]:
    """Every candidate's (blocks run, bytes received, kernel calls) on this rank, one forward + backward on zero
    kernels, after one uncounted (a call's first compares its arguments over the group: ``runtime.agree``)."""
    zero_kernels()
    ctxs, data, cus = _setup(cands, work, cu, full, backend)
    for ctx, d, c in zip(ctxs, data, cus):
        _once(ctx, d, c)
    out = []
    for ctx, d, c in zip(ctxs, data, cus):
        tiles = TILES[0]
        out.append(_once(ctx, d, c)[1:3] + (TILES[0] - tiles,))
    return out


def measure_rank(rank: int, world: int, cands: list[Candidate], work, cu, full: list, repeats: int, warmup: int,
                 backend: str) -> list[list[tuple[float, int, int, float]]]:
    """Every candidate's readings on this rank, the candidates' order rotating per repeat. First a pass on zero
    kernels builds each candidate's groups, masks and layout as a warm-up does, then one real call warms the kernels,
    then ``warmup`` real passes."""
    ctxs, data, cus = _setup(cands, work, cu, full, backend)
    zero_kernels()
    for i in range(len(cands)):
        _once(ctxs[i], data[i], cus[i])
    zero_kernels(False)
    _once(ctxs[0], data[0], cus[0])
    for _ in range(warmup):
        for i in range(len(cands)):
            _once(ctxs[i], data[i], cus[i])
    out: list[list] = [[] for _ in cands]
    for r in range(repeats):
        for j in range(len(cands)):
            i = (j + r) % len(cands)
            out[i].append(_once(ctxs[i], data[i], cus[i]))
    return out


# ---- counted from the layout ----------------------------------------------------------------------------------------

def ring_members(c: Candidate, S: int, cu) -> list[np.ndarray]:
    """Tokens of each ring member (for Ulysses, each rank) as the runtime places them."""
    from sp_plan.runtime.variants.ring import member_pieces

    pieces = member_pieces(c.token_layout, c.ulysses, c.ring, S, True, cu, None)
    if c.algorithm == "ulysses":
        return list(pieces[0])
    return [np.concatenate(p) for p in pieces]


def imbalance(c: Candidate, S: int, cu) -> float:
    """Busiest over mean score entries: per rank (all-gather), summed per round (ring, USP), 1 for Ulysses."""
    from sp_plan.planner.masks import imbalance as max_over_mean, pair_matrix, rank_pairs, round_pairs

    if c.algorithm == "ulysses":
        return 1.0  # every rank attends every token on HEADS / world heads
    members = ring_members(c, S, cu)
    if c.algorithm == "allgather":
        return max_over_mean(rank_pairs(members, cu, True, None))
    busiest, mean = round_pairs(pair_matrix(members, cu, True, None))
    return float(busiest.sum() / mean.sum())


def needed_keys(q_tokens: np.ndarray, cu, S: int) -> int:
    """Keys the queries see (causal, within their document) that they do not hold."""
    q = np.sort(q_tokens)
    k = np.arange(S)
    ends = np.asarray(cu)[np.searchsorted(cu, k, side="right")]
    seen = np.searchsorted(q, ends) > np.searchsorted(q, k)  # some query in [k, end of k's document)
    seen[q] = False
    return int(seen.sum())


def lower_bound_bytes(c: Candidate, S: int, cu, head_dim: int) -> float:
    """Sum over ranks (ring members: a USP member's ulysses ranks share its keys by heads) of the needed K, V and
    the dK, dV sent back: 4 tensors of KV_HEADS x head_dim fp32 per needed key."""
    return float(sum(needed_keys(m, cu, S) for m in ring_members(c, S, cu)) * 4 * KV_HEADS * head_dim * 4)



# ---- the planner's side ---------------------------------------------------------------------------------------------

def preset_cluster(world: int):
    """The cpu-local preset with ``world`` rank slots on its one host (its uncalibrated figures)."""
    import sp_plan.profiles as profiles
    from sp_plan.planner.yamlio import read_data

    spec = read_data(Path(profiles.__file__).parent / "clusters" / "cpu-local.yaml", "cluster")
    return profiles.spec_cluster({**spec, "devices_per_node": world}, 1)


def _profile_file(spec: str) -> str:
    """``spec`` as a path the profile loader reads: a gzipped profile (as benchmarks/truths keeps them) unpacked."""
    if not spec.endswith(".gz") or not Path(spec).is_file():
        return spec
    out = Path(tempfile.mkdtemp(prefix="bench_masks_")) / Path(spec[:-3]).name
    out.write_bytes(gzip.decompress(Path(spec).read_bytes()))
    return str(out)


def tuned_pricing(spec: str, cluster_file: str | None, world: int) -> Pricing:
    """The tuned profile ``spec`` (an id or a file) on the cluster file it was tuned on; SystemExit(2) with one line
    when the cluster is missing, has another world size, or the profile does not apply to it."""
    from sp_plan.planner.errors import PlanError
    from sp_plan.profiles import load_cluster
    from sp_plan.profiles.resolve import resolve_params

    beside = Path(spec).parent / "cluster.yaml"
    cluster_file = cluster_file or (str(beside) if Path(spec).is_file() and beside.is_file() else None)
    if cluster_file is None:
        _fail("--profile-cluster", "a tuned profile is priced on the cluster file it was tuned on",
              "pass --profile-cluster cluster.yaml (the `sp-plan discover` file the tune ran with)")
    try:
        cluster = load_cluster(cluster_file)
        _, line, profile = resolve_params(cluster, _profile_file(spec))
    except PlanError as e:
        _fail(e.field, e.problem, e.fix)
    if cluster.world_size != world:
        _fail("--profile-cluster", f"{cluster_file} has {cluster.world_size} ranks, the bench runs {world}",
              f"pass --world {cluster.world_size} or a profile tuned on {world} ranks")
    if profile is None:
        _fail("--profile", line, "pass a profile tuned on this cluster file (`sp-plan profile list`)")
    return Pricing(f"profile {profile.id or Path(spec).name}", cluster, profile)


def _fail(field: str, problem: str, fix: str) -> None:
    """Exit 2 with one line naming the field and the fix."""
    print(f"error: {field}: {problem}; {fix}", file=sys.stderr)
    raise SystemExit(2)


def predicted(c: Candidate, work, head_dim: int, pricing: Pricing) -> float:
    """The planner's attention seconds of one layer: its attention compute and exposed sequence communication."""
    from sp_plan.pipeline import estimate
    from sp_plan.profiles import load_model

    model = load_model("llama3-8b").model_copy(update={"head_dim": head_dim, "layers": 1})
    pr = estimate(plan_of(c, work), pricing.cluster, model, work, profile=pricing.profile)
    skip = ("linear", "lm head", "grad")
    return sum(p.exposed_seconds for p in pr.breakdown if not p.name.startswith(skip))


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


# ---- one batch ------------------------------------------------------------------------------------------------------

def algorithm_of(row: dict) -> str:
    """The algorithm word of a row's candidate label (``uspu2r4 zigzag`` -> ``uspu2r4``)."""
    return row["candidate"].split()[0]


def key_labels(rows: list[dict], pricings: list[Pricing]) -> set[str]:
    """The candidates ``key`` times: contiguous ring, and per algorithm its policy with the fewest blocks, its least
    imbalanced one, and each pricing's fastest of it (so each pricing's pick is among them)."""
    keep = {BASELINE}
    for alg in dict.fromkeys(algorithm_of(r) for r in rows):
        mine = [r for r in rows if algorithm_of(r) == alg]
        keep.add(min(mine, key=lambda r: r["blocks"])["candidate"])
        keep.add(min(mine, key=lambda r: r["imbalance"])["candidate"])
        keep |= {min(mine, key=lambda r: r["predicted"][p.name])["candidate"] for p in pricings}
    return keep


def chosen(which: str, rows: list[dict], pricings: list[Pricing]) -> set[str]:
    """The labels of the candidates to time: all, key, none, or a comma-separated list of labels."""
    labels = [r["candidate"] for r in rows]
    if which == "all":
        return set(labels)
    if which == "none":
        return set()
    if which == "key":
        return key_labels(rows, pricings) & set(labels)
    asked = {w.strip() for w in which.split(",")}
    unknown = sorted(asked - set(labels))
    if unknown:
        _fail("--candidates", f"no candidate {', '.join(map(repr, unknown))}",
              f"use all, key, none or labels from: {', '.join(labels)}")
    return asked


def counted_rows(name: str, tokens: int, cands: list[Candidate], work, cu, full, args, pricings) -> list[dict]:
    """Every candidate's counted figures (blocks, bytes, imbalance, bound) and each pricing's prediction."""
    from harness.worlds import run_world

    counts = run_world(count_rank, args.world, cands, work, cu, full, args.backend, timeout=args.timeout)
    rows = []
    for i, c in enumerate(cands):
        blocks = [counts[p][i][0] for p in range(args.world)]
        rows.append(dict(batch=f"{name}:{tokens}", candidate=c.label, documents=len(cu) - 1, masked=c.masked,
                         blocks=sum(blocks), blocks_imbalance=max(blocks) * len(blocks) / max(sum(blocks), 1),
                         tiles=sum(counts[p][i][2] for p in range(args.world)),
                         bytes=sum(counts[p][i][1] for p in range(args.world)), imbalance=imbalance(c, tokens, cu),
                         bound=lower_bound_bytes(c, tokens, cu, args.head_dim), planned_tiles=planned_tiles(c, tokens, cu),
                         predicted={p.name: predicted(c, work, args.head_dim, p) for p in pricings}))
    return rows


def planned_tiles(c: Candidate, tokens: int, cu) -> int | None:
    """The kernel calls the planner counts for the candidate's forward + backward on this pack (``masks.pack_tiles``:
    every ring member's tiles, run by each of its Ulysses ranks; Ulysses alone in spans of S/U); None unmasked."""
    from sp_plan.planner.masks import pack_tiles

    if not c.masked:
        return None
    span = -(-tokens // c.ulysses) if c.ring == 1 else None
    return 2 * c.ulysses * pack_tiles(c.token_layout, c.ring, cu, True, None, span)[0]


def print_tiles(rows: list[dict]) -> None:
    """Whether the planner's tile counts are the counted ones: one line, naming the candidates where not."""
    off = [f"{r['candidate']} {r['planned_tiles']} vs {r['tiles']}" for r in rows
           if r["planned_tiles"] is not None and r["planned_tiles"] != r["tiles"]]
    n = sum(r["planned_tiles"] is not None for r in rows)
    print(f"planner's tiles: {'the counted ones for all ' + str(n) if not off else 'differ: ' + '; '.join(off)}")


def time_rows(rows: list[dict], cands: list[Candidate], timed: set[str], work, cu, full, args) -> None:
    """Time the candidates labelled in ``timed`` and add their readings to their rows; the timed world's counts
    must be the counted world's (RuntimeError if not: the zero kernels changed what runs)."""
    from harness.worlds import run_world

    pick = [i for i, c in enumerate(cands) if c.label in timed]
    if not pick:
        return
    per_rank = run_world(measure_rank, args.world, [cands[i] for i in pick], work, cu, full, args.repeats,
                         args.warmup, args.backend, timeout=args.timeout, rank_cpu=args.rank_cpu)
    for j, i in enumerate(pick):
        row, times = rows[i], [r[0] for r in per_rank[0][j]]
        blocks = sum(per_rank[p][j][0][1] for p in range(args.world))
        received = sum(per_rank[p][j][0][2] for p in range(args.world))
        if (blocks, received) != (row["blocks"], row["bytes"]):
            raise RuntimeError(f"{row['batch']} {row['candidate']}: timed run counted {blocks} blocks, {received} "
                               f"bytes; the zero-kernel run {row['blocks']}, {row['bytes']}")
        row.update(median_s=statistics.median(times), min_s=min(times), max_s=max(times), readings_s=times,
                   **cpu_figures([[per_rank[p][j][r][3] for p in range(args.world)] for r in range(len(times))]))


def cpu_figures(cpu: list[list[float]]) -> dict:
    """From each repeat's per-rank CPU seconds: the medians over the repeats of their sum (cpu_s), their largest
    (busiest_cpu_s) and their largest over their mean (cpu_max_mean), and the per-rank readings (rank_cpu_s)."""
    sums = [sum(ranks) for ranks in cpu]
    return dict(cpu_s=statistics.median(sums), busiest_cpu_s=statistics.median(max(ranks) for ranks in cpu),
                cpu_max_mean=statistics.median(max(ranks) * len(ranks) / s if s > 0 else 1.0
                                               for ranks, s in zip(cpu, sums)),
                rank_cpu_s=cpu)


def run_batch(name: str, tokens: int, cands: list[Candidate], which: str, args, pricings) -> list[dict]:
    """Count every candidate on one packed batch, price it, and time the ones ``which`` names."""
    work = workload(name, tokens, args.seed)
    cu, full = pack(work), full_inputs(tokens, args.head_dim, args.seed)
    t = time.perf_counter()
    rows = counted_rows(name, tokens, cands, work, cu, full, args, pricings)
    counted_s = time.perf_counter() - t
    timed = chosen(which, rows, pricings)
    time_rows(rows, cands, timed, work, cu, full, args)
    print(f"\n{name}:{tokens}: {len(cu) - 1} documents; counted in {counted_s:.0f} s, {len(timed)} of {len(rows)} "
          f"candidates timed in {time.perf_counter() - t - counted_s:.0f} s", flush=True)
    return rows


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "median_s" in r]


def ranking(rows: list[dict], pricing: str, measure: str = "median_s") -> tuple[float, float | None, str]:
    """(Spearman of ``pricing``'s predictions against the timed rows' ``measure`` (the wall-time medians, or
    ``busiest_cpu_s``), the top-1 regret of its pick over every row in it (None: its pick was not timed), the
    pick)."""
    timed = _timed(rows)
    pick = min(rows, key=lambda r: r["predicted"][pricing])
    rho = spearman([r["predicted"][pricing] for r in timed], [r[measure] for r in timed]) if len(
        timed) > 2 else float("nan")
    best = min((r[measure] for r in timed), default=None)
    regret = pick[measure] / best - 1 if measure in pick else None
    return rho, regret, pick["candidate"]


def _row_line(r: dict, pricings: list[str]) -> str:
    ratio = r["bytes"] / r["bound"] if r["bound"] else float("nan")
    timed = (f"{r['median_s']:>10.3f}{r['min_s']:>8.3f}-{r['max_s']:<7.3f}{r['cpu_s']:>8.2f}"
             f"{r['busiest_cpu_s']:>15.3f}" if "median_s" in r else f"{'-':>10}{'-':>8} {'':<7}{'-':>8}{'-':>15}")
    measured = f"{r['cpu_max_mean']:>13.3f}" if "median_s" in r else f"{'-':>13}"
    return (f"{r['candidate']:<26}{timed}{r['imbalance']:>10.3f}{measured}{r['blocks']:>8}"
            f"{r['blocks_imbalance']:>13.3f}"
            f"{r['tiles']:>7}"
            f"{r['bytes'] / 1e6:>9.1f}{ratio:>8.2f}" + "".join(f"{r['predicted'][p]:>13.4f}" for p in pricings))


def print_batch(rows: list[dict], pricings: list[Pricing]) -> None:
    """One batch's table (timed rows fastest first, then the others by the first pricing) and each pricing's
    order of every candidate, Spearman and regret."""
    names = [p.name for p in pricings]
    print(f"{'candidate':<26}{'median s':>10}{'spread s':>16}{'cpu s':>8}{'busiest cpu s':>15}{'imbalance':>10}"
          f"{'cpu max/mean':>13}{'blocks':>8}{'blk max/mean':>13}"
          f"{'tiles':>7}"
          f"{'MB recv':>9}{'x bound':>8}" + "".join(f"{'pred ' + ('preset' if i == 0 else 'tuned'):>13}"
                                                    for i in range(len(names))))
    order = sorted(_timed(rows), key=lambda r: r["median_s"]) + sorted(
        (r for r in rows if "median_s" not in r), key=lambda r: r["predicted"][names[0]])
    for r in order:
        print(_row_line(r, names))
    for p in pricings:
        rho, regret, pick = ranking(rows, p.name)
        ranked = " < ".join(r["candidate"] for r in sorted(rows, key=lambda r: r["predicted"][p.name]))
        said = "its pick was not timed" if regret is None else f"top-1 regret {regret:.1%}"
        print(f"planner on {p.name}: picks {pick}; Spearman {rho:.2f} over the {len(_timed(rows))} timed, {said}")
        print(f"  predicted order: {ranked}")


def targets(rows: list[dict], pricings: list[Pricing]) -> None:
    """The batch's figures against the targets: best imbalance, the planner's regret, the speed-up over contiguous
    in wall time and in the busiest rank's CPU seconds."""
    least = min(rows, key=lambda r: r["imbalance"])
    print(f"targets: least imbalance {least['imbalance']:.3f} ({least['candidate']}; <= 1.05)")
    timed = _timed(rows)
    if not timed:
        return
    best = min(timed, key=lambda r: r["median_s"])
    ring = next((r for r in timed if r["candidate"] == BASELINE), None)
    speedup = f"{ring['median_s'] / best['median_s']:.2f}x" if ring else "n/a (not timed)"
    regrets = "; ".join(f"{p.name}'s pick " + ("not timed" if g is None else f"{g:+.1%} of the best") for p in pricings
                        for g in [ranking(rows, p.name)[1]])
    print(f"         measured best {best['candidate']} (imbalance {best['imbalance']:.3f}) of the "
          f"{len(timed)} timed; {regrets} (<= 5 %); best {speedup} contiguous ring (>= 1.3x)")
    print(f"         {busiest_line(timed, ring)}")
    print("         on the busiest rank's cpu s: " + "; ".join(
        f"{p.name}'s pick " + ("not timed" if g is None else f"{g:+.1%} of the least") + f" (Spearman {rho:.2f})"
        for p in pricings for rho, g, _ in [ranking(rows, p.name, "busiest_cpu_s")]))


def busiest_line(timed: list[dict], ring: dict | None) -> str:
    """The timed candidate with the least busiest-rank CPU seconds against the contiguous ring's: a call on dedicated
    cores cannot finish before its busiest rank's CPU seconds."""
    best = min(timed, key=lambda r: r["busiest_cpu_s"])
    said = (f"busiest rank's cpu s: {best['candidate']} (imbalance {best['imbalance']:.3f}, cpu max/mean "
            f"{best['cpu_max_mean']:.3f}) {best['busiest_cpu_s']:.2f} s")
    if ring is None:
        return f"{said}, contiguous ring not timed"
    return (f"{said}, contiguous ring {ring['busiest_cpu_s']:.2f} s: "
            f"{ring['busiest_cpu_s'] / best['busiest_cpu_s']:.2f}x (>= 1.3x on dedicated cores)")


def print_single(rows: list[dict]) -> None:
    """One document against none: blocks and bytes equal, times within the readings' spread."""
    print(f"one document against none ({rows[0]['batch']}):")
    for none, one in zip(rows[::2], rows[1::2]):
        same = none["blocks"] == one["blocks"] and none["bytes"] == one["bytes"]
        line = (f"  {one['candidate']:<24} blocks {none['blocks']} vs {one['blocks']}, bytes {none['bytes']} vs "
                f"{one['bytes']} ({'same' if same else 'DIFFER'})")
        if "median_s" in none and "median_s" in one:
            overlap = one["min_s"] <= none["max_s"] and none["min_s"] <= one["max_s"]
            line += (f"; {none['median_s']:.3f} s vs {one['median_s']:.3f} s "
                     f"({'within' if overlap else 'outside'} the spread)")
        print(line)


def batch_specs(text: str, default: str) -> list[tuple[str, int, str]]:
    """``NAME:TOKENS[:WHICH],...`` as (name, tokens, which); SystemExit(2) naming the bad entry."""
    out = []
    for spec in text.split(","):
        parts = spec.strip().split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit() or int(parts[1]) < 1 or (
                len(parts) == 3 and parts[2] not in WHICH):
            _fail("--batches", f"bad entry {spec!r}",
                  f"write NAME:TOKENS or NAME:TOKENS:WHICH with WHICH one of {', '.join(WHICH)}")
        out.append((parts[0], int(parts[1]), parts[2] if len(parts) == 3 else default))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--batches", default=BATCHES,
                    help="NAME:TOKENS[:WHICH],... (profiles/documents.yaml names; WHICH overrides --candidates)")
    ap.add_argument("--candidates", default="all",
                    help="which candidates to time: all, key, none, or labels (e.g. 'ring contiguous,ring zigzag'); "
                         "every candidate is counted and priced")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=0,
                    help="real passes over the timed candidates before the readings (a pass on zero kernels and one "
                         "real call always come first)")
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--single", type=int, default=4096, help="tokens of the one-document batch (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cpu_flash", help="block kernel (SP_PLAN_ATTN_BACKEND) of every candidate")
    ap.add_argument("--profile", help="a tuned profile (id or file, .gz read) to rank with beside the preset")
    ap.add_argument("--profile-cluster", help="the cluster file --profile was tuned on (default: the cluster.yaml "
                                              "beside the profile file)")
    ap.add_argument("--rank-cpu", type=float, metavar="SHARE",
                    help="cap each timed rank at this share of one core (a CPU cgroup; root): ranks then run side by "
                         "side like dedicated devices, e.g. 0.24 for 8 ranks on 2 cores")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per world")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: a smoke test")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.repeats < 1 or args.head_dim < 1 or args.single < 0 or args.warmup < 0:
        _fail("--repeats/--head-dim/--single/--warmup", "must be at least 1 (--single and --warmup at least 0)",
              "pass positive sizes")
    if args.rank_cpu is not None:
        check_rank_cpu(args.rank_cpu)
    return args


def check_rank_cpu(share: float) -> None:
    """Exit 2 with one line where ``--rank-cpu`` is not a share of one core or this host can make no CPU cgroup."""
    from harness.cpu_share import caps_or_exit, remove_caps

    remove_caps(caps_or_exit(1, share))


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    specs = batch_specs(args.batches, args.candidates)
    pricings = [Pricing("cpu-local (uncalibrated)", preset_cluster(args.world))]
    if args.profile:
        pricings.append(tuned_pricing(args.profile, args.profile_cluster, args.world))
    print(f"{args.world} gloo ranks, causal, {HEADS} query / {KV_HEADS} KV heads x {args.head_dim}, fp32, "
          f"{args.backend} blocks, {args.repeats} repeat{'s' * (args.repeats > 1)} after {args.warmup} real warm-up "
          f"pass{'es' * (args.warmup != 1)}, attention forward + backward, "
          f"{f'each timed rank capped at {args.rank_cpu:g} of a core' if args.rank_cpu else 'ranks uncapped'}; "
          f"priced on {' and '.join(p.name for p in pricings)}", flush=True)
    start, rows = time.perf_counter(), []
    for name, tokens, which in specs:
        batch = run_batch(name, tokens, candidates(args.world), which, args, pricings)
        print_batch(batch, pricings)
        print_tiles(batch)
        targets(batch, pricings)
        rows += batch
    if args.single:
        which = "none" if args.candidates == "none" else "all"  # the check needs both sides of every pair
        single = run_batch("single", args.single, single_candidates(args.world), which, args, pricings)
        print_single(single)
        rows += single
    print(f"\ntotal {time.perf_counter() - start:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
