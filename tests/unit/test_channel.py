"""The local backend's channel: how children's records reach the main process."""

from __future__ import annotations

import math
import pickle
import time

from mprl.backends.local.channel import LocalChannel


class ListQueue:
    """What the channel needs of its ``multiprocessing`` queue: ``put``."""

    def __init__(self) -> None:
        self.items: list = []

    def put(self, item) -> None:
        self.items.append(pickle.loads(pickle.dumps(item)))  # as the queue's pipe carries it


def received(queue: ListQueue) -> list[dict]:
    return [record for sent in queue.items for record in LocalChannel.unpack(sent)]


def test_packed_episodes_arrive_as_episode_records():
    queue = ListQueue()
    channel = pickle.loads(pickle.dumps(LocalChannel(2, queue)))  # as a child gets it
    channel.records = queue
    before = time.time()
    channel.add_steps(0, 100)
    channel.episode(0, "worker:0", 12.5, 12)
    channel.add_steps(1, 50)
    channel.send(1, {"source": "worker:1", "step": 150, "time": before, "loss": 0.5})
    channel.episode(1, "worker:1", math.nan, 7)
    assert queue.items == []  # nothing sent before a flush
    channel.flush()
    records = received(queue)
    assert records[0] == {"source": "worker:1", "step": 150, "time": before, "loss": 0.5}
    episodes = [r for r in records if "episode_return" in r]
    assert [(r["step"], r["episode_return"], r["episode_length"]) for r in episodes] == [
        (100, 12.5, 12),  # the run's steps when the episode ended
        (150, "nan", 7),  # JSON has no NaN
    ]
    assert all(before <= r["time"] <= time.time() for r in episodes)
    assert all(
        isinstance(r["step"], int) and isinstance(r["episode_length"], int) for r in episodes
    )


def test_a_full_batch_of_episodes_is_sent_without_a_flush():
    queue = ListQueue()
    channel = LocalChannel(1, queue)
    # only the count sends here: the time limit would send what came so far whenever the loop
    # below outlasts it (a loaded machine: 438 of 4,096 once)
    channel.FLUSH_S = math.inf
    for i in range(LocalChannel.FLUSH_N + 1):
        channel.episode(0, "worker:0", float(i), i)
    returns = [r["episode_return"] for r in received(queue)]
    assert returns == [float(i) for i in range(LocalChannel.FLUSH_N)]
    channel.flush()
    assert received(queue)[-1]["episode_return"] == float(LocalChannel.FLUSH_N)
