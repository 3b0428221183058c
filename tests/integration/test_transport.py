"""The transport fields as the local backend builds them (mprl.transport.memory), with real
spawned producers, readers and writers: rollout slots, weight publishing, the replay buffer and
the counter. Every interleaving a test needs is forced with a handshake, never hoped for."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from mprl.transport.memory import FULL, MemoryCounter, MemoryReplay, MemoryRollouts, MemoryWeights

T, E = 5, 3
SPEC = {"obs": ((T + 1, E, 2), torch.float32), "action": ((T, E), torch.int64)}
SPAWN = mp.get_context("spawn")
DEADLINE_S = 60  # a cold start of a spawned child imports torch slowly


def never() -> bool:
    return False


def rollouts_of(workers: int, slots: int) -> MemoryRollouts:
    return MemoryRollouts(SPEC, workers, slots, share=True, sleep=True)


def produce(rollouts: MemoryRollouts, rank: int, count: int, stop, returned=None) -> None:
    """Hand ``count`` rollouts over as worker ``rank``; stopped, note when (``returned[rank]``,
    ``time.monotonic()``: one clock for every process) and return."""
    mine = rollouts.bind(rank, stop.is_set)
    for seq in range(count):
        index = mine.acquire()
        if index is None:
            if returned is not None:
                returned[rank] = time.monotonic()
            return
        slot = mine.slot(index)
        slot["obs"].fill_(rank * 1000 + seq)
        slot["action"].copy_(torch.arange(T * E).view(T, E) + seq)
        slot["version"].fill_(seq)
        mine.commit(index)


def test_slots_round_trip_exactly_under_concurrent_producers():
    rollouts = rollouts_of(workers=3, slots=2)  # slots are reused many times
    learner = rollouts.bind(3, never)
    stop = SPAWN.Event()
    producers = [SPAWN.Process(target=produce, args=(rollouts, r, 40, stop)) for r in range(3)]
    for proc in producers:
        proc.start()
    seen, last = [], {}
    for _ in range(3 * 40):
        index = learner.take(timeout=DEADLINE_S)
        assert index is not None
        slot = learner.slot(index)
        rank, seq = int(slot["source"]), int(slot["version"])
        assert torch.all(slot["obs"] == rank * 1000 + seq)  # not torn, not mixed
        assert torch.equal(slot["action"], torch.arange(T * E).view(T, E) + seq)
        assert seq == last.get(rank, -1) + 1  # each worker's rollouts arrive in order
        last[rank] = seq
        seen.append((rank, seq))
        learner.release(index)
    for proc in producers:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert sorted(seen) == [(r, s) for r in range(3) for s in range(40)]  # each exactly once


def test_a_killed_writer_leaves_nothing_locked():
    rollouts = rollouts_of(workers=1, slots=1)
    learner = rollouts.bind(1, never)
    stop = SPAWN.Event()
    first = SPAWN.Process(target=produce, args=(rollouts, 0, 10**6, stop))
    first.start()  # fills its slot, then waits for the learner to free it
    index = learner.take(timeout=DEADLINE_S)
    first.kill()  # dies waiting or writing: nothing of the transport is held
    first.join()
    learner.release(index)
    again = SPAWN.Process(target=produce, args=(rollouts, 0, 1, stop))  # the restarted rank
    again.start()
    assert learner.take(timeout=DEADLINE_S) == index
    again.join(timeout=30)
    assert again.exitcode == 0


def commit(worker: MemoryRollouts, value: float) -> int:
    """A bound worker writes a rollout of ``value``s into its next slot and hands it over."""
    index = worker.acquire(timeout=5)
    assert index is not None
    worker.slot(index)["obs"].fill_(value)
    worker.commit(index)
    return index


def test_blocked_producers_return_when_stopped_with_full_slots():
    rollouts = rollouts_of(workers=2, slots=1)
    stop, returned = SPAWN.Event(), SPAWN.Array("d", 2, lock=False)
    # nobody consumes: both slots end up full, every producer waits for its slot
    producers = [
        SPAWN.Process(target=produce, args=(rollouts, r, 100, stop, returned)) for r in range(2)
    ]
    for proc in producers:
        proc.start()
    deadline = time.monotonic() + DEADLINE_S
    while not (rollouts._state_np == FULL).all() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (rollouts._state_np == FULL).all() and all(proc.is_alive() for proc in producers)
    start = time.monotonic()
    stop.set()
    for proc in producers:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    # each blocked acquire returned soon after the stop (when the process then finished
    # exiting is up to a busy machine)
    assert all(0 < returned[r] - start < 2 for r in range(2)), list(returned)
    assert rollouts.bind(2, never).take(timeout=1) is not None  # the full slots are still there


def _filled(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(64, 64)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def read_weights(weights: MemoryWeights, seen, out, stop) -> None:
    local = _filled(-1.0)
    have, torn, versions = -1, 0, []
    out.put("reading")
    while not stop.is_set():
        have = weights.pull(local, have)
        values = torch.cat([p.detach().flatten() for p in local.parameters()])
        torn += int(not torch.all(values == values[0]))  # the learner writes one value per step
        if not versions or versions[-1] != have:
            versions.append(have)
            torn += int(values[0] != have)
        seen[0] = have
    out.put((torn, versions))


@pytest.mark.parametrize("in_place", [True, False], ids=["shared model", "learner's own model"])
def test_weights_reach_readers_whole_with_increasing_versions(in_place):
    shared = _filled(0.0).share_memory()
    learner = shared if in_place else _filled(0.0)  # a learner on a GPU has its own model
    weights = MemoryWeights(shared, share=True, sleep=True)
    seen = torch.full((1,), -1, dtype=torch.int64).share_memory_()
    out, stop = SPAWN.Queue(), SPAWN.Event()
    reader = SPAWN.Process(target=read_weights, args=(weights, seen, out, stop))
    reader.start()
    try:
        assert out.get(timeout=DEADLINE_S) == "reading"
        for version in range(1, 3001):
            with weights.publishing(learner), torch.no_grad():
                for p in learner.parameters():
                    p.fill_(version)
            if version % 300 == 0:  # the handshake: the reader saw this version before more
                deadline = time.monotonic() + DEADLINE_S
                while int(seen[0]) < version and time.monotonic() < deadline:
                    time.sleep(0.001)
        assert weights.version == 3000
        stop.set()
        torn, versions = out.get(timeout=30)
    finally:
        stop.set()
        reader.join(timeout=10)
        out.close()
        out.join_thread()
    assert torn == 0, f"{torn} reads saw a half-written model"
    assert versions == sorted(versions) and versions[-1] == 3000
    assert {300 * k for k in range(1, 11)} <= set(versions)


def wait_for_update(weights: MemoryWeights, newer_than: int, out, stop) -> None:
    out.put("waiting")
    out.put(weights.bind(0, stop.is_set).wait(newer_than))


def test_wait_sleeps_until_an_update_is_complete_and_returns_on_stop():
    shared = _filled(0.0).share_memory()
    weights, out, stop = MemoryWeights(shared, share=True, sleep=True), SPAWN.Queue(), SPAWN.Event()
    mine = weights.bind(0, never)
    assert mine.wait(-1, timeout=0.1) == 0  # version 0 is newer than -1
    assert mine.wait(0, timeout=0.2) is None  # nothing newer: times out
    waiter = SPAWN.Process(target=wait_for_update, args=(weights, 0, out, stop))
    waiter.start()
    try:
        assert out.get(timeout=DEADLINE_S) == "waiting"
        with weights.publishing(shared):
            time.sleep(1)  # a long update: the waiter must not return in the middle of it
            assert out.empty()
        assert out.get(timeout=10) == 1  # released by the completed update
        waiter.join(timeout=10)
        # a waiter with nothing to wait for returns None once stopped
        waiter = SPAWN.Process(target=wait_for_update, args=(weights, 5, out, stop))
        waiter.start()
        assert out.get(timeout=DEADLINE_S) == "waiting"
        stop.set()
        assert out.get(timeout=10) is None
        # version 1 is newer than 0, but the run has stopped: a version published as it stopped
        # may be half an update (the learner saw the stop mid-update), so no one acts on it
        assert weights.bind(0, stop.is_set).wait(0, timeout=1) is None
    finally:
        stop.set()
        waiter.join(timeout=10)
        out.close()
        out.join_thread()
    assert waiter.exitcode == 0


ROW = {
    "obs": ((4,), torch.float32),
    "action": ((), torch.int64),
    "next_obs": ((4,), torch.float32),
}


def add_rows(replay: MemoryReplay, rank: int, batches: int, ready) -> None:
    mine = replay.bind(rank, never)
    ready.wait()
    for b in range(batches):
        ids = torch.arange(b * 3, b * 3 + 3) + 10_000 * rank  # three rows a call
        obs = ids[:, None].float().expand(3, 4)
        mine.add(obs=obs, action=ids, next_obs=obs + 0.5)


def test_replay_sample_never_returns_a_torn_row_under_concurrent_writers():
    replay = MemoryReplay(ROW, capacity=64, workers=2, share=True)  # rings of 32: overwritten
    learner = replay.bind(2, never)
    assert learner.sample(4) is None and learner.size() == 0
    ready = SPAWN.Event()
    writers = [SPAWN.Process(target=add_rows, args=(replay, r, 3000, ready)) for r in range(2)]
    for proc in writers:
        proc.start()
    ready.set()
    samples, generator = 0, torch.Generator().manual_seed(0)
    deadline = time.monotonic() + DEADLINE_S
    while (any(p.is_alive() for p in writers) or samples == 0) and time.monotonic() < deadline:
        batch = learner.sample(16, generator)
        if batch is None:
            continue
        samples += 1
        ids = batch["action"].float()
        assert torch.equal(batch["obs"], ids[:, None].expand(16, 4))  # every field of one row
        assert torch.equal(batch["next_obs"], ids[:, None].expand(16, 4) + 0.5)
    for proc in writers:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert samples > 10 and learner.size() == 64 == replay.capacity
    # each writer's ring holds its newest 32 rows, in the order it added them
    for rank in range(2):
        ring = replay.buffers["action"][rank * 32 : (rank + 1) * 32].sort().values
        assert ring.tolist() == list(range(9000 - 32 + 10_000 * rank, 9000 + 10_000 * rank))


def count(counter: MemoryCounter, slot: int, n: int) -> None:
    mine = counter.bind(slot, never)
    for _ in range(n):
        mine.add(1)


def test_counter_adds_exactly_from_every_process_and_resumes_from_its_total():
    counter = MemoryCounter(3, share=True)
    procs = [SPAWN.Process(target=count, args=(counter, slot, 5000)) for slot in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=DEADLINE_S)
        assert proc.exitcode == 0
    assert counter.value == 15_000
    resumed = MemoryCounter(2, share=False)  # another worker count: the total carries over
    resumed.load(counter.value)
    resumed.bind(0, never).add(5)
    assert resumed.value == 15_005
    with pytest.raises(RuntimeError, match="added to by the processes of a run"):
        counter.add(1)
