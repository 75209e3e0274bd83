"""Llama 3 405B's long-context layout, priced: TP8 x CP16 (all-gather) x PP16 x DP8 on 16,384 H100s, and sp-plan's own.

Llama 3 (arXiv 2407.21783) trained its 128k stage with TP 8, CP 16 (all-gather K/V, each rank holding two of the
2 x CP chunks: zigzag), PP 16 and DP 8, mesh order [TP, CP, PP, DP] innermost first, at 380 TFLOP/s per GPU and
38 % BF16 MFU (Table 4, §3.3.2), with a 16M-token global batch (128 sequences of 128k) and 126 layers on 16 stages
with one layer fewer on the first and the last. This prices that layout with `sp-plan estimate` on the dgx-h100
preset at 2,048 nodes, packing each sequence with documents drawn from the magi-long distribution, and prints:

- the MFU as the paper counts it (6N + full causal attention FLOPs per token, ``Prediction.mfu_causal``), against
  the published 38 % (target: within 32.3-43.7 %), with Llama 3's interleaved schedule and with plain 1F1B;
- the MFU on the FLOPs the document mask leaves (``Prediction.mfu``);
- the breakdown's pipeline bubble, the term that separates the two schedules, and the MFU at 2, 4 and 8 virtual
  stages a rank;
- `sp-plan plan`'s own best layout on the same inputs beside it.

Llama 3 ran an interleaved 1F1B schedule with V stages on each pipeline rank (§3.3.2, after Narayanan et al. 2021)
and gives V as a symbol only. Its one layer fewer on the first and the last stage leaves the first chunk of the first
stage the embedding alone and the last chunk of the last stage the output and loss alone (§3.3.2): chunks of one
layer, counting the embedding and the head as one each, so 128 / 16 = 8 chunks a rank. PAPER_V = 8 is read from that
(an inference from the paper's text, not a figure it states).

Run: python benchmarks/bench_llama3.py [--no-search]   (figures: docs/benchmarks/llama3.md)
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sp_plan.planner import Plan
from sp_plan.planner.model import Workload
from sp_plan.planner.stages import balanced_stage_layers
from sp_plan.profiles import load_model
from sp_plan.profiles.documents import load_documents
from sp_plan.service.planning import EstimateRequest, PlanRequest, run_estimate, run_plan

CLUSTER, NODES, MODEL, DOCUMENTS = "dgx-h100", 2048, "llama3-405b", "magi-long"
SEQ_LEN, BATCH = 131072, 128  # 128 x 128k = 16M tokens a step
PUBLISHED_MFU, PUBLISHED_TFLOPS = 0.38, 380.0
TARGET = (0.38 * 0.85, 0.38 * 1.15)  # within 15 % relative of the published 38 %
PAPER_V = 8  # virtual stages a pipeline rank: one-layer chunks, the embedding and the head each a chunk's layer


def workload() -> Workload:
    """128 sequences of 128k tokens, each packed with documents from magi-long."""
    return Workload(seq_len=SEQ_LEN, batch=BATCH, documents=load_documents(DOCUMENTS))


def published_plan(virtual_stages: int = PAPER_V) -> Plan:
    """Table 4's 128k row: TP8, CP16 all-gather (zigzag chunks), PP16 with lighter first and last stages, DP8, each
    pipeline rank running ``virtual_stages`` chunks (1: plain 1F1B)."""
    model = load_model(MODEL)
    return Plan(algorithm="allgather", degrees={"tp": 8, "ring": 16, "pp": 16, "dp": 8},
                order=["tp", "ring", "pp", "dp"], token_layout="zigzag", zero_stage=2,
                stage_layers=list(balanced_stage_layers(model, 16, workload())), virtual_stages=virtual_stages,
                model=model, workload=workload())


def priced(plan: Plan) -> Plan:
    """The plan with its prediction, through the API `sp-plan estimate` calls."""
    req = EstimateRequest(plan=plan, cluster=CLUSTER, nodes=NODES, use_profile=False)
    return run_estimate(req).plan


def bubble_share(plan: Plan) -> float:
    """The pipeline bubble's share of the predicted step."""
    return bubble_share_of(plan.predicted)


def bubble_share_of(pr) -> float:
    """The bubble's share of a Prediction's step."""
    return sum(b.seconds for b in pr.breakdown if b.kind == "bubble") / pr.step_time_s


def line(name: str, plan: Plan) -> str:
    """One row: the layout, step, both MFUs, TFLOP/s per GPU as the paper counts them, memory, bubble."""
    pr = plan.predicted
    causal = pr.mfu_causal if pr.mfu_causal is not None else pr.mfu
    tflops = causal * 989.0  # dgx-h100's bf16 dense peak per GPU, TFLOP/s
    fits = "fits" if pr.fits else "over"
    return (f"{name:<10} {plan.summary()}\n{'':<10} step {pr.step_time_s:6.2f} s  MFU paper-counted {causal:6.1%}  "
            f"mask-counted {pr.mfu:6.1%}  {tflops:5.0f} TFLOP/s/GPU  peak {pr.peak_memory_bytes / 2**30:5.1f} GiB "
            f"({fits} {pr.memory_capacity_bytes / 2**30:.1f})  bubble {bubble_share(plan):5.1%}")


def interleaving() -> str:
    """The paper-counted MFU of the published layout priced at each number of virtual stages its stages split into."""
    cells = []
    for v in (1, 2, 4, 8):
        pr = priced(published_plan(v)).predicted
        cells.append(f"v={v}: {pr.mfu_causal:.1%} (bubble {bubble_share_of(pr):.1%})")
    return f"{'':<10} paper-counted MFU by virtual stages a rank: " + ", ".join(cells)


def cli_estimate(plan: Plan) -> str:
    """`sp-plan estimate plan.yaml` as a user runs it on the plan file (stage_layers and virtual_stages read from the
    file)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "llama3-405b-128k.yaml"
        plan.save(path)
        cmd = [sys.executable, "-m", "sp_plan.cli.app", "estimate", str(path), "--cluster", CLUSTER,
               "--nodes", str(NODES), "--documents", DOCUMENTS, "--no-profile"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(r.stderr)
    return r.stdout


def search() -> tuple[Plan, float]:
    """`sp-plan plan`'s winner on the same inputs (grid search, uncalibrated), and the search's seconds."""
    t0 = time.perf_counter()
    res = run_plan(PlanRequest(cluster=CLUSTER, nodes=NODES, model=MODEL, use_profile=False, top=1,
                               workload={"seq_len": SEQ_LEN, "batch": BATCH, "documents": DOCUMENTS}))
    return res.winner, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-search", action="store_true", help="price the published layout only")
    args = ap.parse_args()

    print(f"Llama 3 405B, {SEQ_LEN:,} tokens x {BATCH} sequences ({SEQ_LEN * BATCH / 2**20:.0f}M tokens a step), "
          f"documents {DOCUMENTS}, {CLUSTER} x {NODES} nodes ({NODES * 8:,} GPUs), uncalibrated\n")
    pub = priced(published_plan())
    print(cli_estimate(published_plan()))
    print(line("published", pub))
    causal = pub.predicted.mfu_causal
    lo, hi = TARGET
    print(f"{'':<10} paper: {PUBLISHED_MFU:.0%} MFU, {PUBLISHED_TFLOPS:.0f} TFLOP/s/GPU; target {lo:.1%}-{hi:.1%}: "
          f"{'within' if lo <= causal <= hi else 'MISSED'} ({causal / PUBLISHED_MFU - 1:+.0%})")
    print(line("1F1B", priced(published_plan(1))))
    print(interleaving())
    if not args.no_search:
        best, secs = search()
        print(line("sp-plan", priced(best)))
        print(f"{'':<10} (grid search {secs:.0f} s)")


if __name__ == "__main__":
    main()
