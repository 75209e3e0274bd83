"""`sp-plan tune --documents ... --window W --json` on 4 CPU ranks: candidates that honour masks, measured on packed
batches, each with its attention under the mask measured beside the model's price of it; JSON events only."""
from __future__ import annotations

import json

from sp_plan.profiles.store import Store
from harness import netns
from sp_plan.runtime.attention import MASKED

TUNE = ["-m", "sp_plan.cli.app", "tune", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "512",
        "--link-sizes", "16K", "--iters", "2", "--candidate-timeout", "120", "--confirm", "0", "--reread", "0"]


def test_a_packed_tune_measures_masked_candidates_and_prints_json_events(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    res = netns.launch([*TUNE, "--budget", "2", "--documents", "megatron-dcp", "--window", "256", "--seed", "3",
                        "--json", "--store", url], 4, 4, tmp_path, timeout=900)
    for rank, (code, text) in enumerate(res):
        assert code == 0, f"rank {rank} exited {code}:\n{text[-4000:]}"
    lines = [ln for ln in res[0][1].splitlines() if ln.startswith("{")]
    events = [json.loads(ln) for ln in lines]
    assert events and all(set(e) >= {"event", "step", "done", "total", "elapsed_s", "eta_s", "message"}
                          for e in events[:-1])
    assert {e["step"] for e in events[:-1]} >= {"links", "kernels", "rounds", "candidates"}
    result = events[-1]
    assert result["event"] == "result" and len(result["candidates"]) == 2
    assert not any(text.lstrip().startswith("{") for _, text in res[1:]), "only rank 0 prints events"
    (prof,) = Store(url).list_profiles()
    assert prof.id == result["profile"]
    assert prof.workloads[0]["window"]["size"] == 256 and prof.workloads[0]["seed"] == 3
    for c in prof.candidates:
        assert c.status == "ok", c.reason
        assert c.plan["algorithm"] in MASKED
        att = c.detail["attention"]  # one layer under the mask: measured (slowest rank) and as the model prices it
        assert att["measured_s"] == max(att["per_rank_s"]) > 0 and att["imbalance"] >= 1.0
        assert att["predicted_before_s"] > 0 and att["predicted_after_s"] > 0
    assert [c["attention"]["measured_s"] for c in result["candidates"]] == \
        [c.detail["attention"]["measured_s"] for c in prof.candidates]


def test_a_quiet_tune_prints_only_its_result(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    short = [("256" if a == "512" else a) for a in TUNE]  # one document a sequence: the shortest sweep will do
    res = netns.launch([*short, "--budget", "1", "--quiet", "--store", url, "-o", "plan.yaml"],
                       4, 4, tmp_path, timeout=900)
    for rank, (code, text) in enumerate(res):
        assert code == 0, f"rank {rank} exited {code}:\n{text[-4000:]}"
    (prof,) = Store(url).list_profiles()
    lines = [ln for ln in res[0][1].splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"stored profile {prof.id} in ") and "wrote plan.yaml" in lines[0]
    assert (tmp_path / "plan.yaml").exists()
