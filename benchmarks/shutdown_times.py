"""How long mprl takes to stop, per fault case, measured on the real CLI.

    python benchmarks/shutdown_times.py [--out benchmarks/results/shutdown.json]

Each case starts ``python -m mprl run`` in a subprocess, injects the fault once the run is
stepping, and measures seconds from the fault to the main process's exit and to the moment no
process of the run is left (found through a marker in their environment, so orphans count).
The fault-injecting ``probe`` plugin of the test suite is installed into a temp dir for it.
Bounds by design: stop flag -> 5 s -> SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import child_pids, comm, marked_pids, read_metrics, write_distribution  # noqa: E402


def _wait(cond: Callable[[], object], timeout: float = 90) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError


def measure(name: str, args: list[str], fault: Callable[[subprocess.Popen, Path], None],
            site: Path, at_start: bool = False) -> dict:  # fmt: skip
    """``at_start``: the fault comes as soon as the first child exists (in its own process
    group, so it can be signalled as a whole), not once the run is stepping."""
    run_dir = Path(tempfile.mkdtemp(prefix="mprl-shutdown-")) / "run"
    mark = uuid.uuid4().hex
    env = {**os.environ, "MPRL_TEST_MARK": mark, "PYTHONPATH": str(site)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", *args, "--run-dir", str(run_dir), "--quiet"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=at_start,
    )  # fmt: skip
    if at_start:
        _wait(lambda: child_pids(proc.pid))
    else:
        _wait(lambda: any("episode_return" in r for r in read_metrics(run_dir)))
        time.sleep(1.0)
    t0 = time.monotonic()
    try:
        fault(proc, run_dir)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    exited = time.monotonic() - t0
    _wait(lambda: not marked_pids(mark), timeout=30)
    gone = time.monotonic() - t0
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    row = {
        "case": name,
        "exit_code": proc.returncode,
        "to_exit_s": round(exited, 2),
        "to_nothing_left_s": round(gone, 2),
        "shutdown_s": summary.get("shutdown_s"),
        "restarts": summary.get("restarts"),
    }
    proc.stderr.close()
    shutil.rmtree(run_dir.parent, ignore_errors=True)  # a temp run directory
    print(json.dumps(row), flush=True)
    return row


def _signal(sig: int) -> Callable[[subprocess.Popen, Path], None]:
    return lambda proc, _: proc.send_signal(sig)


def _kill_child(name: str, sig: int = signal.SIGKILL) -> Callable[[subprocess.Popen, Path], None]:
    def fault(proc: subprocess.Popen, _: Path) -> None:
        (pid,) = [p for p in child_pids(proc.pid) if comm(p) == name]
        os.kill(pid, sig)

    return fault


def _forkserver_then_stop(sig: int) -> Callable[[subprocess.Popen, Path], None]:
    """``sig`` to the run's forkserver, then SIGINT to the main process a second later."""

    def fault(proc: subprocess.Popen, _: Path) -> None:
        # the forkserver is the main process's child; what it forked shows the same command line
        (pid,) = [
            p
            for p in child_pids(proc.pid)
            if b"forkserver import main" in _cmd(p) and _parent(p) == proc.pid
        ]
        os.kill(pid, sig)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)

    return fault


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _group(sig: int) -> Callable[[subprocess.Popen, Path], None]:
    return lambda proc, _: os.killpg(proc.pid, sig)


def _twice(sig: int) -> Callable[[subprocess.Popen, Path], None]:
    def fault(proc: subprocess.Popen, _: Path) -> None:
        proc.send_signal(sig)
        time.sleep(1.0)  # the first stop is waiting for children that ignore it
        proc.send_signal(sig)

    return fault


def _worker(proc: subprocess.Popen, rank: int) -> int | None:
    pids = [p for p in child_pids(proc.pid) if comm(p) == f"mprl-worker-{rank}"]
    return pids[0] if pids else None


def _kill_worker_then_stop(proc: subprocess.Popen, run_dir: Path) -> None:
    old = _worker(proc, 1)
    _kill_child("mprl-worker-1")(proc, run_dir)
    _wait(lambda: _worker(proc, 1) not in (None, old))
    time.sleep(3)  # the restarted worker is stepping again
    proc.send_signal(signal.SIGINT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    out = parser.parse_args().out
    site = Path(tempfile.mkdtemp(prefix="mprl-site-"))
    source = (REPO / "tests" / "plugins" / "mprl_testplugin.py").read_text()
    write_distribution(
        site, "mprl-testplugin", {"testplugin": "mprl_testplugin"}, {"mprl_testplugin": source}
    )
    forever = ["--total-steps", "1000000000"]
    a3c = ["--plugin", "a3c", "--workers", "2", *forever, "--set", "lr=1e-6"]
    probe = ["--plugin", "probe", "--workers", "2", *forever, "--set", "step_sleep=0.002"]
    cases = [
        ("a3c: SIGINT to main", a3c, _signal(signal.SIGINT)),
        ("a3c: SIGTERM to main", a3c, _signal(signal.SIGTERM)),
        ("a3c: SIGHUP to main (the terminal closed)", a3c, _signal(signal.SIGHUP)),
        ("a3c: SIGKILL to main (children exit by themselves)", a3c, _signal(signal.SIGKILL)),
        ("a3c: SIGKILL to worker 1, no restarts", a3c, _kill_child("mprl-worker-1")),
        ("a3c: SIGKILL to worker 1, --max-restarts 1, then SIGINT after its restart",
         [*a3c, "--max-restarts", "1"], _kill_worker_then_stop),
        ("probe: Manager server SIGKILLed", probe, _kill_child("mprl-manager")),
        ("probe: train process SIGKILLed", probe, _kill_child("mprl-trainer")),
        ("probe: workers ignore the stop flag and SIGTERM, then SIGINT",
         [*probe, "--set", "fault=ignore_stop", "--set", "ignore_sigterm=true"],
         _signal(signal.SIGINT)),
        ("probe: workers ignore the stop flag, then two SIGINTs (forced exit, checkpoint)",
         [*probe, "--set", "fault=ignore_stop"], _twice(signal.SIGINT)),
        ("probe: 4 workers 10 s apart, SIGINT once worker 0 steps",
         [*probe[:2], "--workers", "4", *probe[4:], "--start-interval", "10"],
         _signal(signal.SIGINT)),
        ("a3c: worker 1 frozen with SIGSTOP (hung), --worker-timeout 3",
         [*a3c, "--worker-timeout", "3"], _kill_child("mprl-worker-1", signal.SIGSTOP)),
        ("a3c: forkserver frozen with SIGSTOP, then SIGINT 1 s later", a3c,
         _forkserver_then_stop(signal.SIGSTOP)),
        ("a3c: forkserver SIGKILLed, then SIGINT 1 s later", a3c,
         _forkserver_then_stop(signal.SIGKILL)),
    ]  # fmt: skip
    try:
        rows = [measure(name, args, fault, site) for name, args, fault in cases]
        rows.append(
            measure(
                "impala: SIGTERM to the process group while the Manager server starts",
                ["--plugin", "impala", "--workers", "2", *forever], _group(signal.SIGTERM),
                site, at_start=True,
            )
        )  # fmt: skip
    finally:
        shutil.rmtree(site, ignore_errors=True)
    print("\n| case | exit code | fault -> main exit (s) | fault -> nothing left (s) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['exit_code']} | {r['to_exit_s']} | {r['to_nothing_left_s']} |")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
