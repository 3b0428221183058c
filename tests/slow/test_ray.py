"""The Ray backend on a real multi-node cluster on this machine (``ray.cluster_utils.Cluster``):
a head and two worker nodes, started once for the module. Runs go through the CLI, as a user
starts them, joined to the cluster with ``--ray-address``.

Every node has 2 CPUs and the tests give each worker ``--worker-cpus 2``, so two workers can only
be placed on two distinct nodes; the head (1 CPU) hosts the train process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import (
    HERE,
    Leftovers,
    child_pids,
    clean_stderr,
    cli,
    marked_pids,
    read_metrics,
    running,
    wait_for_metrics,
    write_distribution,
)

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

WORKER = ["--worker-cpus", "2"]  # a whole node each: two workers, two nodes
#: entry points of the test plugins every node has installed
PLUGINS = {"raytest": "mprl_raytest", "testplugin": "mprl_testplugin", "docs-dqn": "mprl_docs_dqn"}


def _ray_processes(title: str) -> list[int]:
    """Live processes of this module's cluster (descendants of this process: the cluster's nodes
    are our children) whose command line starts with ``ray::TITLE`` (an actor's process); another
    Ray cluster on the machine is not ours to count."""
    out = []
    for pid in child_pids(os.getpid()):
        entry = Path("/proc") / str(pid)
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmd.startswith(f"ray::{title}"):
            out.append(pid)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A head (1 CPU) and two worker nodes (2 CPUs each), with the test plugin installed where
    every node's Python finds it. Ray's temp dir and ``HOME`` are this module's own."""
    site = tmp_path_factory.mktemp("raysite")
    modules = {m: (HERE / "plugins" / f"{m}.py").read_text() for m in PLUGINS.values()}
    write_distribution(site, "mprl-raytest", PLUGINS, modules)
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths
    (temp / "ray").mkdir()  # where RAY_TMPDIR points Ray
    env = pytest.MonkeyPatch()
    env.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    env.setenv("RAY_TMPDIR", str(temp))
    env.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    env.delenv("RAY_ADDRESS", raising=False)
    env.syspath_prepend(str(site))
    made = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "temp_dir": str(temp / "ray"), "include_dashboard": False},
    )
    try:
        made.add_node(num_cpus=2)
        made.add_node(num_cpus=2)
        made.wait_for_nodes(timeout=120)
        yield made
    finally:
        made.shutdown()
        env.undo()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leftovers(monkeypatch: pytest.MonkeyPatch, cluster: Cluster) -> Iterator[None]:
    """This module's leftover check (the cluster's own processes live as long as the module):
    no actor process of a run, no process the test started, no new shared memory."""
    mark = uuid.uuid4().hex
    leftovers = Leftovers(mark, Path(tempfile.gettempdir())).start(monkeypatch)
    yield
    deadline = time.monotonic() + 15  # Ray reaps a killed actor's process asynchronously
    while time.monotonic() < deadline:
        actors = _ray_processes("ChildActor") + _ray_processes("Hub")
        orphans = marked_pids(mark)
        shm = leftovers.shm()  # new entries no process outside this test holds
        if not actors and not orphans and not shm:
            break
        time.sleep(0.2)
    assert not actors, f"actor processes left behind: {actors}"
    assert not orphans, f"processes left behind: {orphans}"
    assert not shm, f"shared memory left: {sorted(shm)}"


def run_ray(cluster: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli("run", "--backend", "ray", "--ray-address", cluster.address, *args, timeout=timeout)


def placed(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Who ran where: the last ``placed`` event of each process, by its name."""
    out = {}
    for r in records:
        if r.get("event") == "placed":
            who = "trainer" if r["rank"] < 0 else f"worker {r['rank']}"
            out[who] = r
    return out


def test_impala_spreads_workers_over_nodes_and_resumes_on_the_local_backend(cluster, tmp_path):
    run_dir = tmp_path / "run"
    done = run_ray(cluster, "--plugin", "impala", "--workers", "2", *WORKER,
                   "--total-steps", "10000", "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    clean_stderr(done.stderr)
    where = placed(read_metrics(run_dir))
    assert set(where) == {"trainer", "worker 0", "worker 1"}
    assert where["worker 0"]["node_id"] != where["worker 1"]["node_id"]
    assert "runs on node" in done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= 10000
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert saved["shared_state"]["weights"]["version"] > 0  # the learner published updates
    assert saved["steps"][:2] == summary["per_worker_steps"][:2]
    # the train process's model reached the driver: the checkpoint is not the initial model
    again = cli("run", "--resume", str(run_dir), "--backend", "local", "--total-steps", "15000")
    assert again.returncode == 0, again.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["env_steps"] >= 15000
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert last["shared_state"]["weights"]["version"] > saved["shared_state"]["weights"]["version"]


def test_ppo_from_the_local_backend_resumes_on_ray(cluster, tmp_path):
    run_dir = tmp_path / "run"
    # (an iteration is 2 workers x 8 envs x 32 steps: 512; a few of them on each backend)
    first = cli("run", "--plugin", "ppo", "--workers", "2", "--total-steps", "2000",
                "--run-dir", str(run_dir))  # fmt: skip
    assert first.returncode == 0, first.stderr
    version = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    again = run_ray(cluster, "--resume", str(run_dir), *WORKER, "--total-steps", "8000")
    assert again.returncode == 0, again.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 8000
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    assert last["weights"]["version"] > version["weights"]["version"]  # ppo learned on Ray


def test_dqn_replay_counter_and_target_across_nodes_then_resumed_locally(cluster, tmp_path):
    """ReplayBuffer, Counter and Module on Ray: a row per worker step reaches the learner's
    buffer, the counter and the target network are checkpointed by the driver, and a local
    resume carries on from them."""
    run_dir = tmp_path / "run"
    small = [f"--set={k}={v}" for k, v in
             {"buffer_size": 1000, "learning_starts": 200, "target_every": 50,
              "batch_size": 32}.items()]  # fmt: skip
    done = run_ray(cluster, "--plugin", "docs-dqn", "--workers", "2", *WORKER, *small,
                   "--total-steps", "3000", "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    shared = saved["shared_state"]
    assert int(shared["replay"]["heads"].sum()) == sum(saved["steps"]) > 0  # a row per step
    assert shared["updates"] > 0 and shared["weights"]["version"] == shared["updates"]
    assert set(shared["target"]) == set(saved["model"])  # the learner's target network
    # beyond what workers may collect ahead of the learner (learning_starts + 4 a step each)
    total = 200 + 4 * shared["updates"] + 1000
    again = cli("run", "--resume", str(run_dir), "--backend", "local", *small,
                "--total-steps", str(total))  # fmt: skip
    assert again.returncode == 0, again.stderr
    after = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert int(after["shared_state"]["replay"]["heads"].sum()) == sum(after["steps"]) >= total
    assert after["shared_state"]["updates"] > shared["updates"]


def test_sac_resumed_on_ray_with_3_workers_then_locally_with_1_keeps_its_replay_rows(
    cluster, tmp_path
):
    """A local run's replay rows re-partitioned over 3 Ray workers (the buffer in the train
    process's actor), then back over 1 local worker, none lost, the run going on each time."""
    run_dir = tmp_path / "run"
    tiny = [f"--set={k}={v}" for k, v in
            {"hidden": [32, 32], "batch_size": 32, "learning_starts": 200,
             "buffer_size": 3000}.items()]  # fmt: skip
    first = cli("run", "--plugin", "sac", "--workers", "2", "--total-steps", "600", *tiny,
                "--run-dir", str(run_dir), "--quiet")  # fmt: skip
    assert first.returncode == 0, first.stderr
    rows = int(torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)[
        "shared_state"]["replay"]["heads"].sum())  # fmt: skip
    on_ray = run_ray(cluster, "--resume", str(run_dir), "--workers", "3", "--worker-cpus", "1",
                     "--total-steps", "1200", "--quiet")  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr
    assert (
        f"resume: shared-state field 'replay' (ReplayBuffer): {rows:,} rows re-partitioned from "
        "2 workers (1,500 rows each) to 3 (1,000 rows each)"
    ) in on_ray.stderr
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    replay = saved["shared_state"]["replay"]
    assert replay["heads"].shape == (3,) and saved["run"]["backend"] == "ray"
    assert int(replay["heads"].sum()) == saved["env_steps"] >= 1200  # the rows kept, and more
    back = cli("run", "--resume", str(run_dir), "--backend", "local", "--workers", "1",
               "--total-steps", "1500", "--quiet")  # fmt: skip
    assert back.returncode == 0, back.stderr
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert last["shared_state"]["replay"]["heads"].tolist() == [last["env_steps"]]
    assert last["env_steps"] >= 1500 and last["session"] == 2


def test_the_classic_shape_works_across_nodes(cluster, tmp_path):
    """Barrier, Queue, List, Value, Lock and PerWorker fields shared by actors on three nodes,
    and workers acting with the train process's model (``ctx.model`` follows it)."""
    run_dir = tmp_path / "run"
    done = run_ray(cluster, "--plugin", "relay", "--workers", "2", *WORKER,
                   "--total-steps", "6000", "--set", "wait_for_model=true",
                   "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    assert state["met"] == [True, True]  # both passed the barrier
    assert state["updates"] == len(state["losses"]) > 0  # changed together under the lock
    assert sum(state["losses"]) <= sum(state["steps"])  # episodes came through the queue
    assert all(saw > 0 for saw in state["saw"])  # both acted with an updated model
    where = placed(read_metrics(run_dir))
    assert len({r["node_id"] for r in where.values()}) == 3


def test_a_sigkilled_worker_actor_is_restarted(cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "relay",
            "--workers", "2", *WORKER, "--max-restarts", "1", "--total-steps", "400000",
            "--set", "step_sleep=0.001", "--run-dir", str(run_dir)]  # fmt: skip
    with running(args) as proc:
        records = wait_for_metrics(
            run_dir, lambda r: r.get("event") == "placed" and r["rank"] == 1, timeout=120
        )
        wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=120)
        victim = placed(records)["worker 1"]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for_metrics(run_dir, lambda r: r.get("event") == "restart", timeout=60)
        records = wait_for_metrics(
            run_dir,
            lambda r: r.get("event") == "placed" and r["rank"] == 1 and r["pid"] != victim,
            timeout=120,
        )
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    restart = next(r for r in read_metrics(run_dir) if r.get("event") == "restart")
    assert restart["rank"] == 1 and "its actor died" in restart["message"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == [0, 1]


def test_a_lost_node_moves_its_worker_to_another(cluster, tmp_path, monkeypatch):
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
            wait_for_metrics(run_dir, lambda r: r.get("event") == "placed", timeout=120)
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
                timeout=180,
            )  # fmt: skip
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        restart = next(r for r in records if r.get("event") == "restart")
        assert restart["rank"] == rank and "its actor died" in restart["message"]
    finally:  # the tests after this one keep a head and two worker nodes
        if removed is None:
            cluster.remove_node(spare)


def test_sigint_stops_the_run_saves_a_checkpoint_and_leaves_no_actor(cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "relay",
            "--workers", "2", *WORKER, "--total-steps", "400000",
            "--set", "step_sleep=0.001", "--run-dir", str(run_dir)]  # fmt: skip
    with running(args) as proc:
        wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=120)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    assert proc.returncode == 130, stderr
    assert took < 10, took
    clean_stderr(stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert summary["status"] == "interrupted"
    assert sum(saved["steps"]) == summary["env_steps"] > 0
    assert not _ray_processes("ChildActor")  # gone when the driver exits, not later


def test_a_crash_reports_the_remote_traceback_role_rank_and_node(cluster, tmp_path):
    done = run_ray(cluster, "--plugin", "relay", "--workers", "2", *WORKER,
                   "--set", "fault=raise", "--set", "fault_rank=1",
                   "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "worker 1" in done.stderr and "RuntimeError: injected failure in worker:1" in done.stderr
    node = placed(read_metrics(tmp_path / "run"))["worker 1"]["node"]
    assert f"on node {node}" in done.stderr


def test_a_hung_actor_is_killed_and_reported(cluster, tmp_path):
    done = run_ray(cluster, "--plugin", "relay", "--workers", "2", *WORKER,
                   "--set", "fault=hang", "--worker-timeout", "3",
                   "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "worker 0" in done.stderr and "hung: no heartbeat for" in done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failures"][0]["rank"] == 0


def test_what_cannot_run_on_ray_is_refused_before_anything_starts(cluster, tmp_path):
    cases = {
        ("--plugin", "a3c"): "Hogwild",
        ("--plugin", "probe"): "field 'seen' (Tensor)",
        ("--plugin", "impala", "--learner-resources", "GPU"): "--learner-resources 'GPU'",
    }
    for args, message in cases.items():
        done = run_ray(cluster, *args, "--run-dir", str(tmp_path / "never"))
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert not (tmp_path / "never").exists()
    # what the cluster cannot hold, or no cluster there: bad usage, said before a run directory
    big = run_ray(cluster, "--plugin", "impala", "--workers", "8", *WORKER,
                  "--run-dir", str(tmp_path / "big"))  # fmt: skip
    assert big.returncode == 2, big.stderr
    assert "the Ray cluster cannot hold this run: the run needs 17 CPU (it has 5)" in big.stderr
    nobody = cli("run", "--plugin", "impala", "--backend", "ray", "--ray-address", "127.0.0.1:1",
                 "--run-dir", str(tmp_path / "nobody"))  # fmt: skip
    assert nobody.returncode == 2 and "127.0.0.1:1: nothing answers there" in nobody.stderr
    assert not (tmp_path / "big").exists() and not (tmp_path / "nobody").exists()


def test_without_ray_installed_the_backend_says_what_to_install(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from mprl.tools.cli import main\n"
        f"sys.exit(main(['run', '--plugin', 'impala', '--backend', 'ray', '--run-dir', "
        f"{str(tmp_path / 'r')!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert 'pip install "mprl[ray]"' in done.stderr


def test_with_no_address_the_run_starts_ray_for_itself_and_stops_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # Ray's own default: it says so
    run_dir = tmp_path / "run"
    sessions = Path(os.environ["RAY_TMPDIR"]) / "ray"
    before = set(sessions.glob("session_2*"))
    done = cli("run", "--plugin", "impala", "--backend", "ray", "--workers", "1",
               "--total-steps", "3000", "--run-dir", str(run_dir), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(sessions.glob("session_2*")) == before  # its Ray's logs went with it
    # Ray's note on turning token authentication on, news about a cluster nobody else sees
    assert "Token authentication is enabled" not in done.stderr, done.stderr
    # its Ray (gcs_server, raylet, workers) was started by the run: the leftover check finds
    # any of them by the test's mark in their environment


@pytest.mark.parametrize("when", ["at once", "once stepping"])
def test_sigterm_and_sigint_to_a_ray_driver_stop_it_cleanly(cluster, tmp_path, when):
    """Ray's init sets its own signal handlers; mprl's are put in after it joins, so a SIGTERM
    is a clean stop with a summary (143) and a SIGINT in the first seconds leaves no
    traceback (130) (issue 27, items 11 and 12)."""
    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "relay",
            "--workers", "2", *WORKER, "--total-steps", "400000",
            "--set", "step_sleep=0.001", "--run-dir", str(run_dir)]  # fmt: skip
    sig = signal.SIGTERM if when == "once stepping" else signal.SIGINT
    with running(args) as proc:
        if when == "at once":  # the run directory is made once Ray is joined
            deadline = time.monotonic() + 120
            while not (run_dir / "config.json").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=120)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr and "TypeError" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == sig


def test_a_flag_and_a_config_value_reach_every_actor_and_come_back(cluster, tmp_path):
    """The data of one run from the command line to each actor on its node, and back."""
    run_dir = tmp_path / "run"
    done = run_ray(cluster, "--plugin", "relay", "--workers", "2", *WORKER,
                   "--total-steps", "300", "--relay-tag", "from-the-cli",
                   "--set", "step_sleep=0.0015", "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = read_metrics(run_dir)
    tagged = {r["source"]: r for r in records if "tag" in r}
    assert set(tagged) == {"worker:0", "worker:1", "trainer"}
    assert {r["tag"] for r in tagged.values()} == {"from-the-cli"}
    assert tagged["worker:1"]["step_sleep"] == 0.0015
    nodes = {r["node_id"] for r in records if r.get("event") == "placed" and r["rank"] >= 0}
    assert len(nodes) == 2  # the workers ran on two nodes


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["sigint", "sighup"])
def test_the_terminals_signals_to_the_whole_group_of_an_embedded_ray_run_stop_it_cleanly(
    cluster, tmp_path, monkeypatch, sig
):
    """Ctrl-C, or a closed terminal, reaches the driver and the Ray it started (one process
    group): Ray's processes keep them blocked, so the driver stops the run cleanly."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mprl", "run", "--plugin", "impala", "--backend", "ray",
         "--workers", "1", "--total-steps", "10000000", "--run-dir", str(run_dir), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_metrics(run_dir, lambda r: "episode_return" in r, timeout=180)
        os.killpg(proc.pid, sig)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr and "Failed to connect to GCS" not in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["env_steps"] > 0
