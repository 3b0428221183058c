"""A Ray worker's rollout slots against a real :class:`Hub` whose calls answer when the test
lets them (a thread pool in place of Ray's actor calls): a worker fills its next slot while its
last commit's answer travels, never has more than ``slots_per_worker`` rollouts in the hub, and
once the learner is behind waits for room before it fills, not after."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("ray")

from mprl.backends.ray import transport
from mprl.backends.ray.transport import Hub, RayRollouts

SPEC = {"x": ((4,), torch.float32)}
FIELD = "rollouts1"


class SlowHub:
    """An actor handle whose ``hub_call.remote`` runs on ``hub`` in a thread once ``gate`` is
    set: calls (and so their answers) are held while it is clear."""

    def __init__(self, hub: Hub) -> None:
        self.hub, self.gate = hub, threading.Event()
        self.gate.set()
        self._actor_id = SimpleNamespace(hex=lambda: "slow-hub")
        self.hub_call = SimpleNamespace(remote=self._remote)
        self.pool = ThreadPoolExecutor(8)
        self.most = 0  # the most rollouts of rank 0 the hub held at once

    def _remote(self, method: str, *args: Any) -> Future:
        def serve() -> Any:
            self.gate.wait()
            out = getattr(self.hub, method)(*args)
            self.most = max(self.most, self.hub.queued.get(FIELD, {}).get(0, 0))
            return out

        return self.pool.submit(serve)


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SlowHub, Any, threading.Event]]:
    got = transport._get

    def resolve(ref: Any, timeout: float = transport.CALL_TIMEOUT_S) -> Any:
        return ref.result(timeout) if isinstance(ref, Future) else got(ref, timeout)

    monkeypatch.setattr(transport, "_get", resolve)
    monkeypatch.setattr(transport, "_HINTS", {})
    handle, stop = SlowHub(Hub()), threading.Event()
    worker = RayRollouts(handle, FIELD, SPEC, workers=1, slots_per_worker=2).bind(0, stop.is_set)
    yield handle, worker, stop
    stop.set()
    handle.gate.set()
    handle.hub.stop_waits()
    handle.pool.shutdown(wait=True, cancel_futures=True)


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_worker_fills_its_next_slot_while_its_commit_travels(slow):
    handle, worker, _ = slow
    assert worker.acquire() == 0
    worker.commit(0)
    handle.gate.clear()  # from here on nothing reaches the hub or answers
    assert worker.acquire() == 1
    worker.commit(1)  # the first commit's answer was in: sent, not answered
    start = time.monotonic()
    assert worker.acquire() == 0  # at once, without the second commit's answer
    assert time.monotonic() - start < 0.5
    committing, done = _in_thread(lambda: worker.commit(0))
    committing.join(0.3)
    assert committing.is_alive()  # the third commit reads the second's answer first
    handle.gate.set()  # the answer: two queued, the rank's queue is full
    committing.join(0.3)
    assert committing.is_alive()
    assert handle.hub.take(FIELD, 1, 1.0) is not None  # the learner takes one: room
    committing.join(5.0)
    assert not committing.is_alive() and done == [None] and handle.most == 2


def test_the_hub_never_holds_more_than_the_ranks_slots_and_a_worker_behind_waits_before_filling(
    slow,
):
    handle, worker, stop = slow
    hub = handle.hub
    filled: list[int] = []

    def work() -> None:
        while (index := worker.acquire()) is not None:
            filled.append(index)
            worker.commit(index)

    thread, _ = _in_thread(work)
    deadline = time.monotonic() + 5.0
    while hub.queued.get(FIELD, {}).get(0, 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # a worker that did not wait would have queued more by now
    assert hub.queued[FIELD][0] == 2 and handle.most == 2
    # two queued and a third filled, waiting for room in its commit: the worker learns that
    # the learner is behind only from the answer of a commit it sent while it filled
    assert len(filled) == 3 and thread.is_alive()
    assert hub.take(FIELD, 1, 1.0) is not None  # room: the third goes in
    deadline = time.monotonic() + 5.0
    while not (hub.queued[FIELD][0] == 2 and worker._behind) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    # behind now: the worker waits in acquire, before it fills its next slot
    assert len(filled) == 3 and thread.is_alive() and handle.most == 2
    assert hub.take(FIELD, 1, 1.0) is not None
    deadline = time.monotonic() + 5.0
    while len(filled) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(filled) == 4 and handle.most == 2
    stop.set()
    hub.stop_waits()
    thread.join(5.0)
    assert not thread.is_alive()
    taken = hub.take(FIELD, 10, 0.1) or []
    assert len(taken) == 2  # the third and the fourth, left for the learner


def test_the_learner_takes_from_the_shared_slots_of_its_machine_and_the_hubs_queue_alike(
    monkeypatch: pytest.MonkeyPatch,
):
    """Worker 0 shares the hub's machine (its slots are the hub's shared memory), worker 1 is
    elsewhere (its arena is another boot's: it commits through the hub's queue). The learner,
    in the hub's process, takes both; a commit from elsewhere wakes its wait; a stop ends it."""
    monkeypatch.setattr(transport, "_HINTS", {})
    hub, stop = Hub(), threading.Event()
    handle = SlowHub(hub)
    arena = hub.arena_rollouts(FIELD, SPEC, 2, 2)
    assert arena is not None
    far = RayRollouts(handle, FIELD, SPEC, workers=2, slots_per_worker=2)
    far.arena = attrs.evolve(arena, boot="another machine")
    far = far.bind(1, stop.is_set)
    assert far._here() is None  # (looked at before this process hosts the hub: as elsewhere)
    monkeypatch.setattr(transport, "_HOSTED", {"slow-hub": hub})
    near = RayRollouts(handle, FIELD, SPEC, workers=2, slots_per_worker=2)
    near.arena = arena
    near = near.bind(0, stop.is_set)
    learner = RayRollouts(handle, FIELD, SPEC, workers=2, slots_per_worker=2).bind(2, stop.is_set)
    try:
        for worker, value in ((near, 1.0), (far, 2.0)):
            index = worker.acquire()
            worker.slot(index)["x"].fill_(value)
            worker.commit(index)
        assert hub.queued[FIELD] == {1: 1}  # only the far one went through the hub
        batch = learner.take_batch(2, timeout=5.0)
        assert batch is not None
        assert batch["source"].tolist() == [0, 1]
        assert batch["x"][:, 0].tolist() == [1.0] * 4 and batch["x"][:, 1].tolist() == [2.0] * 4
        # the near worker's slots bound it as on the local backend: two filled, a third waits
        for _ in range(2):
            index = near.acquire(timeout=1.0)
            near.commit(index)
        assert near.acquire(timeout=0.1) is None
        assert learner.take_batch(2, timeout=5.0)["source"].tolist() == [0, 0]
        start = time.monotonic()
        assert learner.take_batch(1, timeout=0.2) is None  # nothing anywhere: the timeout
        assert 0.2 <= time.monotonic() - start < 5.0  # (not the test's own timeout)
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
    finally:
        stop.set()
        hub.stop_waits()
        handle.pool.shutdown(wait=True, cancel_futures=True)
