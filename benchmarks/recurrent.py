"""Recurrent policies against feed-forward ones: env steps/s of ppo on CartPole-v1 and of mappo
on simple_spread, each with and without ``--set core=gru``, in one invocation.

    python benchmarks/recurrent.py [--repeats 3] [--ppo-steps 40000] [--mappo-steps 20000]
    python benchmarks/recurrent.py --cases "ppo core=gru" --before DIR   # against older code

``--before DIR`` adds each case run on the code in ``DIR`` (its ``mprl`` and ``plugins``, as
``git archive COMMIT mprl plugins | tar -x -C DIR`` gives them, first on ``PYTHONPATH``), as
"CASE (before)", interleaved with the current code's.

Runs, interleaved (repeat 1: every case, repeat 2: ...), ``python -m mprl run --plugin P --env
E --total-steps S --target-return 1e9`` (defaults otherwise: 2 workers) for each case, each in a
fresh interpreter, and reads the run's ``metrics.jsonl``: env steps per second from the first
learner record to the last record (start-up and shutdown left out; the steps of a synchronous
algorithm include the learner's time, which is what a recurrent core costs). Printed: median
(min-max) per case, and the ratio recurrent / feed-forward of each repeat (the two runs of a
repeat are back to back), median (min-max) over the repeats.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import median_range

SPREAD = "mpe2:simple_spread_v3(N=3, max_cycles=25)"
CASES = {
    "ppo": ["--plugin", "ppo", "--env", "CartPole-v1"],
    "ppo core=gru": ["--plugin", "ppo", "--env", "CartPole-v1", "--set", "core=gru"],
    "mappo": ["--plugin", "mappo", "--env", SPREAD],
    "rmappo (mappo core=gru)": ["--plugin", "mappo", "--env", SPREAD, "--set", "core=gru"],
}
PAIRS = {"ppo": ("ppo", "ppo core=gru"), "mappo": ("mappo", "rmappo (mappo core=gru)")}


def rate(run_dir: Path) -> float:
    """Env steps/s from the first learner record to the last record of the run."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "wall" in r and "step" in r]
    first = next(r for r in timed if r["source"] == "trainer")
    last = max(timed, key=lambda r: r["wall"])
    return (last["step"] - first["step"]) / max(last["wall"] - first["wall"], 1e-9)


def one(case: str, steps: int, workers: int, before: str | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        args = [sys.executable, "-m", "mprl", "run", *CASES[case], "--workers", str(workers),
                "--total-steps", str(steps), "--target-return", "1e9", "--run-dir",
                str(run_dir), "--quiet"]  # fmt: skip
        env = dict(os.environ)
        if before is not None:  # older code first on the path: mprl and the built-in plugins
            env["PYTHONPATH"] = os.pathsep.join([before, os.path.join(before, "plugins")])
        start = time.monotonic()
        subprocess.run(args, check=True, capture_output=True, cwd=tmp, env=env)
        command_s = time.monotonic() - start
        summary = json.loads((run_dir / "summary.json").read_text())
        return {
            "steps_per_s": rate(run_dir),
            "env_steps": summary["env_steps"],
            "command_s": command_s,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ppo-steps", type=int, default=40000)
    parser.add_argument("--mappo-steps", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/recurrent.json")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of CASES")
    parser.add_argument("--before", default=None, help="older code's folder (see above)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    runs = [(case, None) for case in cases]
    if args.before:
        runs += [(case, args.before) for case in cases]
    results: dict[str, list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for case, before in runs:
            steps = args.ppo_steps if case.startswith("ppo") else args.mappo_steps
            name = case if before is None else f"{case} (before)"
            results.setdefault(name, []).append(one(case, steps, args.workers, before))
            print(f"repeat {repeat + 1} {name}: {results[name][-1]['steps_per_s']:,.0f} steps/s",
                  flush=True)  # fmt: skip
    print("\n| case | env steps/s, median (min-max) | command s |")
    print("|---|---|---|")
    for name, each_run in results.items():
        rates = median_range([r["steps_per_s"] for r in each_run], ",.0f")
        seconds = median_range([r["command_s"] for r in each_run], ".1f")
        print(f"| {name} | {rates} | {seconds} |")
    print("\n| pair | ratio, median (min-max) over repeats |")
    print("|---|---|")
    ratios = {}
    pairs = dict(PAIRS)
    if args.before:
        pairs.update({f"{case}: now / before": (f"{case} (before)", case) for case in cases})
    for name, (ff, rec) in pairs.items():
        if ff not in results or rec not in results:
            continue
        each = [
            r["steps_per_s"] / f["steps_per_s"]
            for f, r in zip(results[ff], results[rec], strict=True)
        ]
        ratios[name] = each
        print(f"| {name} | {median_range(each)} (each: {', '.join(f'{x:.2f}' for x in each)}) |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": results, "ratios": ratios}, indent=1))
    print(
        "\nmedian ratios: "
        + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in ratios.items())
    )


if __name__ == "__main__":
    main()
