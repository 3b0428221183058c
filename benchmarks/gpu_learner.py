"""The learner alone, on the CPU and on a GPU where there is one: samples learned per second by
impala's V-trace update and ppo's epochs over Atari-shaped batches (uint8 frames 4x84x84, the
Nature CNN), the batch moved to the device as a run moves it (``mprl.device.Staging``: one
pinned, non-blocking copy) and the weights copied back to a CPU model as publishing does.

Usage: ``python benchmarks/gpu_learner.py [--seconds 20] [--threads N]``. Prints a table of
samples/s per device and the GPU / CPU ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time

import gymnasium as gym
import numpy as np
import torch

from mprl.device import Staging
from mprl.lib.envbatch import rollout_spec
from mprl.lib.nets import ActorCritic, make_optimizer
from mprl_builtin.impala.algorithm import PRESETS as IMPALA_PRESETS
from mprl_builtin.impala.algorithm import ImpalaConfig, update
from mprl_builtin.ppo.algorithm import PRESETS as PPO_PRESETS
from mprl_builtin.ppo.algorithm import PPOConfig

FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
ACTIONS = gym.spaces.Discrete(6)


def _batch(steps: int, rollouts: int, envs: int) -> dict[str, torch.Tensor]:
    """A ``take_batch`` of ``rollouts`` rollouts: ``[T, B, E, ...]`` fields."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, (shape, dtype) in rollout_spec(FRAMES, ACTIONS, steps, envs).items():
        full = (shape[0], rollouts, *shape[1:])
        if dtype == torch.uint8:
            out[name] = torch.randint(0, 256, full, dtype=dtype, generator=gen)
        elif dtype == torch.int64:
            out[name] = torch.randint(0, ACTIONS.n, full, generator=gen)
        else:
            out[name] = torch.rand(full, generator=gen) * (-1.8 if name == "logp" else 1)
    out["done"] = (out["done"] > 0.99).float()
    return out


def _publish_to(shared: torch.nn.Module, model: torch.nn.Module) -> None:
    with torch.no_grad():
        for dst, src in zip(shared.parameters(), model.parameters(), strict=True):
            dst.copy_(src)


def bench_impala(device: torch.device, seconds: float) -> float:
    cfg = ImpalaConfig(**IMPALA_PRESETS["atari"])
    shared = ActorCritic(FRAMES, ACTIONS, cfg.hidden)
    model = copy.deepcopy(shared).to(device)
    optimizer = make_optimizer(model.parameters(), cfg)
    batch = _batch(cfg.unroll, cfg.batch_rollouts, cfg.envs_per_worker)
    staging = Staging(device)
    samples = cfg.unroll * cfg.batch_rollouts * cfg.envs_per_worker
    done, start = 0, None
    while start is None or time.perf_counter() - start < seconds:
        there = staging(batch)
        stats = update(model, optimizer, cfg, there, lambda m: contextlib.nullcontext())
        _publish_to(shared, model)
        float(stats["value_loss"])  # the learner logs: a sync per update
        if start is None:  # the first update warms up (cuDNN autotune, allocations)
            start = time.perf_counter()
        else:
            done += samples
    return done / (time.perf_counter() - start)


def bench_ppo(device: torch.device, seconds: float) -> float:
    """ppo's update over one iteration's batch (2 workers' rollouts), ``epochs`` passes."""
    from mprl_builtin.ppo.algorithm import _update

    cfg = PPOConfig(**PPO_PRESETS["atari"])
    shared = ActorCritic(FRAMES, ACTIONS, cfg.hidden)
    model = copy.deepcopy(shared).to(device)
    optimizer = make_optimizer(model.parameters(), cfg)
    batch = _batch(cfg.n_steps, 2, cfg.envs_per_worker)
    staging = Staging(device)

    class _Ctx:
        def should_stop(self) -> bool:
            return False

    generator = torch.Generator().manual_seed(0)
    samples = cfg.n_steps * 2 * cfg.envs_per_worker
    done, start = 0, None
    while start is None or time.perf_counter() - start < seconds:
        there = staging(batch)
        obs = there["obs"].flatten(1, 2)
        n = obs.shape[1]
        with torch.no_grad():
            values = model.value(obs.flatten(0, 1)).view(cfg.n_steps + 1, n)
        data = (
            obs[:-1].flatten(0, 1),
            there["action"].flatten(1, 2).flatten(0, 1),
            there["logp"].flatten(1, 2).flatten(0, 1),
            torch.randn(cfg.n_steps * n, device=device),
            values[:-1].flatten(),
            values[:-1].flatten(),
        )
        _update(_Ctx(), cfg, model, optimizer, data, generator)  # type: ignore[arg-type]
        _publish_to(shared, model)
        if start is None:
            start = time.perf_counter()
        else:
            done += samples
    return done / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=0, help="CPU torch threads (0: as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
        torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads", end="")
    print(f", GPU: {torch.cuda.get_device_name()}" if len(devices) > 1 else ", no GPU")
    print("| learner | " + " | ".join(f"{d.type} samples/s" for d in devices) + " | ratio |")
    print("|---|" + "---|" * len(devices) + "---|")
    for name, bench in (("impala", bench_impala), ("ppo", bench_ppo)):
        rates = [bench(d, args.seconds) for d in devices]
        ratio = f"{rates[1] / rates[0]:.1f}" if len(rates) > 1 else "-"
        print(f"| {name} | " + " | ".join(f"{r:,.0f}" for r in rates) + f" | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
