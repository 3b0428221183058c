"""Runs on the cluster: each algorithm's shared state across nodes and resumed between
backends, the classic program's shape, the data of a run to every actor and back, and what
is refused before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import clean_stderr, cli, cli_here, read_metrics, running
from tests.slow.ray_cluster import WORKER, placed, run_ray

ray = pytest.importorskip("ray")


def test_impala_spreads_workers_over_nodes_and_resumes_on_the_local_backend(cluster, tmp_path):
    run_dir = tmp_path / "run"
    # one checkpoint, at the end (a loaded machine's run outlasted the default 60 s period)
    done = run_ray(cluster, "--plugin", "impala", "--workers", "2", *WORKER,
                   "--total-steps", "4000", "--checkpoint-every", "0",
                   "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    clean_stderr(done.stderr)
    where = placed(read_metrics(run_dir))
    assert set(where) == {"trainer", "worker 0", "worker 1"}
    assert where["worker 0"]["node_id"] != where["worker 1"]["node_id"]
    assert "runs on node" in done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] >= 4000
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert saved["shared_state"]["weights"]["version"] > 0  # the learner published updates
    assert saved["steps"][:2] == summary["per_worker_steps"][:2]
    _fetched_at_the_end(run_dir, 4000)  # no checkpoint before
    # the train process's model reached the driver: the checkpoint is not the initial model
    # (a local impala iteration can take thousands of steps: a budget past the Ray run's own)
    more = str(summary["env_steps"] + 4000)
    again = cli("run", "--resume", str(run_dir), "--backend", "local", "--total-steps", more)
    assert again.returncode == 0, again.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["env_steps"] >= int(more)
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert last["shared_state"]["weights"]["version"] > saved["shared_state"]["weights"]["version"]


def test_the_step_budget_stops_workers_on_two_nodes_near_it(cluster, tmp_path):
    # two workers of 50,000 steps/s each, counted 500 at a time: a worker sees the other's
    # count only through the driver's polls, so near the budget it waits for the next one
    # (a run that goes on until the driver says stop goes tens of thousands past)
    run_dir, total, burst = tmp_path / "run", 30_000, 500
    done = run_ray(cluster, "--plugin", "bursts", "--workers", "2", *WORKER,
                   "--total-steps", str(total), "--set", f"burst={burst}",
                   "--set", "rollout_s=0.01", "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "total steps reached", summary
    assert total <= summary["env_steps"] <= total + 4 * burst, summary


def test_mappo_plays_multi_agent_episodes_on_two_nodes(cluster, tmp_path):
    run_dir = tmp_path / "run"
    done = run_ray(cluster, "--plugin", "mappo", "--env", "mpe2:simple_spread_v3(N=2)",
                   "--workers", "2", *WORKER, "--set", "envs_per_worker=2",
                   "--total-steps", "500", "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = read_metrics(run_dir)
    where = placed(records)
    assert where["worker 0"]["node_id"] != where["worker 1"]["node_id"]
    episodes = [r for r in records if "episode_return" in r]
    assert {r["source"] for r in episodes} == {"worker:0", "worker:1"}
    assert all({"return_agent_0", "return_agent_1"} <= set(r) for r in episodes)
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert saved["shared_state"]["weights"]["version"] > 0  # the learner published updates


def test_ppo_from_the_local_backend_resumes_on_ray(cluster, tmp_path):
    run_dir = tmp_path / "run"
    # (an iteration is 2 workers x 8 envs x 32 steps: 512; a few of them on each backend)
    first = cli("run", "--plugin", "ppo", "--workers", "2", "--total-steps", "2000",
                "--run-dir", str(run_dir))  # fmt: skip
    assert first.returncode == 0, first.stderr
    version = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    # (a worker stops at the budget after the rollout it is in: 2,048)
    target = json.loads((run_dir / "summary.json").read_text())["env_steps"] + 2000
    # (no periodic checkpoint: on a loaded machine the run can outlast its 60 s, and each
    # checkpoint fetches the learner's state)
    again = run_ray(cluster, "--resume", str(run_dir), *WORKER, "--total-steps", str(target),
                    "--checkpoint-every", "0")  # fmt: skip
    assert again.returncode == 0, again.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= target
    last = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    assert last["weights"]["version"] > version["weights"]["version"]  # ppo learned on Ray
    _fetched_at_the_end(run_dir, target)


def _fetched_at_the_end(run_dir: Path, budget: int) -> None:
    """The driver read the train process's state (``learner-state`` records) only at the
    end: for the final checkpoint, and once more where the train process was still running
    then (a loaded machine's workers can outlast their stop grace), never during the run."""
    fetches = [r for r in read_metrics(run_dir) if r.get("event") == "learner-state"]
    assert 1 <= len(fetches) <= 2 and all(r["step"] >= budget for r in fetches), fetches


def _checkpoint_of(path: Path) -> dict[str, Any] | None:
    """What a checkpoint says of the learner: its model's marker (the version it holds), its
    Adam steps, and the weights version the hub had published when it was written."""
    try:
        saved = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError):  # not there yet
        return None
    adam = saved["optimizer"]["state"].values()
    return {
        "marker": float(saved["model"]["marker"]),
        "adam_steps": max([float(param["step"]) for param in adam], default=0.0),
        "published": saved["shared_state"]["weights"]["version"],
    }


def test_weights_go_from_the_learner_to_the_workers_and_the_driver_reads_them_for_checkpoints(
    cluster, tmp_path
):
    """A plugin with a ``Weights`` field, through Ray as between machines: the driver relays no
    model to its workers (each acts with exactly the version it pulled), and fetches the
    learner's state once per checkpoint, never between them; each checkpoint holds the
    learner's model and optimizer of one moment, no older than the weights published when it
    was written."""
    run_dir = tmp_path / "run"
    args = ["--backend", "ray", "--ray-address", cluster.address, "--plugin", "versions",
            "--workers", "2", *WORKER, "--set", "learn_s=8", "--set", "until_checked=200",
            "--max-time", "170", "--checkpoint-every", "1", "--no-shared-memory",
            "--run-dir", str(run_dir)]  # fmt: skip
    seen: list[dict[str, Any]] = []
    with running(args) as proc:
        while proc.poll() is None:
            found = _checkpoint_of(run_dir / "checkpoints" / "last.pt")
            if found is not None and found["marker"] > 0 and found not in seen:
                seen.append(found)
            time.sleep(0.2)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    final = _checkpoint_of(run_dir / "checkpoints" / "last.pt")
    assert final is not None
    # mid-run checkpoints of a learning learner, told apart by its updates (on a loaded machine
    # most come between two updates, so one may be all there is to see: the fetch count below
    # is the one of every checkpoint)
    assert seen, "no mid-run checkpoint of a learner that had updated"
    for found in [*seen, final]:
        assert found["marker"] == found["adam_steps"]  # model and optimizer of one update
        assert found["marker"] >= found["published"]  # fetched when written, not a second ago
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    assert min(state["checked"]) > 0 and min(state["pulled"]) > 0
    assert state["wrong"] == [0, 0]  # nothing but their own pulls changed their ctx.model
    records = read_metrics(run_dir)
    kinds = [r["event"] for r in records if r.get("event") in ("learner-state", "checkpoint")]
    assert kinds.count("learner-state") >= 3
    # a fetch is a checkpoint's: each one followed by its checkpoint, none between them
    assert "learner-state learner-state" not in " ".join(kinds), kinds
    assert kinds[-2:] == ["learner-state", "checkpoint"]


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
    total = sum(saved["steps"]) + 1000
    again = cli("run", "--resume", str(run_dir), "--backend", "local", *small,
                "--total-steps", str(total))  # fmt: skip
    assert again.returncode == 0, again.stderr
    after = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert int(after["shared_state"]["replay"]["heads"].sum()) == sum(after["steps"]) >= total
    # the counter goes on from the checkpoint's (the local learner may not update at all:
    # docs-dqn declares no replay ratio, so its workers do not wait for the learner, and
    # 4,000 steps were once done before its first update)
    assert after["shared_state"]["updates"] >= shared["updates"]


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


def test_the_classic_shape_works_across_nodes_with_the_runs_flags_and_config_in_every_actor(
    cluster, tmp_path
):
    """Barrier, Queue, List, Value, Lock and PerWorker fields shared by actors on three nodes,
    and workers acting with the train process's model (``ctx.model`` follows it); the data of
    the run from the command line (a backend flag, a config value) to each actor on its node,
    and back in its records."""
    run_dir = tmp_path / "run"
    done = run_ray(cluster, "--plugin", "relay", "--workers", "2", *WORKER,
                   "--total-steps", "6000", "--relay-tag", "from-the-cli",
                   "--set", "step_sleep=0.0005", "--set", "wait_for_model=true",
                   "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    assert state["met"] == [True, True]  # both passed the barrier
    assert state["updates"] == len(state["losses"]) > 0  # changed together under the lock
    assert sum(state["losses"]) <= sum(state["steps"])  # episodes came through the queue
    assert all(saw > 0 for saw in state["saw"])  # both acted with an updated model
    records = read_metrics(run_dir)
    where = placed(records)
    assert len({r["node_id"] for r in where.values()}) == 3
    tagged = {r["source"]: r for r in records if "tag" in r}
    assert set(tagged) == {"worker:0", "worker:1", "trainer"}
    assert {r["tag"] for r in tagged.values()} == {"from-the-cli"}
    assert tagged["worker:1"]["step_sleep"] == 0.0005


@pytest.mark.parametrize("shared", [False, True], ids=["object-store", "shared-memory"])
def test_uint8_frames_cross_nodes_byte_for_byte(cluster, tmp_path, shared):
    """Atari-shaped rollouts (900 KB of uint8 frames each) from workers on two nodes reach the
    learner on the third as uint8, every byte as written. With ``--no-shared-memory`` (as
    between machines) each commit is a call to the hub (whose 900 KB of frames Ray moves
    through its object store, as it does every argument past 100 KB); by default these nodes
    share the learner's machine, and no commit is a call at all: the slots are the hub's
    memory, mapped."""
    run_dir = tmp_path / "run"
    flag = [] if shared else ["--no-shared-memory"]
    done = run_ray(cluster, "--plugin", "pixels", "--workers", "2", *WORKER, *flag,
                   "--total-steps", str(32 * 60), "--run-dir", str(run_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr  # Ray's words on joining from a thread
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["shared_state"]
    assert state["bad"] == [0, 0]
    assert min(state["good"]) > 0 and sum(state["good"]) >= 40, state["good"]
    calls = state["call_bytes"]
    if shared:
        assert calls == []
    else:
        assert len(calls) >= 20  # those made after the learner started weighing them
        assert min(calls) > 900_000  # each a whole rollout of frames, into the hub's own slot
    where = placed(read_metrics(run_dir))
    nodes = {who: r["node_id"] for who, r in where.items()}
    assert len(set(nodes.values())) == 3, nodes  # learner, worker 0, worker 1: one node each


def test_what_cannot_run_on_ray_is_refused_before_anything_starts(cluster, tmp_path, capsys):
    import ray

    cases = {
        ("--plugin", "a3c"): "Hogwild",
        ("--plugin", "probe"): "field 'seen' (Tensor)",
        ("--plugin", "impala", "--learner-resources", "GPU"): "--learner-resources 'GPU'",
    }
    for args, message in cases.items():  # in this process: refused before Ray is joined
        code, stderr = cli_here(capsys, "run", "--backend", "ray", "--ray-address",
                                cluster.address, *args, "--run-dir", str(tmp_path / "never"))  # fmt: skip
        assert code == 2 and message in stderr, (args, stderr)
        assert not ray.is_initialized() and not (tmp_path / "never").exists()
    # what the cluster cannot hold, or no cluster there: bad usage, said before a run directory
    big = run_ray(cluster, "--plugin", "impala", "--workers", "8", *WORKER,
                  "--run-dir", str(tmp_path / "big"))  # fmt: skip
    assert big.returncode == 2, big.stderr
    assert "the Ray cluster cannot hold this run: the run needs 17 CPU (it has 5)" in big.stderr
    code, stderr = cli_here(capsys, "run", "--plugin", "impala", "--backend", "ray",
                            "--ray-address", "127.0.0.1:1", "--run-dir", str(tmp_path / "nobody"))  # fmt: skip
    assert code == 2 and "127.0.0.1:1: nothing answers there" in stderr
    assert not ray.is_initialized()
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
