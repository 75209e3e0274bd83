"""The documented Python API given a wrong-typed or out-of-range argument: a PlanError naming that argument (never
a bare TypeError, AttributeError or IndexError from inside); numpy integers and paths taken where ints and files
are."""
from pathlib import Path

import numpy as np
import pytest

import sp_plan
from sp_plan import pipeline
from sp_plan.client import Client
from sp_plan.planner.errors import PlanError, StoreError
from sp_plan.planner.ranking import RankedPlans
from sp_plan.profiles.resolve import resolve_profile

FIXTURES = Path(__file__).parent / "fixtures"
#: nothing listens on the discard port: a request that is made fails as "cannot reach" (field "server")
UNUSED = "http://127.0.0.1:9"
SMALL = ("cpu-local", "tiny-gpt", {"seq_len": 256})


@pytest.fixture(scope="module")
def ranked() -> RankedPlans:
    return sp_plan.plan(*SMALL, profile=False)


def _calls(ranked):
    """(argument the error must name, the call) for each wrong argument."""
    c = sp_plan.load_cluster("dgx-h100")
    plan = lambda **kw: sp_plan.plan(c, "llama3-8b", {"seq_len": 1024}, profile=False, **kw)  # noqa: E731
    request = {"cluster": "dgx-h100", "model": "llama3-8b", "workload": {"seq_len": 1024}}
    return [
        ("nodes", lambda: sp_plan.load_cluster("dgx-h100", nodes="2")),
        ("nodes", lambda: sp_plan.load_cluster("dgx-h100", nodes=2.5)),
        ("nodes", lambda: sp_plan.load_cluster("dgx-h100", nodes=True)),
        ("nodes", lambda: sp_plan.plan("dgx-h100", "llama3-8b", {"seq_len": 1024}, nodes="2")),
        ("cluster", lambda: sp_plan.load_cluster(None)),
        ("cluster", lambda: sp_plan.load_cluster(5)),
        ("cluster", lambda: sp_plan.load_cluster("")),
        ("model", lambda: sp_plan.load_model(None)),
        ("model", lambda: sp_plan.load_model(3)),
        ("store", lambda: sp_plan.plan(c, "llama3-8b", {"seq_len": 1024}, store=5)),
        ("store", lambda: sp_plan.plan(c, "llama3-8b", {"seq_len": 1024}, store="")),
        ("space", lambda: plan(space="x")),
        ("progress", lambda: plan(progress=5)),
        ("top_k", lambda: plan(top_k=np.float64(2))),
        ("window", lambda: plan(window=-1)),
        ("workload", lambda: pipeline.with_masks(None, window=4096)),
        ("plan", lambda: pipeline.rank_work(None)),
        ("request", lambda: pipeline.run_plan(5)),
        ("request.model", lambda: pipeline.run_plan({"cluster": "dgx-h100", "workload": {"seq_len": 1024}})),
        ("request", lambda: pipeline.run_estimate(None)),
        ("cluster", lambda: resolve_profile(None, "dgx-h100")),
        ("cluster", lambda: resolve_profile(None, None)),
        ("top", lambda: pipeline.report(*SMALL, top=0, profile=False)),
        ("model", lambda: pipeline.report("cpu-local", None, {"seq_len": 256}, profile=False)),
        ("server", lambda: Client(None)),
        ("timeout", lambda: Client(UNUSED, timeout=-1)),
        ("timeout", lambda: Client(UNUSED, timeout=0)),
        ("profile", lambda: Client(UNUSED).upload_profile(None)),
        ("profile.cluster_fingerprint", lambda: Client(UNUSED).upload_profile({"id": "x"})),
        ("request", lambda: Client(UNUSED).plan(5)),
        ("request", lambda: Client(UNUSED).plan(request, top=3)),
        ("server", lambda: Client(UNUSED).plan(request)),  # the mapping is a request: it is sent
        ("i", lambda: ranked.equivalents(99)),
        ("i", lambda: ranked.equivalents(-1)),
        ("i", lambda: ranked.equivalents("a")),
        ("i", lambda: RankedPlans().equivalents(0)),
        ("node", lambda: c.node_type(5)),
        ("rank", lambda: c.node_of(999)),
        ("rank", lambda: c.device(-1)),
        ("rank", lambda: c.device(c.world_size)),
    ]


def assert_fields(calls) -> None:
    """Each (field, call) raises a PlanError naming ``field``: no bare TypeError, AttributeError or IndexError."""
    for i, (field, call) in enumerate(calls):
        try:
            call()
        except PlanError as e:
            assert e.field == field, (i, field, str(e))
        else:
            pytest.fail(f"case {i} ({field}) raised nothing")


def test_wrong_arguments_are_plan_errors_naming_them(ranked):
    assert_fields(_calls(ranked))


def test_an_empty_store_is_refused_as_store_refuses_it():
    with pytest.raises(StoreError) as e:
        sp_plan.plan(*SMALL, store="")
    assert e.value.field == "store" and "empty" in e.value.problem


def test_numpy_integers_are_taken_as_ints(ranked):
    rows = sp_plan.plan(*SMALL, profile=False, top_k=np.int64(2), window=np.int64(64), seed=np.int64(3),
                        documents=[64, 128], nodes=np.int64(1))
    w = rows[0].workload
    assert len(rows) <= 2 and w.window.size == 64 and w.seed == 3 and type(w.seed) is int
    c = sp_plan.load_cluster("cpu-local", nodes=np.int32(1))
    assert c.device(np.int64(0)) is c.device(0) and c.node_of(np.int64(1)) == 0
    assert ranked.equivalents(np.int64(0)) == ranked.equivalents(0)


def test_a_profile_path_is_a_file_and_its_error_names_the_profile_once(tmp_path):
    c = sp_plan.load_cluster("dgx-h100")
    prof, line = resolve_profile(FIXTURES / "profile-dgx-h100.yaml", c)
    assert line and (prof is None or prof.cluster_fingerprint == c.topology_fingerprint())
    with pytest.raises(PlanError) as e:
        sp_plan.plan(c, "llama3-8b", {"seq_len": 1024}, profile=tmp_path / "nosuch.yaml")
    assert e.value.field == "profile" and "profile: profile:" not in str(e.value)


def test_report_takes_names_and_mappings_as_plan_does():
    rep = pipeline.report(*SMALL, top=2, sensitivity=False, profile=False)
    assert rep.rows and rep.cluster.name == "cpu-local"


def test_resolve_profile_is_an_sp_plan_name():
    assert sp_plan.resolve_profile is resolve_profile and "resolve_profile" in sp_plan.__all__


def test_the_pure_planner_names_an_argument_it_cannot_take():
    """planner.search.plan and planner.estimate.estimate take the models themselves (the pipeline reads names and
    mappings): anything else is a PlanError naming the argument; a seed is bounded as --seed is."""
    from sp_plan.planner.estimate import estimate as pure_estimate
    from sp_plan.planner.search import plan as pure_plan

    c, m, w = sp_plan.load_cluster("dgx-h100"), sp_plan.load_model("tiny-gpt"), sp_plan.Workload(seq_len="8k")
    for call, field in ((lambda: pure_plan("dgx-h100", m, w), "cluster"), (lambda: pure_plan(c, m, {"seq_len": 8}),
                         "workload"), (lambda: pure_plan(c, m, w, top_k=0), "top_k"),
                        (lambda: pure_estimate(None, c, m, w), "plan"), (lambda: pure_estimate(None, c, "x", w), "model"),
                        (lambda: sp_plan.plan(c, m, w, documents=[1024], seed=2**40), "seed")):
        with pytest.raises(sp_plan.PlanError) as e:
            call()
        assert e.value.field.split(".")[-1] == field


def test_exports_reports_and_the_sensitivity_name_an_argument_they_cannot_take(ranked):
    """The documented exporters (Target.problems, Target.export, nearest), render_report and sensitivity, given a
    name, a mapping or an index out of range where they take a model or a plan."""
    from sp_plan.integrations.export import target
    from sp_plan.integrations.export.nearest import nearest
    from sp_plan.integrations.report import render_report
    from sp_plan.planner.sensitivity import sensitivity

    c, m, w = sp_plan.load_cluster("cpu-local"), sp_plan.load_model("tiny-gpt"), sp_plan.Workload(seq_len=256)
    p, t, plans = ranked[0], target("megatron"), list(ranked)
    assert_fields([
        ("plan", lambda: t.problems({"algorithm": "ring"})),
        ("plan", lambda: t.export("plan.yaml")),
        ("target", lambda: nearest("megatron", p, c, m, w)),
        ("original", lambda: nearest(t, p.model_dump(), c, m, w)),
        ("cluster", lambda: nearest(t, p, "cpu-local", m, w)),
        ("workload", lambda: nearest(t, p, c, m, {"seq_len": 256})),
        ("params", lambda: nearest(t, p, c, m, w, params={})),
        ("plans", lambda: render_report(p, c)),
        ("cluster", lambda: render_report(plans, "cpu-local")),
        ("chosen", lambda: render_report(plans, c, chosen=len(plans))),
        ("jobs", lambda: render_report(plans, c, jobs=0)),
        ("winner", lambda: sensitivity(c, m, w, p.model_dump())),
        ("model", lambda: sensitivity(c, "tiny-gpt", w, p)),
        ("params", lambda: sensitivity(c, m, w, p, params=1.0)),
    ])
