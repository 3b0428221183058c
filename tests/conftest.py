"""Shared fixtures: fresh plugin managers, a test plugin installed as a real distribution, and a
check that no process or shared-memory segment outlives a test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mprl.host.plugins import PluginManager, get_plugin_manager

HERE = Path(__file__).parent
REPO = HERE.parent


def write_distribution(
    root: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]
) -> None:
    """Install a distribution into ``root`` the way pip lays it out: modules + ``.dist-info``."""
    for name, source in modules.items():
        (root / f"{name}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    lines = ["[mprl]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory holding two installed distributions: the test plugins (probe, dqn) and a
    broken one."""
    root = tmp_path_factory.mktemp("site")
    modules = {
        m: (HERE / "plugins" / f"{m}.py").read_text() for m in ("mprl_testplugin", "mprl_dqn")
    }
    write_distribution(
        root, "mprl-testplugin", {"testplugin": "mprl_testplugin", "dqn": "mprl_dqn"}, modules
    )
    write_distribution(
        root,
        "mprl-brokenplugin",
        {"broken": "mprl_brokenplugin"},
        {"mprl_brokenplugin": "raise ImportError('needs the frobnicator package')\n"},
    )
    return root


@pytest.fixture
def installed(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make the test distributions visible to this process and to every child it starts."""
    monkeypatch.syspath_prepend(str(plugin_site))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(plugin_site), os.environ.get("PYTHONPATH", "")])
    )
    return plugin_site


@pytest.fixture
def pm() -> PluginManager:
    """A fresh plugin manager with built-ins only: register test plugins inline."""
    return get_plugin_manager(autoload=False)


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mprl ARGS`` like a user would (typing ``stdin``, if given)."""
    return subprocess.run(
        [sys.executable, "-m", "mprl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def cli_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``python -m mprl ARGS`` in this process (for errors raised before anything starts,
    where a subprocess would only add its start-up time); returns the exit code and stderr."""
    from mprl.tools.cli import main

    code = main(list(args))
    return code, capsys.readouterr().err


@contextlib.contextmanager
def running(args: list[str], **kw: Any) -> Iterator[subprocess.Popen[str]]:
    """``python -m mprl run ARGS`` in the background, killed if the test ends before it does."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The whole records of a run's ``metrics.jsonl``; a line the run is still writing (one
    with no newline yet: a large batch of records reaches the file in more than one write) is
    left for the next read."""
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def wait_for_metrics(run_dir: Path, until: Any = None, timeout: float = 60) -> list[dict]:
    """Wait until ``metrics.jsonl`` has a record (one for which ``until(record)`` is true)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_metrics(run_dir)
        if records and (until is None or any(until(r) for r in records)):
            return records
        time.sleep(0.1)
    raise AssertionError(f"the run did not report what the test waits for in {timeout} s")


def child_pids(pid: int) -> list[int]:
    """Live descendants of ``pid`` (read from /proc, zombies excluded)."""
    by_parent: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        by_parent.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_worker_and_wait_for_restart(
    proc: subprocess.Popen[str], run_dir: Path, rank: int
) -> dict[str, Any]:
    """SIGKILL worker ``rank`` of the run ``proc`` and return the run's "restart" event for it."""
    (pid,) = [p for p in child_pids(proc.pid) if comm(p) == f"mprl-worker-{rank}"]
    os.kill(pid, signal.SIGKILL)
    records = wait_for_metrics(run_dir, lambda r: r.get("event") == "restart")
    (restart,) = [r for r in records if r.get("event") == "restart"]
    return restart


def comm(pid: int) -> str:
    """The process name ``ps`` shows (mprl names its children ``mprl-worker-N`` ...)."""
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _non_tracker(pids: list[int]) -> list[int]:
    # multiprocessing's resource tracker lives as long as the interpreter (here: pytest)
    return [p for p in pids if "resource_tracker" not in _cmdline(p)]


def shm_entries() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir()} if shm.exists() else set()


def marked_pids(mark: str) -> list[int]:
    """Live processes whose environment holds ``MPRL_TEST_MARK=mark``: every process a test
    started, however deep, even after its parent died and it was re-parented to init."""
    needle = f"MPRL_TEST_MARK={mark}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def temp_leftovers() -> set[str]:
    """Temp files a run may leave: torch's error files, mprl's temp run directories, and
    multiprocessing's directories (a Manager server's listening socket is in one)."""
    tmp = Path(tempfile.gettempdir())
    patterns = ("pytorch-errorfile-*", "mprl-*", "pymp-*")
    return {p.name for pattern in patterns for p in tmp.glob(pattern)}


def clean_stderr(stderr: str) -> None:
    """What a run must never print: leaked-semaphore warnings, KeyboardInterrupt tracebacks."""
    assert "leaked semaphore" not in stderr and "resource_tracker" not in stderr, stderr
    assert "KeyboardInterrupt" not in stderr, stderr


@pytest.fixture(autouse=True)
def no_leftovers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test must leave no process (child or orphan), shared-memory segment, semaphore or
    temp file behind."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv("MPRL_TEST_MARK", mark)
    before, tmp_before = shm_entries(), temp_leftovers()
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = _non_tracker(child_pids(os.getpid()))
        orphans = [p for p in marked_pids(mark) if p not in child_pids(os.getpid())]
        if not kids and not orphans:
            break
        time.sleep(0.1)
    new_shm = shm_entries() - before
    assert not kids, f"processes left behind: {[(k, _cmdline(k)) for k in kids]}"
    assert not orphans, f"orphaned processes left behind: {[(k, _cmdline(k)) for k in orphans]}"
    assert not new_shm, f"shared memory left behind: {sorted(new_shm)}"
    assert not temp_leftovers() - tmp_before, f"temp files left: {temp_leftovers() - tmp_before}"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
