"""Multi-agent runs on a two-node cluster started with ``ray start`` (as on real machines, not
``ray.cluster_utils``), resumed on the local backend afterwards, and the throughput against the
local backend on this machine, in one invocation.

The cluster is started here, the way ``docs/backends.md`` says: a token made once
(``ray get-auth-token --generate``), ``RAY_AUTH_MODE=token`` on both nodes and on the driver, a
head (``--head-cpus`` logical CPUs) and a second node (``--node-cpus``) joined by address. Both
nodes are this machine (two raylets, one per ``ray start``): the workers are placed on both,
which the run's ``placed`` events show. ``HOME`` and Ray's temp dir are a folder of this
script's; at the end the cluster's processes (found by that temp dir in their command lines) are
stopped by pid, never with ``ray stop``, and the folder is removed.

For each algorithm (``--plugins``, default ``mappo,qmix``) on ``--env``, and each repeat:

1. ``mprl run --backend ray --ray-address HEAD --workers 2 --worker-cpus 1 --learner-resources
   '{"CPU": 0}'`` for ``--steps`` env steps (each worker a logical CPU of its own, and each
   node has one, so one worker goes to each), its workers' nodes read back;
2. ``mprl run --resume`` of that run on ``--backend local`` for ``--steps`` more: the counters,
   replay and optimizer state go on (its env steps start where the cluster's ended);
3. the same run from scratch on ``--backend local`` (the baseline, back to back with 1).

Env steps/s are taken from each run's ``metrics.jsonl`` from its first episode to its last
record (start-up and shutdown left out). Printed: per algorithm, the median (min-max) of
each, and the ratio ray / local of each repeat, median (min-max).

Usage: ``python benchmarks/marl_cluster.py [--repeats 3] [--steps 30000]``.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import median_range

SPREAD = "mpe2:simple_spread_v3(N=3, max_cycles=25)"


def records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def rate(run_dir: Path) -> float:
    """Env steps/s from the first episode to the run's last record (qmix's learner logs
    rarely: its first record may be the last)."""
    timed = [r for r in records(run_dir) if "wall" in r and "step" in r]
    first = next(r for r in timed if "episode_return" in r)
    last = max(timed, key=lambda r: r["wall"])
    return (last["step"] - first["step"]) / max(last["wall"] - first["wall"], 1e-9)


def worker_nodes(run_dir: Path) -> set[str]:
    """The nodes the run's workers were placed on."""
    return {
        r["node_id"]
        for r in records(run_dir)
        if r.get("event") == "placed" and r.get("rank", -1) >= 0
    }


def ray_processes(temp: str) -> list[int]:
    """The pids of this cluster's processes: those whose command line names its temp dir."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if temp in cmdline:
            pids.append(int(entry.name))
    return pids


def stop(pids: list[int], grace: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)


@contextlib.contextmanager
def cluster(head_cpus: int, node_cpus: int, port: int) -> Iterator[tuple[str, dict[str, str]]]:
    """A head and a second node started with ``ray start``: ``(address, env for the driver)``."""
    root = Path(tempfile.mkdtemp(prefix="mprl-cluster-"))
    temp = str(root / "ray")
    env = {**os.environ, "HOME": str(root / "home"), "RAY_AUTH_MODE": "token"}
    (root / "home").mkdir()
    ray = str(Path(sys.executable).with_name("ray"))
    common = ["--temp-dir", temp, "--include-dashboard", "false", "--disable-usage-stats"]
    try:
        subprocess.run([ray, "get-auth-token", "--generate"], env=env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        subprocess.run([ray, "start", "--head", "--port", str(port), "--num-cpus",
                        str(head_cpus), *common], env=env, check=True, capture_output=True,
                       timeout=120)  # fmt: skip
        address = f"127.0.0.1:{port}"
        subprocess.run([ray, "start", "--address", address, "--num-cpus", str(node_cpus),
                        "--disable-usage-stats"], env=env, check=True, capture_output=True,
                       timeout=120)  # fmt: skip
        yield address, env
    finally:
        stop(ray_processes(temp))
        shutil.rmtree(root, ignore_errors=True)


def mprl(args: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "mprl", "run", *args, "--quiet"],
                          env=env, capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"mprl run {' '.join(args)} failed:\n{done.stderr}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugins", default="mappo,qmix")
    parser.add_argument("--env", default=SPREAD)
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--head-cpus", type=int, default=1)
    parser.add_argument("--node-cpus", type=int, default=1)
    parser.add_argument("--port", type=int, default=6391)
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    args = parser.parse_args()
    plugins = args.plugins.split(",")
    rates: dict[str, dict[str, list[float]]] = {p: {"ray": [], "local": []} for p in plugins}
    ratios: dict[str, list[float]] = {p: [] for p in plugins}
    with (
        tempfile.TemporaryDirectory() as tmp,
        cluster(args.head_cpus, args.node_cpus, args.port) as (address, env),
    ):
        for repeat in range(args.repeats):
            for plugin in plugins:
                base = ["--plugin", plugin, "--env", args.env, "--workers", "2",
                        "--seed", str(repeat), "--target-return", "1e9"]  # fmt: skip
                on_ray = Path(tmp) / f"{plugin}-{repeat}-ray"
                mprl([*base, "--backend", "ray", "--ray-address", address, "--worker-cpus", "1",
                      "--learner-resources", '{"CPU": 0}',
                      "--total-steps", str(args.steps), "--run-dir", str(on_ray)], env)  # fmt: skip
                nodes = worker_nodes(on_ray)
                if len(nodes) < 2:
                    raise SystemExit(f"{plugin}: the workers ran on {len(nodes)} node(s), not 2")
                steps = json.loads((on_ray / "summary.json").read_text())["env_steps"]
                mprl(["--resume", str(on_ray), "--backend", "local",
                      "--total-steps", str(steps + args.steps)])  # fmt: skip
                resumed = json.loads((on_ray / "summary.json").read_text())
                if resumed["env_steps"] < steps + args.steps:
                    raise SystemExit(f"{plugin}: the local resume ended at {resumed}")
                local = Path(tmp) / f"{plugin}-{repeat}-local"
                mprl([*base, "--backend", "local", "--total-steps", str(args.steps),
                      "--run-dir", str(local)])  # fmt: skip
                ray_rate = rate(on_ray)
                local_rate = rate(local)
                rates[plugin]["ray"].append(ray_rate)
                rates[plugin]["local"].append(local_rate)
                ratios[plugin].append(ray_rate / local_rate)
                print(f"repeat {repeat + 1} {plugin}: ray {ray_rate:,.0f} env steps/s on 2 "
                      f"nodes, local {local_rate:,.0f}, resumed locally to "
                      f"{resumed['env_steps']:,}", flush=True)  # fmt: skip
    print("\n| algorithm | ray (2 nodes), env steps/s | local, env steps/s | ray / local |")
    print("|---|---|---|---|")
    for plugin in plugins:
        print(f"| {plugin} | {median_range(rates[plugin]['ray'], ',.0f')} | "
              f"{median_range(rates[plugin]['local'], ',.0f')} | "
              f"{median_range(ratios[plugin], '.2f')} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({"rates": rates, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
