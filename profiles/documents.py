"""Document-length distributions for a workload: the named ones (profiles/documents.yaml) and files of lengths.

The application layer reads files here and hands the planner definitions (planner/model.py's Documents): a name
becomes its cited lognormal or histogram, a file of lengths (one integer per line, or a CSV/Parquet column
``length``, read with pandas) becomes a histogram that records the file's name and sha256, never the raw lengths.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from pydantic import TypeAdapter

from sp_plan.planner.documents import histogram_of
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import MAX_SEQ_LEN, Documents, Histogram
from sp_plan.planner.yamlio import read_data, validation_error

DOCUMENTS_FILE = Path(__file__).parent / "documents.yaml"
_ADAPTER = TypeAdapter(Documents)


def document_presets() -> list[str]:
    """Names of the cited distributions in profiles/documents.yaml."""
    return sorted(read_data(DOCUMENTS_FILE, "documents"))


def load_documents(name: str):
    """The named distribution's definition (its name and source recorded in it)."""
    table = read_data(DOCUMENTS_FILE, "documents")
    if name not in table:
        raise PlanError("documents", f"unknown distribution {name!r}",
                        f"use one of {sorted(table)} or a file of lengths")
    try:
        return _ADAPTER.validate_python({**table[name], "name": name})
    except Exception as err:  # a broken preset file is the package's bug: say which entry
        if hasattr(err, "errors"):
            raise validation_error(f"documents.{name}", err, str(DOCUMENTS_FILE)) from None
        raise


def named_documents(name: str):
    """A distribution given by its name where no file is read (a request to the service, a plan file): its
    definition; an unknown name is refused naming ``workload.documents``."""
    if name not in document_presets():
        raise PlanError("workload.documents", f"unknown distribution {name!r}",
                        f"use one of {document_presets()}, a histogram or a list of lengths")
    return load_documents(name)


def _text_lines(pd, p: Path):
    """A text file of lengths as pandas reads it: each line one string value, whole (a line ``100,200`` is one value
    that no integer reads, never an index and a length); an empty file has no rows."""
    try:
        return pd.read_csv(p, header=None, names=["length"], sep="\x1f", comment="#", skip_blank_lines=True, dtype=str)
    except pd.errors.EmptyDataError:
        return pd.DataFrame({"length": []}, dtype=str)


def read_lengths(path: str | Path) -> np.ndarray:
    """Document lengths from a file: a CSV or Parquet file's column ``length``, else one integer per line."""
    import pandas as pd  # noqa: PLC0415 - pandas loads in ~0.5 s; a named distribution never needs it

    p = Path(path)
    suffix = p.suffix.lower()  # lengths.CSV is a CSV file too
    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(p)
        elif suffix == ".csv":
            frame = pd.read_csv(p)
        else:
            frame = _text_lines(pd, p)
    except (OSError, ValueError, ImportError, pd.errors.ParserError) as e:
        raise PlanError("documents", f"cannot read {p}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                        "give a readable file of lengths: one integer per line, or a CSV/Parquet column 'length'"
                        ) from None
    if "length" not in frame.columns:
        raise PlanError("documents", f"{p} has no column 'length' (columns: {list(frame.columns)[:8]})",
                        "name the column of document lengths 'length'")
    col = pd.to_numeric(frame["length"], errors="coerce")
    if col.isna().any() or (col != col.round()).any():
        row = int(np.flatnonzero((col.isna() | (col != col.round())).to_numpy())[0])
        value = frame["length"].iloc[row]
        shown = "an empty cell" if pd.isna(value) else f"'{value}'"
        raise PlanError("documents", f"{_where(p, suffix, row)}: {shown} is not a whole number",
                        "give one integer length per row")
    if (col.abs() > MAX_SEQ_LEN).any():  # before the integer cast, which would wrap them
        row = int(np.flatnonzero((col.abs() > MAX_SEQ_LEN).to_numpy())[0])
        raise PlanError("documents", f"{_where(p, suffix, row)}: length {frame['length'].iloc[row]} is more than any "
                        f"sequence ({MAX_SEQ_LEN:,} tokens)", "give each document's length in tokens")
    x = col.to_numpy(dtype=np.int64)
    if not len(x):
        raise PlanError("documents", f"{p} holds no lengths", "give at least one document length")
    if x.min() < 1:
        row = int(np.argmin(x))
        raise PlanError("documents", f"{_where(p, suffix, row)}: length {int(x[row])}",
                        "lengths must be at least 1 token")
    return x


def _where(p: Path, suffix: str, row: int) -> str:
    """Where data row ``row`` (from 0) of a file of lengths is: a CSV's or Parquet's row, a text file's line (its
    comments and blank lines counted, as an editor counts them)."""
    if suffix in (".csv", ".parquet"):
        return f"{p} row {row + 1}"
    seen = -1
    with open(p, errors="replace") as f:
        for number, line in enumerate(f, 1):
            seen += bool(line.split("#", 1)[0].strip())
            if seen == row:
                return f"{p} line {number}"
    return f"{p} row {row + 1}"


def documents_from_file(path: str | Path) -> Histogram:
    """A file of lengths as the planner records it: their histogram, with the file's name and sha256."""
    p = Path(path)
    x = read_lengths(p)
    return histogram_of(x, source=p.name, sha256=hashlib.sha256(p.read_bytes()).hexdigest())


def resolve_documents(spec: str):
    """``--documents`` as given: a file of lengths where one exists at that path or the spec reads as a path (a
    folder in it, or a lengths file's suffix), else a named distribution."""
    p = Path(spec)
    if p.exists() or p.suffix.lower() in (".txt", ".csv", ".parquet") or len(p.parts) > 1:
        return documents_from_file(p)
    return load_documents(spec)
