"""USP Tables 5-7 (LLaMA2-7B / LLaMA3-8B on one and two 8 x A800 nodes, TP x Ulysses x Ring): the
predicted MFU of each measured row beside the paper's, and Spearman's rho per table. Nothing is
fitted to these tables. The test asserts what the memory model must get right: every row the paper
ran fits, and the SP-only 64K LLaMA2-7B layout the paper reports out of memory does not."""
import json
from pathlib import Path

import pytest
from scipy.stats import spearmanr

from sp_plan.planner import Estimator, Workload
from sp_plan.planner.candidate import Candidate
from sp_plan.planner.algorithms import algorithm_for
from sp_plan.planner.search import fastest_policy
from sp_plan.profiles import load_cluster, load_model

K = 1024
DATA = json.loads((Path(__file__).parent / "data" / "paper_tables.json").read_text())["usp_training"]
# (seq, global batch, tp, ulysses, ring, measured MFU) per table: tests/data/paper_tables.json (shared with
# benchmarks/bench_fidelity.py)
TABLES = {name: (t["model"], t["nodes"], [tuple(r) for r in t["rows"]]) for name, t in DATA.items()
          if isinstance(t, dict)}


def spearman(a, b):
    return float(spearmanr(a, b).statistic)


def predict(cluster, model, seq, batch, tp, u, r, policies=None):
    """Best fitting memory policy for the row's degrees, mesh order per USP Tip 7 (TP < Ulysses < Ring < DP)."""
    work = Workload(seq_len=seq * K, batch=batch)
    est = Estimator(cluster, model, work)
    dp = cluster.world_size // (tp * u * r)
    order = tuple(n for n, v in (("tp", tp), ("ulysses", u), ("ring", r), ("dp", dp)) if v > 1)
    base = Candidate(algorithm_for(u, r), dp=dp, tp=tp, ulysses=u, ring=r, order=order,
                     token_layout="zigzag" if r > 1 else "contiguous")
    return fastest_policy(est, base, policies)


@pytest.mark.parametrize("name", list(TABLES))
def test_predicted_mfu_beside_usp_tables(name, capsys):
    model_name, nodes, rows = TABLES[name]
    cluster, model = load_cluster("a800-8-nvlink", nodes), load_model(model_name)
    preds = [predict(cluster, model, *row[:5]) for row in rows]
    with capsys.disabled():
        print(f"\nUSP {name}: {model_name} on {nodes} x 8 A800 (seq, bs, tp, ulysses, ring): predicted vs measured MFU")
        for row, p in zip(rows, preds):
            print(f"  {row[0]:>4}K bs{row[1]:<2} tp{row[2]} u{row[3]} r{row[4]:<2}  predicted "
                  f"{p.mfu if p else float('nan'):.2f}  measured {row[5]:.2f}")
        rho = spearman([p.mfu for p in preds], [row[5] for row in rows])
        print(f"  Spearman rho = {rho:.2f}")
    assert all(p is not None for p in preds), "a layout the paper ran is predicted not to fit"
    assert all(0 < p.mfu < 1 for p in preds)


def test_sp_only_64k_llama2_is_out_of_memory_on_one_node():
    """USP Sec. 5.2: 'When seqlen=64K, SP-only will bring OOM' (LLaMA2-7B, 8 x A800, Megatron-LM with its
    distributed optimizer, i.e. ZeRO-1, and no full recomputation), while TP4 x Ulysses2 runs."""
    cluster, model = load_cluster("a800-8-nvlink", 1), load_model("llama2-7b")
    megatron = [(1, "none")]
    assert predict(cluster, model, 64, 1, 1, 8, 1, megatron) is None
    assert predict(cluster, model, 64, 1, 4, 2, 1, megatron) is not None
    # with ZeRO-3 and recomputation the planner finds a way to run SP-only after all
    assert predict(cluster, model, 64, 1, 1, 8, 1) is not None
