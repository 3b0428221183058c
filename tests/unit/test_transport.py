"""The transport fields as the local backend builds them (mprl.transport.memory), with real
spawned producers, readers and writers: rollout slots, weight publishing, the replay buffer and
the counter. Every interleaving a test needs is forced with a handshake, never hoped for."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from mprl.transport.memory import MemoryReplay, MemoryRollouts

T, E = 5, 3


SPEC = {"obs": ((T + 1, E, 2), torch.float32), "action": ((T, E), torch.int64)}


def never() -> bool:
    return False


def rollouts_of(workers: int, slots: int) -> MemoryRollouts:
    return MemoryRollouts(SPEC, workers, slots, share=True, sleep=True)


def commit(worker: MemoryRollouts, value: float) -> int:
    """A bound worker writes a rollout of ``value``s into its next slot and hands it over."""
    index = worker.acquire(timeout=5)
    assert index is not None
    worker.slot(index)["obs"].fill_(value)
    worker.commit(index)
    return index


ROW = {
    "obs": ((4,), torch.float32),
    "action": ((), torch.int64),
    "next_obs": ((4,), torch.float32),
}


def test_back_pressure_blocks_instead_of_dropping():
    rollouts = rollouts_of(workers=1, slots=2)
    worker, learner = rollouts.bind(0, never), rollouts.bind(1, never)
    a = worker.acquire()
    worker.commit(a)
    b = worker.acquire()
    worker.commit(b)
    start = time.monotonic()
    assert worker.acquire(timeout=0.3) is None  # both slots full: the worker waits
    assert time.monotonic() - start >= 0.3
    assert learner.take(timeout=1) == a  # oldest first
    learner.release(a)
    assert worker.acquire(timeout=1) == a  # the freed slot comes back
    assert learner.take(timeout=1) == b and learner.take(timeout=0.2) is None


def test_only_workers_acquire_and_a_slot_starts_with_no_version():
    rollouts = rollouts_of(workers=2, slots=1)
    assert rollouts.buffers["version"].tolist() == [-1, -1]
    with pytest.raises(RuntimeError, match="only a worker acquires"):
        rollouts.bind(2, never).acquire()


def test_take_batch_stacks_rollouts_and_frees_their_slots():
    rollouts = rollouts_of(workers=1, slots=3)
    worker = rollouts.bind(0, never)
    commit(worker, 1.0)
    commit(worker, 2.0)
    batch = rollouts.bind(1, never).take_batch(2)
    assert batch["obs"].shape == (T + 1, 2, E, 2) and batch["version"].shape == (2,)
    assert batch["obs"][0, :, 0, 0].tolist() == [1.0, 2.0]
    assert len({worker.acquire(timeout=1) for _ in range(3)}) == 3


def test_take_batch_orders_a_batch_by_worker_rank_whatever_order_the_rollouts_came_in():
    rollouts = rollouts_of(workers=3, slots=3)
    workers = [rollouts.bind(rank, never) for rank in range(3)]
    for value, rank in ((1.0, 2), (2.0, 1), (3.0, 2), (4.0, 0)):  # finished in this order
        commit(workers[rank], value)
    batch = rollouts.bind(3, never).take_batch(4)
    assert batch["source"].tolist() == [0, 1, 2, 2]
    assert batch["obs"][0, :, 0, 0].tolist() == [4.0, 2.0, 1.0, 3.0]  # a rank's own order kept


def test_take_batch_frees_each_slot_before_the_batch_is_complete():
    rollouts = rollouts_of(workers=1, slots=1)  # one slot, a batch of two
    learner, worker = rollouts.bind(1, never), rollouts.bind(0, never)
    result: list = []
    thread = threading.Thread(target=lambda: result.append(learner.take_batch(2)), daemon=True)
    thread.start()
    assert commit(worker, 1.0) == 0
    assert commit(worker, 2.0) == 0  # only if the learner freed the slot mid-batch
    thread.join(timeout=5)
    assert result[0]["obs"][0, :, 0, 0].tolist() == [1.0, 2.0]


def test_take_batch_keeps_what_it_copied_when_stopped_or_timed_out():
    rollouts = rollouts_of(workers=1, slots=2)
    stopping = [True]
    learner, worker = rollouts.bind(1, lambda: stopping[0]), rollouts.bind(0, never)
    commit(worker, 1.0)
    assert learner.take_batch(3) is None  # one ready, then the stop: no batch
    stopping[0] = False
    commit(worker, 2.0)
    start = time.monotonic()
    assert learner.take_batch(3, timeout=0.3) is None  # two of three: it times out
    assert 0.3 <= time.monotonic() - start < 2
    commit(worker, 3.0)
    batch = learner.take_batch(3)  # nothing was lost
    assert batch["obs"][0, :, 0, 0].tolist() == [1.0, 2.0, 3.0]


def test_replay_rows_checkpoint_and_come_back_only_where_they_fit():
    replay = MemoryReplay(ROW, capacity=8, workers=2, share=False)
    writer = replay.bind(1, never)
    writer.add(obs=torch.ones(3, 4), action=torch.tensor([7, 8, 9]), next_obs=torch.zeros(3, 4))
    with pytest.raises(RuntimeError, match="only a worker adds rows"):
        replay.bind(2, never).add(**{k: torch.zeros(1) for k in ROW})
    with pytest.raises(ValueError, match="add\\(\\) takes the fields"):
        writer.add(obs=torch.ones(1, 4))
    saved = replay.state()
    again = MemoryReplay(ROW, capacity=8, workers=2, share=False)
    assert again.load(saved) and again.size() == 3
    assert sorted(again.bind(2, never).sample(50)["action"].unique().tolist()) == [7, 8, 9]
    assert not MemoryReplay(ROW, capacity=12, workers=3, share=False).load(saved)
