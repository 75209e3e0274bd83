"""What long commands print while they run: plain lines into a log (at most one a step every 10 s, and every step's
start and end), JSON events, nothing with --quiet. Driven by an injected clock."""
from __future__ import annotations

import io
import json

from sp_plan.cli.progress import JsonReporter, LineReporter, QuietReporter, RichReporter, reporter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_keep_to_one_a_step_every_ten_seconds_and_every_boundary():
    clock, buf = Clock(), io.StringIO()
    rep = LineReporter("tune", clock=clock, stream=buf)
    rep("kernels", 0, 4, "timing")  # a step's start: printed
    clock.t += 3
    rep("kernels", 1, 4, "one")  # 3 s later: not
    rep("candidates", 0, 2, "first")  # another step's start: printed
    clock.t += 8
    rep("kernels", 2, 4, "two")  # 11 s after the kernels' last line: printed, eta from its pace (11 s for 2)
    clock.t += 1
    rep("kernels", 4, 4, "done")  # the step's end: printed
    lines = buf.getvalue().splitlines()
    assert lines == ["[tune] kernels 0/4 elapsed 0:00 eta -: timing",
                     "[tune] candidates 0/2 elapsed 0:03 eta -: first",
                     "[tune] kernels 2/4 elapsed 0:11 eta 0:11: two",
                     "[tune] kernels 4/4 elapsed 0:12 eta 0:00: done"]


def test_json_events_carry_every_field_then_the_result_or_the_error():
    clock, buf = Clock(), io.StringIO()
    rep = JsonReporter("tune", clock=clock, stream=buf)
    rep("links", 0, 1, "measuring links")
    clock.t += 2
    rep("links", 1, 1, "links measured")
    rep.result({"profile": "abc"})
    rep.error("boom")
    ev = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert ev[0] == {"event": "progress", "step": "links", "done": 0, "total": 1, "elapsed_s": 0.0, "eta_s": None,
                     "message": "measuring links"}
    assert ev[1]["elapsed_s"] == 2.0 and ev[1]["eta_s"] == 0.0
    assert ev[2] == {"event": "result", "elapsed_s": 2.0, "profile": "abc"}
    assert ev[3] == {"event": "error", "elapsed_s": 2.0, "message": "boom"}


def test_the_reporter_follows_the_flags_and_the_terminal():
    from rich.console import Console

    con = Console(file=io.StringIO())
    assert isinstance(reporter("tune", ("links",), con, as_json=True), JsonReporter)
    assert isinstance(reporter("tune", ("links",), con, quiet=True), QuietReporter)
    assert isinstance(reporter("tune", ("links",), con, tty=True), RichReporter)
    assert isinstance(reporter("tune", ("links",), con, tty=False), LineReporter)


def test_a_long_step_ticking_every_second_prints_a_line_every_ten():
    clock, buf = Clock(), io.StringIO()
    rep = LineReporter("tune", clock=clock, stream=buf)
    rep("candidates", 0, 3, "a (the model's best)")  # the step's start: printed
    for s in range(1, 26):  # a candidate running: a tick a second, still 0 done
        clock.t += 1
        rep("candidates", 0, 3, f"a: running {s} s")
    rep("candidates", 3, 3, "c: ok")  # the end: printed at once
    lines = buf.getvalue().splitlines()
    assert [ln.split(": ", 1)[1] for ln in lines] == ["a (the model's best)", "a: running 10 s", "a: running 20 s",
                                                      "c: ok"]
