"""A tuned profile's prediction against a measurement of a layout that tune did not measure (a script, not a test).

    python benchmarks/gpu/tune_check.py --cluster cluster.yaml --store URL --plan tuned.yaml \
        --check MODEL:SEQ [--check MODEL:SEQ ...] [--json out.json] [--dtype bf16]

Without ``--plan`` the layout is ring degree 1; without ``--store`` the prediction is uncalibrated. On CPU the
peak is the storage tracker's (what tune reads there) and the stack runs in float32 unless ``--dtype`` says:

    python benchmarks/gpu/tune_check.py --cluster cluster.yaml --dtype bf16 \
        --check benchmarks/gpu/mini-llama-2l.yaml:2k --check benchmarks/gpu/mini-llama-4l.yaml:2k \
        --check benchmarks/gpu/mini-llama-2l.yaml:4k

For each ``--check`` (a model preset or file and a sequence length), the tuned plan's layout on that model and
workload is priced by ``sp_plan.estimate`` with the store's profile of the cluster, then measured here: a real
layer stack of every layer of the model through ``init(plan)`` and ``ctx.attention`` (``profiles.tune.candidate
.measure``, the step tune itself times), at world 1. Peak memory is read both ways: the allocator's allocated
peak (what tune records and the model is fitted to) and its reserved peak (what the device must hold). Targets:
step within 15 % and peak memory within 10 % of the measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist

import sp_plan
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.tune.candidate import measure

STEP_TARGET, MEMORY_TARGET = 0.15, 0.10


def check(plan, cluster, model, seq: int, store: str, device, dtype) -> dict:
    """Predicted and measured step and peak memory of ``plan``'s layout on ``model`` at ``seq`` tokens."""
    work = Workload(seq_len=seq, batch=plan.workload.batch if plan.workload else 1, causal=True, training=True)
    layout = plan.model_copy(update={"model": model, "workload": work, "predicted": None, "measured": None})
    pred = sp_plan.estimate(layout, cluster, model, work, **({"store": store} if store else {}))
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    res = measure(layout, model, work, layers=model.layers, warmup=1, iters=3, device=device, dtype=dtype)
    reserved = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else float("nan")
    return {"model": model.name, "layers": model.layers, "seq": seq, "layout": plan.summary(),
            "predicted_s": pred.step_time_s, "measured_s": res["measured_s"],
            "predicted_peak": pred.peak_memory_bytes, "allocated_peak": res["measured_memory"],
            "reserved_peak": reserved}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--store", default=None, help="the store holding the cluster's tuned profile (none: uncalibrated)")
    p.add_argument("--plan", default=None, help="a plan file (none: ring degree 1)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                   help="the stack's dtype (default: the model's on CUDA, fp32 on CPU)")
    p.add_argument("--check", action="append", required=True, help="MODEL:SEQ, e.g. llama3-8b-2l.yaml:32k")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the allocator's statistics need an initialized device
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29536")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"file://{tempfile.mkdtemp()}/init", rank=0, world_size=1)
    cluster = load_cluster(args.cluster)
    plan = sp_plan.Plan.load(args.plan) if args.plan else sp_plan.Plan(algorithm="ring", degrees={"ring": 1},
                                                                         order=["ring"])
    rows = []
    for spec in args.check:
        name, seq = spec.rsplit(":", 1)
        model = load_model(name)
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        dtype = dtypes[args.dtype or (model.dtype if device.type == "cuda" else "fp32")]
        r = check(plan, cluster, model, Workload(seq_len=seq).seq_len, args.store, device, dtype)
        rows.append(r)
        e_t = r["predicted_s"] / r["measured_s"] - 1
        e_a = r["predicted_peak"] / r["allocated_peak"] - 1
        e_r = r["predicted_peak"] / r["reserved_peak"] - 1
        print(f"{r['model']} ({r['layers']} layers) at {r['seq']:,} tokens, {r['layout']}: step predicted "
              f"{1e3 * r['predicted_s']:.1f} ms, measured {1e3 * r['measured_s']:.1f} ms ({e_t:+.1%}, target "
              f"{STEP_TARGET:.0%}); peak predicted {r['predicted_peak'] / 2**30:.2f} GiB, allocated "
              f"{r['allocated_peak'] / 2**30:.2f} GiB ({e_a:+.1%}, target {MEMORY_TARGET:.0%}), reserved "
              f"{r['reserved_peak'] / 2**30:.2f} GiB ({e_r:+.1%})", flush=True)
    dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
