"""Faults while a run goes on, where no process is needed: the pieces behind
``tests/integration/test_faults_runtime.py``."""

from __future__ import annotations

import errno
import io
import os
import signal
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import pytest

from mprl.backends.local import preflight
from mprl.errors import UsageError
from mprl.host import monitor, progress
from mprl.host.progress import Progress
from mprl.host.runner import WAITING, _Signals
from mprl.host.stats import RunStats
from mprl.lib.envbatch import EnvBatch
from tests.conftest import cli_here

KIB = 1024


# sizes under a MiB are said in KiB, not "0 MiB"
def test_a_small_dev_shm_is_said_in_kib(tmp_path, monkeypatch):
    usage = SimpleNamespace(total=64 * KIB, used=0, free=64 * KIB)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage)
    with pytest.raises(UsageError) as info:
        preflight.check_shm(300 * KIB, "its model", shm=str(tmp_path))
    text = str(info.value)
    assert "needs about 300 KiB of shared memory for its model" in text, text
    assert f"{tmp_path} has 64 KiB free. Fix: " in text and "MiB" not in text.split("Fix")[0]
    assert preflight.size_text(3 * 2**20) == "3 MiB" and preflight.size_text(100) == "1 KiB"


# every shared tensor is a file of whole pages in /dev/shm: forty floats take forty pages
def test_the_preflight_counts_a_page_per_shared_tensor(tmp_path, monkeypatch):
    usage = SimpleNamespace(total=64 * KIB, used=0, free=64 * KIB)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage)
    with pytest.raises(UsageError, match=r"needs about \d+ KiB .* has 64 KiB free"):
        preflight.check(shm_bytes=40 * 4, storages=40, processes=1, shm=str(tmp_path))
    assert preflight.check(shm_bytes=4 * 4, storages=4, processes=1, shm=str(tmp_path)) == []


# /dev/shm filled up between the preflight and sharing: the file torch could not fill is
# removed, and the error is one line with the fix
def test_a_share_that_does_not_fit_removes_its_file_and_says_the_fix(tmp_path):
    shm = tmp_path
    (shm / "torch_1_other_process").write_bytes(b"")  # another process's: left alone
    earlier = shm / f"torch_{os.getpid()}_0_0"
    earlier.write_bytes(b"")  # one of this process's from before: left alone

    def put() -> None:  # what torch does when the tmpfs is full
        name = f"torch_{os.getpid()}_123_4"
        (shm / name).write_bytes(b"\0" * 4)
        raise RuntimeError(
            f"unable to allocate shared memory(shm) for file </{name}>: No space left on device "
            "(28)"
        )

    with pytest.raises(UsageError) as info:
        preflight.share(put, "the model and the optimizer state", shm=str(shm))
    text = str(info.value)
    assert text.startswith("could not put the model and the optimizer state in shared memory ")
    assert "No space left on device" in text and "Fix: " in text and "\n" not in text
    assert sorted(p.name for p in shm.iterdir()) == sorted(["torch_1_other_process", earlier.name])

    def bug() -> None:  # not a shared-memory failure: as it is
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        preflight.share(bug, "the model", shm=str(shm))


# the fields mprl fills in itself, and an episode's, must be what mprl makes them
@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"source": "worker:0", "step": 1, "time": "soon", "loss": 0.5}, "time"),
        ({"source": "worker:0", "step": 1, "time": float("nan")}, "time"),
        ({"source": "worker:0", "step": "x", "time": 1.0}, "step"),
        ({"source": 3, "step": 1, "time": 1.0}, "source"),
        ({"source": "worker:0", "step": 1, "episode_return": "x"}, "episode_return"),
        ({"source": "worker:0", "step": 1, "episode_return": None}, "episode_return"),
        ({"source": "worker:0", "step": 1, "episode_return": [1.0]}, "episode_return"),
        ({"source": "worker:0", "step": 1, "episode_return": 10**400}, "episode_return"),
        ({"source": "worker:0", "step": 1, "episode_return": True}, "episode_return"),
        (
            {"source": "worker:0", "step": 1, "episode_return": 1.0, "episode_length": "x"},
            "episode_length",
        ),
    ],
)
def test_a_record_mprl_cannot_count_is_named(record, field):
    problem = RunStats.check(record)
    assert problem is not None and problem[0] == field, problem


@pytest.mark.parametrize(
    "record",
    [
        {"source": "worker:0", "step": 1, "time": 1.5, "episode_return": 1.0, "episode_length": 3},
        {"source": "worker:0", "step": 1, "time": 1.5, "episode_return": "-inf"},  # as sent
        {"source": "trainer", "step": 0, "time": 2, "loss": float("nan"), "note": "text"},
    ],
)
def test_a_record_mprl_makes_is_counted(record):
    assert RunStats.check(record) is None
    stats = RunStats(None, None)
    stats.add(record)
    assert stats.episodes == int("episode_return" in record)


# torch.save turns a failed write into a RuntimeError; its context is the OSError
def test_a_failed_write_is_said_by_its_cause():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos"
            ) from None
    except RuntimeError as exc:
        # `from None` hides the context from tracebacks but keeps it, as torch's does
        assert monitor.describe_write_error(exc) == (
            "the disk is full: [Errno 28] No space left on device"
        )
    gone = FileNotFoundError(errno.ENOENT, "No such file or directory", "/r/checkpoints/.x.tmp")
    assert monitor.describe_write_error(gone) == (
        "[Errno 2] No such file or directory: '/r/checkpoints/.x.tmp'"
    )
    assert monitor.describe_write_error(RuntimeError("bad\nmore")) == "RuntimeError: bad"


class _Gone(io.StringIO):
    """A stream whose reader went away."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")


# nothing the progress display writes can end a run
@pytest.mark.parametrize("mode", ["plain", "live", "none"])
def test_progress_to_a_closed_stream_never_raises(mode):
    display = Progress(mode, stream=_Gone())
    snapshot = RunStats(None, 1000).snapshot()
    display.start("mprl: probe on Corridor-v0")
    display.update(snapshot)
    display.message("mprl: a message", "a detail")
    display.stop(snapshot)
    progress.say("mprl: the last line", _Gone())


# Python started with stderr or stdout closed (`mprl run ... 2>&-`) has None for them
def test_progress_and_last_lines_without_a_stream(monkeypatch):
    monkeypatch.setattr("sys.stderr", None)
    display = Progress("auto")
    assert display.mode == "plain"
    snapshot = RunStats(None, None).snapshot()
    display.start("mprl: probe on Corridor-v0")
    display.update(snapshot)
    display.message("mprl: a message")
    display.stop(snapshot)
    progress.say("mprl: the last line")
    progress.say("mprl: the last line", None)


# a pipe whose reader is gone: the stream's descriptor then writes to /dev/null, so that
# nothing else (the interpreter's last flush at exit) fails or complains either
def test_a_broken_pipe_is_pointed_at_dev_null():
    r, w = os.pipe()
    os.close(r)
    stream = open(w, "w")  # noqa: SIM115 - closed below
    try:
        safe = progress.SafeStream(stream)
        safe.write("a line nobody reads\n")
        safe.flush()
        assert safe.broken
        assert os.readlink(f"/proc/self/fd/{w}") == "/dev/null"
        stream.write("more\n")
        stream.flush()  # would raise BrokenPipeError without the redirect
    finally:
        stream.close()


# SIGHUP asks for a clean stop like SIGTERM, except under nohup
def test_sighup_is_a_stop_unless_nohup_ignores_it():
    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signals = _Signals()
        with signals.installed():
            assert signal.getsignal(signal.SIGHUP) == signals.handle
            signals.handle(signal.SIGHUP, None)
            assert signals.received == signal.SIGHUP and not signals.forced
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        with _Signals().installed():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


# SIGINT ignored when the run starts (a background job of a script) stays ignored, as nohup's
# SIGHUP: the run is stopped by SIGTERM instead (the note it starts with says so)
def test_sigint_ignored_when_the_run_starts_stays_ignored_and_sigterm_still_stops_it():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signals = _Signals()
        with signals.installed():
            assert signals.kept == (signal.SIGINT,)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == signals.handle
            assert signal.getsignal(signal.SIGHUP) == signals.handle
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # and under nohup too
        with (signals := _Signals()).installed():
            assert signals.kept == (signal.SIGINT, signal.SIGHUP)
            assert signal.getsignal(signal.SIGTERM) == signals.handle
        signal.signal(signal.SIGINT, signal.default_int_handler)  # in the foreground
        with (signals := _Signals()).installed():
            assert signals.kept == (signal.SIGHUP,)
            assert signal.getsignal(signal.SIGINT) == signals.handle
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# after the first Ctrl-C, one while a checkpoint is saved is told it waits for it, one more
# cuts it short; one when none is saved forces the exit, as before
def test_a_ctrl_c_during_a_checkpoint_waits_for_it_and_one_more_cuts_it(capsys):
    signals = _Signals()
    signals.handle(signal.SIGINT, None)  # the clean stop
    assert signals.received == signal.SIGINT and not signals.forced
    with signals.saving():
        signals.handle(signal.SIGTERM, None)  # not a Ctrl-C: nothing more
        signals.handle(signal.SIGINT, None)
        assert capsys.readouterr().err == f"{WAITING}\n" and not signals.cut
        signals.handle(signal.SIGINT, None)
        assert signals.cut and not signals.forced and capsys.readouterr().err == ""
        with pytest.raises(KeyboardInterrupt):  # one more: the save is stuck, a forced exit
            signals.handle(signal.SIGINT, None)
        assert signals.forced
        signals.handle(signal.SIGINT, None)  # once: the forced exit's cleanup goes on
    assert capsys.readouterr().err == ""
    other = _Signals()
    other.handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):  # no checkpoint being saved: a forced exit
        other.handle(signal.SIGINT, None)
    assert other.forced and not other.cut
    with other.saving():  # the forced exit's own checkpoint waits too, and can be cut
        other.handle(signal.SIGINT, None)
        other.handle(signal.SIGINT, None)
        other.handle(signal.SIGINT, None)  # (nothing is raised into the forced exit's cleanup)
    assert other.cut and capsys.readouterr().err == f"{WAITING}\n"


# building (and resetting) a worker's envs is start-up work, beaten for as it goes
def test_building_an_env_batch_beats_as_start_up():
    beats: list[tuple[int, bool]] = []
    channel = SimpleNamespace(beat=lambda slot, starting=False: beats.append((slot, starting)))

    def make_env(index: int) -> Any:
        return gym.make("CartPole-v1")

    ctx = SimpleNamespace(
        rank=1, n_workers=2, channel=channel, make_env=make_env, run=None, log_episode=print
    )
    batch = EnvBatch(ctx, 5, 0.99)
    assert len(beats) == 1 + 5 + 5 + 1  # before, per env made, per env reset, done
    assert {slot for slot, _ in beats} == {1}
    assert all(starting for _, starting in beats[:-1]) and beats[-1] == (1, False)
    batch.close()


# the EnvPool message does not contradict itself
@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            "Ant-v4",
            "--env-batch envpool: mprl steps classic-control and Atari envs with EnvPool, not "
            "'Ant-v4' (EnvPool's own build of it is not gymnasium's); use --env-batch gym",
        ),
        (
            "Corridor-v0",
            "--env-batch envpool: EnvPool has no 'Corridor-v0' (mprl steps classic-control and "
            "Atari envs with EnvPool); use --env-batch gym",
        ),
    ],
)
def test_the_envpool_message_says_what_is_stepped(tmp_path, capsys, env, message):
    pytest.importorskip("envpool")
    code, err = cli_here(
        capsys, "run", "--plugin", "ppo", "--env", env, "--env-batch", "envpool",
        "--run-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert code == 2 and err.strip() == f"mprl: error: {message}", err
    assert not (tmp_path / "r").exists()
