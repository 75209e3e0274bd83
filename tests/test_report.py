"""The HTML report: self-contained, every figure there; `sp-plan report`, `plan --report`, `plan --sensitivity`;
opened in a real headless Chromium (Debian's `chromium`), which must render every figure."""
import base64
from html import escape as html_escape
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.planner.errors import PlanError
from sp_plan.cli.report import write_report
from sp_plan.integrations.figures import cluster_groups, drawn_nodes, measured_points
from sp_plan.planner.model import Workload
from sp_plan.planner.plan import Measured, Plan
from sp_plan.planner.profile import Profile
from sp_plan.integrations.report import render_report
from sp_plan.planner.search import finish, finish_each, grid_search
from sp_plan.planner.sensitivity import sensitivity
from sp_plan.profiles import load_cluster, load_model
from sp_plan.workers import forked_map

SP = [sys.executable, "-m", "sp_plan.cli.app"]
PROFILE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"  # tuned on dgx-h100 x2: two measured candidates
DGX = ["--cluster", "dgx-h100", "--nodes", "2", "--model", "llama3-8b", "--seq-len", "32k"]
W = Workload(seq_len=16384, batch=1)  # dgx-h100 x2: ulysses8 x ring2 wins; with InfiniBand halved tp8 x ring2
#: one pytest-xdist worker for the module: its module fixtures compute once, not once per worker
pytestmark = pytest.mark.xdist_group("report")
IMG = re.compile(r'<img class="figure" src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def run(*args, cwd=None):
    """`sp-plan ARGS` in a process of its own, as a user runs it."""
    return subprocess.run(SP + list(args), capture_output=True, text=True, cwd=cwd, timeout=180)


def run_here(*args):
    """`sp-plan ARGS` in this process (typer's CliRunner), as a CompletedProcess: no interpreter start."""
    r = CliRunner().invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


@pytest.fixture(scope="module")
def ranked():
    c, m = load_cluster("dgx-h100", 2), load_model("llama3-8b")
    res = grid_search(c, m, W, keep=4)
    return c, m, finish(res, c, m, W, 4) + finish_each(res, c, m, W)[1:3]


def pngs(html):
    out = [base64.b64decode(b) for b in IMG.findall(html)]
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 10_000 for p in out)
    return out


def test_figures_drawn_over_workers_are_the_ones_drawn_here(ranked, monkeypatch):
    """The report draws its figures over forked workers; the page is the same, byte for byte, drawn in one
    process (the time stamp aside)."""
    import sp_plan.integrations.report as report

    c, m, plans = ranked
    plans = sorted(plans, key=lambda p: p.predicted.step_time_s)
    kw = dict(profile=Profile.load(PROFILE), sensitivity=sensitivity(c, m, W, plans[0]))
    stamp = re.compile(r"generated [0-9-]+ [0-9:]+ UTC")
    forked = []
    monkeypatch.setattr(report, "forked_map", lambda fn, items, jobs: forked.append(jobs) or forked_map(fn, items, jobs))
    two = stamp.sub("", render_report(plans, c, jobs=2, **kw))
    one = stamp.sub("", render_report(plans, c, **kw))
    assert forked == [2, 1] and two == one and len(pngs(one)) == 5


def test_report_is_one_self_contained_page_with_every_figure(ranked):
    c, m, plans = ranked
    plans = sorted(plans, key=lambda p: p.predicted.step_time_s)
    sen = sensitivity(c, m, W, plans[0])
    html = render_report(plans, c, profile=Profile.load(PROFILE), sensitivity=sen)
    assert len(pngs(html)) == html.count("<img") == 5  # steps, memory, measured, cluster, sensitivity
    for fid in ("fig-steps", "fig-memory", "fig-measured", "fig-cluster", "fig-sensitivity"):
        assert f'<figure id="{fid}">' in html
    assert not re.search(r'(src|href)="(?!data:)', html)  # nothing fetched from elsewhere
    assert "CUDA out of memory on rank 3" in html  # the profile's failed candidate is listed
    caption = html[html.index('<figure id="fig-memory">'):].split("</figure>")[0]
    assert all(part in caption for part in plans[0].predicted.memory)  # every part its bars stack, logits too
    assert "changes</span> to" in html and html_escape(plans[0].summary()) in html  # ib halved flips this winner
    bare = render_report(plans, c)
    assert len(pngs(bare)) == 3 and "run <code>sp-plan tune</code>" in bare and "Sensitivity" not in bare


def test_report_needs_predicted_plans(ranked):
    c, _, plans = ranked
    with pytest.raises(PlanError, match="plans"):
        render_report([], c)
    with pytest.raises(PlanError, match="plans"):
        render_report([plans[0].model_copy(update={"predicted": None})], c)


def test_a_big_cluster_draws_whole_nodes_and_says_so():
    c = load_cluster("dgx-h100", 16)
    plan = Plan(algorithm="usp", degrees={"ulysses": 8, "ring": 16}, order=["ulysses", "ring"])
    assert drawn_nodes(c) == 4 and drawn_nodes(load_cluster("a100-16-eth100", 4)) == 2
    assert drawn_nodes(load_cluster("dgx-h100", 2)) == 2
    f = cluster_groups(c, plan)
    assert "the first 4 node(s) (ranks 0-31) are drawn" in f.caption and f.png.startswith(b"\x89PNG")


def chromium():
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if exe is None:
        if os.environ.get("SP_PLAN_REQUIRE_CHROMIUM") == "1":
            pytest.fail("chromium is not installed (SP_PLAN_REQUIRE_CHROMIUM=1: the browser test must run)")
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    return exe


def headless(exe, tmp_path, *args):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chrome'}",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_plan_report_and_sensitivity_render_every_figure_in_chromium(tmp_path):
    exe = chromium()
    out, plan = tmp_path / "report.html", tmp_path / "p.yaml"
    r = run("plan", *DGX, "--profile", str(PROFILE), "--sensitivity", "--report", str(out), "-o", str(plan))
    assert r.returncode == 0, r.stderr
    assert "using profile" in r.stdout and f"wrote {out}" in r.stdout and f"wrote {plan}" in r.stdout
    assert "sensitivity of " in r.stdout and "ib bandwidth halved (inter-node links)" in r.stdout
    assert "compute efficiency at 80%" in r.stdout
    n = len(pngs(out.read_text()))
    assert n == 5  # steps, memory, predicted against measured (the profile's), cluster, sensitivity
    url = out.as_uri()
    dom = headless(exe, tmp_path, "--virtual-time-budget=10000", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert f'data-figures="{n}"' in body and f'data-figures-rendered="{n}"' in body, body
    widths = [int(x) for x in re.findall(r'data-natural-width="(\d+)"', dom.stdout)]
    assert len(widths) == n and min(widths) > 500
    assert dom.stdout.count('data-rendered="yes"') == n
    shot = tmp_path / "shot.png"
    s = headless(exe, tmp_path, "--window-size=1280,2000", f"--screenshot={shot}", url)
    assert s.returncode == 0 and shot.exists(), s.stderr[-2000:]
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    assert img.size == (1280, 2000)
    px = np.asarray(img).reshape(-1, 3).astype(int)
    inked = (px.sum(axis=1) < 600).mean()  # not white: text, tables, bars
    colours = len(np.unique(px, axis=0))
    assert inked > 0.05 and colours > 100, (inked, colours)  # a page with figures, not a blank or one-colour one
    # a plan file alone names its cluster (a preset), model and workload; the report is about that plan
    summary = Plan.load(plan).summary()
    r2 = run("report", str(plan), "--profile", str(PROFILE), "--no-sensitivity", "--top", "3", "-o", str(tmp_path / "r2.html"))
    assert r2.returncode == 0, r2.stderr
    assert f"{summary}: #1 of" in r2.stdout and "sensitivity of" not in r2.stdout
    html = (tmp_path / "r2.html").read_text()
    assert f'<tr class="chosen"><td class=num>1</td><td>{html_escape(summary)}</td>' in html and len(pngs(html)) == 4


def test_measured_plans_join_the_scatter(ranked):
    _, _, plans = ranked
    p = plans[0].model_copy(update={"measured": Measured(step_time_s=0.3, peak_memory_bytes=4e10)})
    pts = measured_points([p, plans[1]], Profile.load(PROFILE).candidates)
    # measured at 128k, not this report's 32k: the label says so; the oom candidate is left out
    assert pts[:2] == [("ulysses8 x ring2 (llama3-8b, 131,072 tokens)", 1.92, 2.31, 2.36),
                       ("ring16 zigzag (llama3-8b, 131,072 tokens)", 2.05, 2.58, 2.49)]
    assert pts[2] == (p.summary(), None, p.predicted.step_time_s, 0.3) and len(pts) == 3


def test_report_errors_are_one_line(tmp_path, ranked):
    r = run_here("report", "-o", str(tmp_path / "r.html"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--cluster NAME --model NAME --seq-len N" in r.stderr
    hand = tmp_path / "hand.yaml"
    Plan(algorithm="ring", degrees={"ring": 16}, cluster="my-cluster").save(hand)
    r = run_here("report", str(hand), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 2 and "error: --cluster" in r.stderr and "not a preset" in r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "r.html").exists()
    c, _, plans = ranked
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(PlanError, match="output: cannot write"):
        write_report(tmp_path / "dir.html", plans, c)
    assert list(tmp_path.glob(".dir.html*")) == []  # nothing half-written left behind


def test_rows_past_the_rankings_top_carry_no_rank():
    """The report's rows are the top plans and then the best of each other algorithm variant: only the top ones are
    numbered, the rest (which rank somewhere below, uncounted) show no number, whichever path renders it."""
    from sp_plan.pipeline import report_plans

    c, m = load_cluster("dgx-h100", 2), load_model("llama3-8b")
    res = grid_search(c, m, W, keep=3)
    rows, chosen, ranked = report_plans(finish(res, c, m, W, 3), finish_each(res, c, m, W))
    assert ranked == 3 and chosen == 0 and len(rows) > 3
    html = render_report(rows, c, ranked=ranked)
    numbers = re.findall(r"<tr(?: class=\"chosen\")?><td class=num>([^<]*)</td>", html)
    assert numbers[:len(rows)] == ["1", "2", "3"] + ["-"] * (len(rows) - 3)
    assert "Rows without a rank" in html
    with pytest.raises(PlanError, match="ranked"):
        render_report(rows, c, ranked=len(rows) + 1)
