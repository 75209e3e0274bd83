"""Bad client input through the real CLI: a malformed --server URL, a token a header cannot carry, a port in use or
an address `sp-plan serve` cannot listen on are each exit 2 and one `error: FLAG: problem; fix` line, no traceback."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sp_plan.client import Client, TOKEN_ENV, checked_url
from sp_plan.planner.errors import PlanError

SP = [sys.executable, "-m", "sp_plan.cli.app"]
PLAN_FILE = str(Path(__file__).parent / "fixtures" / "plans" / "usp-16-with-groups.yaml")
PLAN = ["plan", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "4k", "--no-profile"]
ESTIMATE = ["estimate", PLAN_FILE, "--cluster", "dgx-h100", "--nodes", "2", "--no-profile"]
#: nothing listens on the discard port: a request that is made fails as "cannot reach", not as the input error
UNUSED = "http://127.0.0.1:9"


def run(*args: str, token: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in a fresh process with ``$SP_PLAN_TOKEN`` set to ``token`` (unset where None)."""
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, "SP_PLAN_TOKENS")}
    if token is not None:
        env[TOKEN_ENV] = token
    return subprocess.run([*SP, *args], capture_output=True, text=True, env=env, timeout=timeout)


def assert_one_error(r: subprocess.CompletedProcess, flag: str) -> str:
    """``r`` exited 2 with one non-empty stderr line, ``error: FLAG: ...``, and no traceback; returns the line."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {flag}: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [PLAN, ESTIMATE], ids=["plan", "estimate"])
@pytest.mark.parametrize("url", ["http://host:abc", "http://[::1"])
def test_malformed_server_url_is_one_line(command, url):
    line = assert_one_error(run(*command, "--server", url), "--server")
    assert url in line and "cannot reach" not in line


@pytest.mark.parametrize("url", ["notaurl", "ftp://x", "http://", "http://127.0.0.1:99999", "http://a b"])
def test_other_malformed_urls_fail_before_any_request(url):
    with pytest.raises(PlanError) as e:
        Client(url)
    assert e.value.field == "server" and url in e.value.problem


def test_a_url_keeps_its_host_and_port():
    assert checked_url(" http://[::1]:8000/ ") == "http://[::1]:8000/"
    with Client("https://planner.example:8443/") as c:
        assert c.url == "https://planner.example:8443"


@pytest.mark.parametrize("token", ["tök", "abc\u00a0"], ids=["umlaut", "nbsp"])
def test_non_ascii_token_is_one_line(token):
    line = assert_one_error(run(*PLAN, "--server", UNUSED, token=token), TOKEN_ENV)
    assert "ASCII" in line and "cannot reach" not in line


def test_a_token_passed_in_code_is_checked_too():
    with pytest.raises(PlanError) as e:
        Client(UNUSED, token="t\nk")
    assert e.value.field == "token" and "ASCII" in e.value.fix


def test_serve_on_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run("serve", "--port", str(port), "--store", f"sqlite:///{tmp_path}/store.db")
    line = assert_one_error(r, "--port")
    assert line == f"error: --port: 127.0.0.1:{port} is in use; pick another --port"


def test_serve_on_an_impossible_host_is_one_line(tmp_path):
    r = run("serve", "--host", "256.1.1.1", "--port", "8000", "--store", f"sqlite:///{tmp_path}/store.db")
    assert assert_one_error(r, "--host").startswith("error: --host: cannot listen on 256.1.1.1: ")


def test_a_tune_that_uploads_to_a_malformed_url_is_refused_before_it_measures():
    """`tune --server` uploads after its measuring: a mistyped URL is answered at once, before torch or a world."""
    line = assert_one_error(run("tune", "--cluster", "cpu-local", "--model", "tiny-gpt", "--seq-len", "1k",
                                "--server", "http://host:abc", timeout=30), "--server")
    assert "http://host:abc" in line
