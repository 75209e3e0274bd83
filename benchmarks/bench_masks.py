"""Packed documents on gloo ranks: each algorithm x balancing policy's attention time, work balance and bytes moved,
and the planner's ranking against the measured one (a script, not a test).

    python benchmarks/bench_masks.py [--world 8] [--batches magi-short:16384,magi-short:32768,megatron-dcp:16384]
                                     [--repeats 3] [--head-dim 16] [--profile ID|FILE] [--json out.json] [--quick]

Each batch is one sequence packed with documents drawn from a named distribution (profiles/documents.yaml, seed
``--seed``), causal, llama3-8b's heads (32 query, 8 KV) with the head dim cut to ``--head-dim`` for the CPU, fp32.
Every candidate (ring and all-gather under each balancing policy, Ulysses, USP) runs one attention forward +
backward through ``runtime.init(plan).attention`` between barriers; the candidates take turns within each repeat
(the order rotates), so a slow spell of the shared machine falls on all of them. Per candidate it prints:

- the median time over the repeats and their spread (min-max);
- the work imbalance, max / mean over ranks of the score entries of the blocks each rank runs (``planner.masks``);
  a ring waits on its busiest rank every round, so its figure is the sum over rounds of the busiest rank's
  entries over the mean rank's; and the blocks run (``runtime.variants.ring.BLOCKS``, counted in each rank) max / mean;
- the bytes each rank received (counted in the collectives and point-to-point batches it posted; gloo has no
  reduce-scatter, so the all-gather's backward all-reduces: counted as a ring all-reduce, 2 (P-1)/P of the buffer)
  against the needed-KV lower bound: the K, V of keys a rank's queries see and it does not hold, there and (dK, dV)
  back;
- the planner's predicted attention seconds (compute and exposed communication of one layer, ``estimate`` on the
  cpu-local preset stretched to ``--world`` rank slots, uncalibrated; and on ``--profile`` where given), the
  Spearman rank correlation of predicted and measured, and the top-1 regret (how much slower the planner's pick
  measured than the measured best).

A last batch checks that one document costs what no documents cost: the same blocks and bytes, counted, and the
time within the readings' spread, for ring and all-gather with ``cu_seqlens = [0, S]`` against ``None``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADS, KV_HEADS = 32, 8
POLICIES = ("contiguous", "zigzag", "striped", "balanced")
BATCHES = "magi-short:16384,magi-short:32768,megatron-dcp:16384"
QUICK = dict(batches="megatron-dcp:2048", repeats=1, head_dim=8, single=512)


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


def _inputs(ctx, S: int, head_dim: int, cu, seed: int):
    """This rank's q, k, v (requiring grad) and dout of the global seeded tensors, sharded by the plan."""
    import torch

    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(1, S, h, head_dim, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS, HEADS)]
    local = [ctx.shard(x, dim=1, cu_seqlens=cu) for x in full]
    return [x.requires_grad_() for x in local[:3]] + [local[3]]


def _once(ctx, tensors, cu) -> tuple[float, int, int]:
    """One forward + backward between barriers: (seconds, blocks run, bytes received) on this rank."""
    import torch.distributed as dist

    from sp_plan.runtime.variants.ring import BLOCKS

    q, k, v, dout = tensors
    blocks, received = sum(BLOCKS.values()), RECEIVED[0]
    dist.barrier()
    t = time.perf_counter()
    ctx.attention(q, k, v, causal=True, cu_seqlens=cu).backward(dout)
    dist.barrier()
    return time.perf_counter() - t, sum(BLOCKS.values()) - blocks, RECEIVED[0] - received


def measure_rank(rank: int, world: int, cands: list[Candidate], work, cu, head_dim: int, repeats: int,
                 seed: int, backend: str) -> list[list[tuple[float, int, int]]]:
    """Every candidate's readings on this rank, a warm-up first, the candidates' order rotating per repeat."""
    import torch

    from sp_plan.runtime import init
    from sp_plan.runtime.choice import ENV

    torch.set_num_threads(1)
    os.environ[ENV] = backend  # one kernel for every candidate: no per-context measuring, no choice noise
    count_bytes()
    ctxs = [init(plan_of(c, work)) for c in cands]
    data = [_inputs(ctx, work.seq_len, head_dim, cu, seed) for ctx in ctxs]
    cus = [cu if c.masked else None for c in cands]
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

def cluster(world: int):
    """The cpu-local preset with ``world`` rank slots on its one host (its uncalibrated figures)."""
    import sp_plan.profiles as profiles
    from sp_plan.planner.yamlio import read_data

    spec = read_data(Path(profiles.__file__).parent / "clusters" / "cpu-local.yaml", "cluster")
    return profiles.spec_cluster({**spec, "devices_per_node": world}, 1)


def predicted(c: Candidate, work, head_dim: int, world: int, profile=False) -> float:
    """The planner's attention seconds of one layer: its attention compute and exposed sequence communication."""
    from sp_plan.pipeline import estimate
    from sp_plan.profiles import load_model

    model = load_model("llama3-8b").model_copy(update={"head_dim": head_dim, "layers": 1})
    pr = estimate(plan_of(c, work), cluster(world), model, work, profile=profile)
    skip = ("linear", "lm head", "grad")
    return sum(p.exposed_seconds for p in pr.breakdown if not p.name.startswith(skip))


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


# ---- one batch ------------------------------------------------------------------------------------------------------

def run_batch(name: str, tokens: int, cands: list[Candidate], args) -> list[dict]:
    """Measure the candidates on one packed batch and add what the layout and the planner say of them."""
    from harness.worlds import run_world

    work = workload(name, tokens, args.seed)
    cu = pack(work)
    per_rank = run_world(measure_rank, args.world, cands, work, cu, args.head_dim, args.repeats, args.seed,
                         args.backend, timeout=args.timeout)
    rows = []
    for i, c in enumerate(cands):
        times = [r[0] for r in per_rank[0][i]]
        blocks = [per_rank[p][i][0][1] for p in range(args.world)]
        received = sum(per_rank[p][i][0][2] for p in range(args.world))
        rows.append(dict(batch=f"{name}:{tokens}", candidate=c.label, documents=len(cu) - 1, median_s=statistics.median(
            times), min_s=min(times), max_s=max(times), blocks=sum(blocks), blocks_imbalance=max(blocks) * len(
            blocks) / max(sum(blocks), 1), imbalance=imbalance(c, tokens, cu), bytes=received,
            bound=lower_bound_bytes(c, tokens, cu, args.head_dim), masked=c.masked))
        rows[-1]["predicted_s"] = predicted(c, work, args.head_dim, args.world)
        if args.profile:
            rows[-1]["tuned_s"] = predicted(c, work, args.head_dim, args.world, args.profile)
    return rows


def ranking(rows: list[dict], key: str) -> tuple[float, float, str]:
    """(Spearman of ``key`` against the measured medians, top-1 regret, the pick) over one batch's rows."""
    measured = [r["median_s"] for r in rows]
    pick = min(rows, key=lambda r: r[key])
    return spearman([r[key] for r in rows], measured), pick["median_s"] / min(measured) - 1, pick["candidate"]


def print_batch(rows: list[dict]) -> None:
    """One batch's table and its ranking lines."""
    print(f"\n{rows[0]['batch']}: {rows[0]['documents']} documents", flush=True)
    print(f"{'candidate':<26}{'median s':>10}{'spread s':>16}{'imbalance':>10}{'blocks':>8}{'blk max/mean':>13}"
          f"{'MB recv':>9}{'x bound':>8}{'predicted s':>12}")
    for r in sorted(rows, key=lambda r: r["median_s"]):
        ratio = r["bytes"] / r["bound"] if r["bound"] else float("nan")
        print(f"{r['candidate']:<26}{r['median_s']:>10.3f}{r['min_s']:>8.3f}-{r['max_s']:<7.3f}{r['imbalance']:>10.3f}"
              f"{r['blocks']:>8}{r['blocks_imbalance']:>13.3f}{r['bytes'] / 1e6:>9.1f}{ratio:>8.2f}"
              f"{r['predicted_s']:>12.4f}")
    for key, what in (("predicted_s", "cpu-local (uncalibrated)"), ("tuned_s", "tuned profile")):
        if key in rows[0]:
            rho, regret, pick = ranking(rows, key)
            print(f"planner on {what}: Spearman {rho:.2f}, picks {pick}, top-1 regret {regret:.1%}")


def targets(rows: list[dict]) -> None:
    """The batch's figures against the targets: best imbalance, the planner's regret, the speed-up over contiguous."""
    best = min(rows, key=lambda r: r["median_s"])
    ring = next(r for r in rows if r["candidate"] == "ring contiguous")
    _, regret, _ = ranking(rows, "predicted_s")
    print(f"targets: measured best {best['candidate']} imbalance {best['imbalance']:.3f} (<= 1.05), least imbalance "
          f"{min(r['imbalance'] for r in rows):.3f}; planner's pick {regret:+.1%} of the best (<= 5 %); best "
          f"{ring['median_s'] / best['median_s']:.2f}x contiguous ring (>= 1.3x)")


def print_single(rows: list[dict]) -> None:
    """One document against none: blocks and bytes equal, times within the readings' spread."""
    print(f"\none document against none ({rows[0]['batch']}):")
    for none, one in zip(rows[::2], rows[1::2]):
        same = none["blocks"] == one["blocks"] and none["bytes"] == one["bytes"]
        overlap = one["min_s"] <= none["max_s"] and none["min_s"] <= one["max_s"]
        print(f"  {one['candidate']:<24} blocks {none['blocks']} vs {one['blocks']}, bytes {none['bytes']} vs "
              f"{one['bytes']} ({'same' if same else 'DIFFER'}); {none['median_s']:.3f} s vs {one['median_s']:.3f} s "
              f"({'within' if overlap else 'outside'} the spread)")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--batches", default=BATCHES, help="NAME:TOKENS,... (profiles/documents.yaml names)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--single", type=int, default=16384, help="tokens of the one-document batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cpu_flash", help="block kernel (SP_PLAN_ATTN_BACKEND) of every candidate")
    ap.add_argument("--profile", help="a tuned profile (id or file) to rank with beside the uncalibrated preset")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per batch's world")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: a smoke test")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    print(f"{args.world} gloo ranks, causal, {HEADS} query / {KV_HEADS} KV heads x {args.head_dim}, fp32, "
          f"{args.backend} blocks, {args.repeats} repeats, attention forward + backward", flush=True)
    rows = []
    for spec in args.batches.split(","):
        name, tokens = spec.rsplit(":", 1)
        batch = run_batch(name, int(tokens), candidates(args.world), args)
        print_batch(batch)
        targets(batch)
        rows += batch
    single = run_batch("single", args.single, single_candidates(args.world), args)
    print_single(single)
    rows += single
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
