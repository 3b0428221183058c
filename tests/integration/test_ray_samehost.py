"""The Ray backend's shared memory for the processes on the hub's machine, across a real
spawned process: rollouts written there reach the hub's process byte for byte, every weights
version published by the hub reaches it whole, and a process of another machine (another
boot, another file at that path) is refused, so it goes through Ray. (Nothing is named in
``/dev/shm``: the suite's own check after every test sees that.)"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("ray")

from mprl.backends.ray import samehost
from mprl.backends.ray.transport import Hub, _pack
from mprl.backends.tensors import _floating

SPEC = {"obs": ((5, 3, 7), torch.uint8), "reward": ((5, 3), torch.float32)}
ROLLOUTS = 12


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _obs(number: int) -> torch.Tensor:
    return ((torch.arange(5 * 3 * 7) * 3 + number * 11) % 256).to(torch.uint8).view(5, 3, 7)


def _child(rollouts: samehost.Arena, weights: samehost.Arena, pipe: Any) -> None:
    """Worker rank 1: commits ``ROLLOUTS`` rollouts, then reports each weights version it
    waited for and whether what it pulled is what the hub published (marker = version)."""
    slots = samehost.open_arena(rollouts).bind(1, lambda: False)
    shared = samehost.open_arena(weights).bind(1, lambda: False)
    for number in range(ROLLOUTS):
        index = slots.acquire(timeout=30.0)
        slot = slots.slot(index)
        slot["obs"].copy_(_obs(number))
        slot["reward"].fill_(float(number))
        slot["version"].fill_(number)
        slots.commit(index)
    model, have = _model(), -1
    seen = []
    for _ in range(3):
        assert pipe.recv() == "published"
        version = shared.wait(have, timeout=30.0)
        have = shared.pull(model, have)
        marker = float(next(model.parameters()).detach().flatten()[0])
        seen.append((version, have, marker))
        pipe.send("pulled")
    pipe.send(seen)


def test_a_process_on_the_hubs_machine_shares_its_slots_and_weights_through_the_hubs_file():
    hub, model = Hub(), _model()
    arrays = [t.detach().numpy().copy() for t in _floating(model)]
    hub.publish("weights1", 0, _pack(arrays, 0))
    weights = hub.arena_weights("weights1")
    rollouts = hub.arena_rollouts("rollouts1", SPEC, 2, 2)
    assert weights is not None and rollouts is not None
    learner = hub.arenas["rollouts1"].bind(2, lambda: False)
    ctx = mp.get_context("spawn")
    pipe, theirs = ctx.Pipe()
    child = ctx.Process(target=_child, args=(rollouts, weights, theirs), daemon=True)
    child.start()
    try:
        for number in range(ROLLOUTS):  # in commit order, every byte as written
            index = learner.take(timeout=30.0)
            assert index is not None and index // 2 == 1
            assert torch.equal(learner.buffers["obs"][index], _obs(number))
            assert learner.buffers["reward"][index].eq(float(number)).all()
            assert int(learner.buffers["version"][index]) == number
            learner.release(index)
        for version in (1, 2, 3):  # the learner's publishes, as the hub's host makes them
            with torch.no_grad():
                next(model.parameters()).flatten()[0] = float(version)
            with hub.publishing:
                hub.publish_live("weights1", version, model)
            pipe.send("published")
            assert pipe.poll(30.0) and pipe.recv() == "pulled"
        assert pipe.poll(30.0)
        seen = pipe.recv()
    finally:
        child.join(30.0)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert seen == [(1, 1, 1.0), (2, 2, 2.0), (3, 3, 3.0)]
    # a resumed run's version number reaches the shared copy too
    hub.set_version("weights1", 40)
    assert samehost.open_arena(weights).version == 40


def test_a_process_of_another_machine_or_another_file_is_refused():
    hub = Hub()
    rollouts = hub.arena_rollouts("rollouts1", SPEC, 1, 1)
    assert rollouts is not None
    assert samehost.open_arena(rollouts) is not None  # this process: the hub's machine
    assert samehost.open_arena(attrs.evolve(rollouts, boot="another boot")) is None
    assert samehost.open_arena(attrs.evolve(rollouts, token=b"x" * 16)) is None  # another file
    assert samehost.open_arena(attrs.evolve(rollouts, fd=rollouts.fd + 999)) is None
    assert samehost.open_arena(None) is None


class _NoCalls:
    """An actor handle that fails the test on any call: a process on the hub's machine
    reads weights with none."""

    def __init__(self) -> None:
        self._actor_id = type("Id", (), {"hex": staticmethod(lambda: "no-calls")})()
        self.hub_call = self

    def remote(self, method: str, *args: Any) -> Any:
        raise AssertionError(f"a Ray call ({method}) from a process on the hub's machine")


def test_a_worker_on_the_hubs_machine_reads_versions_pulls_and_waits_with_no_call():
    from mprl.backends.ray.transport import RayWeights

    hub, model = Hub(), _model()
    arrays = [t.detach().numpy().copy() for t in _floating(model)]
    hub.publish("weights1", 0, _pack(arrays, 0))
    weights = RayWeights(_NoCalls(), "weights1")
    weights.arena = hub.arena_weights("weights1")
    worker = weights.bind(0, lambda: False)
    mine = _model()
    with torch.no_grad():
        next(model.parameters()).flatten()[0] = 5.0
    with hub.publishing:
        hub.publish_live("weights1", 1, model)
    assert worker.version == 1
    assert worker.pull(mine, 0) == 1
    assert all(torch.equal(a, b) for a, b in zip(_floating(model), _floating(mine), strict=True))
    assert worker.pull(mine, 1) == 1  # nothing newer: nothing copied
    assert worker.wait(1, timeout=0.05) is None
    with hub.publishing:
        hub.publish_live("weights1", 2, model)
    assert worker.wait(1, timeout=5.0) == 2
