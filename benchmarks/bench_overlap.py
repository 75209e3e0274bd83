"""The ring's double-buffered overlap on one device, with a stand-in transfer (a script, not a test).

    python benchmarks/bench_overlap.py [--rounds 8] [--seq 8192] [--heads 32] [--kv-heads 8] [--head-dim 128]
                                       [--copy-scale N] [--repeats 5]

Runs ``overlap.run_rounds`` over ``--rounds`` rounds of one block forward + backward on the block held
(``kernels.block_attention`` on the measured backend) while the next K, V block arrives by
``overlap.LocalTransfer``: a device-to-device copy of the block, ``--copy-scale`` times (to stand in for
a slower link; by default as many times as make the transfer take the round's compute), on its own
CUDA stream (at the default priority, and for comparison at the highest). Prints the round time of compute
alone, transfer alone, both serialized, and both overlapped; overlapped close to max(compute, transfer) is the
overlap working. On CPU the copy runs inline, so overlapped equals serialized there.
"""
from __future__ import annotations

import argparse

import torch

from sp_plan.profiles.tune.timing import time_call
from sp_plan.runtime.choice import BackendChoice
from sp_plan.runtime.kernels import block_attention, block_attention_backward
from sp_plan.runtime.overlap import HIGH_PRIORITY, DoubleBuffer, LocalTransfer, run_rounds


class _Scaled(LocalTransfer):
    """LocalTransfer copying each tensor ``scale`` times (one stand-in for a slower link)."""

    def __init__(self, device, scale: int, serial: bool = False, priority: int = 0):
        super().__init__(device, serial, priority)
        self.scale = scale

    def post(self, send, recv):
        return super().post(send * self.scale, recv * self.scale)


def balanced_scale(device, rounds: int, repeats: int, compute, block: tuple, sched: DoubleBuffer) -> int:
    """Copies per round that make a round's transfer take about its compute (1..2048): the hardest case to hide."""
    t_compute = time_call(lambda: [compute(i, block) for i in range(rounds)], device, repeats)
    t_copy = time_call(lambda: run_rounds(sched, block, lambda i, b: None, _Scaled(device, 1)), device, repeats)
    return int(min(2048, max(1, round(t_compute / max(t_copy, 1e-9)))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seq", type=int, default=8192, help="block length (tokens per rank)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--copy-scale", type=int, default=0,
                   help="copies of K, V per round; 0 (default): as many as make the copy take the round's compute")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    rnd = lambda h: torch.randn(1, args.seq, h, args.head_dim, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    q, k, v, do = rnd(args.heads), rnd(args.kv_heads), rnd(args.kv_heads), rnd(args.heads)
    backend = BackendChoice.from_env().choose(q, k, causal=False)

    def compute(i, blk):
        o, lse = block_attention(q, blk[0], blk[1], backend=backend)
        block_attention_backward(do, q, blk[0], blk[1], o, lse, backend=backend)

    sched = DoubleBuffer(args.rounds)
    idle = lambda i, blk: None  # noqa: E731
    if args.copy_scale <= 0:
        args.copy_scale = balanced_scale(device, args.rounds, args.repeats, compute, (k, v), sched)
    rows = {
        "compute only": lambda: [compute(i, (k, v)) for i in range(args.rounds)],
        "transfer only": lambda: run_rounds(sched, (k, v), idle, _Scaled(device, args.copy_scale)),
        "serialized": lambda: run_rounds(sched, (k, v), compute, _Scaled(device, args.copy_scale, serial=True)),
        "overlapped": lambda: run_rounds(sched, (k, v), compute, _Scaled(device, args.copy_scale)),
        "overlapped, transfer stream at high priority": lambda: run_rounds(
            sched, (k, v), compute, _Scaled(device, args.copy_scale, priority=HIGH_PRIORITY)),
    }
    mb = 2 * k.numel() * k.element_size() * args.copy_scale / 2**20
    print(f"# {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, {str(dtype)[6:]}, block {args.seq} "
          f"tokens, {args.heads}/{args.kv_heads} heads of {args.head_dim}, backend {backend}, "
          f"{mb:.0f} MiB copied per round, {args.rounds} rounds")
    per = {}
    for name, fn in rows.items():
        per[name] = time_call(fn, device, args.repeats) / args.rounds
        print(f"{name:14s} {1e3 * per[name]:9.2f} ms per round")
    bound = max(per["compute only"], per["transfer only"])
    print(f"overlapped / max(compute, transfer) = {per['overlapped'] / bound:.3f} (target <= 1.10); "
          f"at high priority {per['overlapped, transfer stream at high priority'] / bound:.3f}; "
          f"serialized / max = {per['serialized'] / bound:.3f}")


if __name__ == "__main__":
    main()
