"""Faults of the main process and its files, through the CLI: a Ctrl-C more while the final
checkpoint is written, a run directory removed or moved while the run goes on, a checkpoint
that keeps failing, a plain pickle given as a checkpoint.

A slow checkpoint is made real: a plugin whose shared state is a tensor of 256 MiB. The test
waits for the write's temp file in ``RUN_DIR/checkpoints``, then stops the process
(``SIGSTOP``) before each Ctrl-C it sends, so that it can see that the write is still going on
when the signal arrives, whatever the machine's speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

import mprl
from mprl.errors import UsageError
from mprl.host import checkpoint
from tests.conftest import (
    WAIT_S,
    clean_stderr,
    cli,
    read_metrics,
    running,
    stepped,
    wait_for_metrics,
    wait_until,
    write_distribution,
)

#: a plugin whose checkpoint takes a while to write: its shared state is ``rows`` floats
BALLAST = """
import time

import attrs
import torch

import mprl
from mprl import schema


@attrs.frozen
class Config:
    rows: int = 1


def make_model(obs_space, act_space, config):
    return torch.nn.Linear(4, 2)


def worker(ctx):
    while not ctx.should_stop():
        ctx.add_steps(10)
        ctx.log_episode(10.0, 10)
        time.sleep(0.01)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="ballast", config_cls=Config, worker=worker, make_model=make_model,
            schema=schema.Schema(ballast=schema.Tensor(shape=("config.rows",))),
        )
    )
"""

ROWS = 1 << 26  # 256 MiB of float32: a write of a second or so
#: what a Ctrl-C says while a checkpoint is written, after the one that stopped the run
WAITING = "mprl: saving the checkpoint; Ctrl-C again to exit without it"


@pytest.fixture
def ballast(installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test plugins, and ``ballast`` installed beside them."""
    site = tmp_path / "ballast-site"
    site.mkdir()
    write_distribution(site, "mprl-ballast", {"ballast": "mprl_ballast"}, {"mprl_ballast": BALLAST})
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
    return site


def probe(run_dir: Path, *settings: str, steps: int = 10**9) -> list[str]:
    args = ["--plugin", "probe", "--workers", "1", "--quiet", "--run-dir", str(run_dir)]
    args += ["--total-steps", str(steps)]
    for setting in settings:
        args += ["--set", setting]
    return args


def events(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r.get("event") == kind]


def _temp_file(run_dir: Path, proc) -> Path:
    """The temp file of the checkpoint being written, as soon as it is there."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = list((run_dir / "checkpoints").glob(".last.pt.*.tmp"))
        if found:
            return found[0]
        assert proc.poll() is None, "the run ended before its final checkpoint was written"
        time.sleep(0.002)  # the write lasts about a second: look often
    raise AssertionError("no checkpoint was written")


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The process ``pid`` stopped (SIGSTOP) until the block ends: what it was doing stays as
    it is, and a signal sent meanwhile is handled once it goes on."""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + WAIT_S
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the process did not stop"
            time.sleep(0.001)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _read_until(stream: IO[str], line: str) -> str:
    """What ``stream`` says up to and with ``line``; fails if it ends first."""
    seen = []
    while True:
        got = stream.readline()
        assert got, f"{line!r} was never said; before the end: {''.join(seen)!r}"
        seen.append(got)
        if got.rstrip("\n") == line:
            return "".join(seen)


# a second Ctrl-C while the final checkpoint is written waits for it; a third exits without it,
# the previous checkpoint kept
@pytest.mark.parametrize("third", [False, True], ids=["waits", "third-ctrl-c-cuts-it"])
def test_a_second_ctrl_c_during_the_final_checkpoint_waits_for_it_unless_a_third_comes(
    ballast, run_dir, third
):
    args = ["--plugin", "ballast", "--workers", "1", "--quiet", "--run-dir", str(run_dir)]
    first = cli("run", *args, "--set", f"rows={ROWS}", "--total-steps", "100", timeout=300)
    assert first.returncode == 0, first.stderr
    kept = json.loads((run_dir / "summary.json").read_text())["env_steps"]
    resume = ["--resume", str(run_dir), "--total-steps", str(10**9), "--quiet"]
    resume += ["--checkpoint-every", "3600"]  # the one write after the Ctrl-C is the final one
    with running(resume) as proc:
        wait_for_metrics(run_dir, lambda r: "episode_return" in r and r["step"] > kept)
        proc.send_signal(signal.SIGINT)
        tmp = _temp_file(run_dir, proc)
        with _stopped(proc.pid):
            assert tmp.exists(), "the final checkpoint was written before the test stopped it"
            proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        said = _read_until(proc.stderr, WAITING)
        if third:
            with _stopped(proc.pid):
                assert tmp.exists(), "the final checkpoint was written before the third Ctrl-C"
                proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    stderr = said + rest
    assert proc.returncode == 130, stderr
    clean_stderr(stderr)
    assert "Traceback" not in stderr and "unexpected pos" not in stderr, stderr
    assert "forced exit" not in stderr and stderr.count(WAITING) == 1, stderr
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))  # no cut write left
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGINT
    steps = summary["env_steps"]
    _, saved = checkpoint.load(run_dir)
    path = run_dir / "checkpoints" / "last.pt"
    if not third:  # the final checkpoint, whole, with every step
        assert saved["env_steps"] == steps > kept
        assert summary["checkpoint"] == {"path": str(path), "env_steps": steps}
        assert stderr.strip().splitlines()[-1] == WAITING, stderr
        return
    # the previous checkpoint is kept, and the last line says so
    assert saved["env_steps"] == kept < steps
    assert summary["checkpoint"] == {"path": str(path), "env_steps": kept}
    assert stderr.strip().splitlines()[-1] == (
        f"mprl: the final checkpoint was not written (cut short by Ctrl-C); the last one "
        f"({path}) holds {kept:,} of {steps:,} env steps: --resume {run_dir} continues from it"
    ), stderr
    writes = [r for r in read_metrics(run_dir) if r.get("event", "").startswith("checkpoint")]
    assert writes[-1]["event"] == "checkpoint-cut"


# the run directory is removed (or moved) while the run goes on: the run stops, saying so once
@pytest.mark.parametrize("how", ["removed", "moved"])
def test_a_run_directory_gone_while_the_run_goes_on_stops_it_saying_so_once(
    installed, run_dir, tmp_path, how
):
    moved = tmp_path / "moved"
    with running([*probe(run_dir, "step_sleep=0.002"), "--checkpoint-every", "0.5"]) as proc:
        records = wait_for_metrics(run_dir, lambda r: r.get("event") == "checkpoint" and stepped(r))
        if how == "removed":
            shutil.rmtree(run_dir)
        else:
            run_dir.rename(moved)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    clean_stderr(stderr)
    (line,) = stderr.strip().splitlines()
    found = re.fullmatch(
        rf"mprl: run failed: the run directory {re.escape(str(run_dir))} is gone \(removed or "
        r"moved while the run went on\): the run stopped after ([\d,]+) env steps?, and nothing "
        r"more could be saved there \(no final checkpoint, no summary\.json\)",
        line,
    )
    assert found, line
    steps = int(found[1].replace(",", ""))
    assert steps >= max(r["step"] for r in events(records, "checkpoint")) > 0
    assert not run_dir.exists()  # nothing was made again where it was
    if how == "moved":  # what the run wrote before the move is there, whole
        _, data = checkpoint.load(moved)
        assert 0 < data["env_steps"] <= steps
        assert not (moved / "summary.json").exists()


# a checkpoint that keeps failing is said once, then now and then with a count
@pytest.mark.parametrize("how", ["removed", "a file"])
def test_a_checkpoint_that_keeps_failing_is_said_once_then_counted(installed, run_dir, how):
    where = run_dir / "checkpoints"
    with running([*probe(run_dir, "step_sleep=0.002"), "--checkpoint-every", "0.1"]) as proc:
        wait_for_metrics(run_dir, lambda r: r.get("event") == "checkpoint" and stepped(r))
        shutil.rmtree(where)
        if how == "a file":
            where.write_text("not a directory\n")
        wait_until(
            lambda: len(events(read_metrics(run_dir), "checkpoint-failed")) >= 12,
            "a dozen failed checkpoints",
        )
        proc.send_signal(signal.SIGINT)
        out, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    clean_stderr(stderr)
    failures = len(events(read_metrics(run_dir), "checkpoint-failed"))  # the final one too
    assert failures > 12
    what = "was removed" if how == "removed" else "is not a directory"
    lines = stderr.strip().splitlines()
    assert lines[0].startswith(f"mprl: checkpoint not written ({where} {what}: [Errno "), lines
    assert lines[0].endswith(
        f": '{where / 'last.pt'}'); there is no earlier one: the run cannot be resumed unless "
        "one is written"
    ), lines  # the file it failed to write, not its temp file (a new name each time)
    assert ".tmp" not in stderr
    why = lines[0].removeprefix("mprl: checkpoint not written (").split("); there is")[0]
    again = [line for line in lines[1:] if line.startswith("mprl: checkpoint still failing")]
    counts = [int(re.search(r"\((\d+) times\)", line)[1]) for line in again]  # type: ignore[index]
    assert counts == [n for n in (3, 10, 30, 100, 300) if n <= failures], lines
    assert all(line.endswith(f" times): {why}") for line in again), lines
    assert lines[1 + len(again) :] == [
        "mprl: the run ended with no checkpoint, so it cannot be resumed"
    ], lines
    assert f"; {failures:,} checkpoint writes failed; run directory: {run_dir}" in out, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["checkpoint_failures"] == failures and summary["checkpoint"] is None


# a plain pickle given as a checkpoint: not an mprl checkpoint, and no word of an unsafe load
def test_a_plain_pickle_is_no_checkpoint_and_no_unsafe_load_is_suggested(installed, tmp_path):
    pkl = tmp_path / "x.pkl"
    with pkl.open("wb") as f:  # what a checkpoint holds, pickled
        pickle.dump({"format": "mprl-checkpoint", "version": 2, "model": {}}, f, protocol=4)
    expected = (
        f"checkpoint {str(pkl)!r} is not an mprl checkpoint: it is a plain Python pickle "
        "(pickle.dump, or torch.save's legacy format), not the zip archive of an mprl "
        "checkpoint, and mprl does not read one"
    )
    new = tmp_path / "new"
    for args in (["eval", str(pkl)], ["run", "--resume", str(pkl), "--run-dir", str(new)]):
        proc = cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [f"mprl: error: {expected}"], proc.stderr
        assert "weights_only" not in proc.stderr and "Warning" not in proc.stderr
    assert not new.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning would be an error here
        with pytest.raises(UsageError) as info:
            mprl.load(pkl)
    assert str(info.value) == expected
