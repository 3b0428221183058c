"""The serial backend (``run --serial``): every process a turn-taking thread of this one."""

from __future__ import annotations

import sys
import threading

import attrs
import pytest
import torch

import mprl
from mprl import kinds, schema
from mprl.backends.serial import backend as serial_backend
from mprl.errors import RunFailed
from mprl.host.plugins import get_plugin_manager
from mprl.lib.nets import make_model, make_optimizer
from mprl.testing import build_state
from tests.plugins import mprl_testplugin


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_a_serial_run_repeats_exactly_for_a_seed(mprl_serial):
    # ppo: a train process and two workers meeting at the Weights.wait barrier every update
    pm_run = {"env": "CartPole-v1", "total_steps": 3000, "workers": 2}
    pm = get_plugin_manager()  # the installed ppo plugin
    a = mprl_serial("ppo", plugins=pm, seed=3, **pm_run)
    b = mprl_serial("ppo", plugins=pm, seed=3, **pm_run)
    c = mprl_serial("ppo", plugins=pm, seed=4, **pm_run)
    assert a.summary.status == "finished" and a.summary.stop_reason == "total steps reached"
    assert len(a.episode_returns) > 20
    assert a.episode_returns == b.episode_returns
    assert all(torch.equal(x, y) for x, y in zip(_params(a.model), _params(b.model), strict=True))
    assert a.episode_returns != c.episode_returns
    assert a.state.weights.version == b.state.weights.version > 0  # the learner did update
    # both workers stepped, the budget is spent to the round: no more than one rollout over
    steps = a.summary.per_worker_steps
    assert min(steps) > 0 and 3000 <= sum(steps) <= 3000 + 2 * 8 * 32


def test_inline_plugin_with_its_own_env_runs_serially(mprl_pm, mprl_serial):
    # registered in code, not installed: spawned children could not find it, the serial
    # backend hands the run's own plugin manager to its contexts
    mprl_pm.register(mprl_testplugin)
    # (probe's train process sleeps 50 ms a turn: a sleep in one process stalls them all)
    result = mprl_serial("probe", env="Corridor-v0", workers=2, total_steps=60)
    assert result.summary.status == "finished"
    assert list(result.state.envs) == ["Corridor", "Corridor"]
    assert result.state.seen.tolist() == [float(s) for s in result.summary.per_worker_steps]
    records = result.records
    trainer = [r for r in records if "trainer_saw_visits" in r]
    total = sum(result.summary.per_worker_steps)
    assert total >= 60 and min(result.summary.per_worker_steps) > 0
    # the trainer saw the count of the last step of at most one worker per pending turn
    assert trainer and total - 2 <= trainer[0]["trainer_seen"] <= total
    # each "process" was seeded with its own seed, as in a spawned run
    seeds = {r["rank"]: r["seed"] for r in records if "seed" in r}
    assert seeds == {c.rank: c.seed for c in result.contexts if c.rank >= 0}
    assert len(set(seeds.values())) == 2


def test_a_raising_worker_fails_the_run_with_its_traceback(mprl_pm, mprl_serial):
    mprl_pm.register(mprl_testplugin)
    with pytest.raises(RunFailed, match="worker 1 exited with code 1") as info:
        mprl_serial(
            "probe", env="Corridor-v0", workers=2, total_steps=10**6,
            config={"fault": "raise", "fault_rank": 1, "fault_at_step": 5},
        )  # fmt: skip
    summary = info.value.summary
    assert summary.status == "failed" and summary.failures[0].rank == 1
    assert "RuntimeError: injected failure in worker:1" in summary.failures[0].traceback
    assert "in probe_worker" in summary.failures[0].traceback
    assert threading.active_count() == 1  # every process thread has ended


# a plugin that leans on Manager objects: a lock, a barrier, a queue and a condition


@attrs.frozen
class RoundsConfig:
    rounds: int = 20
    hidden: tuple[int, ...] = (8,)  # for mprl.lib.nets.make_model and make_optimizer
    lr: float = 1e-3


def rounds_worker(ctx: mprl.Context) -> None:
    for i in range(ctx.config.rounds):
        if ctx.should_stop():
            return
        with ctx.state.lock:
            ctx.state.order.append((i, ctx.rank))
        ctx.state.barrier.wait()  # nobody starts round i + 1 before all finished round i
        ctx.state.results.put(ctx.rank)
        ctx.add_steps(1)
    with ctx.state.done:
        ctx.state.finished.value += 1
        ctx.state.done.notify_all()
    while not ctx.should_stop():  # the run ends when the train process has everything
        pass


def rounds_train(ctx: mprl.Context) -> None:
    with ctx.state.done:
        ctx.state.done.wait_for(lambda: ctx.state.finished.value == ctx.n_workers)
    got = [ctx.state.results.get() for _ in range(ctx.n_workers * ctx.config.rounds)]
    ctx.log(received=len(got))


def hogwild_worker(ctx: mprl.Context) -> None:
    """Forward, hand the turn on, then backward and step: the others step the shared model
    in between (as other processes would)."""
    optimizer = ctx.optimizer
    while not ctx.should_stop():
        pi, v = ctx.model(torch.ones(1, 4))
        loss = pi.pow(2).sum() + v.pow(2).sum()
        ctx.add_steps(1)  # the other workers take their turn here
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def deadlock_worker(ctx: mprl.Context) -> None:
    ctx.state.barrier.wait()  # parties: workers + 1, and no train process ever comes


@mprl.hookimpl
def mprl_register_algorithms(register):
    shared = {
        "order": schema.List(),
        "lock": schema.Lock(),
        "results": schema.Queue(),
        "done": schema.Condition(),
        "finished": schema.Value("i", 0),
    }
    register(
        mprl.Algorithm(
            name="rounds", config_cls=RoundsConfig, make_model=make_model, worker=rounds_worker,
            train=rounds_train, schema=schema.Schema(barrier=schema.Barrier("workers"), **shared),
        )
    )  # fmt: skip
    register(
        mprl.Algorithm(
            name="hogwild", config_cls=RoundsConfig, make_model=make_model,
            make_optimizer=make_optimizer, worker=hogwild_worker,
        )
    )  # fmt: skip
    register(
        mprl.Algorithm(
            name="deadlock", config_cls=RoundsConfig, make_model=make_model,
            worker=deadlock_worker, schema=schema.Schema(barrier=schema.Barrier("all")),
        )
    )  # fmt: skip


def test_manager_objects_wait_by_giving_the_others_their_turn(mprl_pm, mprl_serial):
    mprl_pm.register(sys.modules[__name__])
    result = mprl_serial("rounds", workers=3, total_steps=10**6)
    assert result.summary.stop_reason == "trainer finished"
    order = list(result.state.order)
    assert [i for i, _ in order] == sorted(i for i, _ in order)  # the barrier held every round
    assert sorted(order) == [(i, r) for i in range(20) for r in range(3)]
    received = [r["received"] for r in result.records if "received" in r]
    assert received == [60] and result.state.results.empty()


def test_hogwild_workers_have_their_own_tensors_over_the_shared_memory(mprl_pm, mprl_serial):
    mprl_pm.register(sys.modules[__name__])
    result = mprl_serial("hogwild", workers=3, total_steps=300)
    assert result.summary.status == "finished"  # no "modified by an inplace operation"
    models = [c.model for c in result.contexts]
    # one memory: every worker's parameters are the run's model's, not copies of them
    for model in models:
        for mine, shared in zip(model.parameters(), result.model.parameters(), strict=True):
            assert mine is not shared and mine.data_ptr() == shared.data_ptr()
            assert mine.grad is not None and shared.grad is None  # gradients stay per process
    # every worker's step went to the one shared Adam state
    assert result.optimizer is not None
    steps = result.optimizer.state[next(result.model.parameters())]["step"]
    assert int(steps) == result.summary.env_steps


def test_a_deadlock_is_reported_where_it_waits(mprl_pm, mprl_serial, monkeypatch):
    monkeypatch.setattr(serial_backend, "DEADLOCK_S", 0.5)
    mprl_pm.register(sys.modules[__name__])
    with pytest.raises(RunFailed, match="exited with code 1") as info:
        mprl_serial("deadlock", workers=2, total_steps=10**6)
    tb = info.value.summary.failures[0].traceback
    assert "RuntimeError: deadlock: every process has waited on the shared state" in tb
    assert "in deadlock_worker" in tb and "barrier.wait()" in tb
    assert threading.active_count() == 1


def test_in_process_manager_objects_work_across_real_threads():
    state = schema.Schema(
        lock=schema.Lock(), barrier=schema.Barrier(3), queue=schema.Queue(maxsize=1),
        event=schema.Event(), count=schema.Value("i", 0), slots=schema.Array("d", size=3),
        ns=schema.Namespace({"mode": "train"}),
    )  # fmt: skip
    state = build_state(state, workers=3)  # Manager kinds as in-process objects

    def body(rank: int) -> None:
        state.barrier.wait()
        for _ in range(200):
            with state.lock:
                value = state.count.value
                state.count.value = value + 1
        state.slots[rank] = rank + 0.5
        state.queue.put(rank)  # maxsize 1: blocks until the main thread takes the last one
        state.event.wait(timeout=10)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    taken = sorted(state.queue.get(timeout=10) for _ in range(3))
    state.event.set()
    for t in threads:
        t.join(timeout=10)
    assert taken == [0, 1, 2] and state.count.value == 600 and list(state.slots) == [0.5, 1.5, 2.5]
    decl = schema.Namespace({"mode": "x"})
    assert kinds.of(decl).snapshot(decl, state.ns) == {"mode": "train"}
