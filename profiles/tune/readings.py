"""A measured candidate's readings: which to read again (surprises, contenders), and what to keep of them.

Whatever else runs on the hosts only adds time to a reading, so a candidate read more than once is kept at its
fastest reading of those its stacks extrapolate soundly (``kept``); the readings worth taking again are those
whose stacks make no step (``impossible``), those the model says are too slow (``surprises``) and those too close
to the best to rank on one reading (``contenders``). Pure functions of the readings and the fit.
"""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from sp_plan.planner.calibration import FitResult
from sp_plan.planner.profile import MeasuredCandidate

from .choose import MIN_MEASURED
from .settings import SETTINGS, TuneSettings

if TYPE_CHECKING:
    from .run import TuneOptions


def surprises(result: FitResult | None, measured: list[MeasuredCandidate], most: int,
              settings: TuneSettings = SETTINGS) -> list[str]:
    """Of ``measured``, the candidates ``result`` was fitted to, in its order (``result.loo_times`` line up with
    them), those read once whose step reads slower than the fit without them predicts by more than
    max(surprise_floor, surprise_spread x the median leave-one-out error), the largest excess first, ``most`` at most.
    Whatever else runs on the hosts only adds time, so a reading far above what the other candidates predict is the
    likeliest to hold a slow spell, and being one of a few it moves the whole fit: on two hosts of 2 CPU ranks a
    tune read `ring ring2 pp2 contiguous` at 2.08 s, 50 % over its leave-one-out prediction (ground truth 1.26 s);
    the fit priced the pipelines' compute by it, and ranked the ground truth's layouts at Spearman 0.67 (0.84 fitted
    without that reading). A reading faster than predicted is not a surprise of this kind: it is left as read. With
    fewer than MIN_MEASURED timed candidates the leave-one-out error means nothing, and nothing is a surprise."""
    timed = [mc for mc in measured if mc.status == "ok" and mc.measured_s]
    if result is None or most < 1 or result.loo_error_after is None or len(timed) < MIN_MEASURED:
        return []
    reach = max(settings.surprise_floor, settings.surprise_spread * result.loo_error_after)
    excess = {}
    for mc, loo in zip(measured, result.loo_times):
        once = len(readings_of(mc)) == 1
        if mc.status == "ok" and mc.measured_s and loo and once and mc.measured_s / loo - 1 > reach:
            excess[mc.summary] = mc.measured_s / loo - 1
    return sorted(excess, key=lambda n: -excess[n])[:most]


def contenders(measured: dict[str, MeasuredCandidate], opts: TuneOptions,
               predicted: dict[str, float] | None = None, reach: float | None = None,
               done: list[str] | tuple = ()) -> list[str]:
    """The best measured candidate and the runners-up within ``reach`` (default ``opts.confirm_within``) of it,
    measured or as the calibrated model predicts them (``predicted``: summary -> seconds), the likeliest first (by the
    faster of the two: whatever else runs on the hosts only adds time to a reading), those in ``done`` (read again
    already) left out, ``settings.max_contenders`` in all at most; none when no runner-up is that close: one reading each decides
    between them. On 4 CPU ranks sharing two cores a tune read two layouts 568 and 596 ms whose medians of three
    passes are 598 and 554 ms; on 8, one at 944 ms (the third within 5 % of the best) whose median of two passes is
    the best of the five, 868 ms, and one at 993 ms, predicted at 910 ms, within 10 % of the best's 833 ms, whose two
    passes read 845 and 809 ms. tune passes as ``reach`` the model's leave-one-out error where it is wider than 10 %
    (a reading or a prediction is off by as much), then the spread of the contenders' readings."""
    ok = sorted((m for m in measured.values() if m.status == "ok" and m.measured_s), key=lambda m: m.measured_s)
    if not ok or opts.confirm < 1:
        return []
    top = ok[0].measured_s * (1 + (opts.confirm_within if reach is None else reach))
    pred = predicted or {}
    likely = {m.summary: min(m.measured_s, pred.get(m.summary, float("inf"))) for m in ok}
    near = sorted((n for n in likely if likely[n] <= top), key=lambda n: likely[n])
    if len(near) < 2:
        return []
    return [n for n in near if n not in done][:max(opts.settings.max_contenders - len(done), 0)]


def reading_spread(measured: dict[str, MeasuredCandidate], names: list[str]) -> float | None:
    """The median over ``names`` (read more than once) of a candidate's slowest reading over its fastest (of those
    ``kept``), less 1:
    the noise of one reading on these hosts, as the tune itself read it (None without such candidates). The
    confirm step reads the runners-up within it too: on two hosts of 2 CPU ranks a tune read its contenders
    `ring ring4 contiguous` at 1.352, 1.381 and 1.707 s and `usp ulysses2 ring2` at 1.434, 1.631 and 1.433 s (a
    spread of 20 %), and the head-to-head fastest layout, `tokenring ring2 pp2`, once at 1.552 s, 15 % behind."""
    valid = (kept(readings_of(measured[n]), fits_of(measured[n])) for n in names if n in measured)
    spreads = [max(r) / min(r) - 1 for r in valid if len(r) > 1 and min(r) > 0]
    return float(statistics.median(spreads)) if spreads else None


def confirm_order(todo: list[str], confirm: int) -> list[tuple[str, int]]:
    """The confirm step's readings, (contender, k), in rounds: every contender's k-th reading before any one's
    (k+1)-th, so that a slow spell of the hosts lands on several contenders' readings, not on one contender's
    (a randomized-block design's blocks: the reread passes of bench_tune's kept 8-rank truth ran at 0.95-1.42 of its
    first pass's speed)."""
    return [(name, k) for k in range(confirm) for name in todo]


def readings_of(mc: MeasuredCandidate) -> list[float]:
    """A measured candidate's step readings: those kept in ``detail['readings_s']`` (``confirmed``), else its one."""
    return list(mc.detail.get("readings_s") or [mc.measured_s])


def fit_of(detail: dict) -> list:
    """A reading's [clamped, per_layer] (``candidate.extrapolate``'s fit of fwd_bwd_s): whether its stacks timed the
    larger no slower than the smaller (no step can be, so its extrapolation to the model's depth is the smaller
    stack's time, not a reading of the layout), and the seconds a layer adds (None where not recorded)."""
    fit = (detail.get("fit") or {}).get("fwd_bwd_s") or {}
    return [bool(fit.get("clamped")), fit.get("per_layer")]


def fits_of(mc: MeasuredCandidate) -> list[list]:
    """Per reading of ``readings_of(mc)``, its ``fit_of`` (kept in ``detail['readings_fit']``)."""
    fits = mc.detail.get("readings_fit")
    n = len(readings_of(mc))
    if fits is not None and len(fits) == n:
        return [list(f) for f in fits]
    return [fit_of(mc.detail)] + [[False, None]] * (n - 1)


def kept(readings: list[float], fits: list[list]) -> list[float]:
    """The readings a candidate may be kept at (all of them where none is): not ``clamped``, and with a per-layer
    time at least half the median of its readings'. A reading extrapolates its two stacks' difference to the model's
    depth, so noise in either moves it both ways (more in the smaller stack lowers it), and the fastest reading is
    then the one whose smaller stack ran slowest, not the quietest: on a 2-core host beside other work one layout
    read 90 ms for its 2-layer stack after 119 ms for its 1-layer one, extrapolated to 131 ms against its other
    readings of 579 and 951 ms, and another 82 ms after 81 ms, 110 ms against 559 and 703 ms."""
    slopes = [f[1] for f in fits if f[1] is not None]
    floor = statistics.median(slopes) / 2 if len(slopes) > 1 else None
    good = [r for r, (clamp, per) in zip(readings, fits)
            if not clamp and (floor is None or per is None or per >= floor)]
    return good or list(readings)


def impossible(measured: list[MeasuredCandidate], most: int) -> list[str]:
    """The candidates read once whose one reading is ``clamped``: read again before anything ranks by them."""
    return [mc.summary for mc in measured
            if mc.status == "ok" and len(readings_of(mc)) == 1 and fits_of(mc)[0][0]][:max(most, 0)]


def confirmed(mc: MeasuredCandidate, readings: list[float], fits: list[list] | None = None) -> MeasuredCandidate:
    """``mc`` at the fastest of its step-time readings that may be ``kept`` (``fits``: each one's ``fit_of``), all
    kept in ``detail['readings_s']`` and their fits in ``detail['readings_fit']``. Whatever else runs on the hosts
    only adds time (timeit's rule: the minimum, not the mean, measures the code); on two hosts of 2 CPU ranks each a
    layout read 1.21, 1.80 and 1.78 s in three passes of a ground truth, and 1.28-1.30 s in three readings taken
    later beside nine other layouts, whose medians matched each layout's fastest pass within 7 % and its median
    pass only within 45 %."""
    fits = [[False, None]] * len(readings) if fits is None else [list(f) for f in fits]
    return mc.model_copy(update={"measured_s": min(kept(readings, fits)),
                                 "detail": {**mc.detail, "readings_s": list(readings), "readings_fit": fits}})
