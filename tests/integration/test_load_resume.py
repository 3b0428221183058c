"""Real runs resumed with another worker count, through the CLI: the built-in sac's replay rows
re-partitioned across 3 workers and then 1 (counted in the checkpoints) while the run goes on;
a plugin's per-worker lists extended and cut, its per-worker Tensor refused (exit 2, naming it)
unless dropped; ``mprl.load`` and ``mprl eval`` on what the resumed runs wrote."""

from __future__ import annotations

import json
import signal

import numpy as np
import torch

import mprl
from tests.conftest import cli, cli_here, read_metrics, running, wait_for_metrics

TINY = {"hidden": [32, 32], "batch_size": 32, "learning_starts": 200, "buffer_size": 3000}
SETS = [f"--set={k}={v}" for k, v in TINY.items()]


def saved(run_dir) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def transitions(replay: dict, per: int) -> set[tuple[float, ...]]:
    """The transitions a saved replay buffer holds, as their (obs, reward) values."""
    out = set()
    for w, head in enumerate(replay["heads"].tolist()):
        for i in range(w * per, w * per + min(head, per)):
            out.add((*replay["obs"][i].tolist(), float(replay["reward"][i])))
    return out


def notes(run_dir, session: int) -> dict[str, str]:
    """The ``resume-state`` lines of a session: by field, what the resume did."""
    records = read_metrics(run_dir)
    start = [i for i, r in enumerate(records) if r.get("event") == "resume"][session - 1]
    return {
        r["field"]: r["message"]
        for r in records[start:]
        if r.get("event") == "resume-state" and r["source"] == "main"
    }


def test_sac_resumed_with_3_workers_then_1_keeps_its_replay_rows_and_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    first = cli(
        "run", "--plugin", "sac", "--workers", "2", "--total-steps", "600", "--quiet",
        "--run-dir", str(run_dir), *SETS,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = saved(run_dir)
    rows = int(before["shared_state"]["replay"]["heads"].sum())
    assert rows == before["env_steps"] >= 600  # a row per step; 1,500 rows a ring: none lost
    kept = transitions(before["shared_state"]["replay"], 1500)
    assert len(kept) == rows

    more = cli(
        "run", "--resume", str(run_dir), "--workers", "3", "--total-steps", "1200", "--quiet"
    )
    assert more.returncode == 0, more.stderr
    line = (
        f"resume: shared-state field 'replay' (ReplayBuffer): {rows:,} rows re-partitioned "
        "from 2 workers (1,500 rows each) to 3 (1,000 rows each)"
    )
    assert f"mprl: {line}" in more.stderr
    assert notes(run_dir, 1) == {"replay": line}
    after = saved(run_dir)
    replay = after["shared_state"]["replay"]
    assert after["session"] == 1 and after["run"]["workers"] == 3
    assert replay["heads"].shape == (3,) and replay["obs"].shape[0] == 3000
    # every row of the first session is there, and the second session's came on top
    assert kept <= transitions(replay, 1000)
    assert int(replay["heads"].sum()) == after["env_steps"] >= 1200
    assert len(after["steps"]) == 5 and all(s > 0 for s in after["steps"][:3])  # 3 workers
    shared = after["shared_state"]
    assert shared["updates"] > before["shared_state"]["updates"]  # the learner went on
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["session"] == 1

    last = cli(
        "run", "--resume", str(run_dir), "--workers", "1", "--total-steps", "1500", "--quiet"
    )
    assert last.returncode == 0, last.stderr
    rows = int(replay["heads"].sum())
    assert (
        f"mprl: resume: shared-state field 'replay' (ReplayBuffer): {rows:,} rows re-partitioned "
        "from 3 workers (1,000 rows each) to 1 (3,000 rows each)"
    ) in last.stderr
    final = saved(run_dir)["shared_state"]["replay"]
    assert final["heads"].shape == (1,)
    assert int(final["heads"][0]) == saved(run_dir)["env_steps"] >= 1500  # all 3,000 fit
    assert transitions(replay, 1000) <= transitions(final, 3000)

    # what the last session wrote loads and plays
    loaded = mprl.load(run_dir)
    assert (loaded.algorithm, loaded.run.workers, loaded.session) == ("sac", 1, 2)
    assert loaded.data["plugin_distribution"] == "mprl"  # the built-in sac: mprl installs it
    obs = np.stack([loaded.observation_space.sample() for _ in range(3)])
    assert np.shape(loaded.act(obs, True)) == (3, 1)
    played = cli("eval", str(run_dir), "--episodes", "1", "--deterministic")
    assert played.returncode == 0, played.stderr
    assert json.loads((run_dir / "eval.json").read_text())["env_steps_trained"] >= 1500


def test_per_worker_lists_are_extended_and_cut_and_a_per_worker_tensor_needs_dropping(
    installed, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    args = ["--quiet", "--set", "step_sleep=0.001"]
    # on until each worker has ended an episode (a handshake: on a loaded machine worker 0 once
    # made a whole step budget before worker 1 had started)
    with running(["--plugin", "probe", "--workers", "2", "--run-dir", str(run_dir), *args]) as proc:
        for rank in (0, 1):
            wait_for_metrics(run_dir, lambda r, rank=rank: r.get("rank") == rank and "env" in r)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    steps = json.loads((run_dir / "summary.json").read_text())["env_steps"]
    before = saved(run_dir)
    visits = before["shared_state"]["visits"]
    assert len(visits) == 2 and all(v > 0 for v in visits)

    # refused before anything starts: in this process
    code, stderr = cli_here(
        capsys,
        "run",
        "--resume",
        str(run_dir),
        "--workers",
        "3",
        "--total-steps",
        str(steps + 600),
        *args,
    )
    assert code == 2, stderr
    error = stderr.strip().splitlines()[-1]
    assert error.startswith("mprl: ") and "Traceback" not in stderr
    ckpt = str(run_dir / "checkpoints" / "last.pt")
    assert f"cannot resume checkpoint {ckpt!r} with 3 workers (it was saved with 2)" in error
    assert "shared-state field 'seen' (Tensor) cannot be fitted to this run: shape (2,)" in error
    assert "--resume-drop seen" in error and "or resume with --workers 2" in error
    assert saved(run_dir)["session"] == 0  # nothing was started or written

    more = cli(
        "run", "--resume", str(run_dir), "--workers", "3", "--total-steps", str(steps + 600),
        "--resume-drop", "seen", *args,
    )  # fmt: skip
    assert more.returncode == 0, more.stderr
    said = notes(run_dir, 1)
    assert set(said) == {"visits", "envs", "ready", "seen"}
    assert said["visits"] == (
        "resume: shared-state field 'visits' (PerWorker): 2 slots saved, 3 in this run: "
        "ranks 0-1 kept, rank 2 starts at 0"
    )
    assert said["seen"] == (
        "resume: shared-state field 'seen' (Tensor): its data dropped (--resume-drop); it "
        "starts as declared"
    )
    for line in said.values():
        assert f"mprl: {line}" in more.stderr
    shared = saved(run_dir)["shared_state"]
    assert len(shared["visits"]) == 3 and shared["seen"].shape == (3,)
    assert shared["visits"][0] >= visits[0] and shared["visits"][1] >= visits[1]
    assert shared["envs"] == ["Corridor", "Corridor", "Corridor"]

    fewer = cli(
        "run", "--resume", str(run_dir), "--workers", "1", "--total-steps", str(steps + 1000),
        "--resume-drop", "seen", *args,
    )  # fmt: skip
    assert fewer.returncode == 0, fewer.stderr
    said = notes(run_dir, 2)
    assert said["visits"].startswith(
        "resume: shared-state field 'visits' (PerWorker): 3 slots saved, 1 in this run: rank 0 "
        "kept, the slots of ranks 1-2 dropped"
    )
    final = saved(run_dir)["shared_state"]
    assert len(final["visits"]) == 1 and final["visits"][0] >= shared["visits"][0]
    assert final["seen"].shape == (1,)
