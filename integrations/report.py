"""The report: one self-contained HTML page (figures as base64 PNG) explaining why a plan wins.

``render_report`` is what `sp-plan report`, `sp-plan plan --report` and the service's report endpoint call.
"""
from __future__ import annotations

import base64
import html
from datetime import datetime, timezone

from sp_plan.pipeline import mask_line, rank_work
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.errors import PlanError, of_type, whole_number
from sp_plan.planner.plan import Plan
from sp_plan.planner.profile import MeasuredCandidate, Profile
from sp_plan.planner.ranking import largest_extra_cost, mfu_text
from sp_plan.planner.sensitivity import Sensitivity
from sp_plan.workers import forked_map

from .figures import (Figure_, cluster_groups, measured_points, measured_scatter, memory_bars, sensitivity_bars,
                      step_bars)

GIB = 2.0 ** 30
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1200px; color: #222; line-height: 1.4; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; } td.num { text-align: right; }
tr.chosen td { background: #eef4ff; font-weight: 600; }
figure { margin: 0.8em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.85em; max-width: 60em; }
.holds { color: #2e7d32; } .changes { color: #c62828; font-weight: 600; }
.note { background: #fff8e1; border-left: 4px solid #f0c000; padding: 6px 10px; font-size: 0.9em; }
"""
#: marks every figure with whether it decoded (data-rendered, data-natural-width) once the page has loaded;
#: a figure that did not is flagged on the page itself
CHECK_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img.figure"), ok = 0;
  imgs.forEach(function (img) {
    var good = img.complete && img.naturalWidth > 0 && img.naturalHeight > 0;
    img.dataset.naturalWidth = img.naturalWidth; img.dataset.naturalHeight = img.naturalHeight;
    img.dataset.rendered = good ? "yes" : "no"; if (good) { ok++; } else { img.alt = "FIGURE FAILED TO RENDER: " + img.alt; }
  });
  document.body.dataset.figures = imgs.length; document.body.dataset.figuresRendered = ok;
});
"""


def _secs(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _e(x: object) -> str:
    return html.escape(str(x))


def _figure(f: Figure_, fid: str) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (f'<figure id="{fid}"><img class="figure" src="data:image/png;base64,{data}" alt="{_e(f.alt)}">'
            f"<figcaption>{_e(f.caption)}</figcaption></figure>")


def _ranking(plans: list[Plan], chosen: int | None, ranked: int | None = None) -> str:
    """The ranked layouts' table: the leading ``ranked`` rows (None: all) numbered by their rank, the rows after them
    (the best of other variants, a plan file's plan) unnumbered: their ranks lie below and are not counted."""
    rows = []
    win = plans[0]
    for i, p in enumerate(plans):
        pr = p.predicted
        why = "-"
        if i:
            name, extra = largest_extra_cost(p, win)
            why = f"{name} +{_secs(extra)}" if extra > 0 else f"{_secs(pr.step_time_s - win.predicted.step_time_s)} slower"
        cls = ' class="chosen"' if i == chosen else ""
        rank = i + 1 if ranked is None or i < ranked else "-"
        rows.append(f"<tr{cls}><td class=num>{rank}</td><td>{_e(p.summary())}</td><td class=num>{_secs(pr.step_time_s)}</td>"
                    f"<td class=num>{pr.tokens_per_s:,.0f}</td><td class=num>{pr.mfu:.1%}</td>"
                    f"<td class=num>{pr.peak_memory_bytes / GIB:.1f} GiB</td><td>{_e(why)}</td></tr>")
    below = ("" if ranked is None or ranked >= len(plans) else
             "<p>Rows without a rank: the best layout of each other algorithm variant (and a plan file's plan), "
             f"slower than the top {ranked}; their ranks are not counted.</p>")
    return ("<table><tr><th>#</th><th>layout</th><th>step</th><th>tokens/s</th><th>MFU</th><th>peak mem</th>"
            "<th>vs #1: largest extra cost</th></tr>" + "".join(rows) + "</table>" + below)


def _sensitivity(sen: Sensitivity) -> str:
    rows = []
    for s in sen.scenarios:
        verdict = ('<span class="holds">holds</span>' if s.holds else
                   f'<span class="changes">changes</span> to {_e(s.winner.summary())} ({_secs(s.winner.predicted.step_time_s)})')
        rows.append(f"<tr><td>{_e(s.what)}</td><td>{verdict}</td><td class=num>{_secs(s.old_winner_s)} "
                    f"({s.old_winner_s / s.base_s - 1:+.1%})</td><td class=num>{'-' if s.holds else f'{s.loss:.1%}'}</td></tr>")
    head = ("the winner holds under every change" if sen.robust else
            f"the winner changes under {sum(not s.holds for s in sen.scenarios)} of {len(sen.scenarios)} changes")
    return (f"<p>Each row changes one input and ranks every layout again; {head}.</p>"
            "<table><tr><th>change</th><th>winner</th><th>winner's step under it</th>"
            "<th>what keeping the winner loses</th></tr>" + "".join(rows) + "</table>")


def _rank_work(plan: Plan) -> str:
    """The plan's per-rank tokens and score entries on a sample pack, and the imbalance ('' without a mask)."""
    rw = rank_work(plan)
    if rw is None:
        return ""
    pattern = rw.global_pairs is not None
    head = "<th>score entries (windowed layers)</th><th>score entries (global layers)</th>" if pattern else \
        "<th>score entries</th>"
    rows = "".join(f"<tr><td class=num>{r}</td><td class=num>{t:,}</td><td class=num>{x:,}</td>"
                   + (f"<td class=num>{rw.global_pairs[r]:,}</td>" if pattern else "") + "</tr>"
                   for r, (t, x) in enumerate(zip(rw.tokens, rw.pairs, strict=True)))
    extra = f"; {rw.global_imbalance:.3f} on the global layers" if pattern else ""
    return (f"<h2>Per-rank work</h2><p>A sample pack of {rw.documents} document(s) under token layout "
            f"<code>{_e(rw.token_layout)}</code>: imbalance (busiest ring rank / mean) <b>{rw.imbalance:.3f}</b>"
            f"{extra}.</p><table id=rank-work><tr><th>ring rank</th><th>tokens</th>{head}</tr>{rows}</table>")


def _failed(candidates: list[MeasuredCandidate]) -> str:
    bad = [c for c in candidates if c.status != "ok"]
    if not bad:
        return ""
    rows = "".join(f"<tr><td>{_e(c.summary)}</td><td>{_e(c.status)}</td><td>{_e(c.reason)}</td></tr>" for c in bad)
    return ("<p>Candidates that did not run to the end (not in the figure):</p><table><tr><th>candidate</th>"
            "<th>status</th><th>reason</th></tr>" + rows + "</table>")


def _figures(plans: list[Plan], chosen: int | None, cluster: Cluster, plan: Plan, points, sensitivity,
             jobs: int) -> dict[str, Figure_]:
    """The report's figures by name, drawn over ``jobs`` processes (``workers.forked_map``): each is a PNG that
    matplotlib rasterises alone, 0.3-0.8 s apiece, so the page waits for the slowest share, not their sum. The
    cluster's graph, the slowest, is dealt first."""
    todo = {"cluster": lambda: cluster_groups(cluster, plan), "steps": lambda: step_bars(plans, chosen),
            "memory": lambda: memory_bars(plans, chosen)}
    if points:
        todo["measured"] = lambda: measured_scatter(points)
    if sensitivity is not None and sensitivity.scenarios:
        todo["sensitivity"] = lambda: sensitivity_bars(sensitivity)
    drawn = forked_map(lambda draw: draw(), list(todo.values()), jobs)
    return dict(zip(todo, drawn, strict=True))


def _check_arguments(plans, cluster, chosen, jobs, ranked=None) -> None:
    """``render_report``'s arguments, each a PlanError naming it where it is not what the report reads."""
    of_type("plans", plans, (list, tuple), "the list of plans a search returned (sp_plan.plan)")
    of_type("cluster", cluster, Cluster, "sp_plan.load_cluster(name or file)")
    if not plans or any(not isinstance(p, Plan) or p.predicted is None for p in plans):
        raise PlanError("plans", "a report needs ranked plans with predictions", "pass the plans a search returned")
    if chosen is not None:
        whole_number("chosen", chosen, 0, f"pass a plan's index from 0 to {len(plans) - 1}", high=len(plans) - 1)
    whole_number("jobs", jobs, 1, "pass how many processes draw the figures, 1 or more")
    if ranked is not None:
        whole_number("ranked", ranked, 0, f"pass how many leading plans are ranked, 0 to {len(plans)}", high=len(plans))


def render_report(plans: list[Plan], cluster: Cluster, profile: Profile | None = None,
                  measured: list[MeasuredCandidate] | None = None, sensitivity: Sensitivity | None = None,
                  chosen: int | None = 0, notes: list[str] | None = None, jobs: int = 1,
                  ranked: int | None = None) -> str:
    """The HTML report of ranked ``plans`` (fastest first, each with its prediction) on ``cluster``.

    ``profile``: the calibration profile that priced them (its measured candidates feed the predicted-against-
    measured figure); ``measured``: more measured candidates; ``sensitivity``: planner.sensitivity's result;
    ``chosen``: the index of the plan the report is about (the winner by default; its groups are drawn);
    ``notes``: lines shown under the title (e.g. the profile line); ``jobs``: processes that draw the figures (a
    command that owns its host passes its cores; a service's search process draws alone); ``ranked``: how many
    leading plans are the ranking's top, numbered (None: every row numbered in its order)."""
    _check_arguments(plans, cluster, chosen, jobs, ranked)
    plan = plans[chosen if chosen is not None else 0]
    pr = plan.predicted
    m, w = plan.model, plan.workload
    what = ", ".join(x for x in (
        m.name if m else "",
        f"{w.seq_len:,} tokens x {w.batch}, {'causal' if w.causal else 'full'}, {'training' if w.training else 'inference'}"
        if w else "", mask_line(w)) if x)
    candidates = list(profile.candidates if profile else []) + list(measured or [])
    points = measured_points(plans, candidates)
    figs = _figures(plans, chosen, cluster, plan, points, sensitivity, jobs)
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>sp-plan report: {_e(plan.summary())} on {_e(cluster.name)}</title>",
        f"<style>{STYLE}</style><script>{CHECK_SCRIPT}</script></head><body>",
        f"<h1>sp-plan report: {_e(cluster.name)}</h1>",
        f"<p class=meta>{cluster.num_nodes} node(s), {cluster.world_size} x {_e(cluster.device(0).model or cluster.device(0).name)}"
        f" (fingerprint {_e(cluster.fingerprint())}); {_e(what)}; generated "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}</p>",
        *(f"<p class=meta>{_e(n)}</p>" for n in notes or []),
        f"<p><b>{'Plan' if chosen else 'Winner'}: {_e(plan.summary())}</b>: step {_secs(pr.step_time_s)}, "
        f"{pr.tokens_per_s:,.0f} tokens/s, {_e(mfu_text(pr, plan.workload is None or plan.workload.causal))}"
        f", peak memory {pr.peak_memory_bytes / GIB:.1f} GiB of "
        f"{pr.memory_capacity_bytes / GIB:.1f} GiB usable.</p>",
        "<h2>Ranked layouts</h2>", _ranking(plans, chosen, ranked),
        _rank_work(plan),
        _figure(figs["steps"], "fig-steps"),
        "<h2>Memory</h2>", _figure(figs["memory"], "fig-memory"),
        "<h2>Predicted against measured</h2>",
    ]
    if points:
        parts.append(_figure(figs["measured"], "fig-measured"))
        if profile is not None:
            parts.append(f"<p class=meta>{_e(profile.line())}</p>")
    else:
        parts.append('<p class="note">Nothing measured for this cluster yet: run <code>sp-plan tune</code> on it to '
                     "measure the best candidates and calibrate the model; the report then shows predictions against "
                     "measurements.</p>")
    parts.append(_failed(candidates))
    parts += ["<h2>The plan on the cluster</h2>", _figure(figs["cluster"], "fig-cluster")]
    if sensitivity is not None:
        parts += ["<h2>Sensitivity</h2>", _sensitivity(sensitivity)]
        if sensitivity.scenarios:
            parts.append(_figure(figs["sensitivity"], "fig-sensitivity"))
    parts.append("</body></html>")
    return "\n".join(parts)
