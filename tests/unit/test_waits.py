"""Stop-aware waits (``ctx.wait_until``, ``ctx.wait_steps``, ``replay.wait_size``) and the
declared replay ratio (``schema.ReplayBuffer(replay_ratio=...)``): its arithmetic, the replay
buffer that keeps it between threads, its checkpoint, the Ray hub's side of it, and serial runs
in which the processes wait on each other by handing the turn on."""

from __future__ import annotations

import itertools
import sys
import threading

import attrs
import gymnasium as gym
import pytest
import torch

import mprl
from mprl import kinds, schema
from mprl.backends.serial import backend as serial_backend
from mprl.errors import RunFailed, SchemaError
from mprl.lib.nets import make_model
from mprl.transport.memory import MemoryReplay

ROW = {"x": ((2,), torch.float32)}


def never() -> bool:
    return False


# -- the arithmetic --------------------------------------------------------------------------


def test_the_pace_counts_credit_from_learning_starts_and_bounds_both_sides():
    pace = schema.ReplayPace(ratio=32.0, starts=1000, lead=256)
    assert pace.credit(1000, 0) == 0 and pace.credit(1002, 0) == 64
    assert pace.learner_waits(1001, 0, 64) and not pace.learner_waits(1002, 0, 64)
    assert not pace.learner_waits(1004, 64, 64) and pace.learner_waits(1004, 128, 64)
    # SB3's train_freq=256, gradient_steps=128, batch 64: 128 updates per 256 rows
    assert pace.credit(1000 + 256, 0) / 64 == 128
    # workers: wait at lead rows ahead (beyond the learner's batch), go on at half of it
    ahead = 1000 + 2 + 256  # the batch's 2 rows + the lead
    assert not pace.worker_waits(ahead - 1, 0, 64) and pace.worker_waits(ahead, 0, 64)
    assert not pace.worker_resumes(ahead, 0, 64)
    assert pace.worker_resumes(1000 + 2 + 127, 0, 64)
    assert not pace.worker_waits(10**9, 0, 64) or pace.lead is not None
    unbounded = schema.ReplayPace(ratio=4.0)
    assert not unbounded.worker_waits(10**9, 0, 64) and unbounded.worker_resumes(10**9, 0, 64)
    assert pace.caught_up(500) == 0 and pace.caught_up(1100) == 3200


@pytest.mark.parametrize("ratio", [0.25, 1.0, 3.0, 32.0])
def test_a_waiting_learner_always_lets_the_workers_go_on(ratio):
    # never both waiting: whatever the counts, a learner short of rows resumes the workers
    pace = schema.ReplayPace(ratio=ratio, starts=10, lead=4)
    for added, sampled, want in itertools.product(range(0, 200, 3), range(0, 800, 7), (1, 64)):
        if pace.learner_waits(added, sampled, want):
            assert pace.worker_resumes(added, sampled, want), (added, sampled, want)
        if pace.worker_waits(added, sampled, want):
            assert not pace.worker_resumes(added, sampled, want)


def test_the_declaration_is_checked_and_resolved_from_the_config():
    @attrs.frozen
    class Config:
        freq: int = 4
        starts: int = 100

    dims = schema.Dims(2, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), Config())
    decl = schema.ReplayBuffer(
        8, replay_ratio=lambda d: 64 / d.config.freq, learning_starts="config.starts",
        max_lead="config.freq",
    )  # fmt: skip
    assert kinds.pace(decl, dims) == schema.ReplayPace(16.0, 100, 4)
    assert kinds.pace(schema.ReplayBuffer(8), dims) is None  # no ratio: nothing waits
    assert kinds.pace(schema.ReplayBuffer(8, replay_ratio=2, max_lead=None), dims).lead is None
    for kwargs, message in [
        ({"replay_ratio": 0}, "replay_ratio is 0; it must be a number > 0"),
        ({"replay_ratio": -1.5}, "replay_ratio is -1.5"),
        ({"replay_ratio": float("nan")}, "replay_ratio is nan"),
        ({"replay_ratio": "ratio"}, "replay_ratio 'ratio' must be a number, 'config.FIELD'"),
        ({"replay_ratio": 1, "learning_starts": -1}, "learning_starts is -1; it must be a number >= 0"),
        ({"replay_ratio": 1, "max_lead": 0}, "max_lead is 0; it must be a number >= 1"),
    ]:  # fmt: skip
        with pytest.raises(SchemaError, match=rf"field 'replay' \(ReplayBuffer\): {message}"):
            schema.Schema(replay=schema.ReplayBuffer(8, **kwargs))
    late = schema.Schema(replay=schema.ReplayBuffer(8, replay_ratio="config.nope"))
    with pytest.raises(SchemaError, match=r"replay_ratio 'config\.nope': the config has no field"):
        kinds.check_dims(late, dims)
    zero = schema.Schema(replay=schema.ReplayBuffer(8, replay_ratio=lambda d: 0.0))
    with pytest.raises(SchemaError, match=r"replay_ratio is 0\.0; it must be a number > 0"):
        kinds.check_dims(zero, dims)


# -- the replay buffer keeping it, between threads --------------------------------------------


def _rows(n: int, value: float = 0.0) -> dict[str, torch.Tensor]:
    return {"x": torch.full((n, 2), value)}


def test_sample_waits_for_the_ratio_and_add_for_the_learner():
    pace = schema.ReplayPace(ratio=2.0, starts=4, lead=8)
    replay = MemoryReplay(ROW, 1000, 1, share=False, sleep=True, pace=pace)
    stopping = threading.Event()
    worker, learner = replay.bind(0, stopping.is_set), replay.bind(1, stopping.is_set)
    worker.add(**_rows(5))  # 4 to start, then 1 row: credit 2
    assert learner.sample(2) is not None and replay.counts() == (5, 2, 2)
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(learner.sample(2)))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and not got  # level with the worker: it waits
    worker.add(**_rows(1))
    waiting.join(5)
    assert got and got[0]["x"].shape == (2, 2) and replay.sampled() == 4
    # the worker: ahead by lead rows (8) beyond the learner's batch (1 row), it waits
    worker.add(**_rows(9))  # credit: 2 * (15 - 4) - 4 = 18 = want 2 + 2 * 8
    added = threading.Thread(target=lambda: worker.add(**_rows(1)))
    added.start()
    added.join(0.2)
    assert added.is_alive() and replay.added() == 15
    for _ in range(5):  # to half the lead: credit 8 < 2 + 8
        learner.sample(2)
    added.join(5)
    assert not added.is_alive() and replay.added() == 16
    # stopping ends a waiting sample with None and lets a waiting add put its rows in
    blocked: list = []
    sampler = threading.Thread(target=lambda: blocked.append(learner.sample(10**6)))
    sampler.start()
    sampler.join(0.1)
    stopping.set()
    sampler.join(5)
    assert blocked == [None]


def test_wait_size_returns_the_size_or_none_once_stopping():
    replay = MemoryReplay(ROW, 100, 2, share=False)
    stop = threading.Event()
    worker, learner = replay.bind(1, stop.is_set), replay.bind(2, stop.is_set)
    worker.add(**_rows(3))
    assert learner.wait_size(3) == 3
    assert learner.wait_size(4, timeout=0.05) is None
    adder = threading.Timer(0.05, lambda: worker.add(**_rows(2)))
    adder.start()
    assert learner.wait_size(4) == 5
    stop.set()
    assert learner.wait_size(100) is None
    adder.join()


def test_the_counts_are_checkpointed_and_follow_rows_moved_between_workers():
    pace = schema.ReplayPace(ratio=2.0, starts=4, lead=None)
    a = MemoryReplay(ROW, 100, 2, share=False, pace=pace)
    a.bind(0, never).add(**_rows(6))
    a.bind(1, never).add(**_rows(4))
    a.bind(2, never).sample(8)
    saved = a.state()
    assert int(saved["sampled"]) == 8 and int(saved["added"]) == 10
    b = MemoryReplay(ROW, 100, 2, share=False, pace=pace)
    assert b.load(saved) and b.counts() == (10, 8, 0)
    # fewer rows after a re-partition (another worker count): the learner as far ahead as it
    # was, not waiting for rows it already learned from
    moved = {**saved, "heads": torch.tensor([3, 3])}
    c = MemoryReplay(ROW, 100, 2, share=False, pace=pace)
    assert c.load(moved) and c.counts()[:2] == (6, 0)
    assert c.bind(0, never).sampled() == 0 and pace.credit(6, 0) == pace.credit(10, 8)
    # a checkpoint without the counts: level with its rows, no burst of updates
    old = {k: v for k, v in saved.items() if k not in ("sampled", "added")}
    d = MemoryReplay(ROW, 100, 2, share=False, pace=pace)
    assert d.load(old) and d.sampled() == pace.caught_up(10) == 12
    # nor after one of a buffer without a ratio, which counted no rows sampled (sac's, before
    # it declared its ratio): level too, not a burst of ratio * rows updates
    unpaced = MemoryReplay(ROW, 100, 2, share=False)
    unpaced.bind(0, never).add(**_rows(6))
    unpaced.bind(1, never).add(**_rows(4))
    unpaced.bind(2, never).sample(8)
    assert int(unpaced.state()["sampled"]) == 0
    e = MemoryReplay(ROW, 100, 2, share=False, pace=pace)
    assert e.load(unpaced.state()) and e.counts() == (10, pace.caught_up(10), 0)
    assert pace.learner_waits(*e.counts()[:2], want=1)  # it waits for the next rows


# -- serial runs: waiting hands the turn on ---------------------------------------------------


@attrs.frozen
class WaitConfig:
    hidden: tuple[int, ...] = (8,)
    lr: float = 1e-3
    rows: int = 30


def adding_worker(ctx: mprl.Context) -> None:
    replay = ctx.state.replay
    while not ctx.should_stop():
        replay.add(**_transitions(1, 4))  # CartPole's observations
        ctx.add_steps(1)
        ctx.state.added.add(1)


def _transitions(n: int, obs: int) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.zeros(n, obs), "action": torch.zeros(n, dtype=torch.int64),
        "reward": torch.zeros(n), "next_obs": torch.zeros(n, obs), "done": torch.zeros(n),
    }  # fmt: skip


def waiting_trainer(ctx: mprl.Context) -> None:
    replay, added = ctx.state.replay, ctx.state.added
    ok = ctx.wait_steps(20)
    ctx.log(waited_steps=ok, steps_then=ctx.env_steps)
    size = replay.wait_size(ctx.config.rows)
    ctx.log(waited_size=size)
    ok = ctx.wait_until(lambda: added.value >= 50)
    ctx.log(waited_until=ok, added_then=added.value)
    ctx.log(timed_out=ctx.wait_until(lambda: False, timeout=0.01))
    # nothing will make this true: it returns once the run stops (the step budget)
    ctx.log(at_stop=ctx.wait_until(lambda: False), size_at_stop=replay.wait_size(10**6))


def stuck(ctx: mprl.Context) -> None:
    ctx.wait_until(lambda: False)


@mprl.hookimpl
def mprl_register_algorithms(register):
    shape = schema.Schema(
        replay=schema.ReplayBuffer(capacity=100), added=schema.Counter(),
    )  # fmt: skip
    register(
        mprl.Algorithm(
            name="waiter", config_cls=WaitConfig, make_model=make_model,
            worker=adding_worker, train=waiting_trainer, schema=shape,
        )
    )  # fmt: skip
    register(
        mprl.Algorithm(
            name="stuck", config_cls=WaitConfig, make_model=make_model, worker=stuck,
            train=stuck, schema=shape,
        )
    )  # fmt: skip


def test_waits_hand_the_turn_on_in_serial_runs_and_end_false_once_stopping(mprl_pm, mprl_serial):
    mprl_pm.register(sys.modules[__name__])
    result = mprl_serial("waiter", workers=2, total_steps=400)
    assert result.summary.status == "finished"
    logged = {k: v for r in result.records for k, v in r.items() if r["source"] == "trainer"}
    # each wait saw its condition within a round of turns of it coming true
    assert logged["waited_steps"] is True and 20 <= logged["steps_then"] <= 22
    assert 30 <= logged["waited_size"] <= 32
    assert logged["waited_until"] is True and 50 <= logged["added_then"] <= 52
    assert logged["timed_out"] is False
    assert logged["at_stop"] is False and logged["size_at_stop"] is None
    assert result.summary.env_steps >= 400


def test_every_process_waiting_until_is_a_deadlock(mprl_pm, mprl_serial, monkeypatch):
    monkeypatch.setattr(serial_backend, "DEADLOCK_S", 0.3)
    mprl_pm.register(sys.modules[__name__])
    with pytest.raises(RunFailed) as info:
        mprl_serial("stuck", workers=2, total_steps=100)
    tb = info.value.summary.failures[0].traceback
    assert "RuntimeError: deadlock" in tb and "ctx.wait_until(lambda: False)" in tb
    assert threading.active_count() == 1
