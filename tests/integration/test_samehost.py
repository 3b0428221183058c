"""A hub's transport fields mapped by a real spawned process of its machine (Ray's workers on
the learner's node): rollouts written there reach the hub's process byte for byte, every weights
version published by the hub's learner reaches it whole, its replay rows and counter adds land in
the hub's own store, all with no call to the hub; a process of another machine (another boot,
another file at that path) is refused, so it calls the hub instead. (Nothing is named in
``/dev/shm``: the suite's own check after every test sees that.)"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import attrs
import torch

from mprl.schema import ReplayPace
from mprl.transport import samehost
from mprl.transport.client import Direct, Endpoint, HubBuilder
from mprl.transport.hub import Hub
from mprl.transport.memory import published_tensors

SPEC = {"obs": ((5, 3, 7), torch.uint8), "reward": ((5, 3), torch.float32)}
ROW = {"x": ((2,), torch.float32)}
ROLLOUTS = 12


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _obs(number: int) -> torch.Tensor:
    return ((torch.arange(5 * 3 * 7) * 3 + number * 11) % 256).to(torch.uint8).view(5, 3, 7)


class _NoCalls:
    """A link that fails the test on any call: a process on the hub's machine needs none."""

    errors: tuple[type[BaseException], ...] = ()

    def call(self, method: str, *args: Any) -> Any:
        raise AssertionError(f"a call to the hub ({method}) from a process on its machine")


def _as(field: Any, endpoint: Endpoint, slot: int) -> Any:
    field = field.__copy__()
    field.endpoint = endpoint
    return field.bind(slot, lambda: False)


def _child(fields: dict[str, Any], pipe: Any) -> None:
    """Worker rank 1: commits ``ROLLOUTS`` rollouts, adds replay rows and counts, then reports
    each weights version it waited for and whether what it pulled is what the hub published
    (marker = version)."""
    mine = {name: _as(field, Endpoint(_NoCalls()), 1) for name, field in fields.items()}
    slots, weights = mine["rollouts"], mine["weights"]
    for number in range(ROLLOUTS):
        index = slots.acquire(timeout=30.0)
        slot = slots.slot(index)
        slot["obs"].copy_(_obs(number))
        slot["reward"].fill_(float(number))
        slot["version"].fill_(number)
        slots.commit(index)
    mine["replay"].add(x=torch.full((3, 2), 7.0))
    mine["counter"].add(5)
    model, have = _model(), -1
    seen = []
    for _ in range(3):
        assert pipe.recv() == "published"
        version = weights.wait(have, timeout=30.0)
        have = weights.pull(model, have)
        marker = float(next(model.parameters()).detach().flatten()[0])
        seen.append((version, have, marker))
        pipe.send("pulled")
    pipe.send(seen)


def test_a_process_on_the_hubs_machine_uses_its_fields_in_place_with_no_call():
    hub, model = Hub(), _model()
    builder = HubBuilder(None, Endpoint(Direct(hub)), model, None, same_host=True)
    fields = {
        "rollouts": builder.rollouts(SPEC, 2, 2),
        "weights": builder.weights(),
        "replay": builder.replay(ROW, 20, 2, ReplayPace(1.0, 0, None)),
        "counter": builder.counter(3),
    }
    assert all(f.arena is not None for f in fields.values())
    here = Endpoint(Direct(hub), hub)  # the learner's, in the hub's process
    learner = {name: _as(field, here, 2) for name, field in fields.items()}
    ctx = mp.get_context("spawn")
    pipe, theirs = ctx.Pipe()
    child = ctx.Process(target=_child, args=(fields, theirs), daemon=True)
    child.start()
    try:
        for number in range(ROLLOUTS):  # in commit order, every byte as written
            batch = learner["rollouts"].take_batch(1, timeout=30.0)
            assert batch is not None and batch["source"].tolist() == [1]
            assert torch.equal(batch["obs"][:, 0], _obs(number))
            assert batch["reward"].eq(float(number)).all()
            assert batch["version"].tolist() == [number]
        for version in (1, 2, 3):  # the learner's publishes, as the hub's host makes them
            with learner["weights"].publishing(model), torch.no_grad():
                next(model.parameters()).flatten()[0] = float(version)
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
    assert learner["replay"].size() == 3 and learner["replay"].sample(2)["x"].eq(7.0).all()
    assert learner["counter"].value == 5 and hub.info()["counters"] == {"counter1": 5}
    # a resumed run's version number reaches the mapped copy too
    hub.set_version("weights1", 40)
    assert samehost.open_arena(fields["weights"].arena).version == 40


def test_a_process_of_another_machine_or_another_file_is_refused():
    hub = Hub()
    rollouts = hub.make_rollouts("rollouts1", SPEC, 1, 1, same_host=True)
    assert rollouts is not None
    assert samehost.open_arena(rollouts) is not None  # this process: the hub's machine
    assert samehost.open_arena(attrs.evolve(rollouts, boot="another boot")) is None
    assert samehost.open_arena(attrs.evolve(rollouts, token=b"x" * 16)) is None  # another file
    assert samehost.open_arena(attrs.evolve(rollouts, fd=rollouts.fd + 999)) is None
    assert samehost.open_arena(None) is None


def test_a_worker_on_the_hubs_machine_reads_versions_pulls_and_waits_with_no_call():
    hub, model = Hub(), _model()
    builder = HubBuilder(None, Endpoint(Direct(hub)), model, None, same_host=True)
    field = builder.weights()
    worker = _as(field, Endpoint(_NoCalls()), 0)
    learner = _as(field, Endpoint(Direct(hub), hub), 1)
    mine = _model()
    with learner.publishing(model), torch.no_grad():
        next(model.parameters()).flatten()[0] = 5.0
    assert worker.version == 1
    assert worker.pull(mine, 0) == 1
    pairs = zip(published_tensors(model), published_tensors(mine), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert worker.pull(mine, 1) == 1  # nothing newer: nothing copied
    assert worker.wait(1, timeout=0.05) is None
    with learner.publishing(model):
        pass
    assert worker.wait(1, timeout=5.0) == 2
