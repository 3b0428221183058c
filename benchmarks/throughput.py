"""Environment steps per second of the impala plugin against a no-framework ceiling.

    python benchmarks/throughput.py [--workers 1 2 3 4] [--envs 8 16 32] [--window-s 1]
                                    [--pairs 9] [--out benchmarks/results/throughput]

For each envs-per-worker value E, the *ceiling* is one plain Python process stepping E
CartPole-v1 environments with the same network (one batched forward per step, sampling, no
learning, no framework). For each (workers W, E), ``python -m mprl run --plugin impala`` runs
on the same machine; its rate is read from the step counters in the episode records. The ratio
reported is

    framework_steps_per_s / (min(W, cores) * ceiling_steps_per_s(E))

so 1.0 means the framework collects as fast as min(W, cores) bare processes could, with the
learner, transport and weight broadcast running alongside.

The speed of a shared (virtual) machine drifts by 10-20% over a few seconds, more than the
differences measured here, so rates are compared in pairs: the run paused (SIGSTOP to its
process group) while this process measures the ceiling for a window, then a window of the run
of the same length, ``--pairs`` times. The ratio reported is the median of the pairs' ratios
(their range is reported too).

The denominator assumes the cores scale linearly, so the machine's own bound is measured too:
``cores`` bare processes stepping side by side, as a ratio of ``cores * ceiling`` (no
framework, no learner, no main process). So is the learner's: its capacity alone (samples/s of
one thread running impala's update on batches of the run's shape) against the ceiling gives the
highest ratio reachable once the learner's CPU comes out of the same cores (see
:func:`learner_bound`; with as many workers as cores, ``k / (1 + k)`` for ``k = capacity /
ceiling``). The learning rate is set tiny so the policy stays
close to random in both (episode lengths, hence reset costs, match) and the run never stops by
solving. Also reported: learner updates/s (paused time left out) and mean policy staleness
(learner version minus the version a rollout was collected with). Writes JSON, and a PNG when
matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from mprl.host import config
from mprl.lib.envbatch import rollout_spec
from mprl.lib.nets import ActorCritic, make_model, make_optimizer
from mprl_builtin.impala.algorithm import ImpalaConfig, update

ENV = "CartPole-v1"


def ceiling(n_envs: int, seconds: float, seed: int = 0) -> float:
    """Steps/s of one bare process: ``n_envs`` envs, one batched forward per step."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    envs = [gym.make(ENV) for _ in range(n_envs)]
    model = ActorCritic(envs[0].observation_space, envs[0].action_space, (64, 64))
    obs = torch.as_tensor(
        np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]), dtype=torch.float32
    )
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        with torch.no_grad():
            out = model.policy(obs)
            actions = model.sample(out)
            model.log_prob_entropy(out, actions)  # the worker stores log-probs too
        env_actions = model.to_env(actions)
        next_obs = []
        for i, env in enumerate(envs):
            o, _, terminated, truncated, _ = env.step(env_actions[i])
            if terminated or truncated:
                o, _ = env.reset()
            next_obs.append(o)
        obs = torch.as_tensor(np.stack(next_obs), dtype=torch.float32)
        steps += n_envs
    rate = steps / (time.perf_counter() - start)
    for env in envs:
        env.close()
    return rate


def learner_capacity(cfg: ImpalaConfig, seconds: float, seed: int = 0) -> float:
    """Samples/s of impala's learner alone (:func:`mprl_builtin.impala.algorithm.update`, one
    thread) on batches shaped as ``cfg`` makes them: what the train process needs per env step."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    env = gym.make(ENV)
    model = make_model(env.observation_space, env.action_space, cfg)
    optimizer = make_optimizer(model.parameters(), cfg)
    spec = rollout_spec(env.observation_space, env.action_space, cfg.unroll, cfg.envs_per_worker)
    batch = {name: torch.zeros(shape[0], cfg.batch_rollouts, *shape[1:], dtype=dtype)
             for name, (shape, dtype) in spec.items()}  # fmt: skip
    batch["obs"].uniform_(-0.05, 0.05)  # CartPole's start states
    batch["action"].random_(0, 2)
    batch["logp"].fill_(-math.log(2))
    batch["reward"].fill_(1.0)
    samples = cfg.unroll * cfg.batch_rollouts * cfg.envs_per_worker  # per update
    update(model, optimizer, cfg, batch)  # the first update allocates Adam's state
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        update(model, optimizer, cfg, batch)
        updates += 1
    env.close()
    return updates * samples / (time.perf_counter() - start)


def learner_bound(workers: int, cores: int, capacity_per_ceiling: float) -> float:
    """The highest ratio reachable when the learner's CPU comes out of the same cores.

    At ``R`` steps/s the workers need at least ``R / C`` cores (the ceiling's ``C`` steps/s per
    core) and the learner ``R / L`` (its capacity ``L``), so ``R <= cores / (1/C + 1/L)``, and
    no worker steps faster than ``C``. With ``k = L / C``, as a ratio of ``min(W, cores) * C``:
    ``min(1, cores / min(W, cores) * k / (1 + k))`` (the main process and the OS not counted).
    """
    k = capacity_per_ceiling
    return min(1.0, cores / min(workers, cores) * k / (1 + k))


def _ceiling_from(start_at: float, n_envs: int, seconds: float) -> float:
    time.sleep(max(0.0, start_at - time.time()))  # every process measures the same window
    return ceiling(n_envs, seconds)


def side_by_side(n_procs: int, n_envs: int, seconds: float) -> float:
    """Summed steps/s of ``n_procs`` bare processes measuring :func:`ceiling` at once."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(n_procs, mp_context=spawn) as pool:
        start_at = time.time() + 5.0  # after every process has started and imported torch
        rates = pool.map(_ceiling_from, [start_at] * n_procs, [n_envs] * n_procs,
                         [seconds] * n_procs)  # fmt: skip
        return float(sum(rates))


def _segments(records: list[dict], gap_s: float) -> list[list[dict]]:
    """``records`` in wall order, split where no record came for ``gap_s`` (a pause)."""
    records = sorted(records, key=lambda r: r["wall"])
    out = [[records[0]]]
    for r in records[1:]:
        if r["wall"] - out[-1][-1]["wall"] > gap_s:
            out.append([])
        out[-1].append(r)
    return out


def framework(
    workers: int, n_envs: int, warmup_s: float, window_s: float, pairs: int, sets: list[str] = ()
) -> dict:
    """Steps/s of an impala run in ``pairs`` windows, each paired with a ceiling measured
    right before it while the whole run is paused (SIGSTOP to its process group): this
    machine's speed drifts by 10-20% from one few-second window to the next, and only a
    ratio of rates measured side by side in time is reproducible."""
    run_dir = Path(tempfile.mkdtemp(prefix="mprl-throughput-")) / "run"
    args = [
        sys.executable, "-m", "mprl", "run", "--plugin", "impala", "--env", ENV,
        "--workers", str(workers), "--total-steps", "1e12", "--set", f"envs_per_worker={n_envs}",
        "--set", "lr=1e-7", "--run-dir", str(run_dir), "--quiet", "--checkpoint-every", "0",
        *(a for kv in sets for a in ("--set", kv)),
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    metrics = run_dir / "metrics.jsonl"
    ceilings: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(warmup_s)
        for _ in range(pairs):
            os.killpg(proc.pid, signal.SIGSTOP)
            try:
                ceilings.append(ceiling(n_envs, window_s))
            finally:
                os.killpg(proc.pid, signal.SIGCONT)
            time.sleep(window_s)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    if proc.returncode != 130:
        raise RuntimeError(f"impala run failed ({proc.returncode}): {stderr}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    shutil.rmtree(run_dir.parent, ignore_errors=True)  # a temp run directory
    # the pauses are the gaps in the episode records: the warm-up, then one segment a window
    windows = _segments([r for r in records if "episode_return" in r], window_s / 2)[1:]
    if len(windows) != pairs:
        raise RuntimeError(f"expected {pairs} windows between pauses, found {len(windows)}")
    rates = [(w[-1]["step"] - w[0]["step"]) / (w[-1]["wall"] - w[0]["wall"]) for w in windows]
    learner = [
        r for r in records if r["source"] == "trainer" and windows[0][0]["wall"] <= r["wall"]
    ]
    a, b = learner[0]["wall"], learner[-1]["wall"]
    # the run's time between those two records, less the pauses (no update happens in one)
    active = sum(max(0.0, min(b, w[-1]["wall"]) - max(a, w[0]["wall"])) for w in windows)
    return {
        "steps_per_s": rates,
        "ceiling_steps_per_s": ceilings,
        "learner_updates_per_s": (learner[-1]["updates"] - learner[0]["updates"])
        / max(active, 1e-9),
        "staleness": float(np.mean([r["staleness"] for r in learner])),
    }


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for n_envs in sorted({r["envs_per_worker"] for r in rows}):
        sub = [r for r in rows if r["envs_per_worker"] == n_envs]
        ax.plot([r["workers"] for r in sub], [r["ratio"] for r in sub], "o-", label=f"E={n_envs}")
    ax.axhline(0.9, color="grey", linestyle="--", label="target 0.9")
    ax.set_xlabel("workers")
    ax.set_ylabel("steps/s / (min(workers, cores) x ceiling)")
    ax.set_title(f"impala throughput vs bare-process ceiling ({os.cpu_count()} cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--pairs", type=int, default=9, help="framework/ceiling window pairs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/throughput"))
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="an impala config field for the framework runs (repeatable)",
    )  # fmt: skip
    args = parser.parse_args()
    sets = config.parse_assignments(args.sets)
    cores = os.cpu_count() or 1
    bare, capacity = {}, {}
    for n_envs in args.envs:
        before = ceiling(n_envs, args.window_s)
        together = side_by_side(cores, n_envs, args.window_s)
        learner = learner_capacity(
            config.build(ImpalaConfig, {**sets, "envs_per_worker": n_envs}), args.window_s
        )
        alone = (before + ceiling(n_envs, args.window_s)) / 2  # around it: the speed drifts
        bare[n_envs] = together / (cores * alone)
        capacity[n_envs] = learner / alone
    rows = []
    for n_envs in args.envs:
        for workers in args.workers:
            fw = framework(workers, n_envs, args.warmup_s, args.window_s, args.pairs, args.sets)
            ratios = [
                f / (min(workers, cores) * c)
                for f, c in zip(fw["steps_per_s"], fw["ceiling_steps_per_s"], strict=True)
            ]
            row = {
                "workers": workers,
                "envs_per_worker": n_envs,
                "ceiling_steps_per_s": round(statistics.median(fw["ceiling_steps_per_s"]), 1),
                "framework_steps_per_s": round(statistics.median(fw["steps_per_s"]), 1),
                "ratio": round(statistics.median(ratios), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
                "learner_updates_per_s": round(fw["learner_updates_per_s"], 1),
                "staleness": round(fw["staleness"], 2),
                "learner_bound": round(learner_bound(workers, cores, capacity[n_envs]), 3),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{cores} cores; ratio = framework / (min(workers, cores) * ceiling)")
    head = ("workers", "envs/worker", "ceiling steps/s", "framework steps/s", "ratio")
    tail = ("ratio min-max", "learner bound", "updates/s", "staleness")
    print("| " + " | ".join((*head, *tail)) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workers']} | {r['envs_per_worker']} | {r['ceiling_steps_per_s']:,.0f} | "
            f"{r['framework_steps_per_s']:,.0f} | {r['ratio']:.2f} | "
            f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f} | {r['learner_bound']:.2f} | "
            f"{r['learner_updates_per_s']:.1f} | {r['staleness']:.2f} |"
        )
    print(f"\nthe machine's own bound: {cores} bare processes side by side")
    for n_envs, ratio in bare.items():
        print(f"- E={n_envs}: {ratio:.2f} of {cores} x ceiling")
    print("the learner alone (one thread), samples/s per ceiling step/s:")
    for n_envs, k in capacity.items():
        print(f"- E={n_envs}: {k:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "cores": cores,
        "rows": rows,
        "bare_side_by_side_ratio": {str(n): round(r, 3) for n, r in bare.items()},
        "learner_capacity_per_ceiling": {str(n): round(k, 3) for n, k in capacity.items()},
    }
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
