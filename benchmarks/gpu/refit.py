"""Refit a tuned profile's stored candidates with today's calibration and price tune_check's workloads with it (a
script, not a test): what a change to the fit would have predicted for measurements already taken.

    python benchmarks/gpu/refit.py --store sqlite:///store.db --cluster cluster.yaml --plan tuned.yaml \\
        --checks tune_check.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import sp_plan
from sp_plan.planner import Workload
from sp_plan.planner.calibration import fit
from sp_plan.planner.plan import Plan
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.store import Store

MODELS = Path(__file__).parent


def neutral(params, hold: frozenset):
    """The profile's parameters with what the candidates' fit sets put back to neutral (kernels, links and the held
    round overhead kept)."""
    update = {"overlap": 1.0, "round_overhead_s": 0.0, "compute_efficiency": 1.0, "layer_overhead_s": 0.0,
              "tp_overhead_s": 0.0, "activation_factor": 1.0, "memory_overhead_bytes": 0.0}
    return params.model_copy(update={k: v for k, v in update.items() if k not in hold})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--store", "--cluster", "--plan", "--checks"):
        p.add_argument(flag, required=True)
    args = p.parse_args(argv)
    (prof,) = Store(args.store).list_profiles()
    cluster = load_cluster(args.cluster)
    hold = frozenset({"round_overhead_s"}) if prof.measurements.get("rounds_s") else frozenset()  # tune's probe
    refit = fit(cluster, neutral(prof.params, hold), prof.candidates, hold)
    print("stored fit:", "; ".join(prof.fitted))
    print("refit:     ", "; ".join(refit.fitted), "|", "; ".join(refit.notes))
    plan = Plan.load(args.plan)
    for row in json.loads(Path(args.checks).read_text()):
        model = load_model(str(MODELS / f"{row['model']}.yaml"))
        work = Workload(seq_len=row["seq"], batch=1, causal=True, training=True)
        layout = plan.model_copy(update={"model": model, "workload": work, "predicted": None, "measured": None})
        cells = []
        for name, params in (("stored", prof.params), ("refit", refit.params)):
            s = sp_plan.estimate(layout, cluster, model, work, profile=prof.model_copy(update={"params": params}))
            cells.append(f"{name} {s.step_time_s * 1e3:6.1f} ms ({s.step_time_s / row['measured_s'] - 1:+.1%})")
        print(f"{row['model']} at {row['seq']:,} tokens: measured {row['measured_s'] * 1e3:6.1f} ms; " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
