"""Fuzzing the CLI as a whole: generated argument lists and files for plan, estimate, show, discover and
profile; every run exits 0, or 2 with one 'error:' line on stderr, never a traceback.

Arguments are well-typed for click (an --batch is an integer, maybe 0 or negative) and run as the console runs
them (``run_line``): a value outside a flag's declared range or choices is click's usage error, one line too; the
rest reaches sp-plan's validation."""
from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from fuzzing import budget, check_plan_error
from sp_plan.cli.app import app, run_line
from sp_plan.planner.plan import Plan
from sp_plan.profiles import preset_cluster

RUN = CliRunner()
FIX = Path(__file__).parent / "fixtures"


def files(d: Path) -> dict[str, str]:
    """Inputs a user might pass, good and bad, written into ``d``."""
    c = preset_cluster("cpu-local", 1)
    c.save(d / "cluster.yaml")
    (d / "model.yaml").write_text("name: m\nlayers: 2\nhidden: 256\nheads: 4\n")
    (d / "damaged.yaml").write_text("layers: [1, 2\nhidden: :\n")
    (d / "binary.yaml").write_bytes(b"\xff\xfe\x00garbage")
    (d / "dup.yaml").write_text("layers: 2\nlayers: 3\nhidden: 256\nheads: 4\n")
    (d / "newer.yaml").write_text(yaml.safe_dump({"schema_version": 99, "algorithm": "ring", "degrees": {"ring": 4}}))
    Plan(algorithm="ring", degrees={"ring": 4}, token_layout="zigzag").save(d / "plan.yaml")
    (d / "topo.txt").write_text((FIX / "topo" / "a10-4-pcie.txt").read_text())
    (d / "a-file").write_text("x\n")
    (d / "dir.yaml").mkdir()
    return {k: str(d / k) for k in ("cluster.yaml", "model.yaml", "damaged.yaml", "binary.yaml", "dup.yaml",
                                    "newer.yaml", "plan.yaml", "topo.txt", "dir.yaml")} | {
        "missing": str(d / "missing.yaml"), "under-file": str(d / "a-file" / "x.yaml"), "dir": str(d),
        "out-yaml": str(d / "out" / "p.yaml"), "out-json": str(d / "p.json"), "proc": "/proc/version",
        "store": f"sqlite:///{d}/store.db", "study": f"sqlite:///{d}/study.db"}


def pick(*names: str):
    """Draw one of these inputs: plain strings, or '@key' for a file made by files()."""
    return st.sampled_from(names)


def _resolve(args: list, f: dict) -> list[str]:
    return [f[a[1:]] if isinstance(a, str) and a.startswith("@") else str(a) for a in args]


INTS = st.one_of(st.integers(-2, 4), st.just(10**6))


@st.composite
def plan_args(draw, valid: bool = False) -> list:
    if valid:
        args = ["plan", "--cluster", draw(pick("cpu-local", "a10-4-pcie", "@cluster.yaml")),
                "--model", draw(pick("tiny-gpt", "tiny-llama", "@model.yaml")), "--seq-len", draw(pick("4k", "8192")),
                "--batch", str(draw(st.integers(1, 2))), "--top", str(draw(st.integers(1, 3))), "--no-profile"]
        if draw(st.booleans()):
            args += ["--search", "bayes", "--trials", "30"] + (["--storage", "@study"] if draw(st.booleans()) else [])
        return args + ["-o", draw(pick("@out-yaml", "@out-json"))]
    args = ["plan", "--cluster", draw(pick("cpu-local", "a10-4-pcie", "nosuch", "@cluster.yaml", "@damaged.yaml",
                                           "@binary.yaml", "@missing", "@dir.yaml", "@model.yaml")),
            "--model", draw(pick("tiny-gpt", "nosuch", "@model.yaml", "@damaged.yaml", "@dup.yaml", "@binary.yaml",
                                 "@missing", "@cluster.yaml")),
            "--seq-len", draw(pick("4k", "8192", "0", "-1", "1.5k", "abc", "", "9" * 40, "1m", "3"))]
    for opt, values in (("--nodes", INTS), ("--batch", INTS), ("--top", INTS)):
        if draw(st.booleans()):
            args += [opt, str(draw(values))]
    if draw(st.booleans()):
        args += ["--search", draw(pick("grid", "bayes", "nope")), "--trials", str(draw(st.integers(-1, 3)))]
        if draw(st.booleans()):
            args += ["--storage", draw(pick("nosuch://x", "garbage", "sqlite:////nonexistent/dir/s.db", "@study"))]
    if draw(st.booleans()):
        args += ["--profile", draw(pick("nosuch-id", "@damaged.yaml", "@newer.yaml", "@missing"))]
    if draw(st.booleans()):
        args += ["--no-profile"]
    if draw(st.booleans()):
        args += ["--store", draw(pick("nosuch://x", "sqlite:////nonexistent/dir/x.db", "@store"))]
    if draw(st.booleans()):
        args += ["-o", draw(pick("@out-yaml", "@out-json", "@proc", "@dir", "@under-file", "@dir.yaml"))]
    return args


@st.composite
def other_args(draw) -> list:
    cmd = draw(st.sampled_from(["show", "estimate", "discover", "profile list", "profile show", "profile import",
                                "profile delete", "profile export", "presets", "export", "report"]))
    plan_file = draw(pick("@plan.yaml", "@newer.yaml", "@damaged.yaml", "@binary.yaml", "@missing", "@dir.yaml",
                          "@cluster.yaml"))
    if cmd == "show":
        return ["show", plan_file]
    if cmd == "estimate":
        args = ["estimate", plan_file, "--cluster", draw(pick("cpu-local", "nosuch", "@cluster.yaml", "@damaged.yaml")),
                "--no-profile"]
        if draw(st.booleans()):
            args += ["--model", draw(pick("tiny-gpt", "@dup.yaml", "nosuch"))]
        if draw(st.booleans()):
            args += ["--seq-len", draw(pick("4k", "0", "x"))]
        if draw(st.booleans()):
            args += ["--batch", str(draw(INTS))]
        return args
    if cmd == "discover":
        args = ["discover", "--no-nvml", "--sysfs-root", draw(pick("@dir", "/nonexistent"))]
        if draw(st.booleans()):
            args += ["--topo-file", draw(pick("@topo.txt", "@binary.yaml", "@missing", "@dir"))]
        if draw(st.booleans()):
            args += ["-o", draw(pick("@out-yaml", "@proc", "@under-file", "@dir"))]
        return args
    if cmd == "presets":
        return ["presets"]
    if cmd == "export":
        args = ["export", plan_file, "--to", draw(pick("megatron", "deepspeed", "yunchang", "nosuch"))]
        return args + (["-o", draw(pick("@out-yaml", "@proc", "@under-file", "@dir"))] if draw(st.booleans()) else [])
    if cmd == "report":
        return ["report", "-o", draw(pick("@out-yaml", "@proc", "@under-file", "@dir")), "--cluster",
                draw(pick("cpu-local", "nosuch", "@damaged.yaml")), "--model", draw(pick("tiny-gpt", "@dup.yaml")),
                "--seq-len", draw(pick("4k", "0")), "--no-profile"]
    store = ["--store", draw(pick("@store", "nosuch://x", "sqlite:////nonexistent/dir/x.db"))]
    if cmd == "profile list":
        return ["profile", "list"] + store + (["--cluster", draw(pick("cpu-local", "nosuch"))] if draw(st.booleans()) else [])
    if cmd == "profile import":
        return ["profile", "import", draw(pick("@damaged.yaml", "@newer.yaml", "@missing", "@plan.yaml"))] + store
    if cmd == "profile export":
        return ["profile", "export", draw(pick("nosuch", "")), "-o", draw(pick("@out-yaml", "@proc"))] + store
    return ["profile", cmd.split()[1], draw(pick("nosuch", "", "../x"))] + store


def _run(args: list) -> SimpleNamespace:
    """Run the command line as the console does (an exception other than a usage error or PlanError escapes)."""
    with tempfile.TemporaryDirectory() as d:
        line = _resolve(args, files(Path(d)))
        with RUN.isolation() as (out, err, both):
            code = run_line(line)
            r = SimpleNamespace(exit_code=code, stderr=err.getvalue().decode(), output=both.getvalue().decode())
    assert "Traceback" not in r.output, r.output
    return r


def _one_line_error(r, args) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)


@budget(0.5)
@given(plan_args())
def test_plan_exits_0_or_2_with_one_line(args):
    r = _run(args)
    assert r.exit_code in (0, 2), (args, r.output)
    if r.exit_code == 2:
        _one_line_error(r, args)


@budget(0.25)
@given(plan_args(valid=True))
def test_valid_plan_commands_exit_0_and_write_a_plan(args):
    with tempfile.TemporaryDirectory() as d:
        f = files(Path(d))
        r = RUN.invoke(app, _resolve(args, f))
        assert r.exit_code == 0, (args, r.output)
        assert Plan.load(_resolve(args, f)[-1]).predicted is not None


@given(other_args())
def test_other_commands_exit_0_or_2_with_one_line(args):
    r = _run(args)
    assert r.exit_code in (0, 2), (args, r.output)
    if r.exit_code == 2:
        _one_line_error(r, args)


def test_the_issues_three_cases(tmp_path):
    """`--storage 'nosuch://x'`, `-o /proc/version` and a plan of schema_version 99: exit 2, one line each."""
    base = ["plan", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "4k", "--no-profile"]
    newer = tmp_path / "newer.yaml"
    newer.write_text("schema_version: 99\nalgorithm: ring\ndegrees: {ring: 4}\n")
    for args, says in ((base + ["--search", "bayes", "--trials", "2", "--storage", "nosuch://x"], "--storage"),
                       (base + ["-o", "/proc/version"], "--output"),
                       (["show", str(newer)], "plan.schema_version: the file has schema_version 99, newer than this "
                                              "sp-plan supports (1)")):
        r = RUN.invoke(app, args)
        assert r.exit_code == 2
        _one_line_error(r, args)
        assert r.stderr.strip().startswith(f"error: {says}"), r.stderr
    check_plan_error(_plan_error_of(newer))


def _plan_error_of(path: Path):
    from sp_plan.planner.errors import PlanError

    try:
        Plan.load(path)
    except PlanError as e:
        return e
    raise AssertionError("a plan of schema_version 99 loaded")
