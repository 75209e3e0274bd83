"""What `sp-plan tune` holds fixed: its budget's estimates, the kernel sweep's windows, the choice and the readings.

One frozen dataclass instead of module constants: a tune reads them from ``TuneOptions.settings`` (``SETTINGS``
unless a caller passes others), so a test or a benchmark changes one value for one tune without patching a module.
The flags a user passes are ``run.TuneOptions``; these are the values behind them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TuneSettings:
    """The tune's fixed values, each with why it is what it is."""

    #: seconds a candidate costs beyond its steps: its child world's start (fork, rendezvous) and its stacks' builds
    candidate_overhead_s: float = 5.0
    #: the kernel sweep's share of the time left when it starts (the rest is for candidates, reread and confirm)
    kernel_share: float = 0.3
    #: the kernel sweep gets at least this long, whatever is left (one block shape at least must be timed)
    kernel_min_s: float = 5.0
    #: a kernel's shared window: this many calls of its slowest rank's first call, at least ``window_min_s``
    window_calls: int = 8
    window_min_s: float = 0.05
    #: fewest calls of a kernel's first call a budgeted window holds (windows shrink to this to fit the sweep): one,
    #: since a kernel whose windows must shrink this far takes seconds a call, against which its first call's
    #: allocations are small (on two namespace hosts at a load of 36, two calls of an 8192-token block's kernels
    #: took 154 s of a 201 s sweep)
    window_min_calls: int = 1
    #: a shared window holds no more calls than fill this many seconds (``window_min_calls`` at least): the ranks'
    #: shared start is within milliseconds, so a window this long reads all of them computing together whatever its
    #: calls; a 4096-token block's kernels on 4 ranks sharing 2 cores take seconds a call, and 8 of each took most of
    #: a 9-minute tune's kernel step
    window_span_s: float | None = 2.0
    #: the solo-speedup timing's together window: this many calls of the slowest rank's time alone, at least this long
    together_calls: int = 8
    together_min_s: float = 0.2
    #: a candidate's timed steps stop before --iters once its last two forward-backward readings (the warm-up's
    #: counted) agree within this share on every rank: a third reading's median with two such lies between them, so
    #: it could move the step by no more than this, less than readings of one layout spread between runs on shared
    #: cores (6-32 % on the kept truths); None times every step
    step_agree: float | None = 0.05
    #: a kernel timed by each rank (kernel timing "each") stops repeating once its last two readings agree within
    #: this share (the median of more lies between them); None times every repeat
    kernel_agree: float | None = 0.05
    #: before any candidate has run, the step-time fit's candidates are priced at this many times their estimates
    #: where the rest of the kernel sweep and their timed steps are planned: those estimates come from the kernels
    #: alone, and a bert-large candidate on 4 CPU ranks took 1.8x its first estimate (its first step, the stacks'
    #: builds and the host's load are not in them); the sweep's extra block lengths matter less than the fit
    first_estimate_margin: float = 2.0
    #: the candidates the budget should leave room for beside the kernel sweep: a step-time fit needs this many
    #: (``choose.MIN_MEASURED``: a leave-one-out error of fewer means nothing)
    fit_candidates: int = 3
    #: a reading over its leave-one-out prediction by more than max(surprise_floor, surprise_spread x the fit's
    #: median leave-one-out error) is a surprise, read once more (``run.surprises``)
    surprise_floor: float = 0.10
    surprise_spread: float = 2.0
    #: contenders read again at most in the confirm step: the best measured and two runners-up
    max_contenders: int = 3
    #: seconds of --max-minutes kept after the measurements: stopping the candidate in flight, the last fit, storing
    #: the profile, the report, leaving the world (on 4 CPU ranks at a load of 32 these took 36 s)
    finish_s: float = 30.0


#: the settings a tune uses unless its options carry others
SETTINGS = TuneSettings()
