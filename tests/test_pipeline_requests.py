"""What a request to the application pipeline (sp_plan.pipeline: `sp-plan`, the Python API and HTTP) means: its
workload's aliases and defaults, the cluster, model and profile it resolves to, the keys its answer and its bayes
study are stored under, the plan a profile's measurements rank first, what an estimate prices, and which row a
report is about."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import sp_plan
from sp_plan import pipeline
from sp_plan.pipeline import (ANSWERING_CODE, ClusterInfo, PlanRequest, mask_line, plan_notes, profile_version,
                              rank_work, report, report_plans, request_key, resolve, run_estimate, run_plan, search,
                              study_name, tree_hash, with_masks)
from sp_plan.planner.model import MAX_SEED, MAX_TRIALS, Workload
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import MeasuredCandidate, Profile
from sp_plan.profiles import load_cluster, load_model
from sp_plan.profiles.resolve import resolve_params
from sp_plan.profiles.store import Store

CLUSTER, MODEL = load_cluster("dgx-h100"), load_model("llama3-8b")
WORK = Workload(seq_len=131072, batch=1)
#: a request's fields as POST /v1/plan takes them, with no profile (the store is not read)
BASE = dict(cluster="dgx-h100", model="llama3-8b", workload={"seq_len": "128k"}, use_profile=False)


def request(**kw) -> PlanRequest:
    return PlanRequest(**{**BASE, **kw})


def _ran(p: Plan, seconds: float) -> MeasuredCandidate:
    """A candidate a tune ran: layout ``p`` measured at ``seconds`` a step (as test_measured_rank's)."""
    return MeasuredCandidate(summary=p.summary(), plan=p.model_dump(mode="json"), model=p.model.name,
                             seq_len=p.workload.seq_len, measured_s=seconds, measured_memory=1e9)


@pytest.fixture(scope="module")
def searched():
    """The presets' answer for llama3-8b at 128k on one dgx-h100 node, with no profile: top 3 and families."""
    req = PlanRequest(cluster=CLUSTER, model=MODEL, workload=WORK, top=3, families=True, use_profile=False)
    return search(req, resolve(req, files=False))


@pytest.fixture(scope="module")
def short():
    """The same at 32k, top 3 and families: the rows a report is built from."""
    return run_plan({**BASE, "workload": {"seq_len": "32k"}, "top": 3, "families": True})


# ---- the request's workload and defaults

def test_a_request_for_inference_is_priced_as_inference():
    assert request(workload={"seq_len": "128k", "inference": True}).workload.training is False
    assert request(workload={"seq_len": "128k", "inference": False}).workload.training is True
    with pytest.raises(sp_plan.PlanError) as e:
        request(workload={"seq_len": "128k", "inference": True, "training": True})
    assert e.value.field == "workload.inference"


def test_a_layer_pattern_needs_an_integer_window_not_a_boolean():
    w = request(workload={"seq_len": "128k", "window": 4096, "window_pattern": "5:1"}).workload
    assert (w.window.size, w.window.pattern) == (4096, "5:1")
    with pytest.raises(sp_plan.PlanError) as e:
        request(workload={"seq_len": "128k", "window": True, "window_pattern": "5:1"})
    assert e.value.field == "workload.window_pattern"


def test_a_request_returns_five_rows_unless_it_asks_and_takes_the_documented_maxima():
    assert request().top == 5
    assert request(search="bayes", trials=MAX_TRIALS, seed=MAX_SEED).trials == MAX_TRIALS
    for field, value in (("trials", MAX_TRIALS + 1), ("seed", MAX_SEED + 1)):
        with pytest.raises(sp_plan.PlanError) as e:
            request(search="bayes", **{field: value})
        assert e.value.field == field


def test_a_seed_given_for_a_workload_with_documents_is_kept():
    w = with_masks(WORK, documents="magi-short", seed=0)
    again = with_masks(w, seed=7)
    assert again.seed == 7 and again.documents == w.documents


# ---- what a request resolves to

def test_an_inline_cluster_of_other_nodes_than_asked_is_refused():
    two = load_cluster("dgx-h100", 2)
    assert resolve(request(cluster=two, nodes=2), files=False).cluster.num_nodes == 2
    for nodes in (1, 4):
        with pytest.raises(sp_plan.PlanError) as e:
            resolve(request(cluster=two, nodes=nodes), files=False)
        assert e.value.field == "nodes"


def test_a_world_of_exactly_the_limit_is_planned_and_one_more_rank_is_refused():
    assert resolve(request(), max_world=8, files=False).cluster.world_size == 8
    with pytest.raises(sp_plan.PlanError) as e:
        resolve(request(), max_world=7, files=False)
    assert e.value.field == "cluster"


@pytest.fixture()
def store(tmp_path):
    """A store holding profile p1 of the dgx-h100 node."""
    st = Store(f"sqlite:///{tmp_path}/store.db")
    st.save_profile(Profile(id="p1", cluster="dgx-h100", cluster_fingerprint=CLUSTER.topology_fingerprint()))
    yield st
    st.close()


def test_use_profile_false_prices_without_the_stored_profile(store):
    assert resolve(request(use_profile=True), store, files=False).profile.id == "p1"
    assert resolve(request(), store, files=False).profile is None
    with pytest.raises(sp_plan.PlanError) as e:
        resolve(request(profile="p1"), store, files=False)
    assert e.value.field == "profile"


def test_a_service_request_names_a_preset_model_not_a_file_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("llama3-8b").write_text("name: other\nlayers: 2\nhidden: 64\nheads: 2\nkv_heads: 2\nffn_hidden: 128\n"
                                 "vocab: 100\n")
    assert resolve(request(model="./llama3-8b")).model.name == "other"  # a model file the CLI would read
    assert resolve(request(), files=False).model == MODEL


# ---- the keys an answer and a bayes study are stored under

def key(**kw) -> str:
    req = request(**kw)
    return request_key(req, resolve(req, files=False))


def test_requests_that_differ_in_top_seed_or_model_get_different_answers_keys():
    assert key() == key()
    assert key(top=3) != key(top=5)
    assert key(search="bayes", seed=0) != key(search="bayes", seed=1)
    assert key(model="llama3-70b") != key()
    assert key(search="bayes") != key()


def test_a_profile_replaced_under_its_id_gets_a_new_version_and_key():
    p1 = Profile(id="x", cluster="dgx-h100", cluster_fingerprint=CLUSTER.topology_fingerprint())
    p2 = p1.model_copy(update={"params": p1.params.model_copy(update={"overlap": 0.3})})
    assert profile_version(p1) != profile_version(p2) and profile_version(None) is None
    req = request()
    inputs = resolve(req, files=False)
    keys = set()
    for prof in (None, p1, p2):
        inputs.profile = prof  # the same request and profile line, priced with each
        keys.add(request_key(req, inputs))
    assert len(keys) == 3


def test_an_answers_code_version_follows_the_search_and_its_worker_processes(tmp_path):
    """Every module an answer is computed by is under ANSWERING_CODE: changing its bytes changes the hash."""
    root = Path(pipeline.__file__).parent
    for mod in ("workers", "pipeline", "planner.search", "planner.estimate", "profiles.kernels"):
        rel = Path(importlib.import_module(f"sp_plan.{mod}").__file__).relative_to(root)
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("a = 1\n")
        before = tree_hash(tmp_path, ANSWERING_CODE)
        f.write_text("a = 2\n")
        assert tree_hash(tmp_path, ANSWERING_CODE) != before, rel


def study(workload: dict) -> str:
    return study_name(resolve(request(workload=workload), files=False))


def test_a_bayes_study_is_named_by_its_window_and_its_documents_seed():
    assert study({"seq_len": "128k", "window": 4096}) != study({"seq_len": "128k", "window": 8192})
    docs = {"seq_len": "128k", "documents": "magi-short"}
    assert study({**docs, "seed": 0}) != study({**docs, "seed": 1})
    assert study({**docs, "seed": 1}) == study({**docs, "seed": 1})


# ---- a profile's measurements

def test_a_profiles_measured_candidate_ranks_the_plan_as_measured_and_in_the_families_table_too(searched):
    fam = searched.families[2]  # not the best variant: measured at a third of the best prediction
    params = resolve_params(CLUSTER, False)[0]
    prof = Profile(id="p1", cluster=CLUSTER.name, cluster_fingerprint=CLUSTER.topology_fingerprint(),
                   params=params, candidates=[_ran(fam, searched.plans[0].predicted.step_time_s / 3)])
    req = PlanRequest(cluster=CLUSTER, model=MODEL, workload=WORK, top=3, families=True)
    got = search(req, resolve(req, profile=prof, files=False))
    assert got.winner.summary() == fam.summary() and got.winner.measured is not None
    assert got.plans[0].summary() == fam.summary() and got.plans[0].measured.profile == "p1"
    assert got.families[0].summary() == fam.summary() and got.families[0].measured is not None


# ---- an estimate

def estimated(plan: Plan, **kw):
    return run_estimate({"plan": plan.model_dump(mode="json"), "cluster": "dgx-h100", "use_profile": False, **kw},
                        files=False)


def test_estimating_a_plan_file_with_another_model_prices_that_model(short):
    p = short.winner
    other = estimated(p, model="llama3-70b")
    assert other.model.name == "llama3-70b"
    assert other.plan.predicted == sp_plan.estimate(p, CLUSTER, "llama3-70b", profile=False)
    assert other.plan.predicted.step_time_s > estimated(p).plan.predicted.step_time_s


def test_an_estimate_over_http_keeps_the_plans_masks_where_its_workload_sets_none():
    """POST /v1/estimate and Client.estimate price a plan as the Python API does: the plan's documents, window and
    seed stay where the workload given sets none; a workload that sets documents (null included) has its own."""
    docs = with_masks(Workload(seq_len=32768), documents="magi-short", seed=3, window=4096)
    p = run_plan({**BASE, "workload": docs.model_dump(mode="json"), "top": 1}).winner
    e = estimated(p, workload={"seq_len": "32k", "batch": 2})
    assert (e.workload.documents, e.workload.window, e.workload.seed, e.workload.batch) == \
        (docs.documents, docs.window, 3, 2)
    assert e.plan.predicted == sp_plan.estimate(p, CLUSTER, workload={"seq_len": "32k", "batch": 2}, profile=False)
    assert estimated(p, workload={"seq_len": "32k", "documents": None}).workload.documents is None


def test_an_estimate_without_a_profile_names_none_whatever_the_plan_file_said(short):
    e = estimated(short.winner.model_copy(update={"profile": "oldprof"}))
    assert e.profile is None and e.plan.profile is None


def test_an_answers_topology_fingerprint_is_the_one_profiles_are_stored_under(short):
    c = load_cluster("dgx-h100", 2)
    info = ClusterInfo.of(c)
    assert info.topology_fingerprint == c.topology_fingerprint() != c.fingerprint()
    assert info.fingerprint == c.fingerprint()
    assert estimated(short.winner).cluster.topology_fingerprint == CLUSTER.topology_fingerprint()
    assert short.cluster.topology_fingerprint == CLUSTER.topology_fingerprint()


def test_an_inference_plan_with_checkpointing_says_it_is_priced_without_it():
    p = Plan(algorithm="usp", degrees={"ulysses": 8, "ring": 2}, order=["ulysses", "ring"], zero_stage=0,
             checkpointing="full")
    notes = plan_notes(p, Workload(seq_len=65536, training=False))
    assert any(n.startswith("inference: zero0 and checkpointing full are priced as zero0") for n in notes)
    assert not plan_notes(p, Workload(seq_len=65536))


def test_a_plans_work_counts_the_documents_of_its_sample_pack(short):
    w = with_masks(WORK, documents=[65536])  # two documents fill 128k exactly
    p = short.winner.model_copy(update={"workload": w})
    assert rank_work(p).documents == 2
    assert rank_work(short.winner) is None  # no mask to show


def test_a_bidirectional_window_is_said_to_reach_each_way_and_a_causal_one_is_not():
    assert mask_line(Workload(seq_len=8192, window={"size": 1024})) == "window 1024"
    assert mask_line(Workload(seq_len=8192, causal=False, window={"size": 1024})) == "window 1024 each way"


# ---- a report

def test_a_report_about_a_plan_file_highlights_that_plan_in_step_time_order(short):
    top = {p.summary() for p in short.plans}
    others = [f for f in short.families if f.summary() not in top]
    given = others[-1]  # the slowest variant's best, as a plan file holds it
    rows, chosen, _ = report_plans(short.plans, others[:-1], given)
    assert rows[chosen].summary() == given.summary() and chosen > 0
    steps = [r.predicted.step_time_s for r in rows]
    assert steps == sorted(steps)
    middle = others[0]  # faster than some rows, slower than the top
    rows, chosen, _ = report_plans(short.plans, others[1:], middle)
    assert rows[chosen].summary() == middle.summary() and 0 < chosen < len(rows) - 1
    assert [r.predicted.step_time_s for r in rows] == sorted(r.predicted.step_time_s for r in rows)


def test_a_report_reprices_the_plan_file_here(short):
    seen = {p.summary() for p in short.plans + short.families}
    given = next(g for g in (short.winner.model_copy(update=u) for u in ({"checkpointing": "full"}, {"zero_stage": 3}))
                 if g.summary() not in seen)
    stale = given.model_copy(update={"predicted": given.predicted.model_copy(update={"step_time_s": 99.0})})
    r = report("dgx-h100", "llama3-8b", {"seq_len": "32k"}, given=stale, top=2, sensitivity=False, profile=False)
    row = r.rows[r.chosen]
    assert row.summary() == given.summary()
    assert row.predicted == sp_plan.estimate(given, CLUSTER, profile=False)
    assert row.predicted.step_time_s < 99.0
