"""Start-up, measured: from ``python -m mprl run`` to the first env step and the first update.

    python benchmarks/startup.py [--workers 1,2,4] [--backends local,ray] [--repeats 3]
                                 [--start-methods forkserver] [--no-sb3]

Each repeat runs, in a fresh interpreter each and interleaved (repeat 1: every case, repeat 2:
every case, ...), ``python -m mprl run --plugin P --workers N --total-steps S --quiet`` with
``MPRL_TIMELINE`` set (:mod:`mprl.timeline`: every process of the run appends a line as it
passes a mark), and SB3 PPO's first step (``--no-sb3`` leaves it out). The clock starts just
before the subprocess is started. Phases, in seconds:

``imports``       interpreter start and the CLI's imports (torch included), up to ``main()``
``plugins``       plugin discovery (entry points, pluggy registration)
``prepare``       job preparation: config, env spaces, model and optimizer, the backend's checks
                  (on Ray: ``import ray`` and starting or joining it)
``state``         the shared state built (the Manager server started, when the schema needs one)
``launch``        from the first child started to the last (``--start-interval`` sleeps count here)
``child``         per child, median over children: its start (fork from the forkserver, or
                  spawn and imports), the context unpickled, to the function about to run
``env``           per child: from the function's start to its first ``env.step`` returned
``first step``    command start to the first env step of any child
``first update``  command start to the first optimizer step of any process
``exit``          command start to the process's exit, for ``--total-steps S``

SB3: ``python -c`` that imports stable_baselines3, builds ``PPO("MlpPolicy", 8 envs of
CartPole-v1)`` (the rl-zoo setting of time_to_solve.py) and calls ``learn``; its first
``env.step`` is marked by a wrapper. Printed: each phase as median (min-max) over the repeats,
and the ratio of mprl's first step to SB3's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _baseline
from benchmarks._stats import median_range

PLUGIN = {"local": "a3c", "ray": "ppo"}  # a3c is Hogwild: one machine only

SB3_FIRST_STEP = r"""
import json, os, sys, time
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

class First(gym.Wrapper):
    done = False
    def step(self, action):
        out = self.env.step(action)
        if not First.done:
            First.done = True
            print(json.dumps({"first_step": time.time()}), flush=True)
        return out

env = make_vec_env("CartPole-v1", n_envs=8, seed=0, wrapper_class=First)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, seed=0, verbose=0)
model.learn(total_timesteps=256)
"""


def mprl_once(
    backend: str, workers: int, method: str, steps: int, out: Path, tree: str | None = None
) -> dict[str, Any]:
    """One run (of the mprl source ``tree`` when given, else the installed one); its phases in
    seconds from the command's start."""
    timeline, run_dir = out / "timeline.jsonl", out / "run"
    env = {**os.environ, "MPRL_TIMELINE": str(timeline)}
    if tree:  # its mprl, its plugins and its entry points first (the run's cwd is a temp dir)
        env = _baseline.environ(tree, env)
    cmd = [
        sys.executable, "-m", "mprl", "run", "--plugin", PLUGIN[backend], "--workers",
        str(workers), "--total-steps", str(steps), "--backend", backend, "--quiet",
        "--run-dir", str(run_dir), "--seed", "0",
    ]  # fmt: skip
    if backend == "local":
        cmd += ["--start-method", method]
    start = time.time()
    done = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, timeout=300)
    end = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    marks = [json.loads(line) for line in timeline.read_text().splitlines()]
    return phases(marks, start, end)


def phases(marks: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """The phases of one run's timeline (see the module's docstring)."""

    def first(name: str, source: str | None = None) -> float | None:
        times = [m["t"] for m in marks if m["mark"] == name and source in (None, m.get("source"))]
        return min(times) - start if times else None

    def last(name: str) -> float | None:
        times = [m["t"] for m in marks if m["mark"] == name]
        return max(times) - start if times else None

    sources = sorted({m["source"] for m in marks if m["mark"] == "launch"})
    child, env = [], []
    for source in sources:
        launched, ready = first("launch", source), first("child-ready", source)
        stepped = first("env-step", source)
        if launched is not None and ready is not None:
            child.append(ready - launched)
        if ready is not None and stepped is not None:
            env.append(stepped - ready)
    main, plugins, prepared, state = (first(n) for n in ("main", "plugins", "prepared", "state"))
    return {
        "imports": main,
        "plugins": plugins - main if plugins and main else None,
        "prepare": prepared - plugins if prepared and plugins else None,
        "state": state - prepared if state and prepared else None,
        "launch": last("launch") - first("launch") if sources else None,  # type: ignore[operator]
        "child": statistics.median(child) if child else None,
        "env": statistics.median(env) if env else None,
        "first step": first("env-step"),
        "first update": first("update"),
        "exit": end - start,
    }


def sb3_once(out: Path) -> dict[str, Any]:
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-c", SB3_FIRST_STEP], cwd=out, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    end = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"SB3 exited {done.returncode}:\n{done.stderr[-2000:]}")
    stamp = json.loads(done.stdout.strip().splitlines()[-1])["first_step"]
    return {"first step": stamp - start, "exit": end - start}


COLUMNS = ["imports", "plugins", "prepare", "state", "launch", "child", "env", "first step",
           "first update", "exit"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts [1,2,4]")
    parser.add_argument("--backends", default="local,ray", help="local and/or ray [both]")
    parser.add_argument(
        "--start-methods", default="forkserver",
        help="the local backend's, comma-separated (forkserver,spawn) [forkserver]",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000, help="--total-steps of each run")
    parser.add_argument("--no-sb3", action="store_true", help="leave SB3 PPO out")
    parser.add_argument("--out", help="write every run's phases here (JSON)")
    parser.add_argument(
        "--baseline", metavar="TREE",
        help="also run the mprl of this source tree (a `git worktree` of an older commit, with "
        "mprl/timeline.py and its marks), interleaved, as rows 'base ...'",
    )  # fmt: skip
    args = parser.parse_args()
    trees: list[str | None] = [None, *([args.baseline] if args.baseline else [])]
    cases: list[tuple[str, int, str, str | None]] = []
    for backend in args.backends.split(","):
        methods = args.start_methods.split(",") if backend == "local" else ["-"]
        for method in methods:
            for n in args.workers.split(","):
                cases += [(backend, int(n), method, tree) for tree in trees]
    if not args.no_sb3:
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            sys.exit('SB3 PPO is the baseline: pip install -e ".[bench]", or give --no-sb3')
    results: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for backend, workers, method, tree in cases:
            name = f"{backend} {method} {workers}w" if backend == "local" else f"ray {workers}w"
            name = f"base {name}" if tree else name
            with tempfile.TemporaryDirectory(prefix="mprl-startup-") as tmp:
                row = mprl_once(backend, workers, method, args.steps, Path(tmp), tree)
            results.setdefault(name, []).append(row)
            print(f"[{repeat + 1}/{args.repeats}] {name}: first step {row['first step']:.2f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
        if not args.no_sb3:
            with tempfile.TemporaryDirectory(prefix="mprl-startup-") as tmp:
                row = sb3_once(Path(tmp))
            results.setdefault("sb3 ppo", []).append(row)
            print(f"[{repeat + 1}/{args.repeats}] sb3 ppo: first step {row['first step']:.2f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    cores = os.cpu_count()
    print(f"seconds from the command's start, median of {args.repeats} repeats; {cores} cores")
    print(f"{'':<22}" + "".join(f"{c:>13}" for c in COLUMNS))
    for name, rows in results.items():
        cells = []
        for column in COLUMNS:
            values = [r[column] for r in rows if r.get(column) is not None]
            cells.append(f"{statistics.median(values):13.2f}" if values else f"{'-':>13}")
        print(f"{name:<22}" + "".join(cells))
    sb3 = [r["first step"] for r in results.get("sb3 ppo", [])]
    print("\nfirst step, median (min-max); and / SB3 PPO's first step (its median)")
    for name, rows in results.items():
        firsts = [r["first step"] for r in rows]
        ratio = median_range([f / statistics.median(sb3) for f in firsts]) if sb3 else "-"
        print(f"  {name:<22} {median_range(firsts):<20} {ratio}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
