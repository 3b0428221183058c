"""Faults of the file system, through the CLI: links planted in
a run directory, a resumed snapshot that is not the run's last, a cut last line of the metrics,
a full disk and a read-only directory before the start, a path component too long. Each ends in
one line and the exit code docs/running.md documents, with nothing lost."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cli, cli_here

pytestmark = pytest.mark.usefixtures("installed")


def probe(run_dir: Path, *settings: str, steps: int = 200) -> list[str]:
    args = ["--plugin", "probe", "--workers", "1", "--quiet", "--run-dir", str(run_dir)]
    args += ["--total-steps", str(steps)]
    for setting in settings:
        args += ["--set", setting]
    return args


def one_line_error(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The run ended with ``code`` and a single ``mprl: error:`` line, no traceback."""
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mprl: error: "), proc.stderr
    return lines[0]


def refused_here(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``python -m mprl ARGS`` refused before anything starts, run in this process (a
    subprocess would only add its start-up): its one ``mprl: error:`` line."""
    code, err = cli_here(capsys, *args)
    return one_line_error(subprocess.CompletedProcess(args, code, "", err))


def finished_run(run_dir: Path) -> Path:
    proc = cli("run", *probe(run_dir))
    assert proc.returncode == 0, proc.stderr
    return run_dir


def more_steps(run_dir: Path, steps: int = 200) -> str:
    """A ``--total-steps`` that has a resumed run take ``steps`` more env steps."""
    done = json.loads((run_dir / "summary.json").read_text())["env_steps"]
    return str(done + steps)


def _mount(*args: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def mounted(*args: str, at: Path) -> Iterator[bool]:
    """``mount ARGS`` on ``at`` (False when this process may not mount), unmounted at the end."""
    done = _mount(*args, str(at))
    try:
        yield done
    finally:
        if done:
            subprocess.run(["umount", "-l", str(at)], check=True)


class FullDisk:
    """A directory whose file system is full but for ``free`` pages: a small tmpfs filled up
    when this process may mount one (root), else writes limited by RLIMIT_FSIZE in the run's
    process (a write past it fails with EFBIG, as CPython ignores SIGXFSZ): 0 pages lets no byte
    be written, 1 page lets a short file (the lock's pid) be written and nothing longer."""

    def __init__(self, root: Path, tmpfs: bool) -> None:
        self.root, self.tmpfs = root, tmpfs
        self.limit: int | None = None

    def fill(self, free: int) -> None:
        if not self.tmpfs:
            self.limit = 0 if free == 0 else 16
            return
        filler = self.root / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"x" * 4096)
            page = os.statvfs(self.root).f_frsize
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - free * page))
        finally:
            os.close(fd)

    def free_all(self) -> None:
        self.limit = None
        (self.root / "filler").unlink(missing_ok=True)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        limit = self.limit

        def limited() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return subprocess.run(
            [sys.executable, "-m", "mprl", *args],
            capture_output=True, text=True, timeout=120, preexec_fn=limited,
        )  # fmt: skip


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[FullDisk]:
    where = tmp_path / "small"
    where.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=256k", "tmpfs", at=where) as tmpfs:
        yield FullDisk(where, tmpfs)


# a run opens no file of its directory through a link planted there
def test_files_planted_as_links_or_fifos_are_refused_or_replaced_never_written_through(
    tmp_path, capsys
):
    run_dir = finished_run(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    for name in (".lock", "metrics.jsonl", "metrics.csv"):
        victim.write_text("precious\n")
        original = run_dir / name
        kept = original.rename(run_dir / f"{name}.kept")
        original.symlink_to(victim)
        line = refused_here(capsys, "run", "--resume", str(run_dir), "--total-steps", "400")
        assert f"{original}" in line and "symbolic link" in line and "--run-dir" in line, line
        assert victim.read_text() == "precious\n", name
        original.unlink()
        kept.rename(original)
    os.mkfifo(run_dir / "metrics.csv.fifo")  # a writer would block on it for ever
    (run_dir / "metrics.csv").rename(run_dir / "metrics.csv.kept")
    (run_dir / "metrics.csv.fifo").rename(run_dir / "metrics.csv")
    line = refused_here(capsys, "run", "--resume", str(run_dir), "--total-steps", "400")
    assert "is a FIFO" in line, line
    (run_dir / "metrics.csv.kept").replace(run_dir / "metrics.csv")
    # a child's stack file is made anew: a link planted in its place is replaced, not followed
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "logs" / "worker-0.stack").symlink_to(victim)
    proc = cli("run", "--resume", str(run_dir), "--total-steps", more_steps(run_dir), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious\n"
    assert not (run_dir / "logs" / "worker-0.stack").is_symlink()  # replaced, then removed


# resuming a snapshot that is not the run's last.pt overwrites no newer work
def test_resuming_another_checkpoint_of_a_run_needs_a_new_run_directory(tmp_path, capsys):
    run_dir = finished_run(tmp_path / "run")
    ckpt = run_dir / "checkpoints"
    shutil.copy(ckpt / "last.pt", ckpt / "snapshot.pt")
    shutil.copy(ckpt / "last.pt", tmp_path / "loose.pt")
    before = {p: p.read_bytes() for p in (ckpt / "last.pt", run_dir / "config.json")}
    for snapshot in (ckpt / "snapshot.pt", tmp_path / "loose.pt"):
        line = refused_here(capsys, "run", "--resume", str(snapshot), "--total-steps", "400")
        assert str(snapshot) in line and "--run-dir" in line, line
        assert {p: p.read_bytes() for p in before} == before
    new = tmp_path / "from-snapshot"
    proc = cli(
        "run", "--resume", str(ckpt / "snapshot.pt"), "--run-dir", str(new), "--total-steps",
        "400", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (new / "checkpoints" / "last.pt").is_file() and (new / "summary.json").is_file()
    assert {p: p.read_bytes() for p in before} == before
    # the run's own last.pt, named as a file, resumes the run in place as before
    proc = cli("run", "--resume", str(ckpt / "last.pt"), "--total-steps", "400", "--quiet")
    assert proc.returncode == 0, proc.stderr


# a cut last line of metrics.jsonl (a killed run) costs no record of the next session
def test_a_resumed_session_starts_on_a_new_line_after_a_cut_one(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    cut = {}
    for name in ("metrics.jsonl", "metrics.csv"):
        path = run_dir / name
        data = path.read_bytes()
        start = data.rstrip(b"\n").rfind(b"\n") + 1
        cut[name] = data[start : start + (len(data) - start) // 2].decode()
        path.write_bytes(data[:start] + cut[name].encode())  # the last line cut, no newline
    proc = cli("run", "--resume", str(run_dir), "--total-steps", more_steps(run_dir), "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert cut["metrics.jsonl"] in lines  # a line of its own, nothing glued onto it
    records = [json.loads(line) for line in lines if line != cut["metrics.jsonl"]]
    assert [r for r in records if r.get("event") == "resume"], "the resume record was lost"
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert cut["metrics.csv"] in rows
    assert all(len(row.split(",")) == 5 for row in rows if row != cut["metrics.csv"])
    # the readers skip the cut line
    listed = cli("runs", str(tmp_path))
    assert listed.returncode == 0 and str(run_dir) in listed.stdout, listed.stderr


# a full disk before the start: one line, exit 2, and the directory it made removed
@pytest.mark.parametrize("free", [0, 1], ids=["no-room-for-the-lock", "no-room-for-config"])
def test_a_full_disk_before_the_start_is_one_line_and_leaves_no_half_made_directory(
    full_disk, free
):
    run_dir = full_disk.root / "runs" / "exp1"
    full_disk.fill(free)
    proc = full_disk.cli("run", *probe(run_dir))
    line = one_line_error(proc)
    assert str(run_dir) in line, line
    assert not (full_disk.root / "runs").exists(), list(full_disk.root.rglob("*"))
    full_disk.free_all()
    proc = full_disk.cli("run", *probe(run_dir))  # the same command, once there is room
    assert proc.returncode == 0, proc.stderr


def test_a_full_disk_before_the_start_keeps_a_directory_the_user_made(full_disk):
    run_dir = full_disk.root / "mine"
    run_dir.mkdir()
    full_disk.fill(1)
    one_line_error(full_disk.cli("run", *probe(run_dir)))
    assert run_dir.is_dir() and not list(run_dir.iterdir())


# a read-only run directory is refused before anything starts, naming it
def test_resuming_into_a_read_only_run_directory_is_refused_naming_it(tmp_path, capsys):
    run_dir = finished_run(tmp_path / "run")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    with contextlib.ExitStack() as stack:
        ro = stack.enter_context(mounted("--bind", str(run_dir), at=run_dir))
        if ro:
            assert _mount("-o", "remount,bind,ro", str(run_dir))
        else:  # not root: the permission bits are enough
            for d in (run_dir, run_dir / "checkpoints"):
                d.chmod(0o555)
                stack.callback(d.chmod, 0o755)
        line = refused_here(capsys, "run", "--resume", str(run_dir), "--total-steps", "400")
        assert str(run_dir) in line and "--run-dir" in line, line
        # what the line suggests works: the read-only run resumes into a new directory
        new = tmp_path / "new"
        again = cli("run", "--resume", str(run_dir), "--run-dir", str(new), "--quiet")
        assert again.returncode == 0, again.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


# a path component longer than the file system allows
def test_a_run_directory_name_too_long_is_one_line_naming_it(tmp_path, capsys):
    run_dir = tmp_path / ("x" * 300) / "run"
    line = refused_here(capsys, "run", *probe(run_dir))
    assert str(run_dir) in line and "too long" in line, line
    line = refused_here(capsys, "run", "--resume", str(run_dir), "--quiet")
    assert str(run_dir) in line and "too long" in line, line
    line = refused_here(capsys, "runs", str(run_dir))
    assert str(run_dir) in line and "too long" in line, line
