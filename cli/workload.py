"""The workload's mask on the command line: --documents, --window, --window-pattern and --seed, shared by every command
that takes a workload (plan, estimate, report, tune), and the per-rank work table `show` and `report` print.

A command declares the options from ``workload_mask_options()`` and builds its Workload with ``masked_workload`` (or
takes the fields from ``resolve_mask``); both resolve through the application pipeline
(``sp_plan.pipeline.mask_fields``), and their errors name the flag. The pipeline is imported where a command uses it:
it loads the cost engine (numpy), which `presets` and --help do without.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import typer
from rich.table import Table

from sp_plan.cli.console import out
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import MAX_SEED, Workload, parse_seq_len

if TYPE_CHECKING:
    from sp_plan.planner.plan import Plan

DOCUMENTS_HELP = ("lengths of the documents packed into each sequence: a file of lengths (one integer a line, or a "
                  "CSV/Parquet column 'length') or a named distribution: magi-short, magi-long, megatron-dcp, "
                  "megatron-dcp-skewed")
WINDOW_HELP = ("sliding window W in tokens (4096 or 4k): a query attends keys less than W positions away (on every "
               "layer, or the pattern's)")
PATTERN_HELP = "windowed:global layers, repeating, e.g. 5:1 (Gemma 3); needs --window"
SEED_HELP = "seed of the packs drawn from --documents (recorded in the plan)"
#: ring ranks `show` lists one by one; a larger ring shows its first and last ranks (the imbalance counts them all)
SHOWN_RANKS = 16

#: a domain field of the workload's mask -> the flag that sets it
_FLAGS = (("workload.window_pattern", "--window-pattern"), ("workload.window.pattern", "--window-pattern"),
          ("window_pattern", "--window-pattern"), ("workload.documents", "--documents"), ("documents", "--documents"),
          ("workload.window", "--window"), ("window", "--window"), ("workload.seed", "--seed"), ("seed", "--seed"))


class MaskOptions(NamedTuple):
    """The typer options of a workload's mask, one set per command (use each as a parameter's default)."""

    documents: Any
    window: Any
    window_pattern: Any
    seed: Any


def workload_mask_options(from_plan: bool = False) -> MaskOptions:
    """Fresh --documents, --window, --window-pattern and --seed options for one command's signature (``from_plan``:
    a command that reads a plan file, whose mask they replace)."""
    plan = "the plan's, else "
    return MaskOptions(
        typer.Option(None, "--documents", help=DOCUMENTS_HELP,
                     show_default=(plan if from_plan else "") + "one document per sequence"),
        typer.Option(None, "--window", help=WINDOW_HELP, show_default=(plan if from_plan else "") + "full attention"),
        typer.Option(None, "--window-pattern", help=PATTERN_HELP,
                     show_default=(plan if from_plan else "") + "every layer windowed"),
        typer.Option(None, "--seed", min=0, max=MAX_SEED, help=SEED_HELP, show_default=(plan if from_plan else "") + "0"))


def as_flag(e: PlanError) -> PlanError:
    """The error with a mask field named by its flag (the domain name where no flag sets it)."""
    for field, flag in _FLAGS:
        if e.field == field or e.field.startswith(field + "[") or e.field.startswith(field + "."):
            return PlanError(flag, e.problem, e.fix)
    return e


def window_tokens(text: Optional[str | int]) -> Optional[int]:
    """``--window`` in tokens: a whole number, or one with a k or m suffix as ``--seq-len`` takes (4k: 4,096); a
    number below 1 is left to the workload's own check."""
    if text is None or isinstance(text, int):
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return parse_seq_len(text)
    except PlanError as e:
        raise PlanError("--window", e.problem, "write a window like 4096 or 4k") from None


def resolve_mask(documents: Optional[str], window: Optional[str | int], window_pattern: Optional[str],
                 seed: Optional[int], base: Optional[Workload] = None) -> dict[str, Any]:
    """Workload fields documents, window and seed from the flags (a file read here, a name looked up); None: base's."""
    from sp_plan.pipeline import mask_fields  # noqa: PLC0415 - see the module docstring

    try:
        return mask_fields(documents, window_tokens(window), window_pattern, seed, base=base)
    except PlanError as e:
        raise as_flag(e) from None


def masked_workload(fields: dict[str, Any], documents: Optional[str] = None, window: Optional[int] = None,
                    window_pattern: Optional[str] = None, seed: Optional[int] = None,
                    base: Optional[Workload] = None) -> Workload:
    """A Workload of ``fields`` (seq_len, batch, ...) with the mask flags; errors name the flag."""
    mask = resolve_mask(documents, window, window_pattern, seed, base)
    try:
        return Workload(**fields, **mask)
    except PlanError as e:
        raise as_flag(e) from None


def plan_workload(base: Optional[Workload], seq_len: Optional[str], batch: Optional[int], causal: Optional[bool],
                  inference: bool, documents: Optional[str] = None, window: Optional[int] = None,
                  window_pattern: Optional[str] = None, seed: Optional[int] = None) -> Workload:
    """A plan file's workload (``base``) with the flags that replace its fields (None: the plan's, else the
    defaults); ``base`` None needs ``seq_len``."""
    fields = dict(seq_len=parse_seq_len(seq_len) if seq_len else base.seq_len,
                  batch=batch or (base.batch if base else 1),
                  causal=causal if causal is not None else (base.causal if base else True),
                  training=not inference and (base.training if base else True))
    return masked_workload(fields, documents, window, window_pattern, seed, base)


def print_notes(w: Workload) -> None:
    """One line per note of the workload (a window that covers the sequence is full attention)."""
    for n in w.notes:
        out.print(f"note: {n}", highlight=False)


def mask_line(w: Optional[Workload]) -> str:
    """The workload's documents and window in a few words ('' without them): ``sp_plan.pipeline.mask_line``."""
    if w is None or (w.documents is None and w.window is None):
        return ""
    from sp_plan.pipeline import mask_line as line  # noqa: PLC0415 - see the module docstring

    return line(w)


def print_mask(w: Workload) -> None:
    """The workload's documents and window on a line of their own (nothing without them)."""
    if mask_line(w):
        out.print(f"mask: {mask_line(w)}", highlight=False, soft_wrap=True)


def _shown(n: int) -> list[int | None]:
    """Rank indices to list (None: the elided middle)."""
    if n <= SHOWN_RANKS:
        return list(range(n))
    half = SHOWN_RANKS // 2
    return [*range(half), None, *range(n - half, n)]


def rank_work_table(p: Plan) -> tuple[Table, str] | None:
    """The per-ring-rank table of a sample pack (tokens, score entries) and its imbalance line; None without a mask."""
    w = p.workload
    if w is None or (w.documents is None and w.window is None):  # nothing to show: `show` loads no pipeline
        return None
    from sp_plan.pipeline import rank_work  # noqa: PLC0415 - see the module docstring

    rw = rank_work(p)
    if rw is None:
        return None
    t = Table(title=f"per-rank work ({rw.token_layout})")
    cols = ["ring rank", "tokens", "score entries" if rw.global_pairs is None else "score entries (windowed layers)"]
    for c in cols + (["score entries (global layers)"] if rw.global_pairs is not None else []):
        t.add_column(c, justify="right")
    for r in _shown(len(rw.tokens)):
        if r is None:
            t.add_row("...", "", "", *([""] if rw.global_pairs is not None else []))
            continue
        extra = [f"{rw.global_pairs[r]:,}"] if rw.global_pairs is not None else []
        t.add_row(str(r), f"{rw.tokens[r]:,}", f"{rw.pairs[r]:,}", *extra)
    line = f"a sample pack of {rw.documents} document(s): imbalance (busiest rank / mean) {rw.imbalance:.3f}"
    if rw.global_pairs is not None:
        line += f" on the windowed layers, {rw.global_imbalance:.3f} on the global ones"
    if len(rw.tokens) == 1:
        line += " (one ring rank: every rank attends the whole pack on its heads)"
    return t, line


def print_rank_work(p: Plan) -> None:
    """Print the plan's per-rank work table and imbalance where its workload has documents or a window."""
    shown = rank_work_table(p)
    if shown is not None:
        out.print(shown[0])
        out.print(shown[1], highlight=False, soft_wrap=True)
