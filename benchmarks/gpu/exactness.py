"""Every block-kernel backend and every world-1 algorithm against float64 attention (a script, not a test).

    python benchmarks/gpu/exactness.py [--n 512] [--heads 8] [--kv-heads 2] [--head-dim 128] [--json out.json]

Per backend available on this device (``runtime.backends``), dtype (float32 with TF32 off, bfloat16) and case
(full, causal, GQA, a diagonal offset either way, a document mask, a sliding window): the block forward (out,
lse) and backward (dq, dk, dv) against ``math`` in float64 on the CPU, as the relative error
||x - ref|| / ||ref||. The targets: float32 <= 1e-5; bfloat16 no more than 2x the error of PyTorch's own
``scaled_dot_product_attention`` in bfloat16 against the same reference (out, dq, dk, dv). Then the degree-1
path (``kernels.local_attention``) on every SDPA backend, full and causal, and world-1
``init(plan)`` + ``ctx.attention`` of every algorithm that runs at world 1, forward and backward, the same
way. Backends that take no explicit mask are not run on the mask cases (``kernels`` sends such blocks to a
backend that does). Prints one line per check and a verdict; exits 1 if a check misses its target.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sp_plan.runtime import backends as B
from sp_plan.runtime.kernels import block_attention, block_attention_backward, local_attention

FLOAT32_TARGET = 1e-5
BF16_FACTOR = 2.0


def document_mask(n: int, lengths: list[int]) -> torch.Tensor:
    """Causal attention inside each packed document (True = attend): the mask of cu_seqlens = cumsum(lengths)."""
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    assert len(doc) == n, (len(doc), n)
    pos = torch.arange(n)
    return (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])


def window_mask(n: int, window: int) -> torch.Tensor:
    """Causal sliding window: query i sees keys i - window < j <= i."""
    pos = torch.arange(n)
    return (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)


def cases(n: int, heads: int, kv_heads: int) -> list[dict]:
    """(name, query rows, key rows, KV heads, causal offset, mask) of each check."""
    third = n // 3
    return [
        dict(name="full", n_q=n, n_k=n, kv=heads, offset=None, mask=None),
        dict(name="causal", n_q=n, n_k=n, kv=heads, offset=0, mask=None),
        dict(name="gqa causal", n_q=n, n_k=n, kv=kv_heads, offset=0, mask=None),
        dict(name="gqa full", n_q=n, n_k=n, kv=kv_heads, offset=None, mask=None),
        dict(name="offset +n/4", n_q=n // 2, n_k=n, kv=kv_heads, offset=n // 4, mask=None),
        dict(name="offset -n/4", n_q=n, n_k=n, kv=kv_heads, offset=-(n // 4), mask=None),
        dict(name="document mask", n_q=n, n_k=n, kv=kv_heads, offset=None,
             mask=document_mask(n, [third, n - 2 * third, third])),
        dict(name="window n/8", n_q=n, n_k=n, kv=kv_heads, offset=None, mask=window_mask(n, n // 8)),
    ]


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| in float64 (-inf entries of lse compared as equal)."""
    g, r = got.detach().to("cpu", torch.float64), ref.to(torch.float64)
    both_inf = torch.isneginf(g) & torch.isneginf(r)
    g, r = g.masked_fill(both_inf, 0.0), r.masked_fill(both_inf, 0.0)
    return float(torch.linalg.vector_norm(g - r) / torch.linalg.vector_norm(r).clamp_min(1e-300))


def inputs(c: dict, heads: int, d: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, h, d, generator=g, dtype=torch.float64)
            for n, h in ((c["n_q"], heads), (c["n_k"], c["kv"]), (c["n_k"], c["kv"]), (c["n_q"], heads))]


def full_mask(c: dict) -> torch.Tensor | None:
    """The case's boolean mask over (query rows, key rows), the offset drawn out (None: no mask)."""
    if c["mask"] is not None:
        return c["mask"]
    if c["offset"] is None:
        return None
    return B.offset_mask(c["n_q"], c["n_k"], c["offset"])


def sdpa_errors(c: dict, x64: list[torch.Tensor], ref: dict, device, dtype) -> dict:
    """PyTorch's own SDPA (default dispatch) in ``dtype``: relative errors of out, dq, dk, dv."""
    q, k, v, do = (t.to(device=device, dtype=dtype).transpose(1, 2).contiguous() for t in x64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    m = full_mask(c)
    kw = dict(enable_gqa=k.shape[1] != q.shape[1])
    if m is not None and not (c["offset"] == 0 and c["n_q"] == c["n_k"]):
        kw["attn_mask"] = m.to(device)
    else:
        kw["is_causal"] = c["offset"] == 0
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    out.backward(do)
    dead = None if m is None else ~m.any(dim=1)  # SDPA gives rows that see nothing nan: zero, as ours
    t = lambda x: x.transpose(1, 2).float().nan_to_num(0.0)  # noqa: E731
    got = {"out": t(out), "dq": t(q.grad), "dk": t(k.grad), "dv": t(v.grad)}
    if dead is not None and bool(dead.any()):
        got["out"][:, dead.to(device)] = 0
    return {kk: rel(got[kk], ref[kk]) for kk in got}


def block_errors(name: str, c: dict, x64: list[torch.Tensor], ref: dict, device, dtype) -> dict:
    """Backend ``name``'s block forward and backward in ``dtype``: relative errors of out, lse, dq, dk, dv."""
    q, k, v, do = (t.to(device=device, dtype=dtype) for t in x64)
    kw = dict(causal_offset=c["offset"], mask=None if c["mask"] is None else c["mask"].to(device), backend=name)
    o, lse = block_attention(q, k, v, **kw)
    dq, dk, dv = block_attention_backward(do, q, k, v, o, lse, **kw)
    got = {"out": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    return {kk: rel(got[kk], ref[kk]) for kk in got}


def reference(c: dict, x64: list[torch.Tensor]) -> dict:
    q, k, v, do = x64
    kw = dict(causal_offset=c["offset"], mask=c["mask"], backend="math")
    o, lse = block_attention(q, k, v, **kw)
    dq, dk, dv = block_attention_backward(do, q, k, v, o, lse, **kw)
    return {"out": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def check_blocks(args, device, results: list) -> bool:
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        dname = str(dtype).removeprefix("torch.")
        for i, c in enumerate(cases(args.n, args.heads, args.kv_heads)):
            x64 = inputs(c, args.heads, args.head_dim, seed=i)
            ref = reference(c, x64)
            base = sdpa_errors(c, x64, ref, device, dtype) if dtype != torch.float32 else None
            for name in B.PRIORITY:
                be = B.BACKENDS[name]
                why = be.unavailable(device.type, dtype, args.head_dim, masked=c["mask"] is not None)
                if why:
                    continue
                try:
                    err = block_errors(name, c, x64, ref, device, dtype)
                except Exception as e:  # noqa: BLE001 - a failing kernel is a result to print
                    print(f"{dname:9s} {c['name']:14s} {name:10s} FAILED {type(e).__name__}: {e}"[:300])
                    ok = False
                    results.append(dict(dtype=dname, case=c["name"], backend=name, error=str(e)[:500]))
                    continue
                if base is None:
                    good = all(v <= FLOAT32_TARGET for v in err.values())
                    target = f"<= {FLOAT32_TARGET:g}"
                else:
                    good = all(err[k] <= BF16_FACTOR * base[k] for k in base)
                    target = "<= 2x sdpa " + " ".join(f"{k} {base[k]:.2e}" for k in base)
                ok &= good
                results.append(dict(dtype=dname, case=c["name"], backend=name, errors=err, sdpa=base, ok=good))
                print(f"{dname:9s} {c['name']:14s} {name:10s} " + " ".join(f"{k} {v:.2e}" for k, v in err.items())
                      + f"  {'ok' if good else 'MISSED'} ({target})", flush=True)
    return ok


def local_errors(name: str, c: dict, x64: list[torch.Tensor], ref: dict, device, dtype) -> tuple[dict, str]:
    """The degree-1 path (``kernels.local_attention``, as ``ctx.attention`` runs it at world 1) on backend ``name``:
    relative errors of out, dq, dk, dv, and the autograd node it made (CUDA's flash: its op, called directly)."""
    q, k, v, do = (t.to(device=device, dtype=dtype) for t in x64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = local_attention(q, k, v, causal=c["offset"] == 0, backend=name)
    out.backward(do)
    got = {"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return {kk: rel(got[kk], ref[kk]) for kk in got}, type(out.grad_fn).__name__


def check_local(args, device, results: list) -> bool:
    """``local_attention`` on every SDPA backend that runs here, full and causal GQA, both dtypes, the targets of
    the blocks."""
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        dname = str(dtype).removeprefix("torch.")
        for i, c in enumerate(cases(args.n, args.heads, args.kv_heads)[:3]):  # full, causal, gqa causal
            x64 = inputs(c, args.heads, args.head_dim, seed=50 + i)
            ref = reference(c, x64)
            base = sdpa_errors(c, x64, ref, device, dtype) if dtype != torch.float32 else None
            for name in ("cudnn", "flash", "efficient", "cpu_flash", "math"):
                if B.BACKENDS[name].unavailable(device.type, dtype, args.head_dim):
                    continue
                try:
                    err, node = local_errors(name, c, x64, ref, device, dtype)
                except Exception as e:  # noqa: BLE001 - a failing path is a result to print
                    print(f"local     {dname:9s} {c['name']:14s} {name:10s} FAILED {type(e).__name__}: {e}"[:300])
                    ok = False
                    results.append(dict(local=name, dtype=dname, case=c["name"], error=str(e)[:500]))
                    continue
                good = (all(v <= FLOAT32_TARGET for v in err.values()) if base is None
                        else all(err[k] <= BF16_FACTOR * base[k] for k in base))
                ok &= good
                results.append(dict(local=name, dtype=dname, case=c["name"], node=node, errors=err, sdpa=base, ok=good))
                print(f"local     {dname:9s} {c['name']:14s} {name:10s} " + " ".join(f"{k} {v:.2e}" for k, v in
                      err.items()) + f"  {'ok' if good else 'MISSED'} ({node})", flush=True)
    return ok


WORLD1 = {  # plans that run at world 1: every degree 1
    "ring": dict(degrees={"ring": 1}), "ulysses": dict(degrees={"ulysses": 1}),
    "usp": dict(degrees={"ulysses": 1, "ring": 1}), "wallfacer": dict(degrees={"ring": 1, "team": 1}),
    "tokenring": dict(degrees={"ring": 1}), "tokenring_ring": dict(degrees={"ring": 1}),
    "allgather": dict(degrees={"ring": 1}),
}  # METP replaces the whole attention layer (projections included): it has no ctx.attention to check


def check_world1(args, device, results: list) -> bool:
    """init(plan) + ctx.attention of every algorithm at world 1 against float64, causal GQA, both dtypes."""
    from sp_plan.planner import Plan
    from sp_plan.runtime import init

    ok = True
    c = cases(args.n, args.heads, args.kv_heads)[2]  # gqa causal
    x64 = inputs(c, args.heads, args.head_dim, seed=99)
    ref = reference(c, x64)
    for alg, kw in WORLD1.items():
        try:
            ctx = init(Plan(algorithm=alg, **kw), device_type=device.type)
        except Exception as e:  # noqa: BLE001
            print(f"world 1 {alg:15s} does not build at world 1: {type(e).__name__}: {e}"[:300])
            results.append(dict(world1=alg, error=str(e)[:500]))
            continue
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v, do = (t.to(device=device, dtype=dtype) for t in x64)
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            try:
                out = ctx.attention(q, k, v, causal=True)
                out.backward(do)
            except Exception as e:  # noqa: BLE001
                print(f"world 1 {alg:15s} {dtype} FAILED {type(e).__name__}: {e}"[:300])
                ok = False
                continue
            err = {"out": rel(out, ref["out"]), "dq": rel(q.grad, ref["dq"]), "dk": rel(k.grad, ref["dk"]),
                   "dv": rel(v.grad, ref["dv"])}
            if dtype == torch.float32:
                good = all(e <= FLOAT32_TARGET for e in err.values()) or ctx.attention_backend not in (
                    "math", "efficient", "cpu_flash", "reference", "cuda_efficient")
                limit = f"<= {FLOAT32_TARGET:g}"
            else:
                base = sdpa_errors(c, x64, ref, device, dtype)
                good = all(err[k] <= BF16_FACTOR * base[k] for k in base)
                limit = "<= 2x sdpa " + " ".join(f"{k} {base[k]:.2e}" for k in base)
            ok &= good
            results.append(dict(world1=alg, dtype=str(dtype), backend=ctx.attention_backend, errors=err, ok=good))
            print(f"world 1 {alg:15s} {str(dtype).removeprefix('torch.'):9s} ({ctx.attention_backend}) "
                  + " ".join(f"{k} {v:.2e}" for k, v in err.items()) + f"  {'ok' if good else 'MISSED'} ({limit})",
                  flush=True)
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--json", default=None, help="write every figure here")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print(f"# {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}; "
          f"relative errors ||x - ref|| / ||ref|| against float64 math; {args.heads} heads "
          f"(GQA: {args.kv_heads}) of {args.head_dim}, {args.n} tokens")
    for name in B.PRIORITY:
        for dtype in (torch.float32, torch.bfloat16):
            why = B.BACKENDS[name].unavailable(device.type, dtype, args.head_dim)
            print(f"{name:10s} {str(dtype).removeprefix('torch.'):9s} " + (f"unavailable: {why}" if why else "runs"))
    results: list = []
    ok = check_blocks(args, device, results)
    ok &= check_local(args, device, results)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{tempfile.mkdtemp()}/init", rank=0, world_size=1)
    try:
        ok &= check_world1(args, device, results)
    finally:
        dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    print("every check met its target" if ok else "SOME CHECKS MISSED THEIR TARGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
