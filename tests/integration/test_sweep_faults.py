"""Faults of a sweep, through the CLI: a sweep killed with SIGKILL and resumed at once (its runs
stop with it, and a resume never touches a run directory another process holds), links and
other files planted in a sweep directory (never written or removed through), and a garbage or
dangling ``optuna.db``. Each ends in one line and a clean stop, with nothing lost."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mprl.host.plugins import get_plugin_manager
from mprl_builtin.sweep import spec as sweep_spec
from tests.conftest import (
    alive,
    cli,
    cli_here,
    end,
    own_group,
    read_metrics,
    stepped,
    wait_until,
)

BASE = "base-seed0"


def one_line_error(code: int, err: str) -> str:
    """Exit 2 with one ``mprl: error:`` line and no traceback: the line."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mprl: error: "), err
    return lines[0]


def new_sweep(root: Path, steps: int = 300) -> Path:
    """A sweep directory as a new sweep leaves it before its first run: its ``sweep.json``
    alone (a3c, one seed, serial, ``steps`` env steps); ``sweep --resume`` runs it."""
    spec = sweep_spec.make_spec(
        get_plugin_manager(), "a3c", config={}, seeds="1",
        run={"total_steps": steps, "workers": 1, "backend": "serial"},
    )  # fmt: skip
    root.mkdir()
    (root / sweep_spec.SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
    return root


def lock_holder(run_dir: Path) -> str | None:
    """The pid written in ``RUN_DIR/.lock`` while another process holds it (flock); None when
    nobody does."""
    try:
        fd = os.open(run_dir / ".lock", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode().strip() or None
    else:
        return None
    finally:
        os.close(fd)


# -- links planted in a sweep directory --------------------------------------------------------

#: name planted -> what it is a link to: "file" (a file of the user's), "dir" (a directory of
#: the user's holding base-seed0/ with a file in it), "missing" (a path where nothing is)
PLANTED = [
    (".lock", "file"),
    (".lock", "missing"),
    ("sweep.json", "file"),
    ("optuna.db", "file"),
    ("optuna.db", "missing"),
    ("optuna.db-journal", "missing"),
    ("configs", "dir"),
    ("configs/base.toml", "file"),
    ("logs", "dir"),
    ("logs/base-seed0.log", "file"),
    ("logs/base-seed0.log", "missing"),
    ("trials", "dir"),
    ("trials/base-seed0", "dir"),
    ("results.json", "file"),
    ("results.csv", "file"),
    ("sweep.png", "file"),
]


@pytest.mark.parametrize(("name", "target"), PLANTED, ids=[f"{n}->{t}" for n, t in PLANTED])
def test_links_planted_in_a_sweep_directory_are_refused_never_followed(
    tmp_path, capsys, name, target
):
    root = new_sweep(tmp_path / "sw")
    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "elsewhere"
    victim.write_text("precious\n")
    (elsewhere / BASE).mkdir(parents=True)
    (elsewhere / BASE / "keep.txt").write_text("mine\n")
    (elsewhere / "base.toml").write_text("mine\n")
    if name == "sweep.json":  # a link to a sweep of the user's own, kept elsewhere
        victim.write_text((root / name).read_text())
        (root / name).unlink()
    planted = root / name
    planted.parent.mkdir(parents=True, exist_ok=True)
    to = {"file": victim, "dir": elsewhere, "missing": tmp_path / "nothing"}[target]
    planted.symlink_to(to)
    before = victim.read_text()
    line = one_line_error(*cli_here(capsys, "sweep", "--resume", str(root)))
    assert f"'{planted}' is a symbolic link (to '{to}')" in line, line
    assert "remove it" in line, line
    assert victim.read_text() == before  # the link's target untouched
    assert sorted(p.name for p in elsewhere.iterdir()) == [BASE, "base.toml"]
    assert (elsewhere / BASE / "keep.txt").read_text() == "mine\n"
    assert not (tmp_path / "nothing").exists()  # nothing made at a dangling link's target
    assert planted.is_symlink()  # left for the user to see
    assert not list(tmp_path.rglob("config.json"))  # no run started


def test_a_sweep_directory_that_is_not_a_directory_is_one_line(tmp_path, capsys):
    for what, make in [
        ("a regular file", lambda p: p.write_text("")),
        ("a symbolic link (to 'nothing')", lambda p: p.symlink_to("nothing")),
    ]:
        root = tmp_path / "sw"
        make(root)
        line = one_line_error(
            *cli_here(capsys, "sweep", "--plugin", "a3c", "--sweep-dir", str(root))
        )
        assert f"--sweep-dir '{root}' is {what}, not a directory" in line, line
        root.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- optuna.db ---------------------------------------------------------------------------------


def test_a_garbage_optuna_db_is_one_line_naming_it(tmp_path, capsys):
    root = new_sweep(tmp_path / "sw")
    (root / "optuna.db").write_bytes(b"this is no database\n" * 100)
    line = one_line_error(*cli_here(capsys, "sweep", "--resume", str(root)))
    assert f"'{root / 'optuna.db'}' is not a SQLite database" in line, line
    assert (root / "optuna.db").read_bytes() == b"this is no database\n" * 100
    assert not (root / "trials").exists()
    # a SQLite header over a cut file: SQLite's own complaint, in one line naming the file
    (root / "optuna.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    line = one_line_error(*cli_here(capsys, "sweep", "--resume", str(root)))
    assert f"cannot open the sweep's Optuna study '{root / 'optuna.db'}'" in line, line
    assert not (root / "trials").exists()


# -- a sweep killed with SIGKILL, resumed at once ----------------------------------------------


@contextlib.contextmanager
def popen(args: list[str], **kw) -> Iterator[subprocess.Popen[str]]:
    """``python -m mprl ARGS`` in the background, in a process group of its own: what it
    started there ends with the test (:func:`tests.conftest.end`)."""
    proc = subprocess.Popen([sys.executable, "-m", "mprl", *args], text=True, **own_group(**kw))
    try:
        yield proc
    finally:
        end(proc)


@pytest.mark.usefixtures("installed")
def test_a_killed_sweeps_runs_stop_and_a_resume_at_once_never_shares_their_directory(tmp_path):
    root = tmp_path / "sw"
    trial = root / "trials" / BASE
    slow = ["--plugin", "probe", "--workers", "1", "--set", "step_sleep=0.02",
            "--total-steps", "1000000", "--sweep-dir", str(root)]  # fmt: skip
    with popen(["sweep", *slow], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as sweep:
        orphan = int(wait_until(lambda: lock_holder(trial), "the run holding its lock"))
        wait_until(lambda: any(map(stepped, read_metrics(trial))), "the run's first steps")
        inode = trial.stat().st_ino
        sweep.kill()  # SIGKILL: the sweep alone, its run is in a session of its own
        sweep.wait()
    log = tmp_path / "resume.err"
    with log.open("w") as err, popen(["sweep", "--resume", str(root)], stderr=err) as resume:

        def orphan_gone() -> bool:  # meanwhile its directory is its own: not removed, not taken
            if not alive(orphan):
                return True
            assert trial.is_dir(), "the directory of a run still going was removed"
            assert trial.stat().st_ino == inode, "the directory of a run still going was replaced"
            assert lock_holder(trial) in (str(orphan), None), "a second run took it meanwhile"
            return False

        wait_until(orphan_gone, "the killed sweep's run stopping by itself", 60)
        new = int(wait_until(lambda: lock_holder(trial), "the resumed run holding its lock"))
        assert new != orphan
        wait_until(lambda: any(map(stepped, read_metrics(trial))), "the resumed run's steps")
        resume.send_signal(signal.SIGINT)
        assert resume.wait(timeout=120) == 130, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert not alive(orphan) and not alive(new)
    assert json.loads((trial / "summary.json").read_text())["status"] == "interrupted"


HOLDER = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "os.ftruncate(fd, 0); os.write(fd, str(os.getpid()).encode())\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_resume_waits_for_a_run_directory_another_process_holds(tmp_path):
    """The resume of a killed sweep whose run is still going: it says which pid holds the run's
    directory and waits (Ctrl-C stops it, touching nothing), then runs it again once free."""
    root = new_sweep(tmp_path / "sw")
    trial = root / "trials" / BASE
    trial.mkdir(parents=True)
    (trial / "metrics.jsonl").write_text('{"step": 1}\n')  # an interrupted run's
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(trial / ".lock")], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        log = tmp_path / "resume.err"
        with log.open("w") as err, popen(["sweep", "--resume", str(root)], stderr=err) as resume:
            waiting = f"'{trial}' is in use by pid {holder.pid}"
            wait_until(lambda: waiting in log.read_text(), "the resume saying it waits")
            assert (trial / "metrics.jsonl").read_text() == '{"step": 1}\n'
            resume.send_signal(signal.SIGINT)
            assert resume.wait(timeout=60) == 130, log.read_text()
        text = log.read_text()
        assert "Traceback" not in text and f"sweep --resume {root}" in text, text
        assert (trial / "metrics.jsonl").read_text() == '{"step": 1}\n'
        assert lock_holder(trial) == str(holder.pid)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    done = cli("sweep", "--resume", str(root))
    assert done.returncode == 0, done.stderr
    assert "in use by pid" not in done.stderr
    assert json.loads((trial / "summary.json").read_text())["status"] == "finished"
    assert '{"step": 1}' not in (trial / "metrics.jsonl").read_text()  # run again from scratch
