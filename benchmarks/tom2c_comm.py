"""ToM2C with its message step against ToM2C without it and against mappo, at equal env steps.

On ``mpe2:simple_spread_v3(N=n)`` for each ``--agents`` n, each ``--seeds`` seed and each case,
one ``python -m mprl run`` of ``--steps`` env steps (team steps), the cases of a seed back to
back so a change of the machine's load touches all of them alike:

- ``tom2c``: the example's defaults (``comm=true``: each agent decides whom to send the goal it
  pursues, and what it receives enters its actor and its next choice of goal);
- ``tom2c comm=false``: the same model and training, no messages (the ablation);
- ``mappo``: mprl's built-in mappo, its defaults.

Per run: the team return (the mean of the agents' returns) over the last ``--window`` training
episodes, and for tom2c the ToM accuracy (the share of the ToM's inferences that name the goal
the other agent was pursuing, on each update's batch before the ToM trains on it) and the
messages sent per team step, both as the mean of the last 5 updates; env steps/s from the run's
summary. The tables give the median over seeds with the min-max.

    pip install -e examples/mprl-tom2c
    python benchmarks/tom2c_comm.py --agents 3,5 --seeds 0,1,2 --steps 100000

Writes ``--out`` (JSON, default ``benchmarks/results/tom2c_comm.json``) and the tables next to it
(``.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _stats import median_range

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "tom2c_comm.json"
CASES = {
    "tom2c": ["--plugin", "tom2c"],
    "tom2c comm=false": ["--plugin", "tom2c", "--set", "comm=false"],
    "mappo": ["--plugin", "mappo"],
}
LAST_UPDATES = 5


def one_run(case: str, agents: int, seed: int, steps: int, work: Path) -> dict[str, Any]:
    run_dir = work / f"{case.replace(' ', '_')}-N{agents}-seed{seed}"
    env = f"mpe2:simple_spread_v3(N={agents}, max_cycles=25)"
    cmd = [sys.executable, "-m", "mprl", "run", *CASES[case], "--env", env, "--seed", str(seed),
           "--total-steps", str(steps), "--target-return", "1e9", "--quiet",
           "--run-dir", str(run_dir)]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{case} N={agents} seed {seed} failed:\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "case": case, "agents": agents, "seed": seed, "records": records, "summary": summary,
        "wall_s": wall,
    }  # fmt: skip


def measures(run: dict[str, Any], window: int) -> dict[str, float | None]:
    records = run["records"]
    returns = [r["episode_return"] for r in records if "episode_return" in r]
    updates = [r for r in records if "tom_accuracy" in r][-LAST_UPDATES:]

    def last(key: str) -> float | None:
        values = [r[key] for r in updates if key in r]
        return statistics.fmean(values) if values else None

    summary = run["summary"]
    return {
        "team_return": statistics.fmean(returns[-window:]) if returns else None,
        "first_return": statistics.fmean(returns[:window]) if returns else None,
        "tom_accuracy": last("tom_accuracy"),
        "tom_nearest_now": last("tom_nearest_now"),
        "messages_per_step": last("messages_per_step"),
        "env_steps": summary["env_steps"],
        "steps_per_s": summary["env_steps"] / max(summary["wall_s"], 1e-9),
    }


def tables(results: list[dict[str, Any]], steps: int) -> str:
    lines = []
    for agents in sorted({r["agents"] for r in results}):
        lines += [
            f"### N={agents}: {steps:,} env steps, median (min-max) over "
            f"{len({r['seed'] for r in results})} seeds",
            "",
            "| case | team return, first episodes | team return, last episodes | ToM accuracy "
            "| ToM: nearest-landmark guess | messages per step | env steps/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for case in CASES:
            mine = [r["measures"] for r in results if r["agents"] == agents and r["case"] == case]
            if not mine:
                continue
            cells = [
                median_range([m["first_return"] for m in mine], ".1f", " to "),
                median_range([m["team_return"] for m in mine], ".1f", " to "),
                median_range([m["tom_accuracy"] for m in mine], ".2f"),
                median_range([m["tom_nearest_now"] for m in mine], ".2f"),
                median_range([m["messages_per_step"] for m in mine], ".2f"),
                median_range([m["steps_per_s"] for m in mine], ",.0f"),
            ]
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="3,5", help="N of simple_spread, comma-separated")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per run")
    parser.add_argument("--cases", default=",".join(CASES), help="of: " + ", ".join(CASES))
    parser.add_argument("--window", type=int, default=300, help="episodes of a team return")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    cases = [c.strip() for c in args.cases.split(",")]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="tom2c-comm-") as tmp:
        for agents in [int(a) for a in args.agents.split(",")]:
            for seed in [int(s) for s in args.seeds.split(",")]:
                for case in cases:
                    run = one_run(case, agents, seed, args.steps, Path(tmp))
                    run["measures"] = measures(run, args.window)
                    del run["records"]
                    results.append(run)
                    m = run["measures"]
                    print(f"N={agents} seed {seed} {case}: return {m['team_return']:.1f}, "
                          f"ToM {m['tom_accuracy']}, messages {m['messages_per_step']}, "
                          f"{m['steps_per_s']:,.0f} env steps/s", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"steps": args.steps, "runs": results}, indent=1))
    text = tables(results, args.steps)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
