"""YAML/JSON in and out for the pydantic models at the edges, written atomically."""
from __future__ import annotations

import json
import re
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import PlanError

M = TypeVar("M", bound=BaseModel)


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e9 and 2.5e-6 as floats (YAML 1.1 wants 1.0e+9)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def yaml_load(text: str):
    """Parse YAML text with sp-plan's loader (scientific-notation floats)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def atomic_write(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename, so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would otherwise survive the rename
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dump_data(data: Any, path: str | Path) -> None:
    """Write a dict as JSON (``.json``) or YAML (anything else), atomically."""
    if str(path).endswith(".json"):
        atomic_write(path, json.dumps(data, indent=2) + "\n")
    else:
        atomic_write(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120))


def read_data(path: str | Path, what: str) -> dict:
    """Read a YAML or JSON mapping; a missing file or malformed text is a PlanError naming the file."""
    path = Path(path)
    if not path.exists():
        raise PlanError(what, f"file {str(path)!r} does not exist", "check the path")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PlanError(what, f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({first})",
                        "fix the file's syntax") from None
    if not isinstance(data, dict):
        raise PlanError(what, f"{path} does not hold a mapping", f"write the {what} as key: value pairs")
    return data


def validation_error(what: str, err: ValidationError, source: str = "") -> PlanError:
    """Turn pydantic's error into one line naming the first bad field."""
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or what
    return PlanError(f"{what}.{loc}" if loc != what else what, f"{e['msg']}{' in ' + source if source else ''}",
                     "fix that field")


def model_from_data(cls: type[M], data: dict, what: str, source: str = "") -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise validation_error(what, err, source) from None


def load_yaml_model(cls: type[M], path: str | Path, what: str) -> M:
    return model_from_data(cls, read_data(path, what), what, str(path))
