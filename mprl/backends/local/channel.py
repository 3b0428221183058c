"""The local backend's channel: the stop flag, step counters and heartbeats in shared memory,
metric records through a queue read by the main process. Nothing here talks to the Manager."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from mprl.context import episode_record

_STOP = 0  # index of the stop flag in the control tensor
_EPISODES = "_episodes"  # the key of a record of packed episodes (LocalChannel.episode)


class LocalChannel:
    """Shared-memory control block and a metrics queue; nothing here talks to the Manager.

    ``steps`` has one counter per worker, one for the train process and one for the steps of
    earlier sessions of a resumed run; ``beats`` has each child's last sign of life
    (``time.monotonic()``, which is one clock for every process on the machine; negated while the
    child does start-up work, 0 before its first beat). Children write
    through numpy views of the tensors: a store is a few hundred nanoseconds. Records are sent
    in batches (every ``FLUSH_S`` or ``FLUSH_N`` records), so a worker finishing thousands of
    episodes a second does not pay a queue put, and its feeder thread's wake-up, for each.
    Episodes are packed as rows of one array until they are sent, not as a dict each. The main
    process unpacks them (:meth:`unpack`). Why: see benchmarks/README.md, "The local channel:
    records in batches".
    """

    FLUSH_S = 0.2
    FLUSH_N = 4096  # the time limit sends first at a few thousand records a second

    def __init__(self, n_workers: int, records: Any) -> None:
        self.control = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.steps = torch.zeros(n_workers + 2, dtype=torch.int64).share_memory_()
        self.beats = torch.zeros(n_workers + 1, dtype=torch.float64).share_memory_()
        self.records = records
        self._local()

    def _local(self) -> None:
        self._control, self._steps, self._beats = (
            t.numpy() for t in (self.control, self.steps, self.beats)
        )
        self._steps_mv = memoryview(self._steps)  # summed in Python: cheaper than numpy here
        self._pending: list[dict[str, Any]] = []
        self._episodes: list[tuple[float, int, float, int]] = []
        self._episode_source = ""
        self._flushed = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("control", "steps", "beats", "records")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local()

    def beat(self, slot: int, starting: bool = False) -> None:
        now = time.monotonic()
        self._beats[slot] = -now if starting else now  # negative: in start-up work since -now
        if (self._pending or self._episodes) and now - self._flushed >= self.FLUSH_S:
            self.flush()

    def should_stop(self, slot: int) -> bool:
        self.beat(slot)
        return bool(self._control[_STOP])

    def idle(self, slot: int, seconds: float) -> bool:
        """A waiting process's pause (:meth:`mprl.Context.wait_until`): a sleep, then a beat;
        True once the run is stopping."""
        time.sleep(seconds)
        return self.should_stop(slot)

    def stop(self) -> None:
        """Main process: raise the stop flag every child looks at."""
        self._control[_STOP] = 1

    def add_steps(self, slot: int, n: int) -> None:
        self._steps[slot] += n  # each process owns its slot: no lock needed
        self.beat(slot)

    def env_steps(self) -> int:
        return sum(self._steps_mv)

    def send(self, slot: int, record: dict[str, Any]) -> None:
        self._pending.append(record)
        if len(self._pending) >= self.FLUSH_N:
            self.flush()
        self.beat(slot)

    def episode(self, slot: int, source: str, episode_return: float, episode_length: int) -> None:
        self._episodes.append((time.time(), self.env_steps(), episode_return, episode_length))
        self._episode_source = source
        if len(self._episodes) >= self.FLUSH_N:
            self.flush()
        self.beat(slot)

    def flush(self) -> None:
        """Send the pending records now (one queue item)."""
        if self._episodes:
            packed = np.array(self._episodes, dtype=np.float64)  # exact: steps < 2**53
            self._pending.append({"source": self._episode_source, _EPISODES: packed})
            self._episodes = []
        if self._pending:
            self.records.put(self._pending)
            self._pending = []
        self._flushed = time.monotonic()

    @staticmethod
    def unpack(sent: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The records of one queue item, packed episodes unpacked."""
        for item in sent:
            if _EPISODES not in item:
                yield item
                continue
            source = item["source"]
            for wall, step, ret, length in item[_EPISODES].tolist():
                yield episode_record(source, int(step), wall, ret, int(length))
