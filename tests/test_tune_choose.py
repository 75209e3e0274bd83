"""Tune's choice of what to measure: diversified pool, chance to beat the best measured, stopping rule."""
import math
import statistics

from sp_plan.planner.plan import Plan
from sp_plan.profiles.tune.choose import (PRIOR_SIGMA, chance_to_beat, diversify, family, next_candidate, sigma_from,
                                         with_families)


def _plan(alg, u, r, order=None, layout="contiguous"):
    return Plan(algorithm=alg, degrees={"ulysses": u, "ring": r}, order=order or [], token_layout=layout)


def test_diversify_drops_mesh_orders_of_one_layout():
    plans = [_plan("usp", 2, 2, ["ulysses", "ring"]), _plan("usp", 2, 2, ["ring", "ulysses"]),
             _plan("ring", 1, 4), _plan("ring", 1, 4, layout="zigzag"), _plan("ulysses", 4, 1)]
    got = diversify(plans, 10)
    assert [p.summary() for p in got] == [plans[0].summary(), plans[2].summary(), plans[3].summary(),
                                          plans[4].summary()]
    assert len(diversify(plans, 2)) == 2


def test_chance_to_beat_is_a_lognormal_tail():
    assert math.isclose(chance_to_beat(0.99, 1.0, 0.3, margin=0.01), 0.5, abs_tol=1e-12)
    assert chance_to_beat(0.5, 1.0, 0.1) > 0.99
    assert chance_to_beat(2.0, 1.0, 0.1) < 1e-6
    # more uncertainty: a predicted loser has a better chance
    assert chance_to_beat(1.5, 1.0, 0.5) > chance_to_beat(1.5, 1.0, 0.2)


def test_sigma_from_loo_error():
    assert sigma_from(None) == PRIOR_SIGMA
    assert sigma_from(0.0) > 0
    assert math.isclose(sigma_from(0.2), math.log(1.2) / 0.674)
    assert sigma_from(0.01, measured=2) == PRIOR_SIGMA  # two points make no leave-one-out error


def test_next_candidate_first_the_models_best_then_the_likeliest_winner_then_stop():
    preds = [3.0, 1.0, 2.0, 1.05]
    c = next_candidate(preds, [False] * 4, None, 0.3)
    assert c.index == 1
    # measured index 1 at 1.2 s: index 3 (pred 1.05) is the likeliest to beat it
    c = next_candidate(preds, [False, True, False, False], 1.2, 0.3)
    assert c.index == 3 and 0 < c.chance < 1
    # a confident model with nothing close: stop, once enough candidates were measured to trust it
    c = next_candidate(preds, [True, True, False, True], 1.0, 0.05)
    assert c.index is None and "chance" in c.why
    c = next_candidate(preds, [False, True, False, True], 1.0, 0.05)
    assert c.index is not None
    c = next_candidate(preds, [True] * 4, 1.0, 0.3)
    assert c.index is None


def _deg(alg, **d):
    return Plan(algorithm=alg, degrees=d, order=[], token_layout="contiguous")


def test_family_names_the_term_a_layout_exercises():
    assert family(_deg("ring", pp=2, ring=2)) == "pp"
    assert family(_deg("metp", tp=4)) == "metp"  # its own TP: no Megatron TP-sp collective to fit
    assert family(_deg("ring", tp=2, ring=2)) == "tp"
    assert family(_deg("usp", ulysses=2, ring=2)) == "ulysses"
    assert family(_deg("ring", ring=4)) == "ring"
    assert family(_deg("ring", dp=4)) == "dp"
    # a pipeline with TP is "pp", METP's included: its measurement is the one that tells the per-layer cost
    assert family(_deg("ring", pp=2, tp=2)) == "pp" and family(_deg("metp", pp=2, tp=2)) == "pp"


def test_diversify_keeps_layouts_that_differ_only_in_placement():
    plans = [Plan(algorithm="wallfacer", degrees={"ring": 4, "team": 2}, order=[], token_layout="contiguous",
                  placement=where) for where in ("collective_intra", "p2p_intra")]
    assert len(diversify(plans, 2)) == 2


def test_a_family_that_alone_identifies_a_parameter_is_measured_however_slow_its_prediction():
    from sp_plan.profiles.tune.choose import unexplored

    assert unexplored([1.0, 3.0, 1.1], [True, False, False], ["ring", "pp", "ulysses"]) == 1
    assert unexplored([1.0, 3.0, 1.1], [True, False, False], ["ring", "tp", "ulysses"]) == 1


def test_the_chosen_candidate_stays_where_it_and_the_quickest_others_fill_the_fit_in_time():
    from sp_plan.profiles.tune.choose import quickest_for_fit

    assert quickest_for_fit(0, [5, 1, 2], [False] * 3, 2, 6.0) == 0  # 5 + 1 fits 6 s
    assert quickest_for_fit(0, [5, 1, 2], [False] * 3, 2, 5.5) == 1  # it does not: the quickest first
    assert quickest_for_fit(0, [5, 1, 2], [False] * 3, 3, 8.0) == 0 and quickest_for_fit(0, [5, 1, 2], [False] * 3, 3, 7.5) == 1


def test_with_families_adds_the_best_of_each_missing_family_once():
    ranked = [_deg("ring", ring=4), _deg("ulysses", ulysses=4), _deg("ring", tp=2, ring=2), _deg("ring", tp=4),
              _deg("ring", pp=2, ring=2), _deg("ring", pp=4)]
    got = with_families(ranked[:2], ranked)
    assert [p.summary() for p in got] == [p.summary() for p in ranked[:3] + ranked[4:5]]


def test_tune_explores_contender_families_then_chooses_the_likeliest_winner():
    preds = [1.0, 1.02, 1.5, 1.8, 2.5]  # ring, ring, tp, pp, ulysses (ulysses: not a contender, > 2x)
    fams = ["ring", "ring", "tp", "pp", "ulysses"]
    done = [True, False, False, False, False]
    c = next_candidate(preds, done, 1.0, 0.3, families=fams, explore=3)
    assert c.index == 2 and "tp" in c.why
    done[2] = True
    c = next_candidate(preds, done, 1.0, 0.3, families=fams, explore=2)
    assert c.index == 3 and "pp" in c.why
    done[3] = True
    # every contender family measured: back to the chance rule (the ring layout at 1.02)
    assert next_candidate(preds, done, 1.0, 0.3, families=fams, explore=1).index == 1
    # no exploring left in the budget: the chance rule at once
    assert next_candidate(preds, [True, False, False, False, False], 1.0, 0.3, families=fams, explore=0).index == 1
    # the model's best first, whatever the families
    assert next_candidate(preds, [False] * 5, None, 0.3, families=fams, explore=4).index == 0


def test_families_that_alone_identify_a_parameter_are_explored_before_faster_contenders():
    from sp_plan.profiles.tune.choose import unexplored

    fams = ["ring", "ulysses", "tp", "pp", "metp"]
    pred = [1.0, 1.1, 1.6, 1.9, 1.2]
    done = [True, False, False, False, False]
    assert fams[unexplored(pred, done, fams)] == "tp"  # tp and pp before the faster ulysses and metp
    assert fams[unexplored(pred, [True, False, True, False, False], fams)] == "pp"
    assert fams[unexplored(pred, [True, False, True, True, False], fams)] == "ulysses"
    assert unexplored([1.0, 2.5], [True, False], ["ring", "ulysses"]) is None  # beyond 2x: not a contender


def test_contenders_are_the_best_and_the_runners_up_within_reach():
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.run import TuneOptions, confirmed, contenders

    def mc(name, s, status="ok"):
        return MeasuredCandidate(summary=name, plan={}, measured_s=s if status == "ok" else None, status=status)

    opts = TuneOptions()
    near = {n: mc(n, s) for n, s in (("a", 0.60), ("b", 0.568), ("c", 0.9))}
    assert contenders(near, opts) == ["b", "a"]  # 0.60 is within 10 % of 0.568; c is not
    crowd = {n: mc(n, s) for n, s in (("a", 0.907), ("b", 0.902), ("c", 0.944), ("d", 0.95), ("e", 1.2))}
    assert contenders(crowd, opts) == ["b", "a", "c"]  # three at most, fastest first
    assert contenders({n: mc(n, s) for n, s in (("a", 0.70), ("b", 0.568))}, opts) == []  # 23 % apart: one reading will do
    assert contenders({"a": mc("a", 0.5), "x": mc("x", 0.0, "oom")}, opts) == []  # nothing to tell apart
    assert contenders(near, TuneOptions(confirm=0)) == []
    # one reading put a layout out of reach that the calibrated model puts within it: it contends too
    apart = {n: mc(n, s) for n, s in (("u8", 0.833), ("t8", 0.905), ("usp", 0.993), ("pp", 1.26))}
    assert contenders(apart, opts) == ["u8", "t8"]
    assert contenders(apart, opts, {"usp": 0.910, "pp": 1.0, "u8": 0.888}) == ["u8", "t8", "usp"]
    assert contenders({n: apart[n] for n in ("u8", "usp")}, opts, {"usp": 0.95}) == []  # predicted out of reach too
    c = confirmed(near["a"], [0.60, 0.55, 0.70])
    assert c.measured_s == 0.55 and c.detail["readings_s"] == [0.60, 0.55, 0.70] and near["a"].measured_s == 0.60


def test_runners_up_within_the_spread_the_contenders_readings_showed_contend_next():
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.run import TuneOptions, confirmed, contenders, reading_spread

    def mc(name, s, readings=None):
        return MeasuredCandidate(summary=name, plan={}, measured_s=s, status="ok",
                                 detail={"readings_s": readings} if readings else {})

    # readings of a tune on two hosts: two contenders read thrice, the head-to-head fastest once, 15 % behind
    read = {"ring4": confirmed(mc("ring4", 1.352), [1.352, 1.381, 1.707]),
            "usp": confirmed(mc("usp", 1.434), [1.434, 1.631, 1.433]),
            "pp2": mc("pp2", 1.552), "tp": mc("tp", 1.818, [1.914, 1.818])}
    spread = reading_spread(read, ["ring4", "usp"])
    assert abs(spread - statistics.median([1.707 / 1.352 - 1, 1.631 / 1.433 - 1])) < 1e-12
    opts = TuneOptions()
    assert contenders(read, opts, None, opts.confirm_within, ["ring4", "usp"]) == []  # within 10 %: no one new
    assert contenders(read, opts, None, spread, ["ring4", "usp"]) == ["pp2"]  # within 20 %: read it too
    assert contenders(read, opts, None, 1.0, ["ring4", "usp"]) == ["pp2"]  # three in all at most
    assert contenders(read, opts, None, 1.0, ["ring4", "usp", "tp"]) == []
    assert reading_spread(read, ["pp2"]) is None and reading_spread(read, []) is None


def test_with_a_wide_leave_one_out_error_the_likeliest_runners_up_contend():
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.run import TuneOptions, contenders

    # readings of a tune on two hosts: the head-to-head fastest layout read 1.726 s once, predicted 1.450 s; the calibrated
    # model's leave-one-out error 24.5 %
    read = {n: MeasuredCandidate(summary=n, plan={}, measured_s=s, status="ok") for n, s in
            (("u2pp2", 1.299), ("ring4", 1.437), ("usp", 1.518), ("trpp2", 1.726), ("tp", 1.954))}
    pred = {"u2pp2": 1.460, "ring4": 1.470, "usp": 1.476, "trpp2": 1.450, "tp": 1.954}
    assert contenders(read, TuneOptions(), pred) == []  # within 10 %: none, by reading or prediction
    # within 24.5 % (1.617 s): four, the likeliest three by the faster of reading and prediction
    assert contenders(read, TuneOptions(), pred, 0.245) == ["u2pp2", "ring4", "trpp2"]


def test_contenders_are_read_again_in_rounds():
    from sp_plan.profiles.tune.run import confirm_order

    assert confirm_order(["b", "a", "c"], 2) == [("b", 0), ("a", 0), ("c", 0), ("b", 1), ("a", 1), ("c", 1)]
    assert confirm_order(["b", "a"], 0) == [] and confirm_order([], 3) == []


def test_a_reading_whose_stacks_extrapolate_unsoundly_is_kept_out_and_one_making_no_step_is_read_again():
    """A reading extrapolates its stacks' difference to the model's depth: one whose larger stack timed no slower than
    its smaller one (the fit ``clamped``) extrapolates the smaller stack's time, and one whose per-layer time is under
    half its readings' median was lowered by noise in its smaller stack; the minimum would keep exactly these. They
    are recorded, kept out of the minimum and of the readings' spread, and a candidate read once clamped is read
    again first."""
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.readings import confirmed, fits_of, impossible, kept, reading_spread

    def mc(name, s, clamped=False, per=0.08):
        return MeasuredCandidate(summary=name, plan={}, measured_s=s, status="ok",
                                 detail={"fit": {"fwd_bwd_s": {"clamped": clamped, "per_layer": 0.0 if clamped else per}}})

    bad, good = mc("tp2", 0.131, clamped=True), mc("ring2", 0.6)
    assert fits_of(bad) == [[True, 0.0]] and fits_of(good) == [[False, 0.08]]
    assert impossible([good, bad, mc("x", 0.2, True).model_copy(update={"status": "oom"})], 2) == ["tp2"]
    assert impossible([bad], 0) == []
    read = confirmed(bad, [0.131, 0.951, 0.579], [[True, 0.0], [False, 0.116], [False, 0.057]])
    assert read.measured_s == 0.579 and read.detail["readings_s"] == [0.131, 0.951, 0.579]
    assert fits_of(read)[0] == [True, 0.0] and impossible([read], 2) == []
    # a per-layer time far under its siblings': 1.2 ms against 80 and 60 (the median's half is 30)
    assert kept([0.703, 0.110, 0.559], [[False, 0.08], [False, 0.0012], [False, 0.06]]) == [0.703, 0.559]
    assert kept([0.5, 0.45], [[False, 0.05], [False, 0.04]]) == [0.5, 0.45]  # alike: both may be kept
    assert kept([0.5, 0.45], [[False, 0.05], [False, None]]) == [0.5, 0.45]  # an older reading: no per-layer time
    assert confirmed(bad, [0.131, 0.2], [[True, 0.0], [True, 0.0]]).measured_s == 0.131  # none sound: as read
    assert confirmed(good, [0.6, 0.5]).measured_s == 0.5 and fits_of(confirmed(good, [0.6, 0.5])) == [[False, None]] * 2
    assert reading_spread({"tp2": read}, ["tp2"]) == 0.951 / 0.579 - 1


def test_one_confirm_reading_still_reads_the_contenders():
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.run import TuneOptions, contenders

    near = {n: MeasuredCandidate(summary=n, plan={}, measured_s=s) for n, s in (("a", 0.60), ("b", 0.568))}
    assert contenders(near, TuneOptions(confirm=1)) == ["b", "a"]
    assert contenders(near, TuneOptions(confirm=0)) == []


def test_a_reading_is_kept_unless_clamped_or_its_layer_time_is_under_half_the_median():
    from sp_plan.planner.profile import MeasuredCandidate
    from sp_plan.profiles.tune.readings import confirmed, fits_of, kept

    assert kept([1.0, 0.6], [[False, 0.1], [False, 0.01]]) == [1.0]  # two readings: the median of two slopes
    assert kept([1.0, 0.5], [[False, None], [True, None]]) == [1.0]  # clamped: no step runs that fast
    assert confirmed(MeasuredCandidate(summary="a", plan={}, measured_s=1.0), [1.0, 0.5],
                     [[False, None], [True, None]]).measured_s == 1.0
    mc = MeasuredCandidate(summary="a", plan={}, measured_s=0.8,
                           detail={"readings_s": [1.0, 0.8, 1.2], "readings_fit": [[True, 0.1]]})
    assert len(fits_of(mc)) == 3  # a fit per reading, whatever was stored
