"""`sp-plan profile list|show|export|import|delete` through typer's CliRunner and a real subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.planner.profile import Profile
from sp_plan.profiles import load_cluster
from sp_plan.profiles.store import Store

FIXTURE = Path(__file__).parent / "fixtures" / "profile-dgx-h100.yaml"
runner = CliRunner()


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    return f"sqlite:///{tmp_path}/store.db"


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def one_error_line(r, needle: str) -> None:
    assert r.exit_code == 2, r.output
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output


def test_import_list_show_export_delete(store, tmp_path):
    r = cli("profile", "import", FIXTURE, "--store", store)
    assert r.exit_code == 0, r.output
    pid = r.stdout.strip()
    assert len(pid) == 12 and f"as profile {pid}" in r.stderr
    r = cli("profile", "list", "--store", store)
    assert r.exit_code == 0 and pid in r.stdout and "dgx-h100x2" in r.stdout and "2/3" in r.stdout and "3.1%" in r.stdout
    fp = load_cluster("dgx-h100", 2).topology_fingerprint()
    assert pid in cli("profile", "list", "--store", store, "--cluster", "dgx-h100", "--nodes", "2").stdout
    one = cli("profile", "list", "--store", store, "--cluster", "dgx-h100", "--nodes", "1")
    fp1 = load_cluster("dgx-h100", 1).topology_fingerprint()
    shown = " ".join(one.stdout.split())  # rich wraps the line
    assert one.exit_code == 0 and pid not in one.stdout and f"no profiles stored in {store} for topology {fp1}" in shown
    assert one_error_line(cli("profile", "import", FIXTURE, "--server", ""), "--server") is None
    r = cli("profile", "show", pid, "--store", store)
    assert r.exit_code == 0, r.output
    for text in (Store(store).get_profile(pid).line(), "ulysses8 x ring2", "2.360 s", "-2.1%", "oom (CUDA out of memory",
                 "overlap", "all_to_all/inter", f"topology {fp}"):
        assert text in r.stdout, text
    out = tmp_path / "exported.yaml"
    r = cli("profile", "export", pid, "-o", out, "--store", store)
    assert r.exit_code == 0 and out.exists()
    exported = Profile.load(out)
    assert exported.id == pid and exported.model_copy(update={"id": None}) == Profile.load(FIXTURE)
    # importing the same document again keeps its id; a different document under that id gets a new one
    assert cli("profile", "import", out, "--store", store).stdout.strip() == pid
    changed = exported.model_copy(update={"loo_error_after": 0.5})
    changed.save(tmp_path / "changed.yaml")
    r = cli("profile", "import", tmp_path / "changed.yaml", "--store", store)
    new = r.stdout.strip()
    assert new != pid and len(Store(store).list_profiles()) == 2
    assert f"as profile {new} " in r.stderr and f"the file's id {pid} holds another profile there" in r.stderr
    r = cli("profile", "delete", pid[:6], "--store", store)  # a unique prefix: the id removed is the one printed
    assert r.exit_code == 0 and f"deleted profile {pid} from" in r.stdout
    assert pid not in cli("profile", "list", "--store", store).stdout
    one_error_line(cli("profile", "show", pid, "--store", store), f"profile: no profile '{pid}'")


def test_env_var_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SP_PLAN_STORE", f"sqlite:///{tmp_path}/env.db")
    pid = cli("profile", "import", FIXTURE).stdout.strip()
    assert Store(f"sqlite:///{tmp_path}/env.db").get_profile(pid).cluster == "dgx-h100x2"


def test_bad_inputs_exit_2_one_line(store, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_fingerprint: [oops\n")
    one_error_line(cli("profile", "import", bad, "--store", store), "is not valid YAML")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("cluster_fingerprint: abc\nsurprise: 1\n")
    one_error_line(cli("profile", "import", wrong, "--store", store), "profile.surprise")
    one_error_line(cli("profile", "import", tmp_path / "none.yaml", "--store", store), "does not exist")
    # a command that only reads makes no store of a path that is not one (a mistyped --store is not an empty store)
    one_error_line(cli("profile", "list", "--store", store), "--store: no store at ")
    assert not (tmp_path / "store.db").exists()
    Store(store).close()
    one_error_line(cli("profile", "show", "deadbeef", "--store", store), "no profile 'deadbeef'")
    one_error_line(cli("profile", "delete", "deadbeef", "--store", store), "no profile 'deadbeef'")
    one_error_line(cli("profile", "export", "deadbeef", "-o", tmp_path / "x.yaml", "--store", store), "no profile")
    for url in ("nosuch://x", "postgresql+psycopg://sp@127.0.0.1:1/db"):
        one_error_line(cli("profile", "list", "--store", url), "--store: cannot open store")
    one_error_line(cli("profile", "list", "--store", f"sqlite:///{tmp_path}/missing/store.db"), "--store: no store at")
    one_error_line(cli("profile", "import", FIXTURE, "--store", f"sqlite:///{tmp_path}/missing/store.db"),
                   "--store: cannot open store")
    one_error_line(cli("profile", "list", "--store", store, "--nodes", "2"), "--nodes")
    for command in (("profile", "list"), ("profile", "import", FIXTURE)):  # a folder: the URL of a file in it
        one_error_line(cli(*command, "--store", f"sqlite:///{tmp_path}"), f"e.g. sqlite:///{tmp_path}/store.db")


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_plan_and_estimate_say_a_store_is_not_there_and_do_not_make_it(command, tmp_path, monkeypatch):
    """They only read the store: a --store or $SP_PLAN_STORE naming no store (a typo, or a team's store before its
    first tune) is said, not made an empty store reported as holding nothing; an id looked up there is refused."""
    monkeypatch.delenv("SP_PLAN_STORE", raising=False)
    url = f"sqlite:///{tmp_path}/typo.db"
    plan = tmp_path / "plan.yaml"
    assert cli("plan", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "1k", "--no-profile",
               "-o", plan).exit_code == 0
    args = (["plan", "--cluster", "cpu-local", "--model", "tiny-llama", "--seq-len", "1k"] if command == "plan"
            else ["estimate", plan])
    for env in (False, True):
        if env:
            monkeypatch.setenv("SP_PLAN_STORE", url)
        r = cli(*args, *([] if env else ["--store", url]))
        assert r.exit_code == 0 and f"not using a profile: no store at {url}" in " ".join(r.output.split()), r.output
    one_error_line(cli(*args, "--profile", "abcd1234"), "(no store at ")
    assert not (tmp_path / "typo.db").exists()


def test_subprocess(tmp_path):
    store = f"sqlite:///{tmp_path}/store.db"
    run = lambda *a: subprocess.run([sys.executable, "-m", "sp_plan.cli.app", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    r = run("profile", "import", FIXTURE, "--store", store)
    assert r.returncode == 0, r.stderr
    pid = r.stdout.strip()
    # the command closed its store: the write-ahead log is in the .db file, so a copy of that file alone holds it
    assert not (tmp_path / "store.db-wal").exists()
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "store.db").write_bytes((tmp_path / "store.db").read_bytes())
    r = run("profile", "list", "--store", f"sqlite:///{tmp_path}/copy/store.db")
    assert r.returncode == 0 and pid in r.stdout, r.stderr
    r = run("profile", "list", "--store", store)
    assert r.returncode == 0 and pid in r.stdout, r.stderr
    r = run("profile", "show", "nope", "--store", store)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert [l for l in r.stderr.splitlines() if l.strip()] == [
        f"error: profile: no profile 'nope' in store {store}; see the stored ids with `sp-plan profile list --store {store}`"]


def _fake_links_world(tmp_path, monkeypatch):
    """A faked probe (no torchrun world here) whose measurement reports three steps; (cluster, its fit)."""
    from types import SimpleNamespace

    from sp_plan.profiles.discover import probe

    def measure(c, h, s, t, cb=None):
        for i in range(3):
            if cb is not None:
                cb(i + 1, 3, f"all_gather {i}")
        return calibrated, []

    cluster = load_cluster("dgx-h100", 1)
    cluster.save(tmp_path / "c.yaml")
    links = {"backend": "gloo", "device": "cpu", "world_size": 2, "nodes": 1, "applied": {}, "failed": [],
             "classes": {"intra:nvswitch": {"ops": {"all_gather": {"group_size": 2, "alpha_s": 1e-5, "busbw": 1e9,
                                                                   "peak_busbw": 1.2e9, "points": 4}}}}}
    calibrated = cluster.model_copy(update={"calibration": {"links": links}})
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name, fn in {"under_torchrun": lambda: True, "use_cuda": lambda: False, "init_world": lambda t: False,
                     "gather_hosts": lambda: [], "check_world": lambda c, h: None, "finish": lambda owned: None,
                     "profile_links": measure}.items():
        monkeypatch.setattr(probe, name, fn)
    monkeypatch.setattr(probe, "dist", SimpleNamespace(get_rank=lambda: 0, barrier=lambda: None))
    return cluster, links


def test_profile_links_stores_its_fit(tmp_path, monkeypatch):
    """`profile links` writes the cluster file and saves the fit in the store."""
    cluster, links = _fake_links_world(tmp_path, monkeypatch)
    store = f"sqlite:///{tmp_path}/store.db"
    r = cli("profile", "links", "--cluster", tmp_path / "c.yaml", "-o", tmp_path / "cal.yaml", "--store", store)
    assert r.exit_code == 0, r.output
    assert "stored the link fit" in r.stdout and (tmp_path / "cal.yaml").exists()
    assert Store(store).link_fit(cluster.topology_fingerprint()) == links
    one_error_line(cli("profile", "links", "--cluster", tmp_path / "c.yaml", "--store", "nosuch://x"), "--store")


def test_profile_links_json_prints_events_then_the_result(tmp_path, monkeypatch):
    cluster, _ = _fake_links_world(tmp_path, monkeypatch)
    store = f"sqlite:///{tmp_path}/store.db"
    r = cli("profile", "links", "--cluster", tmp_path / "c.yaml", "-o", tmp_path / "cal.yaml", "--store", store,
            "--json")
    assert r.exit_code == 0, r.output
    events = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    progress, last = events[:-1], events[-1]
    assert progress and all(e["step"] == "links" and {"event", "done", "total", "elapsed_s", "eta_s", "message"} <= set(e)
                            for e in progress)
    assert last["event"] == "result" and last["cluster_file"] == str(tmp_path / "cal.yaml")
    assert last["store"] and last["topology_fingerprint"] == cluster.topology_fingerprint()
    quiet = cli("profile", "links", "--cluster", tmp_path / "c.yaml", "-o", tmp_path / "cal.yaml", "--store", store,
                "--quiet")
    assert quiet.exit_code == 0 and quiet.stdout.startswith("wrote ") and "latency" not in quiet.stdout


def test_an_exported_profile_cut_short_is_refused_and_a_gzipped_one_is_read(store, tmp_path):
    """An exported YAML profile starts with the sha256 of the rest: cut on a line's end it still parses (as a profile
    with fewer fields, which would price plans), so the seal refuses it; an edited file loads once its first line is
    removed; an unsealed (older or hand-written) file loads as before. A gzipped profile (as benchmarks/truths keeps
    them) is read as its text, and a gzip cut short is refused in one line."""
    import gzip

    pid = cli("profile", "import", FIXTURE, "--store", store).stdout.strip()
    out = tmp_path / "p.yaml"
    assert cli("profile", "export", pid, "-o", out, "--store", store).exit_code == 0
    lines = out.read_text().splitlines(keepends=True)
    assert lines[0].startswith("# sp-plan sha256: ")
    assert Profile.load(out) == Store(store).get_profile(pid)
    cut = tmp_path / "cut.yaml"
    cut.write_text("".join(lines[:12]))
    one_error_line(cli("profile", "import", cut, "--store", store), "cut short or edited")
    edited = tmp_path / "edited.yaml"
    edited.write_text("".join(lines[1:]).replace("loo_error_after: 0.031", "loo_error_after: 0.05"))
    assert Profile.load(edited).loo_error_after == 0.05
    zipped = tmp_path / "p.yaml.gz"
    zipped.write_bytes(gzip.compress(out.read_bytes()))
    assert Profile.load(zipped) == Profile.load(out)
    short = tmp_path / "short.yaml.gz"
    short.write_bytes(zipped.read_bytes()[:200])
    one_error_line(cli("profile", "import", short, "--store", store), "is not a whole gzip file")
