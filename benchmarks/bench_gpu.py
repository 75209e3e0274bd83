"""Block-kernel backends against PyTorch's best SDPA, and world-1 ``ctx.attention`` (a script, not a test).

    python benchmarks/bench_gpu.py [--seqs 1k,4k,16k,64k] [--heads 32] [--kv-heads 8] [--head-dim 128]
                                   [--dtype bfloat16] [--peak-tflops 989] [--repeats 5]

On CUDA (CPU works too, for small --seqs) it prints, per backend available for the dtype and head dim
(``runtime.backends``) and per S, causal and not, MHA and GQA: the block forward and forward +
backward TFLOP/s (``kernels.block_attention`` / ``block_attention_backward`` with that backend) beside
the best of ``F.scaled_dot_product_attention``'s backends (cuDNN, flash, efficient, math; forward +
backward through autograd with ``enable_gqa``); then world-1 ``init(plan)`` + ``ctx.attention``
forward + backward beside plain SDPA; then the fastest backend's efficiency curves in the format of a
profile's ``params`` (``attention_fwd`` / ``attention_bwd``: [block length, achieved / peak]).
FLOPs: 4 b s^2 h d forward (half when causal), 2.5x that for the backward (``KernelSample``).
The ``math`` backend and SDPA's math path hold the whole score matrix in float32: they are skipped above
``--max-math-seq`` tokens. ``--json`` writes every figure to a file.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.planner import Plan
from sp_plan.planner.profile import KernelSample
from sp_plan.planner.calibration import kernel_curves
from sp_plan.profiles.tune.kernels import attention_flops
from sp_plan.profiles.tune.timing import time_call
from sp_plan.runtime import backends as B
from sp_plan.runtime.choice import check_exact
from sp_plan.runtime.kernels import _sdpa_kernel, block_attention, block_attention_backward, local_attention

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _sizes(text: str) -> list[int]:
    return [int(float(x[:-1]) * 1024) if x[-1] in "kK" else int(x) for x in text.split(",")]


def _inputs(n, heads, kv, d, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, h, d, generator=g).to(device=device, dtype=dtype) for h in (heads, kv, kv, heads)]


def block_times(name, n, heads, kv, d, causal, device, dtype, repeats):
    """(forward s, forward + backward s) of one block on backend ``name``."""
    q, k, v, do = _inputs(n, heads, kv, d, device, dtype)
    off = 0 if causal else None
    o, lse = block_attention(q, k, v, causal_offset=off, backend=name)
    t_f = time_call(lambda: block_attention(q, k, v, causal_offset=off, backend=name), device, repeats)

    def both():
        o, lse = block_attention(q, k, v, causal_offset=off, backend=name)
        block_attention_backward(do, q, k, v, o, lse, causal_offset=off, backend=name)
    return t_f, time_call(both, device, repeats)


SDPA_KINDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
              "math": "MATH"}


def sdpa_best(n, heads, kv, d, causal, device, dtype, repeats, math_ok=True, only=None) -> tuple[str, float, float]:
    """(backend, forward s, forward + backward s) of the fastest SDPA backend (forward + backward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, do = (x.transpose(1, 2).contiguous() for x in _inputs(n, heads, kv, d, device, dtype))
    leaves = [x.requires_grad_() for x in (q, k, v)]
    kinds = ([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
              SDPBackend.MATH] if device.type == "cuda" else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
    kinds = [kd for kd in kinds if (math_ok or kd != SDPBackend.MATH)
             and (only is None or kd in [getattr(SDPBackend, SDPA_KINDS[o]) for o in only])]
    best = None
    for kind in kinds:
        def fwd():
            with sdpa_kernel(kind):
                return F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=kv != heads)

        def both():
            fwd().backward(do)
        try:
            with torch.no_grad():
                t_f = time_call(fwd, device, repeats)
            t_b = time_call(both, device, repeats)
        except RuntimeError:  # this SDPA backend does not take these inputs
            continue
        if best is None or t_b < best[2]:
            best = (kind.name.lower(), t_f, t_b)
    return best


def _world1(args, device, dtype):
    """World 1 (a gloo group in this process): init(plan) + ctx.attention fwd+bwd vs plain SDPA fwd+bwd, per S, and
    the readings that tell where a difference lies (``_world1_row``)."""
    from sp_plan.runtime import init

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29535")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"file://{tempfile.mkdtemp()}/init", rank=0, world_size=1)
    ctx = init(Plan(algorithm="ring", degrees={"ring": 1}, order=["ring"]), device_type=device.type)
    out = [_world1_row(args, device, dtype, ctx, n) for n in args.seqs]
    dist.destroy_process_group()
    return out


def _host_s(fn, device, repeats: int) -> float:
    """Median host seconds of one ``fn()`` from an idle device: the time to enqueue its kernels."""
    import statistics
    import time

    fn()
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize() if device.type == "cuda" else None
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _world1_row(args, device, dtype, ctx, n: int) -> dict:
    """One S: ctx.attention and plain SDPA (inputs already (batch, heads, seq, dim)), each as one call from an idle
    device (``ours``, ``sdpa``) and as the mean of ``RUN`` calls back to back (``*_run``: a layer stack's steady
    state, host work hidden behind the kernels before it); SDPA from (batch, seq, heads, dim) with the transposes in
    the call (``sdpa_bshd``) and held to the backend ctx chose (``sdpa_held``); host seconds to enqueue each."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = args.kv_heads != args.heads
    q, k, v, do = (x.requires_grad_(i < 3) for i, x in enumerate(_inputs(n, args.heads, args.kv_heads,
                                                                            args.head_dim, device, dtype)))
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2)

    def ours():
        ctx.attention(q, k, v, causal=True).backward(do)

    def sdpa():
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa).backward(dot)

    def bshd():
        F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       enable_gqa=gqa).transpose(1, 2).backward(do)

    row = dict(S=n, ours=time_call(ours, device, args.repeats), backend=ctx.attention_backend,
               sdpa=time_call(sdpa, device, args.repeats), sdpa_bshd=time_call(bshd, device, args.repeats))
    row.update(ours_run=time_call(lambda: [ours() for _ in range(RUN)], device, args.repeats) / RUN,
               sdpa_run=time_call(lambda: [sdpa() for _ in range(RUN)], device, args.repeats) / RUN,
               host_ours=_host_s(ours, device, args.repeats), host_sdpa=_host_s(sdpa, device, args.repeats))
    name = _sdpa_kernel(row["backend"], gqa)
    if name:
        with sdpa_kernel(getattr(SDPBackend, name)):
            row["sdpa_held"] = time_call(sdpa, device, args.repeats)
    if not B.BACKENDS["flash"].unavailable(device.type, dtype, args.head_dim):
        def flash():  # the degree-1 path on CUDA's flash: its op on (batch, seq, heads, dim), one autograd node
            local_attention(q, k, v, causal=True, backend="flash").backward(do)

        row.update(flash=time_call(flash, device, args.repeats), host_flash=_host_s(flash, device, args.repeats),
                   flash_run=time_call(lambda: [flash() for _ in range(RUN)], device, args.repeats) / RUN)
    return row


#: calls back to back in a steady-state reading
RUN = 10


def _print_world1(w1: list[dict]) -> None:
    print("\n## world 1, causal, GQA: init(plan) + ctx.attention vs plain SDPA, forward + backward (ms); "
          "target ratio <= 1.10")
    print("     S backend    ctx.attn      sdpa  ratio | back to back: ctx    sdpa  ratio | sdpa: bshd   held | "
          "host: ctx  sdpa")
    for r in w1:
        ms = {k: 1e3 * x for k, x in r.items() if isinstance(x, float)}
        print(f"{r['S']:6d} {r['backend'] or '-':9s} {ms['ours']:9.3f} {ms['sdpa']:9.3f} {r['ours'] / r['sdpa']:5.2f}x |"
              f"  {ms['ours_run']:16.3f} {ms['sdpa_run']:7.3f} {r['ours_run'] / r['sdpa_run']:5.2f}x |"
              f" {ms['sdpa_bshd']:10.3f} {ms.get('sdpa_held', float('nan')):6.3f} |"
              f" {ms['host_ours']:9.3f} {ms['host_sdpa']:5.3f}")
    flash = [r for r in w1 if "flash" in r]
    if flash:
        print("\nthe degree-1 path held to flash (its op on (batch, seq, heads, dim), one autograd node) against plain "
              "SDPA:\n     S     flash  ratio | back to back: flash  ratio | host: flash  sdpa")
    for r in flash:
        ms = {k: 1e3 * x for k, x in r.items() if isinstance(x, float)}
        print(f"{r['S']:6d} {ms['flash']:9.3f} {r['flash'] / r['sdpa']:5.2f}x | {ms['flash_run']:19.3f} "
              f"{r['flash_run'] / r['sdpa_run']:5.2f}x | {ms['host_flash']:11.3f} {ms['host_sdpa']:5.3f}")


def parser() -> argparse.ArgumentParser:
    """The benchmark's options: sizes, head shape, dtype, and which backends to time."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="1k,4k,16k,64k")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--peak-tflops", type=float, default=None, help="for the curves (default: 989 on CUDA, 1 on CPU)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-math-seq", type=int, default=8192, help="skip the float32 score-matrix paths above this")
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--backends", default=None, help="time only these of the runtime's backends (comma-separated)")
    p.add_argument("--sdpa-kinds", default=None,
                   help="SDPA backends to take the fastest of (comma-separated: cudnn,flash,efficient,math; "
                        "default all)")
    p.add_argument("--world1-only", action="store_true", help="time only world-1 ctx.attention against SDPA")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    args.seqs = _sizes(args.seqs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    peak = 1e12 * (args.peak_tflops or (989.0 if device.type == "cuda" else 1.0))
    d = args.head_dim
    names = [n for n in B.available(device.type, dtype, d) if not args.backends or n in args.backends.split(",")]
    print(f"# {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{str(dtype).replace('torch.', '')}, batch 1, {args.heads} heads (GQA: {args.kv_heads} KV heads) of {d}")
    names = exact_backends(args, names, device, dtype)
    print("\n## block TFLOP/s: forward | forward + backward (SDPA: its fastest backend); best / sdpa: the fastest "
          "backend's forward + backward against SDPA's (target >= 0.90 at S >= 4k)")
    print(f"{'S':>6s} {'mask':6s} {'heads':5s} " + " ".join(f"{n:>17s}" for n in names) + f" {'sdpa best':>26s}"
          + f" {'best / sdpa':>11s}")
    samples: dict[str, list[KernelSample]] = {n: [] for n in names}
    rows = []
    for n_tok in [] if args.world1_only else args.seqs:
        for causal in (False, True):
            for kv in sorted({args.heads, args.kv_heads}, reverse=True):
                rows.append(block_row(args, names, samples, (n_tok, causal, kv), device, dtype))
    w1 = _world1(args, device, dtype)
    _print_world1(w1)
    print_curves(samples, peak)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "cuda": torch.version.cuda,
                       "cudnn": torch.backends.cudnn.version(), "dtype": str(dtype).removeprefix("torch."),
                       "head_dim": d, "rows": rows,
                       "world1": w1}, f, indent=1)


def exact_backends(args, names: list[str], device, dtype) -> list[str]:
    """The backends to time: each available one checked against float64 first, and dropped if it is not exact."""
    names = list(names)
    for n in B.PRIORITY:
        why = B.BACKENDS[n].unavailable(device.type, dtype, args.head_dim)
        if why is None and n not in names:
            print(f"{n:10s} available, not timed (--backends)")
        elif why is None:
            bad = check_exact(n, device, dtype, args.head_dim, args.heads, args.kv_heads, True)
            print(f"{n:10s} available" + (f", but NOT EXACT: {bad}" if bad else ", exact against float64"))
            if bad:
                names.remove(n)
        else:
            print(f"{n:10s} unavailable: {why}")
    return names


def block_row(args, names: list[str], samples: dict, case: tuple, device, dtype) -> dict:
    """One size, mask and KV head count: each backend's block TFLOP/s and SDPA's best, printed and returned (causal
    GQA readings also added to ``samples`` for the kernel curves)."""
    n_tok, causal, kv = case
    d = args.head_dim
    f_f = attention_flops(n_tok, args.heads, d, causal)
    f_b = f_f * 3.5
    cells, row = [], {"S": n_tok, "causal": causal, "kv_heads": kv, "heads": args.heads, "backends": {}}
    for name in names:
        if name == "math" and n_tok > args.max_math_seq:
            cells.append("skipped")
            continue
        try:
            t_f, t_fb = block_times(name, n_tok, args.heads, kv, d, causal, device, dtype, args.repeats)
        except torch.OutOfMemoryError:
            cells.append("oom")
            torch.cuda.empty_cache()
            continue
        row["backends"][name] = [t_f, t_fb]
        cells.append(f"{f_f / t_f / 1e12:7.3g} | {f_b / t_fb / 1e12:7.3g}")
        if kv == args.kv_heads and causal:
            for kind, t, fl in (("attention_fwd", t_f, f_f), ("attention_bwd", t_fb - t_f, f_f * 2.5)):
                samples[name].append(KernelSample(kind=kind, size=n_tok, heads=args.heads, head_dim=d,
                                                  causal=True, flops=fl, seconds=max(t, 1e-9),
                                                  dtype=str(dtype).replace("torch.", ""), batch=1, backend=name))
    sb = sdpa_best(n_tok, args.heads, kv, d, causal, device, dtype, args.repeats,
                   math_ok=n_tok <= args.max_math_seq,
                   only=args.sdpa_kinds.split(",") if args.sdpa_kinds else None)
    sdpa = f"{sb[0]:>9s} {f_f / sb[1] / 1e12:7.3g} | {f_b / sb[2] / 1e12:7.3g}" if sb else "none"
    ours = min((t[1] for t in row["backends"].values()), default=None)
    ratio = f"{sb[2] / ours:11.2f}" if sb and ours else f"{'-':>11s}"
    row.update(sdpa=list(sb) if sb else None, flops_fwd=f_f)
    print(f"{n_tok:6d} {'causal' if causal else 'full':6s} {'gqa' if kv < args.heads else 'mha':5s} "
          + " ".join(f"{c:>17s}" for c in cells) + f" {sdpa:>26s}" + ratio, flush=True)
    return row


def print_curves(samples: dict, peak: float) -> None:
    """Each backend's causal GQA kernel curves, in the profile's params format."""
    print(f"\n## kernel curves, causal GQA (efficiency = achieved / {peak / 1e12:g} TFLOP/s), profile params format")
    for name, ss in ((n, ss) for n, ss in samples.items() if ss):
        curves = kernel_curves(ss, peak)
        for kind in ("attention_fwd", "attention_bwd"):
            pts = ", ".join(f"[{int(x)}, {y:.3f}]" for x, y in curves[kind].points)
            print(f"{name}: {kind}: {{points: [{pts}]}}")


if __name__ == "__main__":
    main()
