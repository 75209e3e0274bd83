"""YAML/JSON in and out for the pydantic models at the edges, written atomically."""
from __future__ import annotations

import errno
import gzip
import hashlib
import json
import re
import os
import stat
import tempfile
import zlib
from collections import deque
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import PlanError

M = TypeVar("M", bound=BaseModel)


#: sp-plan's files nest a few levels; a deeper document is refused before PyYAML recurses (and slows) through it
MAX_DEPTH = 64


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e9 and 2.5e-6 as floats (YAML 1.1 wants 1.0e+9), refuses duplicate keys
    and nesting deeper than MAX_DEPTH."""

    _depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nesting deeper than {MAX_DEPTH} levels",
                                              self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: "_Loader", node: yaml.MappingNode, deep: bool = False) -> dict:
    """A mapping that names a key twice is an error (YAML 1.2 forbids it; PyYAML would keep the last silently)."""
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` merges; explicit keys may override it
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            dup = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping below says so
            continue
        if dup:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


#: floats as sp-plan reads them: YAML 1.1's and scientific notation without a dot (1e9, 2.5e-6)
FLOAT_RE = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


#: libyaml's emitter and parser where PyYAML was built with them (the pure-Python ones are ~10-20x slower)
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_SafeDumper):
    """SafeDumper that quotes every string _Loader would read as something else (a profile id such as 123e4567
    reads as a float there): what is written reads back as written."""


class _CLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """_Loader's constructors and resolvers on libyaml's parser; its composer has no depth guard, so ``yaml_load``
    reads the nesting from the parser's events first (``_check_depth``)."""


_LOADERS = (_Loader, _CLoader) if hasattr(yaml, "CSafeLoader") else (_Loader,)
for _cls in _LOADERS:
    _cls.add_constructor("tag:yaml.org,2002:map", lambda loader, node: _construct_mapping(loader, node))
for _cls in (*_LOADERS, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_RE, list("-+0123456789."))


def _check_depth(text: str) -> None:
    """Refuse a node nested deeper than MAX_DEPTH, as _Loader.compose_node does, from libyaml's events."""
    depth = 0
    for ev in yaml.parse(text, Loader=_CLoader):
        if isinstance(ev, yaml.NodeEvent):
            if depth >= MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nesting deeper than {MAX_DEPTH} levels", ev.start_mark)
            if isinstance(ev, yaml.CollectionStartEvent):
                depth += 1
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1


def yaml_load(text: str):
    """Parse YAML text with sp-plan's loader (scientific-notation floats, no duplicate keys, at most MAX_DEPTH
    levels): on libyaml where PyYAML has it; text libyaml refuses is read (or refused, with its message) by the
    Python loader, which reads a few inputs libyaml does not (odd line breaks, tabs)."""
    if len(_LOADERS) > 1:
        try:
            _check_depth(text)
            return yaml.load(text, Loader=_CLoader)  # noqa: S506 - a CSafeLoader subclass
        except yaml.YAMLError:
            pass
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def yaml_dump(data: Any) -> str:
    """YAML text of ``data`` that ``yaml_load`` reads back as it is (strings that look like numbers quoted)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=120)


def _cannot_write(path: Path, e: OSError, field: str) -> PlanError:
    """The OSError of a write as one line: why (a parent that is a file, no space, no permission) and the fix."""
    up = next((p for p in path.parents if p.exists()), None)
    why = f"{up} is a file, not a directory" if up is not None and not up.is_dir() else (e.strerror or type(e).__name__)
    return PlanError(field, f"cannot write {str(path)!r} ({why})",
                     "pass a path in a directory you can write, on a disk with free space")


#: the suffixes of the YAML/JSON files a name may be (any case): a cluster, model, profile or plan file
FILE_SUFFIXES = (".yaml", ".yml", ".json")


def names_file(spec) -> bool:
    """Whether a ``--cluster``/``--model``/``--profile`` value names a file rather than a preset or an id: an
    existing path, or one ending in a YAML/JSON suffix (a missing file is then refused as missing)."""
    return isinstance(spec, (str, Path)) and (Path(spec).suffix.lower() in FILE_SUFFIXES or Path(spec).exists())


def _write_target(path: Path) -> tuple[Path, bool]:
    """Where a write of ``path`` goes and whether in place: an existing file that is not a regular one (a device
    such as /dev/null, a FIFO, a socket) is written in place, never replaced; a symlink's resolved file is replaced
    (the link stays a link); any other path is itself."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise
        st = None  # a new path; a parent that is missing or a file fails where the write makes it
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        return path, True
    if not path.is_symlink():
        return path, False
    real = Path(os.path.realpath(path))
    if st is not None and not _same_file(real, st):
        return path, True  # a /proc/<pid>/fd link to a deleted file: its resolved name names another file or none
    return real, False


def _same_file(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` names the file whose stat is ``st``."""
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def check_writable(path: str | Path, field: str = "--output") -> None:
    """Fail before any long work if ``path`` cannot be written: a directory, a parent that cannot be made or
    written, or a device that cannot be opened for writing (as ``atomic_write`` will write it)."""
    path = Path(path)
    if path.is_dir():
        raise PlanError(field, f"{str(path)!r} is a directory", "pass a file path, e.g. plan.yaml")
    try:
        target, in_place = _write_target(path)
        if in_place:
            if not stat.S_ISFIFO(os.stat(path).st_mode):  # opening a FIFO for writing waits for a reader
                os.close(os.open(path, os.O_WRONLY))  # no O_TRUNC: the check writes nothing
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        # what atomic_write will do: a temporary file beside the target (os.access says yes to root, even on /proc)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise _cannot_write(path, e, field) from None


def _write_in_place(path: Path, text: str | bytes, field: str) -> None:
    """Write ``text`` into the existing non-regular file ``path`` (a device, a FIFO): there is no file to replace."""
    try:
        with open(path, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
    except OSError as e:  # ENOSPC from /dev/full, ENXIO from a socket
        raise _cannot_write(path, e, field) from None


def atomic_write(path: str | Path, text: str | bytes, field: str = "--output") -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and rename, so a crash never leaves
    half a file; a path that cannot be written (missing permission, full disk, not a directory) is a PlanError.
    A symlink is followed (its target is replaced, the link kept); a device or FIFO is written in place."""
    path = Path(path)
    try:
        target, in_place = _write_target(path)
    except OSError as e:
        raise _cannot_write(path, e, field) from None
    if in_place:
        _write_in_place(path, text, field)
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as e:
        raise _cannot_write(path, e, field) from None
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would otherwise survive the rename
        os.replace(tmp, target)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _cannot_write(path, e, field) from None
        raise


def dump_data(data: Any, path: str | Path, field: str = "--output", sealed: bool = False) -> None:
    """Write a dict as JSON (``.json``, any case) or YAML (anything else), atomically; ``sealed`` YAML starts with
    the sha256 of the rest (``seal``), so that a copy cut short on a line's end is refused (``read_data``)."""
    if str(path).lower().endswith(".json"):
        atomic_write(path, json.dumps(data, indent=2) + "\n", field)
    else:
        text = yaml_dump(data)
        atomic_write(path, seal(text) if sealed else text, field)


#: a sealed YAML file's first line: the sha256 of the text after it (a comment: any YAML reader skips it)
SEAL = re.compile(r"# sp-plan sha256: ([0-9a-f]{64})\n")


def seal(text: str) -> str:
    """``text`` under a first line recording its sha256 (``SEAL``)."""
    return f"# sp-plan sha256: {hashlib.sha256(text.encode()).hexdigest()}\n{text}"


def check_seal(text: str, path: Path, what: str) -> None:
    """A sealed file's text after its first line has the sha256 that line records: else it was cut short (a YAML
    mapping cut on a line's end still parses, as fewer fields) or edited. An unsealed file is taken as it is."""
    m = SEAL.match(text)
    if m and hashlib.sha256(text[m.end():].encode()).hexdigest() != m.group(1):
        raise PlanError(what, f"{path} does not match the sha256 its first line records: it was cut short or edited",
                        "copy or export it again; to load a file edited on purpose, delete its first line")


def check_schema_version(data: Any, supported: int, what: str) -> None:
    """A file from a newer sp-plan (or with a version no sp-plan wrote) is refused before its fields are read."""
    if not isinstance(data, dict) or "schema_version" not in data:
        return  # written by hand without a version: read as the current one
    v = data["schema_version"]
    if isinstance(v, bool) or not isinstance(v, int):
        raise PlanError(f"{what}.schema_version", f"must be a whole number, got {v!r}",
                        f"write schema_version: {supported} (or drop it)")
    if v > supported:
        raise PlanError(f"{what}.schema_version", f"the file has schema_version {v}, newer than this sp-plan "
                        f"supports ({supported})", "upgrade sp-plan (pip install -U sp-plan) to read it")
    if v < 1:
        raise PlanError(f"{what}.schema_version", f"schema_version {v} was never written by sp-plan "
                        f"(versions 1 to {supported})", f"write schema_version: {supported}")


def read_data(path: str | Path, what: str) -> dict:
    """Read a YAML or JSON mapping; a missing file or malformed text is a PlanError naming the file."""
    path = Path(path)
    if not path.exists():
        raise PlanError(what, f"file {str(path)!r} does not exist", "check the path")
    zipped = path.suffix.lower() == ".gz"
    kind = "JSON" if (path.with_suffix("") if zipped else path).suffix.lower() == ".json" else "YAML"
    try:
        text = (gzip.open(path, "rt", encoding="utf-8").read() if zipped else path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise PlanError(what, f"{path} is not UTF-8 text (a binary file?)", f"pass the {what} {kind} file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise PlanError(what, f"{path} is not a whole gzip file ({e})", "copy it again, or pass it unzipped") from None
    except OSError as e:
        raise PlanError(what, f"cannot read {str(path)!r} ({e.strerror or type(e).__name__})",
                        f"pass a readable {what} file") from None
    check_seal(text, path, what)
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs) if kind == "JSON" else yaml_load(text)
    except (yaml.YAMLError, ValueError) as e:  # json.JSONDecodeError and duplicate keys are ValueErrors
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PlanError(what, f"{path} is not valid {kind} ({first})", "fix the file's syntax") from None
    except RecursionError:
        raise PlanError(what, f"{path} nests too deeply", f"write the {what} as a flat mapping") from None
    if not isinstance(data, dict):
        raise PlanError(what, f"{path} does not hold a mapping", f"write the {what} as key: value pairs")
    if _expanded_size(data) > MAX_NODES:
        raise PlanError(what, f"{path} expands to more than {MAX_NODES:,} values (YAML aliases?)",
                        f"write the {what} without repeated aliases")
    return data


#: a document larger than this once YAML aliases are expanded is refused (a few KB can expand to billions)
MAX_NODES = 1_000_000


def _json_pairs(pairs: list) -> dict:
    """JSON object hook: a key given twice is an error (json.loads would keep the last silently)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _expanded_size(data: Any) -> int:
    """How many values ``data`` holds with every shared (aliased) container counted each time it appears."""
    memo: dict[int, int] = {}

    def size(x: Any) -> int:
        if not isinstance(x, (dict, list)):
            return 1
        if id(x) in memo:
            return memo[id(x)]
        memo[id(x)] = MAX_NODES + 1  # a cycle (a recursive alias) counts as too large
        items = list(x.keys()) + list(x.values()) if isinstance(x, dict) else x
        n = 1
        for v in items:
            n += size(v)
            if n > MAX_NODES:
                break
        memo[id(x)] = n
        return n

    return size(data)


#: the unit a number field of a file is written in, by the field's last name (a value such as "400Gb/s" is a string)
UNITS = {"capacity": "bytes/s, e.g. 5.0e10 for 400 Gb/s", "rate": "bytes/s, e.g. 5.0e10 for 400 Gb/s",
         "smp_capacity": "bytes/s, e.g. 6.4e10", "memory_bytes": "bytes, e.g. 8.0e10",
         "latency": "seconds, e.g. 5.0e-6 for 5 us"}


def validation_error(what: str, err: ValidationError, source: str = "") -> PlanError:
    """Turn pydantic's error into one line naming the first bad field (and, for a number that came as text, the
    unit it is written in)."""
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or what
    unit = UNITS.get(str(e["loc"][-1])) if e["loc"] and isinstance(e.get("input"), str) else None
    return PlanError(f"{what}.{loc}" if loc != what else what, f"{e['msg']}{' in ' + source if source else ''}",
                     f"write a plain number in {unit}" if unit else "fix that field")


#: the top-level keys that tell each kind of file, and where a file of that kind goes
FILE_KINDS = {"plan": ({"algorithm", "degrees"}, "`sp-plan show`, `estimate` or `export`"),
              "profile": ({"cluster_fingerprint", "params"}, "--profile or `sp-plan profile import`"),
              "cluster": ({"node_types", "nodes"}, "--cluster")}


def other_kind(data: dict, what: str, source: str) -> PlanError | None:
    """The error for a file of another kind (a profile passed as a plan, ...), or None."""
    mine = FILE_KINDS.get(what, (set(), ""))[0]
    for kind, (keys, where) in FILE_KINDS.items():
        if kind != what and keys <= data.keys() and not mine <= data.keys():
            return PlanError(what, f"{source or 'this'} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} file, not a "
                             f"{what} file", f"pass a {what} file here, and the {kind} file to {where}")
    return None


def model_from_data(cls: type[M], data: dict, what: str, source: str = "") -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise other_kind(data, what, source) or validation_error(what, err, source) from None
    except PlanError as err:  # a nested field's validator names the field alone (seq_len, read as a flag's name)
        where = key_path(data, err.field)
        if where is None or where == err.field:
            raise
        raise PlanError(where, f"{err.problem}{' in ' + source if source else ''}", err.fix) from None


def child(x: Any, key: str) -> tuple[bool, Any]:
    """(whether ``x`` has ``key``: a mapping's key or a list's index, and the value there)."""
    if isinstance(x, dict):
        return (True, x[key]) if key in x else (False, None)
    if isinstance(x, list) and key.isdigit() and int(key) < len(x):
        return True, x[int(key)]
    return False, None


def has_path(x: Any, parts: list[str]) -> bool:
    """Whether ``parts`` (keys and list indexes) lead somewhere in ``x``."""
    for key in parts:
        found, x = child(x, key)
        if not found:
            return False
    return True


def key_path(data: Any, field: str | list[str]) -> str | None:
    """The dotted path at which ``field`` (a key, or dotted keys and indexes: ``groups.ring``) sits in nested
    mappings and lists, shallowest first (``seq_len``: ``workload.seq_len``); None where it sits nowhere."""
    parts = field.split(".") if isinstance(field, str) else list(field)
    queue: deque[tuple[list[str], Any]] = deque([([], data)])
    while queue:
        path, x = queue.popleft()
        if has_path(x, parts):
            return ".".join(path + parts)
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        queue.extend((path + [str(k)], v) for k, v in items if isinstance(v, (dict, list)))
    return None


def load_yaml_model(cls: type[M], path: str | Path, what: str) -> M:
    return model_from_data(cls, read_data(path, what), what, str(path))
