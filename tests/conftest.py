"""Shared fixtures: fresh plugin managers, a test plugin installed as a real distribution, and a
check that no process or shared-memory segment outlives a test."""

from __future__ import annotations

import contextlib
import json
import multiprocessing.process
import multiprocessing.resource_sharer
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mprl.host.plugins import PluginManager, get_plugin_manager

HERE = Path(__file__).parent
REPO = HERE.parent


#: the tiers of the suite, by folder: ``pytest tests/unit`` (or ``-m unit``) is the inner loop
TIERS = ("unit", "integration", "slow")


def tier(item: pytest.Item) -> str | None:
    """The tier of a test: the folder under ``tests/`` it is in."""
    try:
        first = item.path.relative_to(HERE).parts[0]
    except ValueError:
        return None
    return first if first in TIERS else None


def pytest_configure(config: pytest.Config) -> None:
    """The tests' own process computes too (serial runs, learner updates in unit tests): with
    one torch thread, as each child of a run has, a busy machine (other tests beside it under
    pytest-xdist, another run) cannot make torch's thread pool spin-wait for a core.

    And this process's multiprocessing temp dir (where a Manager server it starts listens, and
    the fd sharer torch uses) is one for the whole session, made now: made lazily, it would be
    in the temp dir of whichever test came first, and a ``pymp-*`` one would be removed by the
    first run that stops a Manager server started from here (the server inherits the directory
    and the run removes its server's ``pymp-*`` directory), under every later test's feet."""
    torch.set_num_threads(1)
    _children_start_with_default_signals()
    main_tmp = tempfile.mkdtemp(prefix="mprlt-main-")
    multiprocessing.process.current_process()._config["tempdir"] = main_tmp  # type: ignore[attr-defined]
    config.add_cleanup(lambda: shutil.rmtree(main_tmp, ignore_errors=True))
    # matplotlib builds its font cache on first use with a `fc-list` subprocess: done here, once,
    # so a unit test that draws (mprl report) starts no process on a machine without the cache
    with contextlib.suppress(ImportError):
        import matplotlib.font_manager  # noqa: F401


#: the signals the tests send to what they start (and the terminal's others): each is at its
#: default there, however the suite was started (``nohup`` ignores SIGHUP, a background job of a
#: script SIGINT and SIGQUIT), so a test does the same in the foreground, under ``nohup`` and in
#: the background; a run started with one ignored is a test's own choice (``preexec_fn``)
TEST_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, signal.SIGTSTP)
#: the names of the signals the suite was started ignoring, for its pytest-xdist workers
SUITE_IGNORES = "MPRL_TESTS_IGNORE"


def _ignored_by_the_suite(signum: int, frame: Any) -> None:
    """What the suite's own processes do with a signal they were started ignoring: nothing."""


def _children_start_with_default_signals() -> None:
    """A signal ignored when the suite started stays ignored by the suite's own processes
    (pytest, and its pytest-xdist workers, told through :data:`SUITE_IGNORES`: they start with
    it at its default), by a handler that does nothing instead of ``SIG_IGN``: a program that a
    process starts (``execve``) inherits an ignored signal, but a handled one is at its default
    there. So every process a test starts, and every in-process run, sees each of
    :data:`TEST_SIGNALS` as in a suite started in the foreground."""
    noted = set(filter(None, os.environ.get(SUITE_IGNORES, "").split(",")))
    for sig in TEST_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN or sig.name in noted:
            signal.signal(sig, _ignored_by_the_suite)
            noted.add(sig.name)
    if noted:
        os.environ[SUITE_IGNORES] = ",".join(sorted(noted))


def main_listeners() -> set[str]:
    """The sockets in this process's multiprocessing temp dir (a Manager server started from
    here listens there), the fd sharer's long-lived one left out."""
    tmp = multiprocessing.process.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
    sharer = getattr(multiprocessing.resource_sharer._resource_sharer, "_address", None)
    found = {str(p) for p in Path(tmp).glob("listener-*")} if tmp else set()
    return found - {sharer}


#: the longest units of work of the suite (a Ray cluster each, a handful of runs on it): first
LONGEST = {
    HERE / "slow" / "ray_cluster" / "test_runs.py",
    HERE / "slow" / "ray_cluster" / "test_faults.py",
    HERE / "slow" / "ray_cluster" / "test_faults_nodes.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (``-m unit``, ``-m "not slow"``), and run the slow tier first
    (the Ray modules before all), then integration, then unit: under pytest-xdist the longest
    files start first and the short ones fill in around them."""
    for item in items:
        if (name := tier(item)) is not None:
            item.add_marker(name)
    items.sort(key=lambda item: (TIERS[::-1].index(tier(item) or "unit"), item.path not in LONGEST))


@pytest.fixture(autouse=True)
def _unit_starts_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit test starts no process at all (no spawn, no subprocess, no Manager server, no Ray):
    one that does belongs in ``tests/integration``."""
    if tier(request.node) != "unit":
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(
            "a unit test starts no process: move it to tests/integration (or tests/slow)"
        )

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)


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
        m: (HERE / "plugins" / f"{m}.py").read_text() for m in ("mprl_testplugin", "mprl_docs_dqn")
    }
    write_distribution(
        root,
        "mprl-testplugin",
        {"testplugin": "mprl_testplugin", "docs-dqn": "mprl_docs_dqn"},
        modules,
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
def third_party_dqn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A third-party distribution ``mprl-dqn`` installed beside mprl (in this process and the
    children it starts): plugin ``dqn``, module ``mprl_dqn`` (tests/plugins/third_party_dqn.py),
    the same plugin name as the built-in dqn's. ``mprl_dqn`` is forgotten after the test."""
    site = tmp_path / "third-party-site"
    site.mkdir()
    source = (HERE / "plugins" / "third_party_dqn.py").read_text()
    write_distribution(site, "mprl-dqn", {"dqn": "mprl_dqn"}, {"mprl_dqn": source})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    saved = sys.modules.pop("mprl_dqn", None)  # the built-in's under its deprecated name
    yield site
    sys.modules.pop("mprl_dqn", None)
    if saved is not None:
        sys.modules["mprl_dqn"] = saved


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
    """Run ``python -m mprl ARGS`` like a user would (typing ``stdin``, if given); what it
    started ends with it (:func:`end`), also when it runs past ``timeout``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", *args],
        stdin=subprocess.PIPE if stdin is not None else None,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, cwd=cwd, **own_group(),
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout)
    finally:
        end(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def cli_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``python -m mprl ARGS`` in this process (for errors raised before anything starts,
    where a subprocess would only add its start-up time); returns the exit code and stderr."""
    from mprl.tools.cli import main

    code = main(list(args))
    return code, capsys.readouterr().err


@contextlib.contextmanager
def running(args: list[str], **kw: Any) -> Iterator[subprocess.Popen[str]]:
    """``python -m mprl run ARGS`` in the background, in a process group of its own: what it
    started ends with the test (:func:`end`), whichever way the test ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **own_group(**kw),
    )  # fmt: skip
    try:
        yield proc
    finally:
        end(proc)


def own_group(**kw: Any) -> dict[str, Any]:
    """``Popen`` keywords ``kw`` with the process started in a process group of its own (the
    group :func:`end` ends), in the session of the tests: a Ctrl-C or hang-up meant for the
    suite's terminal does not reach it, and a Ctrl-Z stops it as it stops a shell's job."""
    if sys.version_info >= (3, 11):
        return {**kw, "process_group": 0}
    first = kw.get("preexec_fn")

    def setpgrp_first() -> None:
        os.setpgrp()
        if first is not None:
            first()

    return {**kw, "preexec_fn": setpgrp_first}


#: how long what a killed process started gets to end by itself before it is killed too: a run's
#: children end with their parent, and its resource tracker removes the run's semaphores first
END_GRACE_S = 10


def end(proc: subprocess.Popen[Any], grace: float = END_GRACE_S) -> None:
    """End ``proc``, started in a process group of its own (:func:`own_group`, or a session of
    its own), and what it started there, whichever way the test ends: ``proc`` killed if it
    still runs, and reaped (its pipes read to the end). What of its group is still alive after
    ``grace`` s is killed too, resource trackers last (they remove the semaphores of what they
    served once it is gone). Nothing is waited for when nothing is left."""
    if proc.poll() is None:
        proc.kill()
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):  # its pipes held by another
        proc.communicate(timeout=grace)
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _non_tracker(group_members(proc.pid)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_members(proc.pid):  # (a group with a live member keeps its id: none other is hit)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (read from /proc, zombies excluded)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The whole records of a run's ``metrics.jsonl``; a line the run is still writing (one
    with no newline yet: a large batch of records reaches the file in more than one write) is
    left for the next read."""
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


#: how long a test waits for a run to reach the state it needs before it gives up: a guard
#: against a hang, not a speed the run must reach (a cold start on a busy machine is slow)
WAIT_S = 180


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll ``condition()`` until it is true and return its value: a handshake with a run,
    never a guess of how long it takes."""
    deadline = time.monotonic() + timeout
    while True:
        if value := condition():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout:g} s")
        time.sleep(0.1)


def wait_for_metrics(run_dir: Path, until: Any = None, timeout: float = WAIT_S) -> list[dict]:
    """Wait until ``metrics.jsonl`` has a record (one for which ``until(record)`` is true)."""

    def found() -> list[dict] | None:
        records = read_metrics(run_dir)
        if records and (until is None or any(until(r) for r in records)):
            return records
        return None

    return wait_until(found, "the run did not report what the test waits for", timeout)


def stepped(record: dict[str, Any]) -> bool:
    """A record logged once the run had taken an env step (``step`` is the run's total then)."""
    return record.get("step", 0) > 0


def wait_for_children(
    proc: subprocess.Popen[str], names: set[str], timeout: float = WAIT_S
) -> dict[int, str]:
    """Wait until the run ``proc`` has a child process by each of ``names`` (``mprl-worker-0``,
    ``mprl-trainer``, ``mprl-manager``: children name themselves once they are up); returns
    every child's name by pid."""

    def named() -> dict[int, str] | None:
        found = {pid: comm(pid) for pid in child_pids(proc.pid)}
        return found if names <= set(found.values()) else None

    return wait_until(named, f"children {sorted(names)} of the run", timeout)


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


def shm_holders(names: set[str]) -> dict[str, set[int]]:
    """For each of ``names`` (entries of ``/dev/shm``), the live processes that map it or hold
    it open (a POSIX semaphore or a shared tensor is mapped by every process that uses it)."""
    out: dict[str, set[int]] = {name: set() for name in names}
    paths = {f"/dev/shm/{name}": name for name in names}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        pid = int(entry.name)
        try:
            for line in (entry / "maps").read_text().splitlines():
                at = line.find("/dev/shm/")
                if at >= 0 and line[at:] in paths:
                    out[paths[line[at:]]].add(pid)
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target in paths:
                        out[paths[target]].add(pid)
        except OSError:
            continue
    return out


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


#: what a run may leave in the temp dir: torch's error files, mprl's temp run directories, and
#: multiprocessing's directories (a Manager server's listening socket is in one)
TEMP_PATTERNS = ("pytorch-errorfile-*", "mprl-*", "pymp-*")


def temp_leftovers(tmp: Path | None = None) -> set[str]:
    """Temp files a run may leave in ``tmp`` (the temp dir of this process by default)."""
    tmp = Path(tempfile.gettempdir()) if tmp is None else tmp
    return {p.name for pattern in TEMP_PATTERNS for p in tmp.glob(pattern)}


def clean_stderr(stderr: str) -> None:
    """What a run must never print: leaked-semaphore warnings, KeyboardInterrupt tracebacks."""
    assert "leaked semaphore" not in stderr and "resource_tracker" not in stderr, stderr
    assert "KeyboardInterrupt" not in stderr, stderr


#: a folder on every test's ``PYTHONPATH``: its ``sitecustomize`` names the semaphores of every
#: Python process the test starts after the test
TAGGING = HERE / "tagging"


def semaphore_prefix(mark: str) -> str:
    """The name prefix of the semaphores made by the processes of the test marked ``mark``."""
    return "/mpt" + mark[:12]


class Leftovers:
    """What one test left behind, counting only what the test itself made: its processes (the
    descendants of this process, and every process carrying the test's ``MPRL_TEST_MARK``, even
    one re-parented to init), the ``/dev/shm`` entries its processes made, and the files in the
    test's own temp dir. Another mprl run on the machine, or another pytest-xdist worker, is
    never counted: its processes carry no mark of this test and are not our descendants, its
    semaphores are not named after this test, and its temp files are in its own temp dir.

    :meth:`start` marks what the test starts from here on (environment, semaphore names)."""

    def __init__(self, mark: str, tmp: Path) -> None:
        self.mark, self.tmp = mark, tmp
        self.semaphores = "sem." + semaphore_prefix(mark)[1:] + "-"

    def start(self, monkeypatch: pytest.MonkeyPatch) -> Leftovers:
        """Mark this process and every process the test starts, then note what exists now."""
        monkeypatch.setenv("MPRL_TEST_MARK", self.mark)
        path = os.environ.get("PYTHONPATH")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TAGGING), *([path] if path else [])]))
        config = multiprocessing.process.current_process()._config  # type: ignore[attr-defined]
        monkeypatch.setitem(config, "semprefix", semaphore_prefix(self.mark))
        self.shm_before, self.listeners_before = shm_entries(), main_listeners()
        return self

    def ours(self) -> set[int]:
        return {os.getpid(), *child_pids(os.getpid()), *marked_pids(self.mark)}

    def processes(self) -> tuple[list[int], list[int]]:
        """(children of this process, orphans of the test), this process's resource tracker left
        out (it lives as long as this process, whichever test happened to start it)."""
        family = child_pids(os.getpid())
        return _non_tracker(family), [p for p in marked_pids(self.mark) if p not in family]

    def shm(self) -> set[str]:
        """New ``/dev/shm`` entries of the test: its semaphores (by name), and what else no
        process but the test's own holds (a shared tensor is held by every process using it)."""
        new = shm_entries() - self.shm_before
        mine = {name for name in new if name.startswith(self.semaphores)}
        other = {name for name in new if not name.startswith("sem.")}  # another's semaphore: not
        if other:
            ours = self.ours()
            mine |= {name for name, pids in shm_holders(other).items() if not pids - ours}
        return mine

    def check(self, timeout: float = 30) -> None:
        """Wait up to ``timeout`` s for what the test made to go, then fail naming what did not."""
        deadline = time.monotonic() + timeout
        while True:
            (kids, orphans), shm = self.processes(), self.shm()
            # a name with no holder may be another process's between creating and mapping it,
            # or between unmapping and unlinking it: it has to stay to count
            if (not kids and not orphans and not shm) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        named = {pid: _cmdline(pid) for pid in [*kids, *orphans]}
        for pid in named:  # the test fails; what it left must not load the rest of the suite
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        assert not kids, f"processes left behind: {[(k, named[k]) for k in kids]}"
        assert not orphans, f"orphaned processes left behind: {[(k, named[k]) for k in orphans]}"
        assert not shm, f"shared memory left behind: {sorted(shm)}"
        left = temp_leftovers(self.tmp) | (main_listeners() - self.listeners_before)
        assert not left, f"temp files left: {left}"


@pytest.fixture(autouse=True)
def no_leftovers(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Every test must leave no process (child or orphan), shared-memory segment, semaphore or
    temp file behind. The test (and every process it starts) gets a temp dir of its own
    (``TMPDIR``), so a leftover is the test's own whatever else runs beside it."""
    tmp_path_factory.getbasetemp()  # pytest's own temp dirs stay where they are
    tmp = Path(tempfile.mkdtemp(prefix="mprlt-"))  # short: a Manager's socket path is in it
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    leftovers = Leftovers(uuid.uuid4().hex, tmp).start(monkeypatch)
    try:
        yield
        leftovers.check()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


SEED = REPO / "examples" / "mprl-seed"


def pip_site(tmp_path_factory: pytest.TempPathFactory, project: Path) -> Path:
    """``project`` installed with pip into a directory of its own, as a user would."""
    target = tmp_path_factory.mktemp(f"{project.name}-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(project)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


@pytest.fixture(scope="session")
def seed_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/mprl-seed installed with pip (:func:`pip_site`)."""
    return pip_site(tmp_path_factory, SEED)


def with_site(site: Path) -> dict[str, str]:
    """The environment that puts ``site`` on a child's path."""
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
