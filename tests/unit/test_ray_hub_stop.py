"""The Ray hub's waits: long slices while the run goes on (each slice of a remote wait is a call
the learner's process serves), ended at once by the driver's stop, short after it."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("ray")

from mprl.backends.ray.transport import REMOTE_WAIT_S, WAIT_SLICE_S, Hub


def test_the_stop_ends_a_waiting_call_at_once_and_later_waits_are_short():
    hub = Hub()
    hub.put("rollouts", 0, [False, 1], {})  # rank 0 holds its one slot: no room
    out: dict[str, float | None] = {}

    def wait() -> None:
        start = time.monotonic()
        out["found"] = hub.room("rollouts", 0, 1, 30.0)
        out["s"] = time.monotonic() - start

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # longer than a slice of the hub's own process
    hub.stop_waits()
    waiter.join(5.0)
    assert not waiter.is_alive() and out["found"] is None and out["s"] < 2.0
    start = time.monotonic()  # once stopping: a short wait, not a spin and not a long one
    assert hub.room("rollouts", 0, 1, 30.0) is None
    assert WAIT_SLICE_S / 2 <= time.monotonic() - start < 2.0
    # what is there is still given while stopping
    assert hub.take("rollouts", 1, 30.0) == [[False, 1]]
    assert hub.room("rollouts", 0, 1, 30.0) is True


def test_a_wait_that_finds_what_it_waits_for_returns_at_once():
    hub = Hub()
    hub.put("rollouts", 0, [False, 1], {})
    taken: list = []
    waiter = threading.Thread(target=lambda: taken.append(hub.room("rollouts", 0, 1, 30.0)))
    waiter.start()
    time.sleep(0.2)
    assert hub.take("rollouts", 1, 1.0) == [[False, 1]]
    waiter.join(2.0)
    assert taken == [True]


def test_a_remote_wait_is_a_call_per_second_not_ten():
    assert REMOTE_WAIT_S >= 10 * WAIT_SLICE_S


def test_a_waiting_worker_is_woken_by_its_own_ranks_room_not_by_every_commit():
    class Looks(dict):
        looks = 0

        def get(self, key, default=None):
            if key == 0:
                Looks.looks += 1
            return super().get(key, default)

    hub = Hub()
    hub.queued["rollouts"] = Looks()
    hub.put("rollouts", 0, [False, 0], {})
    found: list = []
    waiter = threading.Thread(target=lambda: found.append(hub.room("rollouts", 0, 1, 30.0)))
    waiter.start()
    time.sleep(0.2)
    before = Looks.looks
    for i in range(50):  # the other workers' commits, and the learner taking them
        hub.put("rollouts", 1, [False, i], {})
    assert hub.take("rollouts", 1, 1.0) == [[False, 0]]  # rank 0's, first in commit order
    waiter.join(2.0)
    assert found == [True]
    assert Looks.looks - before <= 3  # not once per commit
