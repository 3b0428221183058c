"""What a run says and records, in the test's own process (serial runs): the progress modes
``mprl.run`` takes, numbers only in ``log_episode``, one wall clock across summary, metrics,
checkpoint and a resume (whose record carries the run's step), where a worker's output goes on
the serial backend, and Ray's token note left out of mprl's own embedded cluster."""

from __future__ import annotations

import json
import logging
import sys

import attrs
import numpy as np
import pytest
import torch

import mprl
from mprl import schema, testing
from mprl.errors import UsageError
from mprl.host import checkpoint
from mprl.host.progress import MODES
from mprl.host.stats import RunStats
from mprl_builtin.ray import start as ray_start
from tests.conftest import REPO
from tests.plugins import mprl_docs_dqn

DQN = testing.registered(mprl_docs_dqn)["docs-dqn"]


@pytest.mark.parametrize("mode", ["quiet", "", None, "Plain", 0])
def test_an_unknown_progress_mode_is_refused_naming_the_modes(mode, tmp_path):
    with pytest.raises(UsageError) as caught:
        mprl.run("a3c", progress=mode, run_dir=tmp_path / "run", backend="serial")
    assert str(caught.value) == (
        f"progress={mode!r}: not a progress mode; use one of 'auto', 'live', 'plain', 'none'"
    )
    assert not (tmp_path / "run").exists()  # refused before anything


def test_the_progress_modes_are_documented():
    assert MODES == ("auto", "live", "plain", "none")
    doc = mprl.run.__doc__ or ""
    assert all(f'``"{mode}"``' in doc for mode in MODES)
    running = (REPO / "docs" / "running.md").read_text()
    assert all(f'`"{mode}"`' in running for mode in MODES)


def test_log_episode_takes_numbers_only():
    bench = testing.Bench(DQN, workers=1)
    ctx = bench.context(0)
    ctx.log_episode(np.float32(10.5), np.int64(3))  # numpy scalars and tensors are numbers
    ctx.log_episode(torch.tensor(2.0), 2, epsilon=torch.tensor(0.5), note="kept as it is")
    assert [r["episode_return"] for r in bench.records] == [10.5, 2.0]
    assert bench.records[1]["epsilon"] == 0.5 and bench.records[1]["note"] == "kept as it is"
    for bad in (("10", 3), (10.0, "3"), (b"1", 3)):
        with pytest.raises(TypeError, match=r"an episode's return and length are numbers"):
            ctx.log_episode(*bad)
    assert len(bench.records) == 2


def test_the_wall_clock_stops_with_the_run():
    stats = RunStats(None, None)
    stats.stop_clock()
    stopped = stats.wall_s
    assert stats.wall_s == stopped == stats.state()["wall_s"] == stats.snapshot().wall_s


def _metrics(run_dir):
    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_one_wall_clock_across_summary_metrics_checkpoint_and_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    first = testing.run_serial("a3c", run_dir=run_dir, total_steps=800, workers=1)
    saved = checkpoint.load(run_dir)[1]
    records = _metrics(run_dir)
    # the final checkpoint holds the summary's wall time, and its record says it
    assert saved["stats"]["wall_s"] == pytest.approx(first.summary.wall_s, abs=1e-3)
    assert records[-1]["event"] == "checkpoint" and records[-1]["wall"] == pytest.approx(
        first.summary.wall_s, abs=1e-3
    )
    assert max(r["wall"] for r in records) <= first.summary.wall_s + 1e-3
    second = mprl.run(resume=run_dir, total_steps=1600, backend="serial", progress="none")
    records = _metrics(run_dir)
    (resume,) = [r for r in records if r.get("event") == "resume"]
    # the resume record: the run's step and wall time, where the first session ended
    assert (
        resume["step"] == first.summary.env_steps == saved["steps"][-1] + sum(saved["steps"][:-1])
    )
    ended = first.summary.wall_s - 1e-3  # (rounded to 3 places there, 4 in the records)
    assert ended <= resume["wall"] <= second.wall_s
    after = records[records.index(resume) :]
    assert all(r["wall"] >= ended for r in after)
    assert second.wall_s > first.summary.wall_s and second.env_steps >= 1600
    assert checkpoint.load(run_dir)[1]["stats"]["wall_s"] == pytest.approx(second.wall_s, abs=1e-3)


@attrs.frozen
class ChattyConfig:
    pass


def chatty_model(obs_space, act_space, config):
    return torch.nn.Linear(obs_space.shape[0], act_space.n)


def chatty_worker(ctx: mprl.Context) -> None:
    print(f"worker {ctx.rank} says hello")
    print(f"worker {ctx.rank} complains", file=sys.stderr)
    while not ctx.should_stop():
        ctx.add_steps(1)


class Chatty:
    @mprl.hookimpl
    def mprl_register_algorithms(self, register):
        register(
            mprl.Algorithm(
                name="chatty", config_cls=ChattyConfig, make_model=chatty_model,
                worker=chatty_worker, schema=schema.Schema(),
            )
        )  # fmt: skip


def test_a_worker_print_reaches_this_process_stdout_on_the_serial_backend(capsys):
    testing.run_serial("chatty", plugins=[Chatty()], total_steps=50, workers=2)
    out, err = capsys.readouterr()
    assert "worker 0 says hello" in out and "worker 1 says hello" in out
    assert "worker 0 complains" in err and "worker 1 complains" in err


def test_rays_token_note_is_left_out_of_its_logger_only_while_mprl_starts_ray(caplog):
    logger = logging.getLogger(ray_start.AUTH_LOGGER)
    note = f"{ray_start.AUTH_NOTE}. Set RAY_AUTH_MODE=disabled to opt out."
    with caplog.at_level(logging.WARNING, logger=ray_start.AUTH_LOGGER):
        with ray_start.without_auth_note():
            logger.warning(note)
            logger.warning("Token authentication is disabled for this Ray cluster.")
        logger.warning(note)  # outside: Ray's word, as Ray says it
    assert [r.getMessage() for r in caplog.records] == [
        "Token authentication is disabled for this Ray cluster.",
        note,
    ]
    assert not logger.filters
