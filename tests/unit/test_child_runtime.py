"""The one child runtime (mprl.backends.child.run_child) on its own, in this process: how a
plugin's function ends, seeding, what it trains, and the GPU learner's copies and copy-back
(the device faked by a learner that copies on the CPU)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from mprl import RunConfig
from mprl.backends import child
from mprl.backends.child import ChildExit, DeviceLearner, Trained, run_child
from mprl.context import Context
from tests.unit.test_docs import BudgetChannel


def context(role: str = "trainer", device: str = "cpu") -> Context:
    model = torch.nn.Linear(3, 2)
    named = {"policy": torch.optim.Adam(model.parameters(), lr=0.1)}
    return Context(
        role=role, rank=-1 if role == "trainer" else 0, n_workers=1, seed=1234, config=None,
        run=RunConfig(workers=1, device=device), state=None, model=model, optimizer=None,
        optimizers=named, channel=BudgetChannel(3), make_env=None,
    )  # fmt: skip


def step(ctx: Context) -> None:
    while not ctx.should_stop():
        loss = ctx.model(torch.ones(3)).sum()
        ctx.optimizers["policy"].zero_grad()
        loss.backward()
        ctx.optimizers["policy"].step()
        ctx.add_steps(1)


def test_a_function_that_returns_raises_or_exits_is_reported_as_such():
    assert run_child(step, context()) == ChildExit(0)

    def boom(ctx: Context) -> None:
        raise ValueError("no")

    ended = run_child(boom, context())
    assert ended.code == 1 and "ValueError: no" in ended.traceback

    def leave(ctx: Context) -> None:
        sys.exit(3)

    assert run_child(leave, context()).code == 3

    class Stopped(BaseException):
        pass

    def waiting(ctx: Context) -> None:
        raise Stopped

    assert run_child(waiting, context(), stopped=(Stopped,)) == ChildExit(0)


def test_the_process_is_seeded_with_the_contexts_seed_before_the_function():
    drawn = []
    for _ in range(2):
        run_child(lambda ctx: drawn.append(torch.rand(3)), context())
    assert torch.equal(drawn[0], drawn[1])


def test_on_the_cpu_the_function_trains_the_shared_objects():
    ctx = context()
    seen: list[Trained] = []
    before = ctx.model.weight.detach().clone()
    run_child(step, ctx, on_ready=lambda c, trained: seen.append(trained))
    assert seen[0].model is ctx.model and seen[0].optimizers["policy"] is ctx.optimizers["policy"]
    assert not torch.equal(ctx.model.weight, before)  # trained in place


class CpuLearner(DeviceLearner):
    """The GPU learner's copies and copy-back, with the copies on the CPU."""

    def __init__(self, model: Any, optimizers: Any, device: torch.device) -> None:
        super().__init__(model, optimizers, torch.device("cpu"))


def test_a_train_process_on_a_device_trains_copies_and_copies_the_optimizer_state_back(
    monkeypatch,
):
    monkeypatch.setattr(child, "resolve_device", lambda spec, *a: torch.device("cuda"))
    monkeypatch.setattr(child, "DeviceLearner", CpuLearner)
    ctx = context(device="cuda")
    shared_model, shared_opt = ctx.model, ctx.optimizers["policy"]
    before = shared_model.weight.detach().clone()
    seen: list[tuple[Context, Trained]] = []
    assert run_child(step, ctx, on_ready=lambda c, t: seen.append((c, t))) == ChildExit(0)
    given, trained = seen[0]
    assert given.model is trained.model is not shared_model  # the function got the copy
    assert given.optimizers["policy"] is trained.optimizers["policy"] is not shared_opt
    assert torch.equal(shared_model.weight, before)  # weights reach workers by publishing
    steps = [s["step"] for s in shared_opt.state.values()]
    assert steps and all(int(s) == 3 for s in steps)  # copied back when the function returned


def test_a_worker_never_gets_the_device_copies(monkeypatch):
    monkeypatch.setattr(child, "resolve_device", lambda spec, *a: torch.device("cuda"))
    monkeypatch.setattr(child, "DeviceLearner", CpuLearner)
    ctx = context(role="worker", device="cuda")
    seen: list[Trained] = []
    run_child(step, ctx, on_ready=lambda c, t: seen.append(t))
    assert seen[0].model is ctx.model


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_are_set_for_the_function(threads):
    saved = torch.get_num_threads()
    try:
        got = []
        run_child(lambda ctx: got.append(torch.get_num_threads()), context(), threads=threads)
        assert got == [threads]
    finally:
        torch.set_num_threads(saved)


def test_profile_stats_are_written_anew_never_through_a_planted_link(tmp_path):
    import pstats

    target = tmp_path / "someone-elses-file"
    target.write_text("keep")
    planted = tmp_path / "worker-0.prof"
    planted.symlink_to(target)
    assert run_child(step, context(), profile_to=str(planted)) == ChildExit(0)
    assert target.read_text() == "keep" and not planted.is_symlink()
    assert pstats.Stats(str(planted)).total_calls > 0
