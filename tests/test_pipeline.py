"""One planning pipeline (sp_plan.pipeline): the CLI's --json, the Python API and HTTP answer the same request with
the same ranked plans, grouped into the same rows of equivalent plans; RankedPlans as a table."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import sp_plan
from sp_plan.pipeline import EstimateResponse, PlanResponse
from sp_plan.planner.equivalent import group
from sp_plan.planner.model import Workload
from sp_plan.planner.plan import Plan
from sp_plan.planner.ranking import RankedPlans
from sp_plan.cli.app import app
from sp_plan.profiles import load_cluster, load_model

#: one pytest-xdist worker for the module: its module fixtures compute once, not once per worker
pytestmark = pytest.mark.xdist_group("pipeline")
#: a request whose top rows hold equivalent plans (the presets' model prices two mesh orders of tp2 x ulysses4 x
#: ring2 alike: one row)
CASE = dict(cluster="dgx-h100", nodes=2, model="llama3-8b", seq_len="128k", top=8)
CLI = ["--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "128k", "--top", "8",
       "--no-profile"]


def cli_json(*args: str) -> dict:
    """What `sp-plan ARGS --json` prints, parsed (the command in this process: typer's CliRunner)."""
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.stderr or r.exception
    return json.loads(r.stdout)


def rows(plans: list[Plan]) -> list[list[str]]:
    """A flat ranking as rows of equivalent plans (each row: its plan, then its alternatives)."""
    return [[r.plan.summary()] + [a.summary() for a in r.alternatives] for r in group(plans)]


@pytest.fixture(scope="module")
def api() -> RankedPlans:
    c, m = load_cluster(CASE["cluster"], CASE["nodes"]), load_model(CASE["model"])
    return sp_plan.plan(c, m, Workload(seq_len=CASE["seq_len"]), top_k=CASE["top"], profile=False)


@pytest.fixture(scope="module")
def http(tmp_path_factory) -> PlanResponse:
    from fastapi.testclient import TestClient

    from sp_plan.service.app import create_app
    from sp_plan.service.settings import Settings

    body = {"cluster": CASE["cluster"], "nodes": CASE["nodes"], "model": CASE["model"],
            "workload": {"seq_len": CASE["seq_len"]}, "top": CASE["top"], "use_profile": False}
    with TestClient(create_app(Settings(store=f"sqlite:///{tmp_path_factory.mktemp('store')}/s.db", processes=1))) as client:
        r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return PlanResponse.model_validate(r.json())


def test_cli_python_and_http_rank_the_same_plans_in_the_same_rows(api, http):
    cli = PlanResponse.model_validate(cli_json("plan", *CLI))
    flat = [p.summary() for p in api.flat()]
    assert [p.summary() for p in cli.plans] == flat == [p.summary() for p in http.plans]
    assert [p.predicted for p in cli.plans] == [p.predicted for p in api.flat()] == [p.predicted for p in http.plans]
    want = [[p.summary()] + [q.summary() for q in api.equivalents(i)] for i, p in enumerate(api)]
    assert rows(cli.plans) == want == rows(http.plans)
    assert len(api) == CASE["top"] and any(len(r) > 1 for r in want)  # the case does group equivalent plans
    assert cli.winner == http.winner and cli.winner.summary() == api[0].summary()


def test_ranked_plans_are_a_list_of_plans_with_a_table(api):
    assert isinstance(api, list) and all(isinstance(p, Plan) for p in api)
    df = api.to_pandas()
    assert list(df.columns) == ["rank", "layout", "step_s", "measured_s", "tokens_per_s", "mfu", "peak_memory_bytes",
                                "equivalents", "vs_first"]
    assert list(df["rank"]) == list(range(1, len(api) + 1)) and len(df) == len(api)
    assert list(df["step_s"]) == [p.predicted.step_time_s for p in api]
    assert df["step_s"].is_monotonic_increasing and df["vs_first"][0] == "-"
    assert [len(e) for e in df["equivalents"]] == [len(api.equivalents(i)) for i in range(len(api))]
    assert df["layout"][0].startswith(api[0].summary())


def test_estimate_json_is_the_http_response_model(tmp_path, api):
    path = tmp_path / "p.yaml"
    api[0].save(path)
    res = EstimateResponse.model_validate(cli_json("estimate", str(path), "--cluster", "dgx-h100", "--nodes", "2",
                                                   "--no-profile"))
    assert res.plan.predicted == api[0].predicted and res.profile is None
    assert res.plan.predicted == sp_plan.estimate(api[0], load_cluster("dgx-h100", 2), load_model("llama3-8b"),
                                                  Workload(seq_len="128k"), profile=False)


def test_a_parquet_file_of_lengths_without_its_extra_names_the_install(monkeypatch, tmp_path):
    import importlib

    from sp_plan.pipeline import documents_definition
    from sp_plan.planner.errors import MissingExtra

    real = importlib.import_module

    def without_pyarrow(name, *args, **kw):
        if name == "pyarrow":
            raise ImportError("No module named 'pyarrow'")
        return real(name, *args, **kw)

    monkeypatch.setattr(importlib, "import_module", without_pyarrow)
    with pytest.raises(MissingExtra) as e:
        documents_definition(str(tmp_path / "lengths.parquet"))
    assert e.value.field == "documents" and "sp-plan[parquet]" in e.value.fix


def test_the_python_api_takes_names_and_mappings_as_the_cli_does(api, tmp_path):
    """``sp_plan.plan`` and ``sp_plan.estimate`` read a preset's name, a model or workload mapping and a plan file's
    path as the CLI's flags do: the same rows as the loaded objects give."""
    c = load_cluster("dgx-h100", 2)
    by_name = sp_plan.plan(c, CASE["model"], {"seq_len": CASE["seq_len"]}, top_k=CASE["top"], profile=False)
    assert [p.summary() for p in by_name] == [p.summary() for p in api]
    with_nodes = sp_plan.plan("dgx-h100", CASE["model"], {"seq_len": CASE["seq_len"]}, top_k=CASE["top"],
                              profile=False, nodes=2)  # --cluster dgx-h100 --nodes 2
    assert [(p.summary(), p.cluster) for p in with_nodes] == [(p.summary(), p.cluster) for p in api]
    api[0].save(tmp_path / "p.yaml")
    from_file = sp_plan.estimate(str(tmp_path / "p.yaml"), "dgx-h100", CASE["model"], {"seq_len": CASE["seq_len"]},
                                 profile=False, nodes=2)
    assert from_file.step_time_s == api[0].predicted.step_time_s


@pytest.mark.parametrize("args, kw, field", [
    ((None, "llama3-8b", {"seq_len": 4096}), {}, "cluster"),
    (("dgx-h100", 3, {"seq_len": 4096}), {}, "model"),
    (("dgx-h100", {"name": "x"}, {"seq_len": 4096}), {}, "model.layers"),
    (("dgx-h100", "llama3-8b", None), {}, "workload"),
    (("dgx-h100", "llama3-8b", {"seq_len": 4096, "batch": "x"}), {}, "workload.batch"),
    (("dgx-h100", "llama3-8b", {"seq_len": 4096}), {"top_k": 0}, "top_k"),
    (("dgx-h100", "llama3-8b", {"seq_len": 4096}), {"top_k": True}, "top_k"),
    (("dgx-h100", "llama3-8b", {"seq_len": 4096}), {"nodes": 0}, "nodes"),
    ((load_cluster("dgx-h100", 2), "llama3-8b", {"seq_len": 4096}), {"nodes": 3}, "nodes"),
])
def test_the_python_api_names_a_wrong_argument(args, kw, field):
    """A wrong type or value is a PlanError naming the argument (not an AttributeError deep in the planner)."""
    with pytest.raises(sp_plan.PlanError) as e:
        sp_plan.plan(*args, profile=False, **kw)
    assert e.value.field == field


def test_a_preset_clusters_own_name_is_answered_with_the_preset_and_its_nodes():
    """"dgx-h100x2", the name a 2-node preset cluster reports (plan files, `plan`'s header), is no preset: the fix
    spells the preset and its node count, in the CLI as in Python."""
    with pytest.raises(sp_plan.PlanError) as e:
        sp_plan.plan("dgx-h100x2", "llama3-8b", {"seq_len": 4096}, profile=False)
    assert e.value.field == "cluster" and "--cluster dgx-h100 --nodes 2" in e.value.fix
    assert "nodes=2" in e.value.fix
    r = CliRunner().invoke(app, ["plan", "--cluster", "dgx-h100x2", "--model", "llama3-8b", "--seq-len", "4k",
                                 "--no-profile"])
    assert r.exit_code == 2 and "--cluster dgx-h100 --nodes 2" in r.output and "Traceback" not in r.output
    with pytest.raises(sp_plan.PlanError) as e:  # a name that only looks like one stays unknown
        sp_plan.plan("nosuchx2", "llama3-8b", {"seq_len": 4096}, profile=False)
    assert "unknown preset 'nosuchx2'" in str(e.value)


def test_estimate_names_a_plan_that_is_no_plan():
    for plan, field in ((None, "plan"), ({"algorithm": "x"}, "plan.algorithm")):
        with pytest.raises(sp_plan.PlanError) as e:
            sp_plan.estimate(plan, "dgx-h100", "llama3-8b", {"seq_len": 4096}, profile=False)
        assert e.value.field == field


def test_an_answer_is_keyed_by_the_code_that_computes_it(tmp_path, monkeypatch):
    """The service stores answers by request_key: an answer of another planner (an older sp-plan's store) gets
    another key, so it is computed afresh, not served as this code's. tree_hash follows the answering files' content
    and paths, and nothing else."""
    from sp_plan import pipeline
    from sp_plan.pipeline import PlanRequest, request_key, resolve, tree_hash

    (tmp_path / "planner" / "masks").mkdir(parents=True)
    (tmp_path / "planner" / "masks" / "a.py").write_text("x = 1\n")
    (tmp_path / "pipeline.py").write_text("y = 2\n")
    names = ("planner", "pipeline.py")
    before = tree_hash(tmp_path, names)
    (tmp_path / "planner" / "notes.md").write_text("not code")
    (tmp_path / "other.py").write_text("z = 3\n")
    assert tree_hash(tmp_path, names) == before
    (tmp_path / "planner" / "masks" / "a.py").write_text("x = 2\n")
    assert tree_hash(tmp_path, names) != before

    req = PlanRequest(cluster="dgx-h100", model="llama3-8b", workload={"seq_len": "16k"}, use_profile=False)
    inputs = resolve(req)
    key = request_key(req, inputs)
    assert request_key(req, inputs) == key  # the same code: the stored answer is found again
    monkeypatch.setattr(pipeline, "code_version", lambda: "another planner")
    assert request_key(req, inputs) != key


def test_a_search_space_of_other_inputs_is_named():
    """A caller's Space enumerates its own problem's layouts: one built without the window given beside it (or for
    another world or model) is refused naming the space, not left to fail at a layout the window rules out."""
    from sp_plan.planner.search import Space

    c, m, w = load_cluster("cpu-local"), load_model("tiny-llama"), Workload(seq_len=128)
    assert sp_plan.plan(c, m, w, space=Space(4, m, w, tp_max=1), profile=False)[0].degrees["tp"] == 1
    for kw, space in [(dict(window=16), Space(4, m, w)), ({}, Space(8, m, w)),
                      ({}, Space(4, load_model("tiny-gpt"), w))]:
        with pytest.raises(sp_plan.PlanError) as e:
            sp_plan.plan(c, m, w, space=space, profile=False, **kw)
        assert e.value.field == "space" and "built for another" in e.value.problem


def test_an_inference_estimate_says_it_ignores_the_zero_stage_and_checkpointing():
    """Inference prices whole weights and nothing recomputed: a ZeRO-3, checkpointed plan prices as ZeRO-0 without
    checkpointing, and the response says so (an export that shards the weights would gather them)."""
    from sp_plan.pipeline import run_estimate

    p = Plan(algorithm="usp", degrees={"ulysses": 8, "ring": 2}, order=["ulysses", "ring"], zero_stage=3,
             checkpointing="full")
    req = dict(cluster="dgx-h100", nodes=2, model="llama3-8b", use_profile=False,
               workload={"seq_len": 65536, "batch": 8, "training": False})
    z3 = run_estimate({**req, "plan": p.model_dump(mode="json")})
    z0 = run_estimate({**req, "plan": p.model_copy(update={"zero_stage": 0, "checkpointing": "none"})
                       .model_dump(mode="json")})
    assert z3.plan.predicted.step_time_s == z0.plan.predicted.step_time_s
    assert any(n.startswith("inference: zero3 and checkpointing full are priced as zero0") for n in z3.notes)
    assert not any(n.startswith("inference:") for n in z0.notes)
