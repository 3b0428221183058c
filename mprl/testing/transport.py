"""The transport contract: what every placement of the transport kinds keeps, as tests.

:class:`TransportContract` holds the tests; a placement (:class:`Placement`: how the fields
are built and how each process gets them) is given by the test class that inherits them, in
the shape of fsspec's abstract tests::

    from mprl.testing import TransportContract, SharedMemory

    class TestSharedMemory(TransportContract):
        @pytest.fixture
        def placement(self):
            return SharedMemory()

mprl runs it over each of its own: :class:`SharedMemory` (the local backend),
:class:`InProcess` (the serial backend, :mod:`mprl.testing`) and :class:`HubInProcess` (a hub
reached by calls, or mapped by the processes of its machine); the Ray backend's tests run it
on a hub in a Ray actor. The processes of a run are threads of the test, each with its own view
of the state (its own endpoint on a hub), as each process of a run has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from mprl import kinds, schema
from mprl.schema import Dims, Schema, SharedState
from mprl.transport.client import FLUSH_ROWS, Direct, Endpoint, HubBuilder, _HubField, connect
from mprl.transport.hub import Hub
from mprl.transport.memory import MemoryBuilder

#: the longest any step of a contract test may wait for what it expects
PATIENCE_S = 20.0
SPEC = {"x": ((3,), torch.float32)}
ROW = {"x": ((2,), torch.float32)}


class Placement:
    """How a transport is placed: subclass it and implement :meth:`build` and
    :meth:`process` (and :meth:`stopping`, :meth:`finish`, :meth:`close` where needed)."""

    #: rollouts a worker may have filled beyond its rank's slots (one filled while its last
    #: commit travels, where a commit is a call)
    in_flight = 0
    #: rows the workers together may be past a declared ``max_lead`` (a batch not yet sent)
    replay_slack = 0

    def build(self, fields: Schema, workers: int, model: torch.nn.Module) -> SharedState:
        """The state ``fields`` declares, built for ``workers`` workers, unbound."""
        raise NotImplementedError

    def process(self, state: SharedState, slot: int, stop: Callable[[], bool]) -> SharedState:
        """``state`` as the process of ``slot`` (a worker's rank, ``workers`` for the train
        process) uses it, its waits ending once ``stop()`` is true."""
        raise NotImplementedError

    def stopping(self) -> None:
        """The run stops (``stop()`` is true from now on): wake what waits elsewhere."""

    def finish(self, view: SharedState) -> None:
        """The process of ``view`` has returned: what it batched goes out."""

    def close(self) -> None:
        """Release what :meth:`build` made."""


def _dims(workers: int) -> Dims:
    import gymnasium as gym

    box = gym.spaces.Box(-1.0, 1.0, (3,))
    return Dims(workers, box, gym.spaces.Discrete(2), None)


def _make_model(*_: Any) -> torch.nn.Module:
    return torch.nn.Linear(3, 2)


class SharedMemory(Placement):
    """Tensors in shared memory, a nap between looks: the local backend's."""

    def build(self, fields: Schema, workers: int, model: torch.nn.Module) -> SharedState:
        builder = MemoryBuilder(None, model, _make_model, share=True, sleep=True)
        return kinds.build(fields, builder, _dims(workers))

    def process(self, state: SharedState, slot: int, stop: Callable[[], bool]) -> SharedState:
        return state.bound(slot, stop)


class InProcess(SharedMemory):
    """Plain tensors and no nap, the stop check handing the turn on: the serial backend's (the
    turn here is a short sleep, as threads of a test take no turns)."""

    def build(self, fields: Schema, workers: int, model: torch.nn.Module) -> SharedState:
        builder = MemoryBuilder(None, model, _make_model, share=False, sleep=False)
        return kinds.build(fields, builder, _dims(workers))

    def process(self, state: SharedState, slot: int, stop: Callable[[], bool]) -> SharedState:
        def turn() -> bool:
            time.sleep(0.0002)
            return stop()

        return state.bound(slot, turn)


class _HubPlacement(Placement):
    """A hub: the train process uses its fields in place, every other process through its own
    endpoint, on :meth:`link`."""

    in_flight = 1
    replay_slack = FLUSH_ROWS
    same_host = False
    hub: Any = None

    def link(self) -> Any:
        raise NotImplementedError

    def local(self) -> Endpoint:
        """The train process's endpoint."""
        raise NotImplementedError

    def build(self, fields: Schema, workers: int, model: torch.nn.Module) -> SharedState:
        self.workers = workers
        builder = HubBuilder(None, Endpoint(self.link()), model, _make_model, self.same_host)
        return kinds.build(fields, builder, _dims(workers))

    def process(self, state: SharedState, slot: int, stop: Callable[[], bool]) -> SharedState:
        own = SharedState(
            **{k: v.__copy__() if isinstance(v, _HubField) else v for k, v in vars(state).items()}
        )
        own._workers = state._workers
        connect(own, self.local() if slot == self.workers else Endpoint(self.link()))
        return own.bound(slot, stop)

    def finish(self, view: SharedState) -> None:
        for value in vars(view).values():
            if isinstance(value, _HubField):
                value.endpoint.flush()
                return


class HubInProcess(_HubPlacement):
    """A hub in this process: workers call it (``same_host``: map its memory instead)."""

    def __init__(self, same_host: bool = False) -> None:
        self.hub, self.same_host = Hub(), same_host
        if same_host:
            self.in_flight, self.replay_slack = 0, 0

    def link(self) -> Any:
        return Direct(self.hub)

    def local(self) -> Endpoint:
        return Endpoint(Direct(self.hub), self.hub)

    def stopping(self) -> None:
        self.hub.stop_waits()


class _Run:
    """A run's worth of processes as threads of the test, with one stop for all."""

    def __init__(self, placement: Placement, fields: Schema, workers: int) -> None:
        self.placement, self.workers = placement, workers
        self.model = _make_model()
        self.stop = threading.Event()
        self.state = placement.build(fields, workers, self.model)
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def view(self, slot: int | str) -> SharedState:
        slot = self.workers if slot == "trainer" else slot
        return self.placement.process(self.state, int(slot), self.stop.is_set)

    def start(self, fn: Callable[..., Any], *args: Any) -> threading.Thread:
        def main() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # the test fails with it
                self.errors.append(exc)

        thread = threading.Thread(target=main, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def end(self) -> None:
        self.stop.set()
        self.placement.stopping()
        for thread in self.threads:
            thread.join(PATIENCE_S)
        assert not [t for t in self.threads if t.is_alive()], "a process did not return"
        if self.errors:
            raise self.errors[0]


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {PATIENCE_S:g} s: {what}"
        time.sleep(0.005)


class TransportContract:
    """The tests every placement passes (see the module's docstring)."""

    @pytest.fixture
    def placement(self) -> Placement:
        raise NotImplementedError("give the placement under test as a `placement` fixture")

    @pytest.fixture
    def run(self, placement: Placement) -> Iterator[Callable[..., _Run]]:
        made: list[_Run] = []

        def make(workers: int = 2, **fields: schema.Field) -> _Run:
            made.append(_Run(placement, Schema(**fields), workers))
            return made[-1]

        try:
            yield make
        finally:
            for one in made:
                one.stop.set()
            placement.stopping()
            for one in made:
                for thread in one.threads:
                    thread.join(PATIENCE_S)
            placement.close()

    # -- rollouts --------------------------------------------------------------------------

    def test_every_rollout_reaches_the_learner_once_in_its_ranks_order(self, run):
        r = run(workers=2, rollouts=schema.Rollouts(SPEC, slots_per_worker=2))
        each = 15

        def worker(rank: int) -> None:
            slots = r.view(rank).rollouts
            for i in range(each):
                index = slots.acquire()
                assert index is not None
                slots.slot(index)["x"].fill_(rank * 1000 + i)
                slots.commit(index)
            r.placement.finish(r.view(rank))

        for rank in range(2):
            r.start(worker, rank)
        learner = r.view("trainer").rollouts
        seen: dict[int, list[int]] = {0: [], 1: []}
        for _ in range(each):  # batches of 2, each in rank order
            batch = learner.take_batch(2, timeout=PATIENCE_S)
            assert batch is not None, "a batch did not come"
            sources = batch["source"].tolist()
            assert sources == sorted(sources)
            for column, rank in enumerate(sources):
                seen[rank].append(int(batch["x"][0, column]) - rank * 1000)
        assert seen == {0: list(range(each)), 1: list(range(each))}
        r.end()

    def test_a_batch_is_in_rank_order_whatever_order_the_rollouts_came_in(self, run):
        r = run(workers=2, rollouts=schema.Rollouts(SPEC, slots_per_worker=1))
        learner = r.view("trainer").rollouts
        for rank in (1, 0):
            slots = r.view(rank).rollouts
            index = slots.acquire()
            slots.slot(index)["x"].fill_(rank)
            slots.commit(index)
            r.placement.finish(r.view(rank))
        batch = learner.take_batch(2, timeout=PATIENCE_S)
        assert batch is not None and batch["source"].tolist() == [0, 1]
        assert batch["x"][0].tolist() == [0.0, 1.0]
        r.end()

    def test_a_worker_ahead_of_the_learner_waits_for_a_free_slot(self, run):
        slots_per_worker = 2
        r = run(workers=1, rollouts=schema.Rollouts(SPEC, slots_per_worker=slots_per_worker))
        committed = [0]

        def worker() -> None:
            slots = r.view(0).rollouts
            while (index := slots.acquire()) is not None:
                slots.commit(index)
                committed[0] += 1

        r.start(worker)
        most = slots_per_worker + r.placement.in_flight
        _until(lambda: committed[0] >= slots_per_worker, "the worker filled its slots")
        time.sleep(0.5)  # a worker that did not wait would have gone on by now
        assert committed[0] <= most
        before = committed[0]
        assert r.view("trainer").rollouts.take_batch(1, timeout=PATIENCE_S) is not None
        _until(lambda: committed[0] > before, "a freed slot let the worker go on")
        time.sleep(0.3)
        assert committed[0] <= before + 1 + r.placement.in_flight
        r.end()

    # -- weights ---------------------------------------------------------------------------

    def test_readers_see_whole_versions_in_increasing_order(self, run):
        r = run(workers=2, weights=schema.Weights())
        versions = 30
        seen: list[list[tuple[int, set[float]]]] = [[], []]

        def reader(rank: int) -> None:
            weights, mine, have = r.view(rank).weights, _make_model(), -1
            while have < versions:
                have = weights.pull(mine, have)
                values = {float(v) for t in mine.parameters() for v in t.detach().flatten()}
                seen[rank].append((have, values))

        for rank in range(2):
            r.start(reader, rank)
        learner = r.view("trainer").weights
        for version in range(1, versions + 1):
            with learner.publishing(r.model), torch.no_grad():
                for t in r.model.parameters():
                    t.fill_(float(version))
            time.sleep(0.002)
        for rank in range(2):
            _until(lambda rank=rank: seen[rank] and seen[rank][-1][0] == versions, "version")
            pulled = [version for version, _ in seen[rank]]
            assert pulled == sorted(pulled)
            for version, values in seen[rank]:
                if version > 0:
                    assert values == {float(version)}, (version, values)  # never torn
        assert learner.version == versions
        r.end()

    def test_a_reader_waits_for_a_newer_version(self, run):
        r = run(workers=1, weights=schema.Weights())
        reader, learner = r.view(0).weights, r.view("trainer").weights
        assert reader.wait(0, timeout=0.1) is None
        got: list[int | None] = []
        r.start(lambda: got.append(reader.wait(0, timeout=PATIENCE_S)))
        time.sleep(0.1)
        with learner.publishing(r.model):
            pass
        _until(lambda: bool(got), "the wait ended")
        assert got == [1]
        r.end()

    # -- replay ----------------------------------------------------------------------------

    def test_replay_keeps_its_declared_ratio(self, run):
        ratio, starts, lead, batch = 2.0, 8, 16, 8
        replay = schema.ReplayBuffer(
            100, row=ROW, replay_ratio=ratio, learning_starts=starts, max_lead=lead
        )
        r = run(workers=1, replay=replay)
        added = [0]

        def worker() -> None:
            rows = r.view(0).replay
            while not r.stop.is_set():
                rows.add(x=torch.ones(2, 2))
                added[0] += 2

        r.start(worker)
        learner = r.view("trainer").replay
        sampled = 0
        for _ in range(20):
            got = learner.sample(batch)
            assert got is not None and got["x"].shape == (batch, 2)
            sampled += batch
            # the learner never samples more than the rows added allow
            assert sampled <= ratio * (added[0] - starts) + batch + r.placement.replay_slack
            # the worker never runs further ahead than its lead beyond the learner's batch
            allowed = starts + (sampled + batch) / ratio + lead + r.placement.replay_slack + 2
            assert added[0] <= allowed, (added[0], allowed)
        r.end()

    # -- stopping --------------------------------------------------------------------------

    def test_every_wait_returns_none_once_the_run_stops(self, run):
        replay = schema.ReplayBuffer(10, row=ROW, replay_ratio=1.0, learning_starts=5)
        r = run(workers=1, rollouts=schema.Rollouts(SPEC, slots_per_worker=1),
                empty=schema.Rollouts(SPEC, slots_per_worker=1), weights=schema.Weights(),
                replay=replay)  # fmt: skip
        worker, learner = r.view(0), r.view("trainer")
        index = worker.rollouts.acquire()
        worker.rollouts.commit(index)  # its one slot: a worker waits for room now
        answers: dict[str, Any] = {}

        def blocked_worker() -> None:
            slots = r.view(0).rollouts
            for _ in range(3):  # more than its slot: it waits for room (in acquire or commit)
                index = slots.acquire()
                if index is None:
                    return None
                slots.commit(index)
            return "went on"  # type: ignore[return-value]

        waits = {
            "acquire": blocked_worker,
            "take_batch": lambda: r.view("trainer").empty.take_batch(1),
            "wait": lambda: worker.weights.wait(learner.weights.version),
            "sample": lambda: learner.replay.sample(4),
            "wait_size": lambda: learner.replay.wait_size(1),
        }
        for name, wait in waits.items():
            r.start(lambda name=name, wait=wait: answers.__setitem__(name, wait()))
        time.sleep(0.3)
        assert answers == {}, "a wait returned before the run stopped"
        r.end()  # the stop, and every thread joined within the patience
        assert answers == dict.fromkeys(waits)

    # -- counters and checkpoints ----------------------------------------------------------

    def test_a_counter_sums_every_process_adds(self, run):
        r = run(workers=2, steps=schema.Counter())

        def worker(rank: int) -> None:
            view = r.view(rank)
            for _ in range(100):
                view.steps.add(rank + 1)
            r.placement.finish(view)

        done = [r.start(worker, rank) for rank in range(2)]
        for thread in done:
            thread.join(PATIENCE_S)
        trainer = r.view("trainer")
        trainer.steps.add(5)
        _until(lambda: trainer.steps.value == 100 + 200 + 5, "every add counted")
        r.end()

    def test_the_state_a_checkpoint_keeps_comes_back_whole(self, run, placement):
        fields = {
            "steps": schema.Counter(),
            "weights": schema.Weights(),
            "replay": schema.ReplayBuffer(20, row=ROW),
        }
        r = run(workers=2, **fields)
        worker, trainer = r.view(1), r.view("trainer")
        worker.steps.add(7)
        worker.replay.add(x=torch.arange(6.0).view(3, 2))
        r.placement.finish(worker)
        for _ in range(3):
            with trainer.weights.publishing(r.model):
                pass
        _until(lambda: trainer.replay.size() == 3, "the rows arrived")
        saved = kinds.snapshot(Schema(**fields), r.state)
        again = run(workers=2, **fields)
        assert kinds.restore(Schema(**fields), again.state, saved) == []
        back = again.view("trainer")
        assert back.steps.value == 7 and back.weights.version == 3
        assert back.replay.size() == 3
        rows = back.replay.sample(50)["x"]
        assert {tuple(row) for row in rows.tolist()} <= {(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)}
        r.end()
        again.end()
