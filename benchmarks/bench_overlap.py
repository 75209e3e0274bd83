"""The ring's double-buffered overlap on one device, with a stand-in transfer (a script, not a test).

    python benchmarks/bench_overlap.py [--rounds 8] [--seq 8192] [--heads 32] [--kv-heads 8] [--head-dim 128]
                                       [--copy-scale N] [--repeats 5] [--transfers copy,channels,host]

Runs ``overlap.run_rounds`` over ``--rounds`` rounds of one block forward + backward on the block held
(``kernels.block_attention`` on the measured backend) while the next K, V block arrives by
``overlap.LocalTransfer``: a device-to-device copy of the block, ``--copy-scale`` times (to stand in for
a slower link; by default as many times as make the transfer take the round's compute), on its own
CUDA stream (at the default priority, and for comparison at the highest). Prints the round time of compute
alone, transfer alone, both serialized, and both overlapped; overlapped close to max(compute, transfer) is the
overlap working. On CPU the copy runs inline, so overlapped equals serialized there.

``--transfers`` names the stand-ins, each timed the same way: ``copy`` (``Tensor.copy_``, a kernel as wide as
the GPU), ``channels`` (a copy kernel of ``--channels`` thread blocks, launched first, as NCCL's ring kernels
hold a few SMs, one block per channel) and ``host`` (device to pinned host memory and back, on the copy
engines: no SMs at all, so it isolates the schedule's own overlap from SM sharing).
"""
from __future__ import annotations

import argparse

import torch

from sp_plan.profiles.tune.timing import time_call
from sp_plan.runtime.choice import BackendChoice
from sp_plan.runtime.kernels import block_attention, block_attention_backward
from sp_plan.runtime.overlap import HIGH_PRIORITY, DoubleBuffer, LocalTransfer, run_rounds


class _Scaled(LocalTransfer):
    """LocalTransfer copying each tensor ``scale`` times (one stand-in for a slower link) by ``copy``."""

    def __init__(self, device, scale: int, serial: bool = False, priority: int = 0, copy=None):
        super().__init__(device, serial, priority)
        self.scale, self.copy = scale, copy

    def post(self, send, recv):
        if self.copy is None:
            return super().post(send * self.scale, recv * self.scale)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for s, r in zip(send, recv):
                self.copy(s, r, self.scale)
            done = torch.cuda.Event()
            done.record(self.stream)
        if self.serial:
            torch.cuda.current_stream().wait_event(done)
        return done


class HostBounce:
    """``copy`` through pinned host memory: device to host, host to device, both on the DMA copy engines."""

    def __init__(self):
        self.bounce = {}

    def __call__(self, src, dst, reps: int) -> None:
        key = (src.shape, src.dtype)
        if key not in self.bounce:
            self.bounce[key] = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        for _ in range(reps):
            self.bounce[key].copy_(src, non_blocking=True)
            dst.copy_(self.bounce[key], non_blocking=True)


def channel_copy(channels: int):
    """``copy`` by one Triton kernel of ``channels`` thread blocks striding over the tensor ``reps`` times (one
    launch a tensor, so its blocks keep their SMs for the whole transfer, as NCCL's channels do)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(src, dst, n, reps, BLOCK: tl.constexpr, STEP: tl.constexpr):
        for _ in range(reps):
            for start in range(tl.program_id(0) * BLOCK, n, STEP):
                offs = start + tl.arange(0, BLOCK)
                tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    def copy(src, dst, reps: int) -> None:
        block = 8192
        _copy[(channels,)](src.reshape(-1), dst.reshape(-1), src.numel(), reps, BLOCK=block, STEP=block * channels,
                           num_warps=16)

    return copy


def balanced_scale(device, rounds: int, repeats: int, compute, block: tuple, sched: DoubleBuffer, copy=None) -> int:
    """Copies per round that make a round's transfer take about its compute (1..2048): the hardest case to hide."""
    t_compute = time_call(lambda: [compute(i, block) for i in range(rounds)], device, repeats)
    t_copy = time_call(lambda: run_rounds(sched, block, lambda i, b: None, _Scaled(device, 1, copy=copy)), device,
                       repeats)
    return int(min(2048, max(1, round(t_compute / max(t_copy, 1e-9)))))


def transfers(names: str, device, channels: int) -> dict:
    """The stand-ins ``names`` asks for that run here: name -> copy function (None: ``Tensor.copy_``)."""
    made = {}
    for name in names.split(","):
        if name == "copy":
            made[name] = None
        elif device.type != "cuda":
            print(f"{name}: not timed (needs CUDA)")
        elif name == "host":
            made[name] = HostBounce()
        elif name == "channels":
            made[f"channels ({channels} blocks)"] = channel_copy(channels)
        else:
            raise SystemExit(f"--transfers: unknown stand-in {name!r}; use copy, channels or host")
    return made


def time_transfer(name: str, copy, args, device, compute, block: tuple, sched: DoubleBuffer) -> None:
    """Round time of compute alone, ``copy`` alone, both serialized and both overlapped; the verdict line."""
    scale = args.copy_scale or balanced_scale(device, args.rounds, args.repeats, compute, block, sched, copy)
    idle = lambda i, blk: None  # noqa: E731
    rows = {
        "compute only": lambda: [compute(i, block) for i in range(args.rounds)],
        "transfer only": lambda: run_rounds(sched, block, idle, _Scaled(device, scale, copy=copy)),
        "serialized": lambda: run_rounds(sched, block, compute, _Scaled(device, scale, serial=True, copy=copy)),
        "overlapped": lambda: run_rounds(sched, block, compute, _Scaled(device, scale, copy=copy)),
        "overlapped, transfer stream at high priority": lambda: run_rounds(
            sched, block, compute, _Scaled(device, scale, priority=HIGH_PRIORITY, copy=copy)),
    }
    mb = sum(t.numel() * t.element_size() for t in block) * scale / 2**20
    print(f"## transfer: {name}, {mb:.0f} MiB per round")
    per = {}
    for row, fn in rows.items():
        per[row] = time_call(fn, device, args.repeats) / args.rounds
        print(f"{row:14s} {1e3 * per[row]:9.2f} ms per round")
    bound = max(per["compute only"], per["transfer only"])
    print(f"overlapped / max(compute, transfer) = {per['overlapped'] / bound:.3f} (target <= 1.10); "
          f"at high priority {per['overlapped, transfer stream at high priority'] / bound:.3f}; "
          f"serialized / max = {per['serialized'] / bound:.3f}")


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
    p.add_argument("--transfers", default="copy,channels,host", help="stand-ins to time: copy, channels, host")
    p.add_argument("--channels", type=int, default=16, help="thread blocks of the channels stand-in")
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

    print(f"# {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, {str(dtype)[6:]}, block {args.seq} "
          f"tokens, {args.heads}/{args.kv_heads} heads of {args.head_dim}, backend {backend}, {args.rounds} rounds")
    for name, copy in transfers(args.transfers, device, args.channels).items():
        try:
            time_transfer(name, copy, args, device, compute, (k, v), DoubleBuffer(args.rounds))
        except Exception as e:  # noqa: BLE001 - one stand-in failing leaves the others' figures
            print(f"## transfer: {name} failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
