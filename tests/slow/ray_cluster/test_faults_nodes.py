"""Nodes lost to a run on a cluster of this module's own, whose Ray checks its nodes' health
every 0.5 s, so that a node gone or cut off is declared dead within seconds (Ray's defaults take
tens of seconds to a minute and a half).

A node removed (its raylet killed): its worker moves to a spare node. A node partitioned (its
raylet stopped with SIGSTOP, so that Ray declares it dead while the actor processes on it go on
running, cut off from Ray): the run says what happens as it happens (the worker's node lost, its
restart waiting for resources that no node has), fails within a bound instead of hanging, and
names the actor it could not confirm ended; once the raylet runs again (and, marked dead,
exits), that actor ends itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import read_metrics, running, wait_for_metrics
from tests.slow.ray_cluster import WORKER, placed, started_cluster

ray = pytest.importorskip("ray")

#: a raylet that misses this many health checks in a row is declared dead (about 5 s: room
#: for a loaded machine, on which a live raylet may answer late)
HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 10,
}
#: --worker-timeout of the run: also the bound on a restart waiting for resources
TIMEOUT_S = 15
#: from the SIGSTOP to the run's end: Ray's detection, the restart delay, the wait for
#: resources (TIMEOUT_S), the stop's grace and the release, with room for a loaded machine
END_S = 90


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with started_cluster(tmp_path_factory, HEALTH) as made:
        yield made


def _alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_lost_node_moves_its_worker_to_another(cluster, tmp_path, monkeypatch):
    """(First: it leaves the head and two worker nodes, which the next test needs.)"""
    with monkeypatch.context() as env:  # the node outlives the test: not one of its processes
        env.delenv("MPRL_TEST_MARK")
        spare = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes(timeout=120)
    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "relay",
            "--workers", "2", *WORKER, "--max-restarts", "1", "--total-steps", "400000",
            "--set", "step_sleep=0.001", "--run-dir", str(run_dir)]  # fmt: skip
    removed = None
    try:
        with running(args) as proc:
            deadline = time.monotonic() + 120
            while len(placed(read_metrics(run_dir))) < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            where = placed(read_metrics(run_dir))
            nodes = {n.node_id: n for n in cluster.list_all_nodes()}
            rank, node_id = next(
                (r["rank"], r["node_id"]) for who, r in where.items()
                if who.startswith("worker") and nodes[r["node_id"]] is not cluster.head_node
            )  # fmt: skip
            removed = nodes[node_id]
            cluster.remove_node(removed, allow_graceful=False)
            records = wait_for_metrics(
                run_dir,
                lambda r: r.get("event") == "placed" and r["rank"] == rank
                and r["node_id"] != node_id,
                timeout=120,
            )  # fmt: skip
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        restart = next(r for r in records if r.get("event") == "restart")
        # its processes went with the node: the actor's connection broke before Ray could
        # declare the node dead
        assert restart["rank"] == rank and "its actor died" in restart["message"], restart
    finally:  # the test after this one needs a head and two worker nodes
        if removed is None:
            cluster.remove_node(spare)


def test_a_partitioned_node_is_said_bounded_and_its_actor_ends_once_it_is_back(cluster, tmp_path):
    from ray._private import ray_constants

    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "relay",
            "--workers", "2", *WORKER, "--max-restarts", "1", "--total-steps", "10000000",
            "--worker-timeout", str(TIMEOUT_S), "--set", "step_sleep=0.001",
            "--run-dir", str(run_dir)]  # fmt: skip
    raylet = ghost = None
    lines: list[tuple[float, str]] = []  # (time.monotonic(), a line of stderr)
    try:
        with running(args) as proc:

            def read() -> None:
                for line in proc.stderr:  # type: ignore[union-attr]
                    lines.append((time.monotonic(), line.rstrip("\n")))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            drain = threading.Thread(target=proc.stdout.read, daemon=True)  # type: ignore[union-attr]
            drain.start()
            deadline = time.monotonic() + 120
            while len(placed(read_metrics(run_dir))) < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=120)
            where = placed(read_metrics(run_dir))
            nodes = {n.node_id: n for n in cluster.list_all_nodes()}
            lost = nodes[where["worker 1"]["node_id"]]
            assert lost is not cluster.head_node, where
            ghost = where["worker 1"]["pid"]  # the actor process on the node to be lost
            raylet = lost.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
            stopped_at = time.monotonic()
            os.kill(raylet.pid, signal.SIGSTOP)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=END_S)
            ended_s = time.monotonic() - stopped_at if proc.poll() is not None else None
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            reader.join(timeout=10)
            drain.join(timeout=10)
            os.kill(raylet.pid, signal.SIGCONT)  # the node is back: its raylet, dead to the
            continued = time.monotonic()  # cluster, exits, and so does what it started
            while _alive(ghost) and time.monotonic() - continued < 30:
                time.sleep(0.1)
            ghost_left = _alive(ghost)
            raylet.wait(timeout=30)
    finally:
        if raylet is not None:
            if raylet.poll() is None:
                os.kill(raylet.pid, signal.SIGCONT)
            cluster.remove_node(lost, allow_graceful=False)
        if ghost is not None and _alive(ghost):  # (it failed): not left to load the machine
            os.kill(ghost, signal.SIGKILL)
    lines = [(t - stopped_at, line) for t, line in lines]  # from the SIGSTOP
    said = "\n".join(f"{t:6.1f} s  {line}" for t, line in lines)
    print(said)  # with -s: the time of each line from the SIGSTOP

    def first(*words: str) -> float:
        hit = [t for t, line in lines if t > 0 and all(w in line for w in words)]
        return hit[0] if hit else float("inf")

    # while it happens: the node, then the restart that cannot be placed, then the bound
    node_lost = first("worker 1", "node", "declared dead")
    waits = first("worker 1", "waits for resources", "{CPU: 2}")
    # (said once the run has stopped: it gave up that stop's time before)
    stop_s = json.loads((run_dir / "summary.json").read_text())["shutdown_s"] or 0.0
    gave_up = first("worker 1", f"could not be placed within {TIMEOUT_S} s") - stop_s
    unconfirmed = first("could not be confirmed ended", f"pid {ghost}")
    events = {r.get("event") for r in read_metrics(run_dir)}
    checks = {
        "worker 1's node said to be declared dead within 30 s": node_lost < 30,
        "its restart said to wait for resources within 15 s": node_lost < waits < node_lost + 15,
        f"the wait bounded: given up {TIMEOUT_S} s later": waits < gave_up <= waits + TIMEOUT_S + 5,
        f"the run ended within {END_S} s": ended_s is not None and ended_s < END_S,
        "the run failed (exit 1)": proc.returncode == 1,
        "no silence taken for a hang": "hung: no heartbeat" not in said,
        "the actor it could not end named, with its pid": unconfirmed < float("inf"),
        "the events logged": {"node-lost", "placement-waits", "unconfirmed"} <= events,
        # the node is back: the actor Ray could not end ended itself, nothing of the run is left
        "the cut-off actor gone once its raylet ran again": not ghost_left,
    }
    failed = [what for what, ok in checks.items() if not ok]
    assert not failed, "\n".join(["not so:", *failed, "the run said:", said])
