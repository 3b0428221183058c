"""Faults while a run goes on: full disks, a closed terminal or pipe, plugins that log what
mprl cannot count, a removed ``checkpoints/``.

A full disk is made real: a small tmpfs in a mount namespace of the run's own (``unshare``), or a
file size limit (``RLIMIT_FSIZE``: Python ignores SIGXFSZ, so a write past it fails with EFBIG,
as one to a full disk fails with ENOSPC). The test reaches into the run's namespace through
``/proc/PID/root`` to read its metrics and to fill its disk at the moment it chooses.
"""

from __future__ import annotations

import json
import os
import pty
import resource
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mprl.host import checkpoint
from mprl.host.runner import IGNORED_SIGINT
from tests.conftest import (
    alive,
    child_pids,
    clean_stderr,
    end,
    own_group,
    read_metrics,
    running,
    stepped,
    wait_for_metrics,
    wait_until,
    write_distribution,
)


def probe(run_dir: Path, *settings: str, steps: int = 10**9, workers: int = 1) -> list[str]:
    args = ["--plugin", "probe", "--workers", str(workers), "--quiet", "--run-dir", str(run_dir)]
    args += ["--total-steps", str(steps)]
    for setting in settings:
        args += ["--set", setting]
    return args


def events(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r.get("event") == kind]


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe_mount = ["unshare", "--mount", "--propagation", "private", "true"]
    return subprocess.run(probe_mount, capture_output=True, check=False).returncode == 0


needs_unshare = pytest.mark.skipif(
    not _can_unshare(), reason="needs root and unshare (a mount namespace for a small tmpfs)"
)

#: the run of :func:`in_namespace`: mount a tmpfs of size $2 at $1, run mprl, copy the run
#: directory out to $3 (the namespace, and its tmpfs, end with the run), exit as mprl did
NAMESPACED = """
mount -t tmpfs -o size="$2" tmpfs "$1" || exit 97
shift 3
"$@"
code=$?
cp -a "$MNT/run" "$OUT/run" 2>/dev/null
exit $code
"""


@contextmanager
def in_namespace(
    mount_at: Path, size: str, out: Path, args: list[str]
) -> Iterator[subprocess.Popen[str]]:
    """``python -m mprl run ARGS`` in a mount namespace of its own with a tmpfs of ``size`` at
    ``mount_at``; its run directory ``mount_at/run`` is copied to ``out/run`` when it ends."""
    mount_at.mkdir()
    out.mkdir()
    script = NAMESPACED.replace("$MNT", str(mount_at)).replace("$OUT", str(out))
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    cmd += [str(mount_at), size, "-", sys.executable, "-m", "mprl", "run", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **own_group()
    )
    try:
        yield proc
    finally:
        end(proc)


def python_in(shell: subprocess.Popen[str]) -> int:
    """The pid of the mprl process the namespace's shell started."""

    def found() -> int | None:
        for pid in child_pids(shell.pid):
            if _is_mprl(pid):
                return pid
        return None

    return wait_until(found, "the run in its namespace")


def fill(disk: Path, leave: int = 0) -> None:
    """Fill the file system of ``disk`` (seen through ``/proc/PID/root``) but ``leave`` bytes."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave))
            f.flush()
        except OSError:  # it is full
            pass


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# the disk fills up while the run writes its metrics
@needs_unshare
def test_a_full_disk_stops_the_run_with_one_line_and_the_checkpoint_kept(installed, tmp_path):
    disk, out = tmp_path / "disk", tmp_path / "out"
    args = [*probe(disk / "run", "step_sleep=0.002"), "--checkpoint-every", "0.5"]
    with in_namespace(disk, "2m", out, args) as shell:
        pid = python_in(shell)
        seen = Path(f"/proc/{pid}/root") / str(disk).lstrip("/")
        records = wait_for_metrics(
            seen / "run", lambda r: r.get("event") == "checkpoint" and stepped(r)
        )
        fill(seen)
        _, stderr = shell.communicate(timeout=120)
    assert shell.returncode == 1, stderr
    line = last_line(stderr)
    assert line.startswith(
        f"mprl: run failed: metrics could not be written to {disk / 'run'} (the disk is full: "
        "[Errno 28] No space left on device): "
    ), stderr
    # the final checkpoint was tried first: it did not fit either, and the line says what is kept
    assert "the final checkpoint was not written either; the last one" in line, line
    assert f"--resume {disk / 'run'} continues from it" in line, line
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 4, stderr
    clean_stderr(stderr)
    run = out / "run"
    _, data = checkpoint.load(run)  # the previous checkpoint is whole
    assert data["env_steps"] >= max(r["step"] for r in events(records, "checkpoint"))


# ... and where the checkpoint still fits (a file size limit), it is written before the end
def test_metrics_that_cannot_be_written_stop_the_run_after_its_final_checkpoint(installed, run_dir):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (96 * 1024, resource.RLIM_INFINITY))

    args = [*probe(run_dir, "step_sleep=0.0005"), "--full-metrics"]
    with running(args, preexec_fn=limit) as proc:
        _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = summary["env_steps"]
    assert last_line(stderr) == (
        f"mprl: run failed: metrics could not be written to {run_dir} ([Errno 27] File too "
        f"large): the run was stopped after its final checkpoint ({steps:,} env steps); run "
        f"directory: {run_dir}"
    ), stderr
    assert "Traceback" not in stderr
    clean_stderr(stderr)
    assert summary["status"] == "failed" and summary["exit_code"] == 1
    assert summary["stop_reason"] == "metrics could not be written"
    assert summary["checkpoint"] == {
        "path": str(run_dir / "checkpoints/last.pt"),
        "env_steps": steps,
    }
    _, data = checkpoint.load(run_dir)
    assert data["env_steps"] == steps and data["episodes"] == summary["episodes"]


# the disk is too full for a checkpoint (torch raises RuntimeError, not OSError)
@needs_unshare
def test_a_checkpoint_the_disk_cannot_hold_is_reported_and_the_run_goes_on(installed, tmp_path):
    disk, out = tmp_path / "disk", tmp_path / "out"
    args = [*probe(disk / "run", "step_sleep=0.05"), "--checkpoint-every", "0.5"]
    with in_namespace(disk, "1m", out, args) as shell:
        pid = python_in(shell)
        seen = Path(f"/proc/{pid}/root") / str(disk).lstrip("/")
        records = wait_for_metrics(
            seen / "run", lambda r: r.get("event") == "checkpoint" and stepped(r)
        )
        kept = max(r["step"] for r in events(records, "checkpoint"))
        fill(seen, leave=16 * 1024)  # room for the metrics a while, not for a checkpoint
        failed = wait_for_metrics(seen / "run", lambda r: r.get("event") == "checkpoint-failed")
        first = events(failed, "checkpoint-failed")[0]
        # the run goes on
        wait_for_metrics(
            seen / "run", lambda r: "episode_return" in r and r["step"] > first["step"]
        )
        os.kill(pid, signal.SIGINT)
        _, stderr = shell.communicate(timeout=120)
    assert shell.returncode == 130, stderr
    kept = events(read_metrics(out / "run"), "checkpoint")[-1]["step"]
    path = disk / "run" / "checkpoints" / "last.pt"
    assert (
        f"mprl: checkpoint not written (the disk is full: [Errno 28] No space left on device); "
        f"the previous one ({path}, {kept:,} env steps) is kept"
    ) in stderr, stderr
    assert "Traceback" not in stderr and "RuntimeError" not in stderr, stderr
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["checkpoint"] == {"path": str(path), "env_steps": kept}
    assert last_line(stderr).startswith("mprl: the final checkpoint was not written; the last one")
    assert f"holds {kept:,} of {summary['env_steps']:,} env steps" in stderr, stderr
    _, data = checkpoint.load(out / "run")
    assert data["env_steps"] == kept


# a file system with few inodes: every file the run makes (its directory's, its children's stack
# files, checkpoints) may be the one that fails, whatever bytes are free
@needs_unshare
def test_no_inodes_left_is_one_line_naming_them_wherever_the_run_is(installed, tmp_path):
    exits = {}
    for inodes in (4, 5, 7, 10, 12):  # the run directory, logs/, a stack file, a checkpoint
        disk, out = tmp_path / f"disk{inodes}", tmp_path / f"out{inodes}"
        args = [*probe(disk / "run", "step_sleep=0.0005", steps=400, workers=2)]
        with in_namespace(
            disk, f"64m,nr_inodes={inodes}", out, [*args, "--checkpoint-every", "0"]
        ) as shell:
            _, stderr = shell.communicate(timeout=120)
        exits[inodes] = shell.returncode
        lines = stderr.strip().splitlines()
        assert shell.returncode in (0, 1, 2), (inodes, stderr)
        assert "Traceback" not in stderr and all(x.startswith("mprl: ") for x in lines), stderr
        clean_stderr(stderr)
        if shell.returncode == 1:  # it started, and stopped on a file it could not make
            assert len(lines) <= 2 and "file system has no free inodes left" in lines[-1], stderr
            assert lines[-1].startswith("mprl: run failed: "), stderr
        elif shell.returncode == 2:  # its run directory could not be made
            assert lines == [lines[0]] and "No space left on device" in lines[0], stderr
    # every stage was reached: the run directory, the run, and a run that had all it needed
    assert set(exits.values()) == {0, 1, 2}, exits


# checkpoints/ removed while the run goes on
def test_a_removed_checkpoints_directory_is_said_and_the_summary_has_no_checkpoint(
    installed, run_dir
):
    args = [*probe(run_dir, "step_sleep=0.002"), "--checkpoint-every", "0.5"]
    with running(args) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("event") == "checkpoint" and stepped(r))
        shutil.rmtree(run_dir / "checkpoints")
        wait_for_metrics(run_dir, lambda r: r.get("event") == "checkpoint-failed")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    where = run_dir / "checkpoints"
    assert f"mprl: checkpoint not written ({where} was removed: " in stderr, stderr
    assert "there is no earlier one: the run cannot be resumed unless one is written" in stderr
    assert "the previous one is kept" not in stderr and "is kept" not in stderr, stderr
    assert "mprl: the run ended with no checkpoint, so it cannot be resumed" in stderr, stderr
    clean_stderr(stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["checkpoint"] is None


# SIGHUP (the terminal was closed, the ssh session ended) to the main process
def test_sighup_is_a_clean_stop_with_a_final_checkpoint(installed, run_dir):
    with running(probe(run_dir, "step_sleep=0.002", workers=2)) as proc:
        wait_for_metrics(run_dir, stepped)
        proc.send_signal(signal.SIGHUP)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 129, stderr
    stopped_cleanly(run_dir, stderr, signal.SIGHUP)


# a run started with SIGINT ignored (`mprl run ... &` in a script: a shell without job control
# ignores SIGINT in a background job, so that a Ctrl-C at the terminal does not reach it) keeps it
# ignored for the whole run, as nohup's SIGHUP: a SIGINT at each stage the run passes, from the
# forkserver's start while the CLI imports to the children stepping, is nothing; SIGTERM stops it
# cleanly, with its final checkpoint
def test_a_run_started_with_sigint_ignored_ignores_it_throughout_and_stops_on_sigterm(
    installed, tmp_path
):
    run_dir, timeline = tmp_path / "run", tmp_path / "timeline.jsonl"

    def background_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def marks() -> list[str]:  # (the lines written whole)
        text = timeline.read_text() if timeline.exists() else ""
        return [json.loads(line)["mark"] for line in text[: text.rfind("\n") + 1].splitlines()]

    args = probe(run_dir, "step_sleep=0.002", workers=2)
    args.remove("--quiet")  # the line it starts with
    env = {**os.environ, "MPRL_TIMELINE": str(timeline)}
    sent: list[set[str]] = []  # the marks passed when each SIGINT came
    with running(args, preexec_fn=background_job, env=env) as proc:
        while proc.poll() is None and not any(map(stepped, read_metrics(run_dir))):
            passed = set(marks())
            if passed and (not sent or passed != sent[-1]):
                os.killpg(proc.pid, signal.SIGINT)  # a Ctrl-C at the terminal: the whole group
                sent.append(passed)
            time.sleep(0.005)
        assert proc.poll() is None, proc.communicate()  # (a SIGINT stopped it)
        step = max(r.get("step", 0) for r in read_metrics(run_dir))
        os.killpg(proc.pid, signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        # the run goes on: an ignored signal is dropped as it is sent, and a handled one
        # would have been recorded as the run's first (the summary's signal)
        wait_until(
            lambda: (
                proc.poll() is not None
                or any(r.get("step", 0) > step for r in read_metrics(run_dir))
            ),
            "steps after the SIGINT",
        )
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert sent and "prepared" not in sent[0], sent  # one came while the CLI started
    assert proc.returncode == 143, stderr
    assert stderr.count(IGNORED_SIGINT.format(pid=proc.pid)) == 1, stderr
    stopped_cleanly(run_dir, stderr, signal.SIGTERM)


# 4 and 16: the terminal of the shell the run was started from is closed: the shell gets SIGHUP
# and ends, and the kernel sends SIGHUP to every process of the terminal's foreground group (the
# run's children and its Manager server too); every later write to the terminal fails (EIO)
def test_a_closed_terminal_stops_the_run_cleanly(installed, run_dir):
    master, slave = pty.openpty()
    args = [sys.executable, "-m", "mprl", "run", *probe(run_dir, "step_sleep=0.002", workers=2)]
    args.remove("--quiet")  # the live panel, as on a terminal

    def own_terminal() -> None:  # after setsid: the pty becomes the controlling terminal
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    shell = subprocess.Popen(
        ["sh", "-c", '"$@"', "sh", *args], stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True, preexec_fn=own_terminal,
    )  # fmt: skip
    os.close(slave)
    shown: list[bytes] = []
    done = threading.Event()

    def drain() -> None:  # what the terminal shows; a full pty would block the run
        while not done.is_set():
            if select.select([master], [], [], 0.1)[0]:
                try:
                    shown.append(os.read(master, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:  # the shell's session, the run in it, ends with the test (a failing one too)
        try:
            wait_for_metrics(run_dir, stepped)
            wait_until(lambda: b"env steps" in b"".join(shown), "the live panel")
            (main,) = [p for p in child_pids(shell.pid) if _is_mprl(p)]
        finally:
            done.set()
            reader.join()
            os.close(master)  # the terminal is closed (hung up)
        shell.wait(timeout=60)
        wait_until(lambda: not alive(main), "the end of the run")  # not the shell's any more
    finally:
        end(shell)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGHUP
    assert summary["exit_code"] == 129
    records = read_metrics(run_dir)
    # every process stopped cleanly: none was killed by the hang-up, the Manager server neither
    assert not summary["failures"], summary["failures"]
    assert not events(records, "checkpoint-partial"), events(records, "checkpoint-partial")
    _, data = checkpoint.load(run_dir)
    assert data["env_steps"] == summary["env_steps"]


def _is_mprl(pid: int) -> bool:
    """Whether ``pid`` is a ``python -m mprl`` command's main process: its forkserver and the
    children forked from it show the same command line, under a parent that does too."""
    return _command(pid) and not _command(_parent(pid))


def _command(pid: int) -> bool:
    return _argv(pid)[1:3] == [b"-m", b"mprl"]


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


# nobody reads the run's output any more (`mprl run ... 2>&1 | head`, a `tee` killed)
def test_a_closed_output_pipe_does_not_end_the_run(installed, run_dir):
    args = [sys.executable, "-m", "mprl", "run", *probe(run_dir, "step_sleep=0.002")]
    args.remove("--quiet")  # plain progress lines on the pipe
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **own_group()
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the title; then the reader goes away
        assert first.startswith("mprl: probe on Corridor-v0"), first
        proc.stdout.close()
        # (a run that the closed pipe ended has no steps to wait for)
        wait_until(
            lambda: proc.poll() is not None or any(map(stepped, read_metrics(run_dir))), "steps"
        )
        proc.send_signal(signal.SIGINT)  # the stop writes its last progress line, and more
        proc.wait(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 130
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    _, data = checkpoint.load(run_dir)
    assert data["env_steps"] == summary["env_steps"]


#: a plugin that logs what mprl cannot count, among good episodes of the same batch
BADLOG = """
import attrs
import torch
import mprl


@attrs.frozen
class Config:
    bad: str = "time"


def make_model(obs_space, act_space, config):
    return torch.nn.Linear(4, 2)


def worker(ctx):
    for _ in range(3):
        ctx.log_episode(1.0, 1)
    if ctx.config.bad == "time":
        ctx.log(time="soon", loss=0.5)
    else:
        ctx.log(episode_return="x", episode_length=1)
    for _ in range(3):
        ctx.log_episode(2.0, 1)
    ctx.add_steps(6)
    while not ctx.should_stop():
        ctx.add_steps(1)
        ctx.heartbeat()


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="badlog", config_cls=Config, worker=worker, make_model=make_model,
        )
    )
"""


@pytest.fixture
def badlog(installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test plugins, and ``badlog`` installed beside them."""
    site = tmp_path / "badlog-site"
    site.mkdir()
    write_distribution(site, "mprl-badlog", {"badlog": "mprl_badlog"}, {"mprl_badlog": BADLOG})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
    return site


# a plugin's record mprl cannot count is dropped with a warning naming the plugin
@pytest.mark.parametrize(
    ("bad", "shown"),
    [("time", "time='soon'"), ("episode_return", "episode_return='x'")],
)
def test_a_record_mprl_cannot_count_is_dropped_naming_the_plugin(badlog, run_dir, bad, shown):
    args = ["--plugin", "badlog", "--workers", "1", "--quiet", "--run-dir", str(run_dir)]
    args += ["--total-steps", "2000", "--set", f"bad={bad}"]
    with running(args) as proc:
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    warning = f"mprl: algorithm 'badlog' (plugin 'badlog') logged {shown} from worker:0: "
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith(warning)]
    assert line.endswith(f"the record is dropped, and so is every later one with a bad {bad!r}")
    records = read_metrics(run_dir)
    # the good episodes of the same batch are all there
    returns = [r["episode_return"] for r in records if "episode_return" in r]
    assert returns == [1.0] * 3 + [2.0] * 3, returns
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] == 6 and summary["status"] == "finished"
    (event,) = events(records, "record-dropped")
    assert event["field"] == bad


# /dev/shm with room for the model's bytes, but not for a file (of whole pages) per tensor
@needs_unshare
def test_a_dev_shm_too_small_for_the_model_is_refused_in_kib_and_leaves_nothing(
    installed, tmp_path
):
    script = (
        'mount -t tmpfs -o size=64k tmpfs /dev/shm || exit 97; "$@"; code=$?; '
        'echo "left in /dev/shm: [$(ls /dev/shm)]"; exit $code'
    )
    args = probe(tmp_path / "run", "model_tensors=40", steps=100)
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    cmd += [sys.executable, "-m", "mprl", "run", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("mprl: error: the run needs about "), line
    assert " KiB of shared memory for its model, optimizer state and shared tensors, but " in line
    assert "/dev/shm has 64 KiB free. Fix: " in line and "0 MiB" not in line, line
    assert proc.stdout.strip().endswith("left in /dev/shm: []"), proc.stdout
    assert not (tmp_path / "run").exists()


# many envs per worker take long to build: start-up, not a hung worker
def test_building_many_envs_is_start_up_not_a_hang(installed, run_dir):
    args = ["--plugin", "a3c", "--workers", "1", "--quiet", "--run-dir", str(run_dir)]
    args += ["--worker-timeout", "2", "--set", "envs_per_worker=15000", "--set", "n_steps=2"]
    args += ["--total-steps", "30000"]
    with running(args) as proc:
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "hung" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 30000 and summary["status"] == "finished"


def stopped_cleanly(run_dir: Path, stderr: str, sig: int) -> None:
    """The run in ``run_dir`` was stopped by ``sig`` cleanly: no traceback, an interrupted
    summary without failures, and a final checkpoint that holds every step."""
    clean_stderr(stderr)
    assert "Traceback" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == sig
    assert summary["stop_reason"] == signal.Signals(sig).name and not summary["failures"]
    _, data = checkpoint.load(run_dir)
    assert data["env_steps"] == summary["env_steps"] == summary["checkpoint"]["env_steps"]
