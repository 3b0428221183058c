"""The hub and its clients, in this process (the hub imports no Ray): a remote worker against
a real :class:`Hub` whose calls run in a thread pool and answer when the test lets them, the
hub's waits and their stop, and the learner that reads the hub's store in place."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import torch

from mprl import schema
from mprl.transport.client import (
    LOCAL_WAIT_S,
    REMOTE_WAIT_S,
    Direct,
    Endpoint,
    HubBuilder,
    HubRollouts,
)
from mprl.transport.hub import WAIT_SLICE_S, Hub

SPEC = {"x": ((4,), torch.float32)}


class GatedLink:
    """A link whose calls run on ``hub`` in threads once ``gate`` is set: while it is clear,
    calls (and so their answers) are held, as a slow network would."""

    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, hub: Hub) -> None:
        self.hub, self.gate = hub, threading.Event()
        self.gate.set()
        self.pool = ThreadPoolExecutor(8)
        self.calls: list[str] = []

    def call(self, method: str, *args: Any) -> Future:
        self.calls.append(method)

        def serve() -> Any:
            self.gate.wait()
            return getattr(self.hub, method)(*args)

        return self.pool.submit(serve)

    def get(self, pending: Future, timeout: float) -> Any:
        return pending.result(timeout)

    def ready(self, pending: Future, timeout: float) -> bool:
        try:
            pending.result(timeout)
        except TimeoutError:
            return False
        return True


@pytest.fixture
def hub() -> Iterator[Hub]:
    hub = Hub()
    yield hub
    hub.stop_waits()


@pytest.fixture
def link(hub: Hub) -> Iterator[GatedLink]:
    link = GatedLink(hub)
    yield link
    link.gate.set()
    hub.stop_waits()
    link.pool.shutdown(wait=True, cancel_futures=True)


def _rollouts(hub: Hub, workers: int = 1, slots: int = 2, same_host: bool = False) -> HubRollouts:
    """A rollouts field made in ``hub`` (as the driver makes it), unbound, no endpoint yet."""
    builder = HubBuilder(None, Endpoint(Direct(hub)), torch.nn.Linear(1, 1), None, same_host)
    return builder.rollouts(SPEC, workers, slots)


def _as(field: Any, endpoint: Endpoint, slot: int, stop: threading.Event) -> Any:
    """``field`` as a process of ``endpoint`` uses it."""
    field = field.__copy__()
    field.endpoint = endpoint
    return field.bind(slot, stop.is_set)


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def _held(hub: Hub, rank: int = 0) -> int:
    """The rollouts of ``rank`` the hub holds."""
    store = hub.fields["rollouts1"]
    return store.slots_per_worker - store.free_slots(rank)


def _until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.01)


def test_a_worker_fills_its_next_slot_while_its_commit_travels(hub, link):
    stop = threading.Event()
    worker = _as(_rollouts(hub), Endpoint(link), 0, stop)
    assert worker.acquire() == 0
    worker.commit(0)
    link.gate.clear()  # from here on nothing reaches the hub or answers
    assert worker.acquire() == 1
    worker.commit(1)  # the first commit's answer was in: sent, not answered
    start = time.monotonic()
    assert worker.acquire() == 0  # at once, without the second commit's answer
    assert time.monotonic() - start < 0.5
    committing, done = _in_thread(lambda: worker.commit(0))
    committing.join(0.3)
    assert committing.is_alive()  # the third commit reads the second's answer first
    link.gate.set()  # the answer: no free slot left for the rank
    committing.join(0.3)
    assert committing.is_alive() and _held(hub) == 2
    learner = _as(_rollouts_of(hub), Endpoint(Direct(hub), hub), 1, stop)
    assert learner.take_batch(1, timeout=1.0) is not None  # the learner takes one: room
    committing.join(5.0)
    assert not committing.is_alive() and done == [None]
    _until(lambda: _held(hub) == 2)  # the third commit, sent: in the hub once it is served


def _rollouts_of(hub: Hub) -> HubRollouts:
    """The rollouts field the hub already holds, as a new process gets it."""
    store = hub.fields["rollouts1"]
    return HubRollouts(Endpoint(Direct(hub)), "rollouts1", None, SPEC, store.workers,
                       store.slots_per_worker)  # fmt: skip


def test_the_hub_never_holds_more_than_the_ranks_slots_and_a_worker_behind_waits_before_filling(
    hub, link
):
    stop = threading.Event()
    worker = _as(_rollouts(hub), Endpoint(link), 0, stop)
    learner = _as(_rollouts_of(hub), Endpoint(Direct(hub), hub), 1, stop)
    filled: list[int] = []
    most = [0]

    def work() -> None:
        while (index := worker.acquire()) is not None:
            filled.append(index)
            worker.commit(index)
            most[0] = max(most[0], _held(hub))

    thread, _ = _in_thread(work)
    deadline = time.monotonic() + 5.0
    while _held(hub) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # a worker that did not wait would have sent more by now
    # two held and a third filled, waiting for room in its commit: the worker learns that the
    # learner is behind only from the answer of a commit it sent while it filled
    assert _held(hub) == 2 and len(filled) == 3 and thread.is_alive()
    assert learner.take_batch(1, timeout=1.0) is not None  # room: the third goes in
    deadline = time.monotonic() + 5.0
    while not (_held(hub) == 2 and worker._full) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    # behind now: the worker waits in acquire, before it fills its next slot
    assert len(filled) == 3 and thread.is_alive() and _held(hub) == 2
    assert learner.take_batch(1, timeout=1.0) is not None
    deadline = time.monotonic() + 5.0
    while len(filled) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(filled) == 4 and most[0] <= 2
    stop.set()
    hub.stop_waits()
    thread.join(5.0)
    assert not thread.is_alive()
    assert _held(hub) == 2  # the third and the fourth, left for the learner


def test_the_learner_takes_what_came_through_the_hub_and_what_its_machine_wrote_alike(hub):
    """Worker 0 maps the hub's memory (same machine); worker 1 calls the hub (its process has
    no such memory: an endpoint whose arenas are another boot's). The learner, in the hub's
    process, takes both from the one store; a call's commit wakes its wait; a stop ends it."""
    stop = threading.Event()
    made = _rollouts(hub, workers=2, same_host=True)
    assert made.arena is not None
    near = _as(made, Endpoint(Direct(hub)), 0, stop)
    assert near._store() is not None  # mapped: commits are a flag in the hub's memory
    far_field = made.__copy__()
    far_field.arena = None  # (another machine: nothing to map)
    far = _as(far_field, Endpoint(Direct(hub)), 1, stop)
    assert far._store() is None
    learner = _as(made, Endpoint(Direct(hub), hub), 2, stop)
    calls_before = hub.fields["rollouts1"].free_slots(1)
    for worker, value in ((near, 1.0), (far, 2.0)):
        index = worker.acquire()
        worker.slot(index)["x"].fill_(value)
        worker.commit(index)
    assert calls_before == 2 and hub.fields["rollouts1"].free_slots(1) == 1
    batch = learner.take_batch(2, timeout=5.0)
    assert batch is not None and batch["source"].tolist() == [0, 1]
    assert batch["x"][:, 0].tolist() == [1.0] * 4 and batch["x"][:, 1].tolist() == [2.0] * 4
    # the near worker's slots bound it as on the local backend: two filled, a third waits
    for _ in range(2):
        near.commit(near.acquire(timeout=1.0))
    assert near.acquire(timeout=0.1) is None
    assert learner.take_batch(2, timeout=5.0)["source"].tolist() == [0, 0]
    start = time.monotonic()
    assert learner.take_batch(1, timeout=0.2) is None  # nothing anywhere: the timeout
    assert 0.2 <= time.monotonic() - start < 5.0
    waiting, got = _in_thread(lambda: learner.take_batch(1, timeout=10.0))
    time.sleep(0.2)
    index = far.acquire()
    far.slot(index)["x"].fill_(3.0)
    far.commit(index)
    waiting.join(5.0)
    assert not waiting.is_alive() and got[0]["x"][0, 0].item() == 3.0
    waiting, got = _in_thread(lambda: learner.take_batch(1, timeout=None))
    time.sleep(0.1)
    stop.set()
    waiting.join(5.0)
    assert not waiting.is_alive() and got == [None]


def test_the_stop_ends_a_waiting_call_at_once_and_later_waits_are_short(hub):
    _rollouts(hub, slots=1)
    hub.put("rollouts1", 0, {"x": torch.ones(4).numpy()}, {})  # rank 0's one slot: no room
    out: dict[str, Any] = {}

    def wait() -> None:
        start = time.monotonic()
        out["found"] = hub.room("rollouts1", 0, 30.0)
        out["s"] = time.monotonic() - start

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # longer than a slice of the hub's own process
    hub.stop_waits()
    waiter.join(5.0)
    assert not waiter.is_alive() and out["found"] is None and out["s"] < 2.0
    start = time.monotonic()  # once stopping: a short wait, not a spin and not a long one
    assert hub.room("rollouts1", 0, 30.0) is None
    assert WAIT_SLICE_S / 2 <= time.monotonic() - start < 2.0
    # what is there is still given while stopping
    batch = hub.take_batch("rollouts1", 1, 30.0)
    assert batch is not None and batch["x"].tolist() == [[1.0]] * 4  # [T, n]
    assert hub.room("rollouts1", 0, 30.0) is True


def test_a_remote_wait_is_a_call_per_second_not_ten():
    assert REMOTE_WAIT_S >= 10 * LOCAL_WAIT_S


def test_a_waiting_worker_is_woken_by_its_own_ranks_room_not_by_every_commit(hub):
    _rollouts(hub, workers=2, slots=1)
    looks = [0]
    store = hub.fields["rollouts1"]
    free_slots = store.free_slots

    def counted(rank: int) -> int:
        looks[0] += rank == 0
        return free_slots(rank)

    store.free_slots = counted
    hub.put("rollouts1", 0, {"x": torch.zeros(4).numpy()}, {})
    found: list = []
    waiter = threading.Thread(target=lambda: found.append(hub.room("rollouts1", 0, 30.0)))
    waiter.start()
    time.sleep(0.2)
    before = looks[0]
    learner = store.bind(2, lambda: False)
    for i in range(50):  # the other worker's commits, and its slot freed each time
        hub.put("rollouts1", 1, {"x": torch.full((4,), float(i)).numpy()}, {})
        learner.release(1)  # (rank 1's one slot: as the learner frees it once copied)
    time.sleep(0.1)
    assert looks[0] - before <= 2 and waiter.is_alive()  # not once per commit
    assert learner.take_batch(1, 1.0)["source"].tolist() == [0]  # rank 0's: room for it
    waiter.join(5.0)
    assert found == [True]


def test_weights_are_read_once_per_version_and_a_commit_answer_carries_the_newest(hub):
    model = torch.nn.Linear(3, 2)
    builder = HubBuilder(None, Endpoint(Direct(hub)), model, None, same_host=False)
    weights, _ = builder.weights(), builder.rollouts(SPEC, 1, 2)
    stop = threading.Event()
    learner = _as(weights, Endpoint(Direct(hub), hub), 1, stop)
    for version in (1, 2, 3):  # three updates: in place, nothing read for anyone yet
        with learner.publishing(model):
            torch.nn.init.constant_(model.weight, float(version))
    assert hub.info()["weights"] == {"weights1": 3} and "weights1" not in hub._read
    assert hub.latest("weights1", 3) is None  # the worker has it: nothing read
    version, arrays = hub.latest("weights1", 1)
    assert version == 3 and arrays[0].tolist() == [[3.0] * 3] * 2
    again = hub.latest("weights1", 2)
    assert again[1][0] is arrays[0]  # read once for this version, kept for the others
    torch.nn.init.constant_(model.weight, 9.0)  # (not published: never seen)
    assert hub.latest("weights1", 2)[1][0].tolist() == [[3.0] * 3] * 2
    with learner.publishing(model):
        pass
    _, newer, info = hub.put("rollouts1", 0, {"x": torch.zeros(4).numpy()}, {"weights1": 3})
    assert newer["weights1"][0] == 4 and newer["weights1"][1][0].tolist() == [[9.0] * 3] * 2
    assert info["weights"] == {"weights1": 4}
    # a remote worker pulls from that answer with no call of its own
    link = GatedLink(hub)
    try:
        worker = _as(weights, Endpoint(link), 0, stop)
        worker.endpoint.hints.update(newer)  # as its commit's answer gives them
        worker.endpoint.note(info)
        mine = torch.nn.Linear(3, 2)
        assert worker.pull(mine, 3) == 4 and link.calls == []
        assert mine.weight.tolist() == [[9.0] * 3] * 2
        assert worker.pull(mine, 4) == 4 and link.calls == []  # nothing newer known: no call
    finally:
        link.pool.shutdown(wait=True, cancel_futures=True)


def test_the_hub_keeps_the_replay_pace_where_the_buffer_lives(hub):
    builder = HubBuilder(None, Endpoint(Direct(hub)), torch.nn.Linear(1, 1), None, False)
    row = {"x": ((2,), torch.float32)}
    builder.replay(row, 100, 2, schema.ReplayPace(2.0, 0, 8))
    info = hub.flush(0, {}, {"replay1": [{"x": torch.zeros(3, 2).numpy()}]})
    assert info["replays"]["replay1"] == (3, 0, 0)
    assert hub.replay_room("replay1", 0.01) is not None  # credit 6 < want 0 + 2 * 8 / 2
    hub.flush(1, {}, {"replay1": [{"x": torch.zeros(2, 2).numpy()}]})
    assert hub.replay_room("replay1", 0.05) is None  # credit 10: ahead, the worker waits on
    woken: list = []
    waiter = threading.Thread(target=lambda: woken.append(hub.replay_room("replay1", 5.0)))
    waiter.start()
    learner = hub.fields["replay1"].bind(2, lambda: False)
    assert learner.sample(4)["x"].shape == (4, 2)  # the learner's sample wakes it
    waiter.join(5)
    assert woken and woken[0]["replays"]["replay1"] == (5, 4, 4)
    assert hub.wait_size("replay1", 5, 0.01) == 5
    assert hub.wait_size("replay1", 6, 0.01) is None
    with pytest.raises(RuntimeError, match="only a worker adds rows"):
        hub.flush(2, {}, {"replay1": [{"x": torch.zeros(1, 2).numpy()}]})
    # a process's cache keeps the newest counts whatever order the answers come in
    endpoint = Endpoint(Direct(hub))
    endpoint.note({"replays": {"replay1": (5, 4, 4)}})
    endpoint.note({"replays": {"replay1": (3, 0, 0)}})  # an older answer's
    assert endpoint.info["replays"]["replay1"] == (5, 4, 4)
