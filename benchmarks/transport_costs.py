"""What each way of moving data between a run's processes costs, on the local backend.

    python benchmarks/transport_costs.py [--reps 2000]

The fields are built as a local run builds them (a real Manager server, shared memory) and used
the way a plugin would, one process writing and another reading where that is the pattern. A
"step" is one CartPole transition (4 float observations, an action, a reward); an "episode" is
200 of them. Prints microseconds per step and per episode, the median of 5 repeats and their
range. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from multiprocessing.managers import SyncManager

import gymnasium as gym
import numpy as np
import torch

from mprl import schema
from mprl.transport.memory import MemoryBuilder

STEPS = 200  # a CartPole episode
SPACES = gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2)


def _timed(fn: Callable[[], None], reps: int) -> tuple[float, float, float]:
    """Median, min and max seconds of ``fn`` over 5 repeats of ``reps`` calls (per call)."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - start) / reps)
    return statistics.median(times), min(times), max(times)


def _drain(q, n: int) -> None:  # the learner's side, in its own process
    for _ in range(n):
        q.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000, help="calls per repeat")
    reps = parser.parse_args().reps
    ctx = mp.get_context("spawn")
    manager = SyncManager(ctx=ctx)
    manager.start()
    try:
        dims = schema.Dims(2, *SPACES)
        spec = {"obs": ((STEPS + 1, 4), torch.float32), "action": ((STEPS,), torch.int64),
                "reward": ((STEPS,), torch.float32)}  # fmt: skip
        state = schema.Schema(
            steps=schema.PerWorker(0),
            episodes=schema.Queue(),
            table=schema.Tensor(shape=(STEPS, 6)),
            counter=schema.Counter(),
            rollouts=schema.Rollouts(spec, slots_per_worker=1),
            replay=schema.ReplayBuffer(capacity=10_000),
        ).build(MemoryBuilder(manager, torch.nn.Linear(1, 1), None, share=True, sleep=True), dims)
        worker, learner = state.bound(0, lambda: False), state.bound(2, lambda: False)
        obs = np.zeros(4, dtype=np.float32)
        episode = (np.zeros((STEPS, 4), np.float32), [0] * STEPS, [1.0] * STEPS)
        rows = {name: torch.zeros((1, *shape), dtype=dtype)
                for name, (shape, dtype) in schema.transition_row(dims).items()}  # fmt: skip

        def manager_counter() -> None:
            worker.steps[0] += 1  # a read and a write: two round trips

        def queue_step() -> None:  # a transition per put; the learner takes them elsewhere
            worker.episodes.put((obs, 0, 1.0))

        def queue_episode() -> None:
            worker.episodes.put(episode)

        def tensor_step() -> None:
            worker.table[0, :4] = torch.from_numpy(obs)

        def counter_step() -> None:
            worker.counter.add(1)

        def replay_step() -> None:
            worker.replay.add(**rows)

        def rollout_episode() -> None:
            index = worker.rollouts.acquire()
            slot = worker.rollouts.slot(index)
            slot["obs"].zero_()
            worker.rollouts.commit(index)
            learner.rollouts.take_batch(1)

        results = []
        for name, fn, per, n in (
            ("Manager PerWorker item += 1", manager_counter, "step", reps),
            ("Manager Queue put, a transition", queue_step, "step", reps),
            ("Manager Queue put, a whole episode", queue_episode, "episode", reps // 10),
            ("Tensor write (shared memory)", tensor_step, "step", reps * 10),
            ("Counter.add", counter_step, "step", reps * 10),
            ("ReplayBuffer.add, one row", replay_step, "step", reps),
            ("Rollouts slot: acquire, write, commit, take", rollout_episode, "episode", reps // 10),
        ):
            reader = None
            if "Queue" in name:  # the learner takes them in another process meanwhile
                reader = ctx.Process(target=_drain, args=(state.episodes, 5 * n))
                reader.start()
            median, low, high = _timed(fn, n)
            if reader is not None:
                reader.join()
            per_step = median / (STEPS if per == "episode" else 1)
            per_episode = median * (STEPS if per == "step" else 1)
            results.append((name, per_step, per_episode, low / median, high / median))
        print("| way | us per step | us per 200-step episode | range (x median) |")
        print("|---|---|---|---|")
        for name, per_step, per_episode, low, high in results:
            print(f"| {name} | {per_step * 1e6:,.2f} | {per_episode * 1e6:,.0f} | "
                  f"{low:.2f}-{high:.2f} |")  # fmt: skip
    finally:
        manager.shutdown()


if __name__ == "__main__":
    main()
