"""Progress of a long command (`tune`, `profile links`): rich bars on a terminal, plain lines in a log, JSON events.

On a terminal the bars draw on stderr as before. Where stdout is not a terminal (torchrun into a file, Slurm,
Kubernetes) each step prints plain lines on stdout instead: the step, done/total, the command's elapsed time and an
estimate of the step's time left, at its first tick and its end (done = total), else at most one line every
``LINE_EVERY_S`` seconds per step (a step that runs long ticks about every second; the latest tick is printed). ``--json`` prints the same as one JSON object per line (``event`` "progress"), then one "result"
or "error" event; ``--quiet`` prints nothing but the result. The caller makes one on rank 0 only.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Callable, TextIO

#: a step prints a plain line (or a JSON event) at most this often, besides its start and end
LINE_EVERY_S = 10.0


def _clock_s(seconds: float | None) -> str:
    """Seconds as m:ss ("-" for none)."""
    if seconds is None:
        return "-"
    s = max(int(round(seconds)), 0)
    return f"{s // 60}:{s % 60:02d}"


class Reporter:
    """The ``progress(step, done, total, message)`` callback of a command, and its final result or error."""

    def __init__(self, command: str, clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None,
                 every_s: float = LINE_EVERY_S):
        self.command, self.clock, self.every_s = command, clock, every_s
        self.stream = stream or sys.stdout
        self.started = clock()
        self._step_start: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def _event(self, step: str, done: int, total: int | None, message: str) -> dict | None:
        """The progress event of this tick, or None where the step printed less than ``every_s`` ago mid-way."""
        now = self.clock()
        first = step not in self._step_start
        begun = self._step_start.setdefault(step, now)
        boundary = first or (total is not None and done >= total)
        if not boundary and now - self._last.get(step, begun) < self.every_s:
            return None
        self._last[step] = now
        eta = None
        if total and done:
            eta = 0.0 if done >= total else (now - begun) / done * (total - done)
        return {"event": "progress", "step": step, "done": done, "total": total,
                "elapsed_s": round(now - self.started, 3), "eta_s": None if eta is None else round(eta, 3),
                "message": message}

    def __call__(self, step: str, done: int, total: int | None, message: str) -> None:
        ev = self._event(step, done, total, message)
        if ev is not None:
            self.emit(ev)

    def emit(self, ev: dict) -> None:
        """Print one progress event (subclasses say how)."""

    def result(self, payload: dict) -> None:
        """The command's result (subclasses say how)."""

    def error(self, message: str) -> None:
        """The command's error (the caller prints its one error line on stderr too)."""


class LineReporter(Reporter):
    """Plain progress lines, flushed: what a log file gets."""

    def emit(self, ev: dict) -> None:
        total = "?" if ev["total"] is None else ev["total"]
        self.stream.write(f"[{self.command}] {ev['step']} {ev['done']}/{total} elapsed {_clock_s(ev['elapsed_s'])} "
                          f"eta {_clock_s(ev['eta_s'])}: {ev['message']}\n")
        self.stream.flush()


class JsonReporter(Reporter):
    """One JSON object per line: progress events, then the result or the error."""

    def _write(self, ev: dict) -> None:
        self.stream.write(json.dumps(ev, default=str) + "\n")
        self.stream.flush()

    def emit(self, ev: dict) -> None:
        self._write(ev)

    def result(self, payload: dict) -> None:
        self._write({"event": "result", "elapsed_s": round(self.clock() - self.started, 3), **payload})

    def error(self, message: str) -> None:
        self._write({"event": "error", "elapsed_s": round(self.clock() - self.started, 3), "message": message})


class QuietReporter(Reporter):
    """No progress at all."""


class RichReporter(Reporter):
    """rich's progress bars on stderr, one per step, shown once the step starts (a terminal)."""

    def __init__(self, command: str, steps: tuple[str, ...], console, **kw):
        super().__init__(command, **kw)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.prog = Progress(TextColumn("{task.fields[step]:>10}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.description}"), TimeElapsedColumn(), console=console)
        self.tasks = {s: self.prog.add_task("", total=None, step=s, visible=False) for s in steps}

    def __enter__(self) -> RichReporter:
        self.prog.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.prog.__exit__(*exc)

    def __call__(self, step: str, done: int, total: int | None, message: str) -> None:
        from rich.markup import escape

        if step not in self.tasks:
            self.tasks[step] = self.prog.add_task("", total=None, step=step)
        self.prog.update(self.tasks[step], completed=done, total=total, description=escape(message[:90]), visible=True)


def reporter(command: str, steps: tuple[str, ...], console, quiet: bool = False, as_json: bool = False,
             tty: bool | None = None) -> Reporter:
    """The progress a command prints: JSON events, nothing, bars on a terminal, else plain lines."""
    if as_json:
        return JsonReporter(command)
    if quiet:
        return QuietReporter(command)
    if sys.stdout.isatty() if tty is None else tty:
        return RichReporter(command, steps, console)
    return LineReporter(command)
