"""Predicted step times of every candidate (every mesh order x fitting memory policy) on a few small presets.

``python tests/golden_predictions.py`` records them in tests/data/golden_predictions.json.gz (run it only
when a change of the cost model is intended); tests/test_search_scale.py recomputes and compares.
The cases cover every algorithm: ring (contiguous, zigzag, striped), ulysses, usp, wallfacer (both
placements), tokenring, tokenring_ring, metp and allgather, causal and not, training and inference; and masks:
packed documents (every balancing policy), a local:global window pattern, documents under a bidirectional window.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from sp_plan.planner import Workload
from sp_plan.planner.estimate import Estimator, Orders
from sp_plan.planner.search import Space, degree_groups
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.documents import load_documents

PATH = Path(__file__).parent / "data" / "golden_predictions.json.gz"

#: (name, cluster preset, nodes, model preset, seq_len, batch, causal, training[, workload's documents and window])
CASES = [
    ("dgx-h100x2 llama3-8b 128k", "dgx-h100", 2, "llama3-8b", "128k", 2, True, True),
    ("a100-16-eth100x4 gpt-7b 64k", "a100-16-eth100", 4, "gpt-7b", "64k", 1, True, True),
    ("ascend-910b-8x2 llama3-8b 128k inference", "ascend-910b-8", 2, "llama3-8b", "128k", 1, True, False),
    ("a10-4-pcie x2 gpt-3b 32k non-causal", "a10-4-pcie", 2, "gpt-3b", "32k", 2, False, True),
    ("dgx-h100x16 llama3-8b 256k", "dgx-h100", 16, "llama3-8b", "256k", 1, True, True),  # rings > 64
    ("dgx-h100x2 llama3-8b 64k megatron-dcp documents", "dgx-h100", 2, "llama3-8b", "64k", 2, True, True,
     {"documents": "megatron-dcp"}),
    ("dgx-h100x2 llama3-8b 64k window 4096 5:1", "dgx-h100", 2, "llama3-8b", "64k", 2, True, True,
     {"window": {"size": 4096, "pattern": "5:1"}}),
    ("a10-4-pcie x2 gpt-3b 32k magi-short window 1024 non-causal", "a10-4-pcie", 2, "gpt-3b", "32k", 2, False, True,
     {"documents": "magi-short", "window": 1024}),
]


def case_inputs(case):
    """(cluster, model, workload) of a case; a named document distribution resolved from the presets."""
    _, cl, nodes, model, seq, batch, causal, training, *masks = case
    extra = dict(masks[0]) if masks else {}
    if "documents" in extra:
        extra["documents"] = load_documents(extra["documents"])
    return (load_cluster(cl, nodes), load_model(model),
            Workload(seq_len=seq, batch=batch, causal=causal, training=training, **extra))


def candidate_times(case) -> dict[str, float]:
    """Every candidate's predicted step time, keyed by a readable candidate string."""
    cluster, model, work = case_inputs(case)
    est = Estimator(cluster, model, work)
    space = Space(cluster.world_size, model, work)
    out = {}
    for d in space.degrees():
        found, _, _ = degree_groups(est, space, d)
        for base, orders, fitting in found:
            times, _ = est.evaluate_orders(base, Orders(est.engine, base.degrees, orders, base.placement), fitting)
            for k, order in enumerate(orders):
                for j, pol in enumerate(fitting):
                    key = (f"{base.algorithm} dp{base.dp} pp{base.pp} tp{base.tp} u{base.ulysses} r{base.ring} "
                           f"C{base.team} {base.placement} {'-'.join(order)} {base.token_layout} {pol}"
                           + (f" v{base.virtual_stages}" if base.virtual_stages > 1 else ""))
                    out[key] = float(times[k, j])
    return out


#: a cluster-scale case: the fastest layout of every algorithm variant (exact under the grid's pruning)
SCALE_CASE = ("dgx-h100x128 llama3-70b 1m", "dgx-h100", 128, "llama3-70b", "1m", 1, True, True)


def best_of_each(case) -> dict[str, float]:
    """The grid search's best step time per algorithm variant (plus the overall top 5) at cluster scale."""
    from sp_plan.planner.search import best_per_variant, grid_search

    cluster, model, work = case_inputs(case)
    res = grid_search(cluster, model, work, keep=5)
    out = {f"best {c.algorithm} C{c.team} {c.placement}": t for t, c in best_per_variant(res.ranked)}
    out.update({f"top{i} {c.to_plan().summary()} {c.zero_stage} {c.checkpointing} {c.micro_batch_size}": t
                for i, (t, c) in enumerate(res.ranked[:5])})
    return out


def record() -> dict[str, dict[str, float]]:
    out = {case[0]: candidate_times(case) for case in CASES}
    out[SCALE_CASE[0]] = best_of_each(SCALE_CASE)
    return out


if __name__ == "__main__":
    data = record()
    with gzip.open(PATH, "wt") as f:
        json.dump(data, f, sort_keys=True)
    for name, times in data.items():
        algs = sorted({k.split()[0] for k in times})
        print(f"{name}: {len(times)} candidates, {algs}", file=sys.stderr)
    print(f"{PATH} {PATH.stat().st_size} bytes", file=sys.stderr)
