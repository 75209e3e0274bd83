"""The measuring commands (`tune`, `discover`, `profile links`) check their flags before they start any slow work:
a bad value is exit 2 and one `error: FLAG: problem; fix` line naming the option the user typed, never a traceback,
a wait of minutes, or an error about something else (the torchrun world) that hides the mistyped flag."""
import os
import subprocess
import sys

import pytest
from test_client_input_errors import assert_one_error

SP = [sys.executable, "-m", "sp_plan.cli.app"]
TUNE = ["tune", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "4k"]
#: torchrun's variables: without them a command is not in a world, so none of these runs can start to measure
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID")


def run(args: list[str], cwd) -> subprocess.CompletedProcess:
    """The CLI in a fresh process, outside any torchrun world, in ``cwd``."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN}
    return subprocess.run([*SP, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("value", ["abc", "0"])
def test_tune_names_its_own_sizes_flag(value, tmp_path):
    """tune's link sizes are `--link-sizes`: an error naming `--sizes` (`profile links`' flag) would send the user to
    an option tune refuses as unknown."""
    line = assert_one_error(run([*TUNE, "--link-sizes", value], tmp_path), "--link-sizes")
    assert repr(value) in line


@pytest.mark.parametrize("flag", ["--max-minutes", "--candidate-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
def test_tune_times_must_be_positive_and_finite(flag, value, tmp_path):
    """A time of nan passes a `<= 0` check (every comparison with nan is False) and bounds nothing, as inf does: the
    tune would run without the limit the user meant to set."""
    assert_one_error(run([*TUNE, flag, value], tmp_path), flag)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_discover_timeout_must_be_positive_and_finite(value, tmp_path):
    """`discover --timeout` is how long a rank waits for the others: zero or less gives up at once and nan or inf
    never does, so it is refused on a single host too, where it would otherwise pass unnoticed until torchrun."""
    assert_one_error(run(["discover", "--timeout", value], tmp_path), "--timeout")


@pytest.mark.parametrize("args, flag", [
    (["--sizes", "abc"], "--sizes"),
    (["--sizes", "0"], "--sizes"),
    (["--timeout", "-1"], "--timeout"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--cluster", "missing.yaml"], "--cluster"),
    (["-o", "a_directory.yaml"], "--output"),
], ids=["sizes-abc", "sizes-0", "timeout-negative", "timeout-zero", "timeout-nan", "timeout-inf", "cluster-missing",
        "output-directory"])
def test_profile_links_checks_its_flags_before_the_world(args, flag, tmp_path):
    """Run outside torchrun, `profile links` would fail anyway; the flag must still be named first, so that a user
    who fixes the launch is not then stopped by a typo (after torch loads and every rank joins)."""
    (tmp_path / "a_directory.yaml").mkdir()
    line = assert_one_error(run(["profile", "links", *args], tmp_path), flag)
    assert "torchrun" not in line


def test_profile_links_json_error_names_the_flag(tmp_path):
    """With --json the error event carries the same flag as the error line: a script reading the events is told the
    option to change, not an internal field name."""
    r = run(["profile", "links", "--json", "--cluster", "missing.yaml"], tmp_path)
    assert_one_error(r, "--cluster")
    assert '"event": "error"' in r.stdout and '"message": "--cluster: ' in r.stdout, r.stdout
