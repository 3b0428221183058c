"""mprl's mappo against BenchMARL's MAPPO (and a random policy) on PettingZoo MPE simple_spread.

One invocation runs every system, seeds interleaved (seed 0: mprl, benchmarl, random; seed 1:
...), each as its own process except the random policy, for the largest of ``--budgets`` wall
seconds; the team return at each smaller budget is read off the same run's curve (neither
system's settings depend on the budget: no schedule is tied to it). The env: ``simple_spread_v3``
with 3 agents, 3 landmarks, ``max_cycles=25``, ``local_ratio=0.5``, discrete actions; an env
step is one step of the whole team.

Systems (``--systems``):

- ``mprl``: ``python -m mprl run --plugin mappo --env mpe2:simple_spread_v3 --seed S
  --max-time B --quiet --run-dir DIR``, its defaults; the curve from ``DIR/metrics.jsonl``'s
  episode records (``wall``, ``step``, ``episode_return``: the mean of the agents' returns).
- ``mprl-ray``: the same with ``--backend ray``; ``tom2c``: ``--plugin tom2c``.
- ``benchmarl``: ``benchmarks/_benchmarl_run.py`` in BenchMARL's own virtual environment
  (``--benchmarl-python``): its default MAPPO on ``PettingZooTask.SIMPLE_SPREAD`` (see that
  file); team return as BenchMARL logs it (``episode_reward_mean``: the mean over agents of
  each agent's episode return), the same definition as mprl's.
- ``random``: uniform random actions in this process (mpe2's ``simple_spread_v3.parallel_env``)
  for ``min(budget, --random-cap-s)``: it does not learn, so a longer run only narrows its mean.

A system that is not installed (no mappo/tom2c plugin, no Ray backend, no BenchMARL venv) is
skipped with a line saying why. Each system's clock starts after its imports, before it builds
its envs and processes (``wall_total_s`` is the whole subprocess); ``final return at B`` is the
mean team return of the last 100 training episodes finished within B seconds on that clock.

    python benchmarks/marl.py --budgets 300,900 --seeds 0,1,2           # the benchmark
    python benchmarks/marl.py --budgets 60 --seeds 0 --systems benchmarl,random  # a smoke run

Writes ``--out`` (JSON, default ``benchmarks/results/marl.json``), a markdown table next to it
(``.md``) and, with matplotlib, a plot (``.png``): team return against wall seconds and
against env steps, one line per run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUNNER = Path(__file__).resolve().parent / "_benchmarl_run.py"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "marl.json"
DEFAULT_BENCHMARL_PYTHON = "/work/benchmarl-venv/bin/python"
ENV = "mpe2:simple_spread_v3"
ENV_KWARGS = {"N": 3, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": False}
SYSTEMS = ("mprl", "benchmarl", "random", "mprl-ray", "tom2c")
LABELS = {
    "mprl": "mprl mappo",
    "mprl-ray": "mprl mappo (ray)",
    "tom2c": "mprl tom2c",
    "benchmarl": "BenchMARL MAPPO",
    "random": "random",
}
WINDOW = 100  # episodes in a "final return"
GRACE_S = 60.0  # past the budget before a run is interrupted (imports, set-up, the last step)
POINTS = 60  # curve points over the largest budget

Episode = tuple[float, int, float]  # (wall seconds, env steps so far, team return)


# --- which systems can run --------------------------------------------------------------------


def mprl_plugins() -> tuple[set[str], set[str]]:
    """The algorithms and backends ``python -m mprl plugins`` lists."""
    out = subprocess.run(
        [sys.executable, "-m", "mprl", "plugins"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    algorithms: set[str] = set()
    backends: set[str] = set()
    for line in out.splitlines():
        key, _, value = line.strip().partition(":")
        names = {w.split()[0] for w in value.split(",") if w.strip() and w.strip() != "-"}
        if key == "algorithms":
            algorithms |= names
        elif key == "backends":
            backends |= names
    return algorithms, backends


def skip_reason(system: str, args: argparse.Namespace, plugins: tuple[set, set]) -> str | None:
    algorithms, backends = plugins
    if system in ("mprl", "mprl-ray") and "mappo" not in algorithms:
        return "mprl's mappo plugin is not installed (`python -m mprl plugins` lists no mappo)"
    if system == "mprl-ray":
        if "ray" not in backends:
            return "mprl's ray backend is not registered"
        try:
            import ray  # noqa: F401
        except ImportError:
            return 'Ray is not installed (pip install "mprl[ray]")'
    if system == "tom2c" and "tom2c" not in algorithms:
        return "mprl's tom2c plugin is not installed (`python -m mprl plugins` lists no tom2c)"
    if system == "benchmarl" and not Path(args.benchmarl_python).exists():
        return f"no BenchMARL venv: {args.benchmarl_python} (see benchmarks/README.md)"
    return None


# --- running one system -----------------------------------------------------------------------


def run_process(cmd: list[str], log: Path, limit_s: float) -> tuple[int | None, float, bool]:
    """Run ``cmd`` (output to ``log``); SIGINT it after ``limit_s``, SIGKILL 20 s later.
    Returns (exit code, wall seconds of the whole process, whether it was interrupted)."""
    start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        interrupted = False
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            interrupted = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return proc.returncode, time.monotonic() - start, interrupted


def run_mprl(system: str, seed: int, budget: float, work: Path) -> dict[str, Any]:
    run_dir = work / f"{system}-seed{seed}"
    plugin = "tom2c" if system == "tom2c" else "mappo"
    cmd = [sys.executable, "-m", "mprl", "run", "--plugin", plugin, "--env", ENV]
    cmd += ["--seed", str(seed), "--max-time", str(budget), "--quiet", "--run-dir", str(run_dir)]
    if system == "mprl-ray":
        cmd += ["--backend", "ray"]
    rc, total, interrupted = run_process(cmd, work / f"{system}-seed{seed}.log", budget + GRACE_S)
    episodes: list[Episode] = []
    last_wall, last_steps = 0.0, 0
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill
                continue
            wall, steps = rec.get("wall"), rec.get("step")
            if isinstance(wall, int | float) and isinstance(steps, int | float):
                last_wall, last_steps = max(last_wall, wall), max(last_steps, int(steps))
            ret = rec.get("episode_return")
            if isinstance(ret, int | float) and wall is not None:
                episodes.append((float(wall), int(steps or 0), float(ret)))
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    env_steps = int(summary.get("env_steps", last_steps))
    wall_s = float(summary.get("wall_s", last_wall))
    return {
        "cmd": cmd,
        "rc": rc,
        "interrupted": interrupted,
        "wall_total_s": round(total, 2),
        "wall_s": round(wall_s, 2),
        "env_steps": env_steps,
        "steps_per_s": env_steps / wall_s if wall_s > 0 else math.nan,
        "status": summary.get("status"),
        "stop_reason": summary.get("stop_reason"),
        "run_dir": str(run_dir),
        "episodes": episodes,
    }


def run_benchmarl(seed: int, budget: float, work: Path, args: argparse.Namespace) -> dict:
    out = work / f"benchmarl-seed{seed}.json"
    cmd = [args.benchmarl_python, str(RUNNER), "--seed", str(seed), "--budget-s", str(budget)]
    cmd += ["--out", str(out), "--save-folder", str(work / f"benchmarl-seed{seed}")]
    if args.benchmarl_threads:
        cmd += ["--torch-threads", str(args.benchmarl_threads)]
    rc, total, interrupted = run_process(cmd, work / f"benchmarl-seed{seed}.log", budget + GRACE_S)
    data = json.loads(out.read_text()) if out.exists() else {"curve": []}
    episodes = [
        (float(p["wall_s"]), int(p["env_steps"]), float(r))
        for p in data["curve"]
        for r in p["team_returns"]
    ]
    curve = data.pop("curve")
    env_steps = int(data.get("env_steps") or 0)
    # its clock when it stopped (past the last batch's collection: that batch's training)
    stopped = data.get("stopped_s") or (budget if interrupted else data.get("wall_s"))
    wall_s = min(budget, float(stopped or 0.0))
    collect_s = sum(p["collect_s"] for p in curve)
    return {
        "cmd": cmd,
        "rc": rc,
        "interrupted": interrupted,
        "wall_total_s": round(total, 2),
        "wall_s": wall_s,
        "env_steps": env_steps,
        "steps_per_s": env_steps / wall_s if wall_s > 0 else math.nan,
        "collect_steps_per_s": env_steps / collect_s if collect_s > 0 else math.nan,
        "iterations": [{k: v for k, v in p.items() if k != "team_returns"} for p in curve],
        "benchmarl": data,  # task, config, import and set-up seconds, stop reason
        "episodes": episodes,
    }


def run_random(seed: int, seconds: float) -> dict[str, Any]:
    """Uniform random actions on mpe2's simple_spread_v3 for ``seconds`` wall seconds."""
    import numpy as np
    from mpe2 import simple_spread_v3

    start = time.monotonic()
    env = simple_spread_v3.parallel_env(**ENV_KWARGS)
    env.reset(seed=seed)
    spaces = {a: env.action_space(a) for a in env.possible_agents}
    for i, space in enumerate(spaces.values()):
        space.seed(seed * 1000 + i)
    returns = dict.fromkeys(env.possible_agents, 0.0)
    episodes: list[Episode] = []
    steps = 0
    while True:
        wall = time.monotonic() - start
        if wall >= seconds:
            break
        _, rewards, terminated, truncated, _ = env.step({a: spaces[a].sample() for a in env.agents})
        steps += 1
        for agent, reward in rewards.items():
            returns[agent] += reward
        if not env.agents or all(terminated[a] or truncated[a] for a in rewards):
            team = float(np.mean(list(returns.values())))
            episodes.append((time.monotonic() - start, steps, team))
            returns = dict.fromkeys(env.possible_agents, 0.0)
            env.reset()
    env.close()
    return {
        "wall_s": round(wall, 2),
        "wall_total_s": round(wall, 2),
        "env_steps": steps,
        "steps_per_s": steps / wall if wall > 0 else math.nan,
        "episodes": episodes,
    }


# --- numbers from a run ----------------------------------------------------------------------


def at_budget(episodes: Sequence[Episode], budget: float) -> dict[str, Any]:
    """The mean team return of the last 100 episodes finished within ``budget`` seconds, and
    the env steps by then."""
    within = [e for e in episodes if e[0] <= budget]
    last = [r for _, _, r in within[-WINDOW:]]
    return {
        "return": sum(last) / len(last) if last else None,
        "episodes": len(within),
        "env_steps": max((s for _, s, _ in within), default=0),
    }


def curve(episodes: Sequence[Episode], horizon: float) -> list[dict[str, Any]]:
    """Points every ``horizon / POINTS`` seconds: the mean of the last 100 returns by then."""
    points = []
    for k in range(1, POINTS + 1):
        t = horizon * k / POINTS
        point = at_budget(episodes, t)
        if point["return"] is not None:
            points.append({"wall_s": round(t, 2), **point})
    return points


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {"mean": statistics.fmean(xs), "sd": sd, "min": min(xs), "max": max(xs), "n": len(xs)}


def aggregate(runs: list[dict[str, Any]], budgets: list[float]) -> dict[str, Any]:
    """Per system: steps/s and, per budget, the final return and env steps over seeds; each
    system's ratios to BenchMARL's means, and its share of BenchMARL's gain over random."""
    table: dict[str, Any] = {}
    for system in dict.fromkeys(r["system"] for r in runs):
        mine = [r for r in runs if r["system"] == system]
        table[system] = {
            "seeds": [r["seed"] for r in mine],
            "steps_per_s": spread([r["steps_per_s"] for r in mine]),
            "budgets": {
                str(int(b)): {
                    "return": spread([r["at"][str(int(b))]["return"] for r in mine]),
                    "env_steps": spread([r["at"][str(int(b))]["env_steps"] for r in mine]),
                }
                for b in budgets
            },
        }
    ref, rnd = table.get("benchmarl"), table.get("random")
    for row in table.values():
        row["x_benchmarl"] = ratios = {}
        if ref is None:
            continue
        ratios["steps_per_s"] = _ratio(row["steps_per_s"]["mean"], ref["steps_per_s"]["mean"])
        for b, cell in row["budgets"].items():
            mine, theirs = cell["return"]["mean"], ref["budgets"][b]["return"]["mean"]
            ratios[f"return_{b}"] = _ratio(mine, theirs)
            ratios[f"env_steps_{b}"] = _ratio(
                cell["env_steps"]["mean"], ref["budgets"][b]["env_steps"]["mean"]
            )
            if rnd is not None:
                base = rnd["budgets"][b]["return"]["mean"]
                gain = None if None in (mine, theirs, base) else theirs - base
                ratios[f"gain_{b}"] = _ratio(None if gain is None else mine - base, gain)
    return table


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


# --- output ----------------------------------------------------------------------------------


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def markdown(table: dict[str, Any], budgets: list[float]) -> str:
    head = ["system", "seeds", "env steps/s"]
    for b in budgets:
        head += [
            f"return @{int(b)} s (mean ± sd)",
            f"min..max @{int(b)} s",
            f"env steps @{int(b)} s",
        ]
    head += ["x BenchMARL steps/s"]
    for b in budgets:
        head += [f"x BenchMARL return @{int(b)} s", f"gain over random @{int(b)} s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, row in table.items():
        sps = row["steps_per_s"]
        cells = [LABELS.get(system, system), str(len(row["seeds"]))]
        cells.append(f"{_num(sps['mean'], 0)} ± {_num(sps['sd'], 0)}")
        for b in budgets:
            cell = row["budgets"][str(int(b))]
            ret = cell["return"]
            cells += [
                f"{_num(ret['mean'])} ± {_num(ret['sd'])}",
                f"{_num(ret['min'])}..{_num(ret['max'])}",
                _num(cell["env_steps"]["mean"], 0),
            ]
        ratios = row["x_benchmarl"]
        cells.append(_num(ratios.get("steps_per_s")))
        for b in budgets:
            cells += [_num(ratios.get(f"return_{int(b)}")), _num(ratios.get(f"gain_{int(b)}"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = dict(zip(SYSTEMS, ("C0", "C1", "C7", "C2", "C3"), strict=True))
    seen: set[str] = set()
    for run in runs:
        points = run["curve"]
        if not points:
            continue
        system = run["system"]
        label = None if system in seen else LABELS.get(system, system)
        seen.add(system)
        ys = [p["return"] for p in points]
        style = {"color": colors.get(system), "alpha": 0.8, "lw": 1.2}
        axes[0].plot([p["wall_s"] for p in points], ys, label=label, **style)
        axes[1].plot([p["env_steps"] for p in points], ys, **style)
    axes[0].set_xlabel("wall seconds (each system's own clock)")
    axes[1].set_xlabel("env steps (team steps)")
    axes[1].set_xscale("symlog", linthresh=1e4)
    for ax in axes:
        ax.set_ylabel(f"team return (mean of last {WINDOW} episodes)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("simple_spread_v3 (3 agents, 25 steps, discrete): one line per run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="300,900", help="wall seconds, comma separated")
    parser.add_argument("--seeds", default="0,1,2", help="comma separated")
    parser.add_argument(
        "--systems", default="mprl,benchmarl,random", help=f"any of {','.join(SYSTEMS)}"
    )
    parser.add_argument("--benchmarl-python", default=DEFAULT_BENCHMARL_PYTHON)
    parser.add_argument(
        "--benchmarl-threads", type=int, default=0, help="BenchMARL's torch threads (0: default)"
    )
    parser.add_argument(
        "--random-cap-s", type=float, default=60.0, help="random policy's seconds (0: budget)"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="run dirs and logs (tmp)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    args = parser.parse_args(argv)
    args.budgets = sorted(float(b) for b in args.budgets.split(","))
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="mprl-marl-"))
    work.mkdir(parents=True, exist_ok=True)
    horizon = args.budgets[-1]
    plugins = mprl_plugins()
    systems, skipped = [], {}
    for system in args.systems:
        reason = skip_reason(system, args, plugins)
        if reason:
            skipped[system] = reason
            print(f"skipping {system}: {reason}", flush=True)
        else:
            systems.append(system)
    print(
        f"budgets {args.budgets} s, seeds {args.seeds}, systems {systems}; runs of {horizon:.0f} s "
        f"each (about {len(args.seeds) * len(systems) * (horizon + 15) / 60:.0f} min); "
        f"logs in {work}",
        flush=True,
    )
    runs = []
    for seed in args.seeds:
        for system in systems:
            if system == "benchmarl":
                run = run_benchmarl(seed, horizon, work, args)
            elif system == "random":
                run = run_random(seed, min(horizon, args.random_cap_s or horizon))
            else:
                run = run_mprl(system, seed, horizon, work)
            episodes = run.pop("episodes")
            run.update(system=system, seed=seed, episodes=len(episodes))
            run["at"] = {str(int(b)): at_budget(episodes, b) for b in args.budgets}
            if system == "random":  # no learning: every budget gets the whole run's mean
                whole = [r for _, _, r in episodes]
                mean = sum(whole) / len(whole) if whole else None
                for cell in run["at"].values():
                    cell["return"] = mean
            run["curve"] = curve(episodes, horizon if system != "random" else run["wall_s"])
            runs.append(run)
            finals = ", ".join(f"@{b}s {_num(c['return'])}" for b, c in run["at"].items())
            print(
                f"seed {seed} {system}: {run['env_steps']:,} env steps in {run['wall_s']:.0f} s "
                f"({run['steps_per_s']:,.0f}/s), {len(episodes):,} episodes; team return {finals}"
                + (f"; exit {run['rc']}" if run.get("rc") not in (None, 0) else ""),
                flush=True,
            )
    table = aggregate(runs, args.budgets)
    md = markdown(table, args.budgets)
    print("\n" + md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "env": ENV,
        "env_kwargs": ENV_KWARGS,
        "budgets_s": args.budgets,
        "seeds": args.seeds,
        "skipped": skipped,
        "window": WINDOW,
        "table": table,
        "runs": runs,
        "work_dir": str(work),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    args.out.write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".md").write_text(md)
    png = args.out.with_suffix(".png")
    print(
        f"wrote {args.out}, {args.out.with_suffix('.md')}" + (f", {png}" if plot(runs, png) else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
