"""The ``threads`` example backend against ``local``, on envs stepped in C++ or C.

    python benchmarks/threads_backend.py [--repeats 3] [--steps 60000] [--workers 2]

Installs ``examples/mprl-threads`` into a temporary folder (``pip install --target``), then runs,
interleaved (repeat 1: every case, repeat 2: ...), ``python -m mprl run --plugin ppo --workers
N --total-steps S`` on each backend for each env, each in a fresh interpreter, and reads the
run's ``summary.json``: env steps per second of wall time (``env_steps / wall_s``, the run's
own clock, which starts before the children do) and the command's wall time. Printed: median
(min-max) per case, and the ratio threads / local per repeat.

The envs: CartPole stepped by EnvPool in C++ (``--env-batch envpool``, which releases the GIL
while it steps), and MuJoCo's HalfCheetah-v5 (``mujoco`` steps in C).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import median_range

REPO = Path(__file__).resolve().parent.parent
ENVS = {
    "envpool CartPole": ["--env", "CartPole-v1", "--env-batch", "envpool"],
    "HalfCheetah-v5": ["--env", "HalfCheetah-v5"],
}


def one(site: Path, backend: str, env: list[str], steps: int, workers: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        args = [sys.executable, "-m", "mprl", "run", "--plugin", "ppo", "--backend", backend,
                "--workers", str(workers), "--total-steps", str(steps), "--target-return", "1e9",
                "--run-dir", str(run_dir), "--quiet", *env]  # fmt: skip
        environ = {**os.environ, "PYTHONPATH": str(site)}
        start = time.monotonic()
        subprocess.run(args, env=environ, check=True, capture_output=True, cwd=tmp)
        wall = time.monotonic() - start
        summary = json.loads((run_dir / "summary.json").read_text())
    return {"steps_per_s": summary["env_steps"] / summary["wall_s"], "command_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(site), str(REPO / "examples" / "mprl-threads")],
                       check=True, capture_output=True)  # fmt: skip
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(args.repeats):
            for env, flags in ENVS.items():
                for backend in ("local", "threads"):
                    out = one(site, backend, flags, args.steps, args.workers)
                    results.setdefault((env, backend), []).append(out)
    for env in ENVS:
        for backend in ("local", "threads"):
            runs = results[(env, backend)]
            rate = median_range([r["steps_per_s"] for r in runs], ",.0f")
            took = median_range([r["command_s"] for r in runs], ".1f")
            print(f"{env:18} {backend:8} env steps/s {rate}   command s {took}")
        ratios = [
            t["steps_per_s"] / lo["steps_per_s"]
            for t, lo in zip(results[(env, "threads")], results[(env, "local")], strict=True)
        ]
        print(f"{env:18} threads / local: {median_range(ratios, '.2f')}x")


if __name__ == "__main__":
    main()
