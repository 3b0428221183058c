"""What a worker's ``weights.pull(local, version)`` costs on the local backend, by model size.

    python benchmarks/weights_pull.py [--reps 2000]

The published model is in shared memory, as a local run builds it (``schema.Weights``); the
worker's copy is a ``copy.deepcopy`` of it. A pull of a newer version copies every parameter and
floating-point buffer; a pull of the version the copy holds copies nothing. The models are
``mprl.lib.nets.ActorCritic`` for CartPole's spaces with hidden layers of growing width (64x64
is the built-in plugins' CartPole network). Prints the median of 7 repeats and their range, on
one torch thread. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import gymnasium as gym
import torch

from mprl.lib.nets import ActorCritic
from mprl.transport.memory import MemoryWeights, published_tensors

SPACES = gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2)
WIDTHS = (64, 256, 1024, 2048)


def per_pull_us(weights: MemoryWeights, local: torch.nn.Module, have: int, reps: int) -> list:
    """Microseconds per pull, for 7 repeats of ``reps`` pulls."""
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(reps):
            weights.pull(local, have)
        times.append((time.perf_counter() - start) / reps * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000, help="pulls per repeat (64x64)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'hidden':>11} {'MB':>7} {'tensors':>7} {'us/pull':>9} {'range':>15} {'us/MB':>6}")
    for width in WIDTHS:
        model = ActorCritic(*SPACES, (width, width))
        weights = MemoryWeights(model, share=True, sleep=True).bind(0, lambda: False)
        local = copy.deepcopy(model)
        tensors = published_tensors(model)
        mb = sum(t.numel() * t.element_size() for t in tensors) / 1e6
        reps = max(10, int(args.reps * min(1.0, 0.05 / mb)))
        times = per_pull_us(weights, local, -1, reps)  # -1: never held, so every pull copies
        median = statistics.median(times)
        print(
            f"{width:>5}x{width:<5} {mb:>7.3f} {len(tensors):>7} {median:>9.1f} "
            f"{min(times):>7.1f}-{max(times):<7.1f} {median / mb:>6.0f}"
        )
    same = statistics.median(per_pull_us(weights, local, weights.version, args.reps))
    print(f"a pull of the version held (nothing copied): {same:.2f} us")


if __name__ == "__main__":
    main()
