"""Shared-state schema -> real Manager objects, for every supported kind, used across processes."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.managers import BaseProxy, SyncManager

import pytest
import torch

from mprl import schema as s
from mprl.testing import build_state
from tests.unit.test_schema import FULL

N = 3


@pytest.fixture
def manager():
    m = SyncManager(ctx=mp.get_context("spawn"))
    m.start()
    yield m
    m.shutdown()


def child_updates(state: s.SharedState, rank: int) -> None:
    """Runs in a spawned process: touch every field so the parent can see the effect."""
    state.train_modes[rank] = False
    state.n_iters[rank] += 5
    state.histories[rank].append(("episode", rank))
    state.per_worker_stats[rank]["loss"] = 0.25
    state.log.append(3)
    state.table["child"] = rank
    state.ns.epoch = 9
    with state.lock, state.rlock:
        state.value.value += 1
    state.array[rank] = 2.5
    state.buffer[rank] += 41
    state.queue.put(("from", rank))
    state.event.set()


def test_every_kind_is_built_and_shared_with_a_spawned_child(manager):
    state = build_state(FULL, N, manager=manager)
    # built as the hand-written main would have built them
    assert list(state.train_modes) == [True] * N
    assert list(state.n_iters) == [0] * N
    assert [list(h) for h in state.histories] == [[]] * N
    assert list(state.log) == [1, 2]
    assert dict(state.table) == {"a": 1}
    assert (state.ns.mode, state.ns.epoch) == ("train", 0)
    assert state.value.value == 7
    assert list(state.array) == [0.5] * N
    assert state.buffer.shape == (N, 5) and state.buffer.is_shared()
    assert state.buffer.dtype == torch.float64
    for name in ("lock", "rlock", "sem", "bsem", "cond", "event", "barrier", "queue"):
        assert isinstance(getattr(state, name), BaseProxy), name
    assert state.barrier.parties == N + 1  # "all" = workers + train process
    assert state.sem.acquire(blocking=False) and state.sem.acquire(blocking=False)
    assert not state.sem.acquire(blocking=False)  # value 2
    state.bsem.acquire()
    state.bsem.release()
    with pytest.raises(ValueError):
        state.bsem.release()  # bounded: cannot go above its initial value
    with state.cond:
        assert not state.cond.wait(timeout=0.01)

    proc = mp.get_context("spawn").Process(target=child_updates, args=(state, 1))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0

    assert list(state.train_modes) == [True, False, True]
    assert list(state.n_iters) == [0, 5, 0]
    assert [list(h) for h in state.histories] == [[], [("episode", 1)], []]
    assert dict(state.per_worker_stats[1]) == {"loss": 0.25}
    assert list(state.log) == [1, 2, 3]
    assert state.table["child"] == 1
    assert state.ns.epoch == 9
    assert state.value.value == 8
    assert list(state.array) == [0.5, 2.5, 0.5]
    assert state.buffer[1].tolist() == [42.0] * 5 and state.buffer[0].tolist() == [1.0] * 5
    assert state.queue.get(timeout=5) == ("from", 1)
    assert state.event.is_set()
