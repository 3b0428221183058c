"""The Ray backend against the local backend and SB3 PPO, in one run (issue "Ray backend").

For each seed, interleaved so background load hits every system alike, one run of each system
until CartPole-v1 is solved (or ``--cap-s``):

``local``      ``python -m mprl run --plugin impala --workers W`` (spawned processes)
``ray``        the same with ``--backend ray`` and no address: a Ray runtime started for the run
``cluster``    the same joined to ``--address`` (e.g. two ``ray start`` nodes), when given
``ray-calls``  ``ray`` with ``--no-shared-memory`` (every rollout a Ray call, as between
               machines), with ``--calls``
``ray-base``   ``ray`` with the mprl of ``--baseline TREE`` (a ``git worktree`` of an older
               commit), when given: a before/after of a change in the same invocation
               (``ray-calls-base`` too, with ``--calls``)
``sb3_ppo``    Stable-Baselines3 PPO, rl-zoo settings (``time_to_solve.run_sb3``)

Reported per run, from the run directory and ``/proc``:

- ``solve_s``: the run's clock when solved; ``total_s``: the whole command, start-up included;
- ``learn_s``: from the first finished episode to solved (``solve_s`` without the start-up);
- ``first_step_s``: seconds from the command's start to the first finished episode (start-up:
  imports, Ray's start, actors placed and importing torch);
- ``collect_sps``: env steps per second from the first episode to the end (collection speed
  while it learns; on CartPole that is a second or two, mostly the start of collection);
- ``steady_sps``: env steps per second of a second run of ``--collect-s`` seconds that never
  solves (``--target-return 1e9``), from ``--warmup-s`` after its first episode to its end;
- ``driver_mb`` / ``child_mb``: the largest RSS of the main process and of one child (a Ray
  actor or a spawned child) seen while it ran.

Ratios are ray / local within each seed; the table gives their median and range.

``--plugin dqn --total-steps 20000 --sps-from 3000 --no-sb3``: the off-policy case (issue 28,
item 2). Each run takes the env-step budget instead of solving; ``collect_sps`` is measured from
the first episode past ``--sps-from`` steps (after ``learning_starts``, where the declared replay
ratio paces the workers), and ``replay_ratio`` is what the run kept: the rows its replay buffer
sampled per row added after ``learning_starts``, read from its final checkpoint.

Usage: ``python benchmarks/ray_backend.py --seeds 3 [--address HOST:PORT]``
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
from typing import Any

import _baseline
from _stats import median_range

sys.path.insert(0, str(Path(__file__).parent))
from time_to_solve import run_sb3

PLUGIN = "impala"


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children_of_run(driver: int) -> list[int]:
    """A run's children: Ray actor processes (any parent) or the driver's spawned children."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if cmd.startswith("ray::ChildActor") or (
            ppid == driver and "spawn_main" in cmd and "resource_tracker" not in cmd
        ):
            out.append(int(entry.name))
    return out


def replay_ratio(run_dir: Path) -> float | None:
    """Rows sampled per row added after ``learning_starts``, as the final checkpoint counts
    them (``None`` without a replay buffer that counts them)."""
    import torch

    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    starts = json.loads((run_dir / "config.json").read_text())["config"].get("learning_starts", 0)
    for field in saved.get("shared_state", {}).values():
        if isinstance(field, dict) and "sampled" in field and "added" in field:
            return round(int(field["sampled"]) / max(1, int(field["added"]) - starts), 2)
    return None


def _budget(total_steps: int) -> list[str]:
    return ["--total-steps", str(total_steps)] if total_steps else []


def _backend(system: str, address: str) -> list[str]:
    if system in ("ray", "ray-base"):
        return ["--backend", "ray"]
    if system in ("ray-calls", "ray-calls-base"):
        return ["--backend", "ray", "--no-shared-memory"]
    if system == "cluster":
        return ["--backend", "ray", "--ray-address", address]
    return []


def _env(system: str, baseline: str) -> dict[str, Any]:
    """``subprocess`` arguments: ``ray-base`` runs the mprl and plugins of the ``baseline``
    tree, from that tree (Ray puts the driver's working directory first on its actors' path:
    run from this checkout, the actors would import this checkout's mprl)."""
    if not system.endswith("-base"):
        return {"env": dict(os.environ)}
    return {"env": _baseline.environ(baseline), "cwd": baseline}


def steady(
    system: str, seed: int, workers: int, seconds: float, warmup: float, address: str,
    plugin: str, baseline: str,
) -> float | None:  # fmt: skip
    """Env steps/s of a run that never solves, from ``warmup`` s after its first episode."""
    run_dir = Path(tempfile.mkdtemp(prefix="raybench-")) / "run"
    cmd = [sys.executable, "-m", "mprl", "run", "--plugin", plugin, "--workers", str(workers)]
    cmd += ["--seed", str(seed), "--run-dir", str(run_dir), "--quiet", "--target-return", "1e9"]
    cmd += ["--max-time", str(seconds), *_backend(system, address)]
    subprocess.run(cmd, capture_output=True, text=True, timeout=600, **_env(system, baseline))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next((r["wall"] for r in records if "episode_return" in r), None)
    ticks = [
        (r["wall"], r["step"])
        for r in records
        if r["source"] == "main" and "steps_per_s" in r and first is not None
        and r["wall"] >= first + warmup
    ]  # fmt: skip
    if len(ticks) < 2:
        return None
    return round((ticks[-1][1] - ticks[0][1]) / (ticks[-1][0] - ticks[0][0]))


def run_mprl(
    system: str,
    seed: int,
    workers: int,
    cap_s: float,
    address: str,
    plugin: str = PLUGIN,
    total_steps: int = 0,
    sps_from: int = 0,
    baseline: str = "",
) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="raybench-")) / "run"
    cmd = [sys.executable, "-m", "mprl", "run", "--plugin", plugin, "--workers", str(workers)]
    cmd += ["--seed", str(seed), "--run-dir", str(run_dir), "--quiet"]
    cmd += _budget(total_steps)
    cmd += _backend(system, address)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        **_env(system, baseline),
    )  # fmt: skip
    driver_mb = child_mb = 0.0
    first_step_s = None
    while proc.poll() is None:
        driver_mb = max(driver_mb, _rss_mb(proc.pid))
        child_mb = max([child_mb, *(_rss_mb(p) for p in _children_of_run(proc.pid))])
        metrics = run_dir / "metrics.jsonl"
        if first_step_s is None and metrics.exists() and '"episode_return"' in metrics.read_text():
            first_step_s = time.monotonic() - t0
        if time.monotonic() - t0 > cap_s:
            proc.send_signal(2)
            break
        time.sleep(0.5)
    err = proc.communicate(timeout=60)[1]
    total_s = time.monotonic() - t0
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    episodes = [r for r in records if "episode_return" in r and r["step"] >= sps_from]
    first_wall = episodes[0]["wall"] if episodes else summary["wall_s"]
    span = max(1e-9, summary["wall_s"] - first_wall)
    first_step = episodes[0]["step"] if episodes else 0
    solved_at = summary.get("solved_at") or {}
    first_episode = next((r["wall"] for r in records if "episode_return" in r), None)
    solve_s = solved_at.get("wall_s")
    return {
        "system": system,
        "seed": seed,
        "solved": summary["solved"],
        "solve_s": solve_s,
        "learn_s": round(solve_s - first_episode, 3) if solve_s and first_episode else None,
        "total_s": round(total_s, 2),
        "first_step_s": round(first_step_s, 2) if first_step_s else None,
        "collect_sps": round((summary["env_steps"] - first_step) / span),
        "driver_mb": round(driver_mb),
        "child_mb": round(child_mb),
        "replay_ratio": replay_ratio(run_dir),
        "returncode": proc.returncode,
        "error": err[-500:] if proc.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cap-s", type=float, default=150.0)
    parser.add_argument("--address", default="", help="also run on this Ray cluster")
    parser.add_argument("--no-sb3", action="store_true")
    parser.add_argument("--plugin", default=PLUGIN)
    parser.add_argument("--total-steps", type=int, default=0, help="a budget (0: until solved)")
    parser.add_argument(
        "--sps-from", type=int, default=0, help="env steps/s counted from this step on"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ray_backend.json"))
    parser.add_argument(
        "--collect-s", type=float, default=20.0,
        help="seconds of each steady collection run (steady_sps); 0: none",
    )  # fmt: skip
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--baseline", default="", metavar="TREE", help="also run ray-base")
    parser.add_argument("--calls", action="store_true", help="also run ray-calls")
    args = parser.parse_args()
    systems = ["local", "ray"] + (["cluster"] if args.address else [])
    systems += ["ray-calls"] if args.calls else []
    systems += ["ray-base"] if args.baseline else []
    systems += ["ray-calls-base"] if args.baseline and args.calls else []
    rows: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        for system in systems:
            budget = (args.plugin, args.total_steps, args.sps_from, args.baseline)
            rows.append(run_mprl(system, seed, args.workers, args.cap_s, args.address, *budget))
            if args.collect_s:
                rows[-1]["steady_sps"] = steady(
                    system, seed, args.workers, args.collect_s, args.warmup_s, args.address,
                    args.plugin, args.baseline,
                )  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        if not args.no_sb3:
            sb3 = run_sb3("CartPole-v1", seed, args.cap_s, None)
            rows.append({"system": "sb3_ppo", "seed": seed, "solved": sb3.solved,
                         "solve_s": sb3.wall_s, "total_s": sb3.wall_total_s})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    by = {s: [r for r in rows if r["system"] == s] for s in [*systems, "sb3_ppo"]}
    print(f"\n{'system':<8} {'solve s':>20} {'learn s':>20} {'first step s':>20} "
          f"{'collect sps':>22} {'steady sps':>22} {'driver MB':>10} {'child MB':>9} "
          f"{'replay ratio':>20}")  # fmt: skip
    for system, runs in by.items():
        if not runs:
            continue
        print(
            f"{system:<8} {median_range([r['solve_s'] for r in runs]):>20} "
            f"{median_range([r.get('learn_s') for r in runs]):>20} "
            f"{median_range([r.get('first_step_s') for r in runs]):>20} "
            f"{median_range([r.get('collect_sps') for r in runs]):>22} "
            f"{median_range([r.get('steady_sps') for r in runs]):>22} "
            f"{median_range([r.get('driver_mb') for r in runs]):>10} "
            f"{median_range([r.get('child_mb') for r in runs]):>9} "
            f"{median_range([r.get('replay_ratio') for r in runs]):>20}"
        )
    for system in systems[1:]:
        print(f"\n{system} / local, per seed (median, range):")
        for key in ("collect_sps", "steady_sps", "solve_s", "learn_s", "first_step_s"):
            ratios = [
                ray[key] / local[key]
                for ray, local in zip(by[system], by["local"], strict=True)
                if ray.get(key) and local.get(key)
            ]
            print(f"  {key:<13} {median_range(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
