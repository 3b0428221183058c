"""Opening a run directory's files in place (mprl.files) and the refusals of RunDir before a run
starts; tests/integration/test_faults_files.py drives the same through
the CLI."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from mprl.errors import UsageError
from mprl.files import NotRegularFile, open_new, open_regular
from mprl.host import checkpoint, rundir
from mprl.host.rundir import RunDir, refusal


def test_open_regular_opens_a_regular_file_and_refuses_links_fifos_and_directories(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    fd = open_regular(tmp_path / "new", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, kind in [
        ("link", "a symbolic link"),
        ("dangling", "a symbolic link"),
        ("fifo", "a FIFO"),  # refused, not waited on
        ("dir", "a directory"),
    ]:
        with pytest.raises(NotRegularFile, match=kind):
            open_regular(tmp_path / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    assert victim.read_text() == "precious\n" and not (tmp_path / "nowhere").exists()


def test_exists_as_says_what_is_there_and_refuses_links_and_the_other_kind(tmp_path):
    from mprl.files import exists_as

    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    assert exists_as(tmp_path / "file") and exists_as(tmp_path / "dir", directory=True)
    assert not exists_as(tmp_path / "none") and not exists_as(tmp_path / "none", directory=True)
    for name, directory, what in [
        ("link", True, f"a symbolic link (to '{tmp_path / 'dir'}'), not a directory"),
        ("dangling", False, f"a symbolic link (to '{tmp_path / 'nowhere'}'), not a regular file"),
        ("fifo", False, "a FIFO, not a regular file"),
        ("dir", False, "a directory, not a regular file"),
        ("file", True, "a regular file, not a directory"),
    ]:
        with pytest.raises(NotRegularFile) as caught:
            exists_as(tmp_path / name, directory=directory)
        assert caught.value.strerror == f"'{tmp_path / name}' is {what}"
    assert not (tmp_path / "nowhere").exists()


def test_open_new_replaces_a_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    stack = tmp_path / "worker-0.stack"
    stack.symlink_to(victim)
    with open(stack, "w", opener=open_new) as f:
        f.write("stack\n")
    assert not stack.is_symlink() and stack.read_text() == "stack\n"
    assert victim.read_text() == "precious\n"


def test_a_run_directory_with_a_planted_lock_or_metrics_link_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    RunDir.create(run_dir, "probe", "Corridor-v0").close()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in (".lock", "metrics.jsonl", "metrics.csv"):
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(victim)
        with pytest.raises(UsageError, match=r"symbolic link.*--run-dir"):
            RunDir.reopen(run_dir)
        assert victim.read_text() == "precious\n"
        (run_dir / name).unlink()


def test_a_resumed_run_appends_from_a_new_line(tmp_path):
    run_dir = tmp_path / "run"
    run = RunDir.create(run_dir, "probe", "Corridor-v0")
    run.append_metrics([{"wall": 1.0, "step": 1, "source": "main", "x": 1}])
    run.close()
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"wall": 2.0, "st')  # cut by a kill
    run = RunDir.reopen(run_dir)
    run.append_metrics([{"wall": 3.0, "step": 2, "source": "main", "event": "resume"}])
    run.close()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines[1:] == ['{"wall": 2.0, "st', '{"wall": 3.0, "step": 2, "source": "main", '
                         '"event": "resume"}']  # fmt: skip
    assert (run_dir / "metrics.csv").read_text().splitlines()[0] == "wall,step,source,name,value"


def test_a_name_too_long_is_refused_naming_the_path(tmp_path):
    run_dir = tmp_path / ("x" * 300) / "run"
    with pytest.raises(UsageError, match=r"300 bytes long.*--run-dir") as caught:
        RunDir.create(run_dir, "probe", "Corridor-v0")
    assert str(run_dir) in str(caught.value)
    with pytest.raises(UsageError, match="too long"):
        checkpoint.load(run_dir)
    assert not list(tmp_path.iterdir())


def test_a_failure_before_the_start_removes_only_what_the_run_made(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    run = RunDir.create(mine, "probe", "Corridor-v0")
    run.discard()
    assert mine.is_dir() and not list(mine.iterdir())
    made = tmp_path / "a" / "b" / "run"
    run = RunDir.create(made, "probe", "Corridor-v0")
    run.discard()
    assert not (tmp_path / "a").exists()


def test_the_refusal_says_what_to_do():
    run = Path("runs/x")
    full = OSError(errno.ENOSPC, "No space left on device", str(run / "config.json"))
    assert str(refusal(run, full, resume=False)) == (
        "cannot create run directory 'runs/x': config.json: No space left on device; free some "
        "space, or choose another --run-dir"
    )
    ro = OSError(errno.EROFS, "not writable: Read-only file system", "runs/x")
    assert str(refusal(run, ro, resume=True)) == (
        "cannot resume into run directory 'runs/x': it is on a read-only file system; make it "
        "writable, or resume into a new directory with --run-dir NEW_DIR"
    )


def test_only_a_runs_last_checkpoint_resumes_in_place(tmp_path):
    assert checkpoint.resumed_run_dir(tmp_path / "checkpoints" / "last.pt") == tmp_path
    for other in (tmp_path / "checkpoints" / "best.pt", tmp_path / "last.pt"):
        with pytest.raises(UsageError, match="--run-dir NEW_DIR"):
            checkpoint.resumed_run_dir(other)


# a write cut short (a Ctrl-C more during a checkpoint) stops between chunks and keeps the old
# file; so does a cut that comes once every byte is written, before the replace
@pytest.mark.parametrize("cut_after", [1, 3])
def test_a_cut_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, cut_after):
    target = tmp_path / "last.pt"
    target.write_bytes(b"old")
    chunks: list[int] = []

    def write(f) -> None:
        f.write(b"x" * (2 * rundir.CHUNK + 1))  # three chunks

    def cut() -> bool:
        chunks.append(len(chunks))
        return len(chunks) > cut_after

    with pytest.raises(rundir.WriteCut):
        rundir.atomic_write(target, write, cut)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert len(chunks) == cut_after + 1  # asked before each chunk, then before the replace
    rundir.atomic_write(target, write, lambda: False)
    assert target.stat().st_size == 2 * rundir.CHUNK + 1


# a write that fails names the file it writes, not its temp file (a new name each time)
def test_a_failed_atomic_write_names_its_target_not_its_temp_file(tmp_path):
    gone = tmp_path / "checkpoints" / "last.pt"
    with pytest.raises(FileNotFoundError) as caught:
        rundir.atomic_write(gone, lambda f: f.write(b"x"))
    assert caught.value.filename == str(gone)

    def fails(f) -> None:
        f.write(b"x")
        raise OSError(errno.ENOSPC, "No space left on device", f"{tmp_path}/.last.pt.abc.tmp")

    target = tmp_path / "last.pt"
    with pytest.raises(OSError, match="No space left") as caught:
        rundir.atomic_write(target, fails)
    assert caught.value.filename == str(target) and not list(tmp_path.glob(".*.tmp"))
