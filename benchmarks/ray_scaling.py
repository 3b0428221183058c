"""The Ray backend's scaling curve on a three-node cluster on this machine (issue "Ray at scale",
item 4): what the hub, the driver's poll and the Manager server cost per unit of work, as the
number of workers grows.

A ``ray.cluster_utils.Cluster`` is started here: a head with ``--head-cpus`` logical CPUs (the
driver's node, 0 by default: no actor on it) and two nodes of ``--node-cpus`` logical CPUs each,
where the workers and the train process go. Logical CPUs are what Ray schedules by, not cores:
16 workers fit on two nodes of 9 logical CPUs even on a 2-core machine, and then share its
cores. Ray's temp dir and ``HOME`` (where its auth token goes) are a temp dir of this script's,
removed at the end; only this cluster is shut down.

For each ``--workers`` count N, one ``python -m mprl run --plugin impala --backend ray
--ray-address ADDR --workers N --max-time ...`` (with its env-step budget and target return out
of reach, so a solved CartPole does not end it). Once every actor is placed and the first
episode is logged, and ``--warmup`` seconds later, a ``--window``-second steady window is
measured: CPU seconds (utime + stime, ``/proc/PID/stat``) at its start and end of

- ``driver``: the ``mprl run`` process (the supervise loop and its polls, the monitor);
- ``trainer``: the train process's actor, which hosts the hub; split, per thread
  (``/proc/PID/task``), into ``learner`` (its busiest thread: the one running the plugin's
  ``train``) and ``hub`` (every other thread: the hub's calls from the workers, the driver's
  polls, and Ray's core-worker threads that receive them: what the actor would not spend
  without the hub);
- ``workers``: every worker actor, summed;
- ``manager``: the Manager server (a spawned child of the driver);
- ``raylet``, ``gcs``, ``ray_other``: Ray's own processes of this cluster (found by its temp dir
  in their command lines).

Work in the window: env steps (the largest ``step`` in ``metrics.jsonl``), rollouts (env steps /
``envs_per_worker * unroll``), learner updates (the trainer's ``updates`` records). Derived:
CPU-seconds per second of each part, the hub's and the trainer's milliseconds per rollout, the
driver's milliseconds per tick and microseconds per actor per tick (``TICK_S`` = 0.25 s), and a
least-squares line of the driver's CPU against the number of actors.

Actors are found from the run's ``placed`` events (``... runs on node ... (pid N)``).

``--py-spy DIR``: also a py-spy profile (50 Hz, collapsed stacks) of the driver and the trainer
during each window, for where their time goes.

Usage: ``python benchmarks/ray_scaling.py [--workers 1,2,4,8,12] [--window 20]``; writes
``--out`` (JSON) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TICK_S = 0.25  # mprl.backends.base.TICK_S
ROLLOUT_STEPS = 16 * 16  # impala's envs_per_worker * unroll (defaults)
CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (``None`` when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK


def thread_cpu(pid: int) -> dict[int, float]:
    """utime + stime per thread of ``pid``."""
    out = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                out[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLK
    return out


def processes() -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every process."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.append((int(entry.name), ppid, cmd))
    return out


def ray_pids(temp: str, exclude: set[int]) -> dict[str, list[int]]:
    """This cluster's own processes (its temp dir in their command line), by kind."""
    out: dict[str, list[int]] = {"raylet": [], "gcs": [], "ray_other": []}
    for pid, _, cmd in processes():
        if pid in exclude or temp not in cmd:
            continue
        kind = "raylet" if "/raylet" in cmd.split(" ")[0] else "ray_other"
        kind = "gcs" if "gcs_server" in cmd.split(" ")[0] else kind
        out[kind].append(pid)
    return out


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def work(run_dir: Path) -> dict[str, float]:
    """The run's env steps and learner updates logged so far, and when (monotonic)."""
    recs = records(run_dir)
    steps = max((r.get("step", 0) for r in recs), default=0)
    updates = [r for r in recs if "updates" in r]
    return {
        "t": time.monotonic(),
        "steps": steps,
        "updates": updates[-1]["updates"] if updates else 0,
        "updates_wall": updates[-1]["wall"] if updates else 0.0,
    }


def snapshot(groups: dict[str, list[int]], trainer: int | None) -> dict[str, Any]:
    cpu = {
        name: sum(c for p in pids if (c := cpu_s(p)) is not None) for name, pids in groups.items()
    }
    return {"cpu": cpu, "trainer_threads": thread_cpu(trainer) if trainer else {}}


def run_one(n: int, address: str, temp: str, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="rayscale-", dir=temp)) / "run"
    cap = args.startup_cap + args.warmup + args.window + 30
    cmd = [
        sys.executable,
        "-m",
        "mprl",
        "run",
        "--plugin",
        args.plugin,
        "--workers",
        str(n),
        "--backend",
        "ray",
        "--ray-address",
        address,
        "--seed",
        "0",
        "--quiet",
        "--run-dir",
        str(run_dir),
        "--total-steps",
        str(10**10),
        "--target-return",  # never solved: the run goes on until it is stopped
        "1e9",
        "--max-time",
        str(cap),
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    row: dict[str, Any] = {"workers": n, "plugin": args.plugin}
    try:
        # every actor placed, and an episode logged
        placed: dict[str, int] = {}
        while proc.poll() is None and time.monotonic() - t0 < args.startup_cap:
            recs = records(run_dir)
            placed = {
                r["message"].split(" runs on")[0]: r["pid"]
                for r in recs
                if r.get("event") == "placed"
            }
            if len(placed) >= n + 1 and any("episode_return" in r for r in recs):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{n} workers: not started ({len(placed)} placed)")
        row["startup_s"] = round(time.monotonic() - t0, 1)
        time.sleep(args.warmup)
        trainer = next(pid for who, pid in placed.items() if who.startswith("trainer"))
        workers = [pid for who, pid in placed.items() if not who.startswith("trainer")]
        manager = [pid for pid, ppid, cmd in processes() if ppid == proc.pid and "python" in cmd]
        groups = {
            "driver": [proc.pid],
            "trainer": [trainer],
            "workers": workers,
            "manager": manager,
            **ray_pids(temp, {proc.pid, trainer, *workers, *manager}),
        }
        spies = []
        if args.py_spy:  # where the driver's and the trainer's time goes (collapsed stacks)
            args.py_spy.mkdir(parents=True, exist_ok=True)
            for name, pid in (("driver", proc.pid), ("trainer", trainer)):
                out = args.py_spy / f"{name}-{n}.txt"
                spy = [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-p",
                    str(pid),
                    "-d",
                    str(int(args.window)),
                    "-r",
                    "50",
                ]
                spy += ["-f", "raw", "-o", str(out), "--nonblocking"]
                spies.append(
                    subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
        w0, s0 = work(run_dir), snapshot(groups, trainer)
        time.sleep(args.window)
        w1, s1 = work(run_dir), snapshot(groups, trainer)
        for spy in spies:
            spy.wait(timeout=60)
        if proc.poll() is not None:
            row["error"] = "the run ended before its window did"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    row["returncode"] = proc.returncode
    if "Traceback" in err:
        row["error"] = err[-800:]
    span = w1["t"] - w0["t"]
    rate = {k: (s1["cpu"][k] - s0["cpu"][k]) / span for k in s0["cpu"]}
    # the trainer's threads: its busiest one learns, the others serve the hub and the polls
    deltas = {t: c - s0["trainer_threads"].get(t, 0.0) for t, c in s1["trainer_threads"].items()}
    learner = max(deltas.values(), default=0.0) / span
    rate["learner"], rate["hub"] = learner, max(0.0, rate["trainer"] - learner)
    steps_s = (w1["steps"] - w0["steps"]) / span
    rollouts_s = steps_s / ROLLOUT_STEPS
    upd_span = max(1e-9, w1["updates_wall"] - w0["updates_wall"])
    updates_s = (w1["updates"] - w0["updates"]) / upd_span
    ticks_s = 1 / TICK_S
    row.update(
        window_s=round(span, 2),
        env_steps_s=round(steps_s),
        rollouts_s=round(rollouts_s, 1),
        updates_s=round(updates_s, 1),
        cpu_s_per_s={k: round(v, 3) for k, v in rate.items()},
        cpu_total=round(sum(v for k, v in rate.items() if k not in ("learner", "hub")), 2),
        trainer_ms_per_rollout=round(1e3 * rate["trainer"] / max(rollouts_s, 1e-9), 3),
        hub_ms_per_rollout=round(1e3 * rate["hub"] / max(rollouts_s, 1e-9), 3),
        learner_ms_per_update=round(1e3 * learner / max(updates_s, 1e-9), 2),
        worker_ms_per_rollout=round(1e3 * rate["workers"] / max(rollouts_s, 1e-9), 2),
        driver_ms_per_tick=round(1e3 * rate["driver"] / ticks_s, 3),
        driver_us_per_actor_tick=round(1e6 * rate["driver"] / ticks_s / (n + 1), 1),
        manager_ms_per_s=round(1e3 * rate["manager"], 2),
        ray_cpu_s_per_s=round(rate["raylet"] + rate["gcs"] + rate["ray_other"], 3),
    )
    return row


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,12")
    parser.add_argument("--plugin", default="impala")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the start")
    parser.add_argument("--startup-cap", type=float, default=150.0)
    parser.add_argument("--head-cpus", type=int, default=0)
    parser.add_argument("--node-cpus", type=int, default=0, help="default: max workers / 2 + 1")
    parser.add_argument(
        "--py-spy", type=Path, default=None, help="also record the driver and trainer here"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ray_scaling.json"))
    args = parser.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    node_cpus = args.node_cpus or max(counts) // 2 + 1

    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="rs-", dir="/tmp")  # short: Ray's socket paths
    (Path(temp) / "ray").mkdir()
    (Path(temp) / "home").mkdir()
    saved = {k: os.environ.get(k) for k in ("HOME", "RAY_TMPDIR", "RAY_ADDRESS")}
    os.environ.update(HOME=f"{temp}/home", RAY_TMPDIR=temp)
    os.environ.pop("RAY_ADDRESS", None)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": args.head_cpus,
            "temp_dir": f"{temp}/ray",
            "include_dashboard": False,
        },
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: the cluster shut down
    rows: list[dict[str, Any]] = []
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=node_cpus)
        cluster.wait_for_nodes(timeout=120)
        print(
            f"cluster at {cluster.address}: head {args.head_cpus} CPUs, 2 nodes of "
            f"{node_cpus} logical CPUs, on {os.cpu_count()} cores",
            flush=True,
        )
        for n in counts:
            rows.append(run_one(n, cluster.address, temp, args))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        cluster.shutdown()
        for k, value in saved.items():
            if value is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = value
        shutil.rmtree(temp, ignore_errors=True)
    ok = [r for r in rows if "error" not in r]
    a, b = fit([r["workers"] + 1 for r in ok], [r["cpu_s_per_s"]["driver"] for r in ok])
    result = {
        "cores": os.cpu_count(),
        "node_cpus": node_cpus,
        "rows": rows,
        "driver_fit": {"fixed_cpu_s_per_s": round(a, 4), "per_actor_cpu_s_per_s": round(b, 5)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(
        f"\n{'N':>3} {'steps/s':>8} {'roll/s':>7} {'upd/s':>6} {'driver':>7} {'trainer':>8} "
        f"{'learner':>8} {'hub':>6} {'workers':>8} {'manager':>8} {'ray':>6} {'total':>6} "
        f"{'hub ms/roll':>11} {'drv us/act/tick':>15}"
    )
    for r in ok:
        c = r["cpu_s_per_s"]
        print(
            f"{r['workers']:>3} {r['env_steps_s']:>8} {r['rollouts_s']:>7} {r['updates_s']:>6} "
            f"{c['driver']:>7.3f} {c['trainer']:>8.3f} {c['learner']:>8.3f} {c['hub']:>6.3f} "
            f"{c['workers']:>8.3f} {c['manager']:>8.3f} {r['ray_cpu_s_per_s']:>6.3f} "
            f"{r['cpu_total']:>6.2f} {r['hub_ms_per_rollout']:>11.3f} "
            f"{r['driver_us_per_actor_tick']:>15.1f}"
        )
    print(f"\ndriver CPU-s/s = {a:.4f} + {b:.5f} x actors  (CPU-seconds per second, least squares)")
    for r in rows:
        if "error" in r:
            print(f"{r['workers']} workers failed: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
