"""The multi-agent plugins as a user runs them: spawned workers playing MPE's Cooperative
Navigation, the lockstep of a synchronous learner, a resume, eval with each agent's return, and
the per-agent plot."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli, read_metrics

ENV = "mpe2:simple_spread_v3(N=3, max_cycles=25)"


def test_mappo_workers_collect_whole_team_rollouts_in_lockstep_and_resume(tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "mappo", "--env", ENV, "--workers", "2", "--total-steps", "4000",
               "--set", "envs_per_worker=4", "--run-dir", str(run_dir), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    rollout = 4 * 25  # one rollout per worker per policy version: envs x n_steps team steps
    per_worker = summary["per_worker_steps"]
    assert all(steps % rollout == 0 for steps in per_worker[:2])
    assert abs(per_worker[0] - per_worker[1]) <= rollout
    records = read_metrics(run_dir)
    episodes = [r for r in records if "episode_return" in r]
    assert {r["source"] for r in episodes} == {"worker:0", "worker:1"}
    assert all(r["episode_length"] == 25 for r in episodes)
    for r in episodes:  # the team's return is the agents' mean
        each = [r[f"return_agent_{i}"] for i in range(3)]
        assert r["episode_return"] == pytest.approx(sum(each) / 3)
    assert any("policy_loss" in r for r in records if r["source"] == "trainer")
    again = cli("run", "--resume", str(run_dir), "--total-steps", "6000", "--quiet")
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] >= 6000


def test_eval_and_plot_of_a_multi_agent_run_tell_each_agents_return(tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "ippo", "--env", ENV, "--workers", "1", "--total-steps", "1000",
               "--set", "envs_per_worker=2", "--run-dir", str(run_dir), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ev = cli("eval", str(run_dir), "--episodes", "3", "--seed", "4")
    assert ev.returncode == 0, ev.stderr
    assert "per agent: agent_0 " in ev.stdout
    result = json.loads((run_dir / "eval.json").read_text())
    agents = result["agents"]
    assert set(agents) == {"agent_0", "agent_1", "agent_2"}
    for i, team in enumerate(result["returns"]):
        assert team == pytest.approx(sum(a["returns"][i] for a in agents.values()) / 3, rel=1e-5)
    assert cli("eval", str(run_dir), "--episodes", "3", "--seed", "4").returncode == 0
    assert json.loads((run_dir / "eval.json").read_text())["returns"] == result["returns"]
    pytest.importorskip("matplotlib")
    out = tmp_path / "agents.png"
    plot = cli("plot", str(run_dir), "--metric", "agents", "-o", str(out))
    assert plot.returncode == 0, plot.stderr
    assert out.stat().st_size > 10_000


def test_rmappo_replays_the_workers_log_probs_and_its_eval_resets_each_agents_state(tmp_path):
    """``--set core=gru``: spawned workers store each agent's hidden state at every chunk's
    start; the learner's replay of the chunks gives the workers' log-probabilities before each
    update (episodes of 6 steps end inside the chunks of 4). Eval plays the recurrent policy."""
    run_dir = tmp_path / "run"
    env = "mpe2:simple_spread_v3(N=3, max_cycles=6)"
    proc = cli("run", "--plugin", "mappo", "--env", env, "--workers", "2", "--total-steps", "1200",
               "--set", "core=gru", "--set", "envs_per_worker=4", "--set", "n_steps=10",
               "--set", "data_chunk_length=4", "--run-dir", str(run_dir), "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    losses = [r for r in read_metrics(run_dir) if "replay_logp_error" in r]
    assert losses and all(r["replay_logp_error"] < 1e-5 for r in losses)
    ev = cli("eval", str(run_dir), "--episodes", "3", "--seed", "4")
    assert ev.returncode == 0, ev.stderr
    result = json.loads((run_dir / "eval.json").read_text())
    assert len(result["returns"]) == 3 and set(result["agents"]) == {
        "agent_0",
        "agent_1",
        "agent_2",
    }
    again = cli("eval", str(run_dir), "--episodes", "3", "--seed", "4")
    assert again.returncode == 0 and json.loads((run_dir / "eval.json").read_text()) == result


def test_a_competitive_task_with_unlike_agents_trains_and_evals_each_teams_return(tmp_path):
    """simple_world_comm: the leader has 20 actions, the others 5 (masked); three teams by
    name (leadadversary, adversary, agent), each with its own networks (``groups=names``), each
    one's return logged, evaluated and filmed."""
    run_dir = tmp_path / "run"
    env = "mpe2:simple_world_comm_v3(max_cycles=10)"
    proc = cli("run", "--plugin", "mappo", "--env", env, "--serial", "--workers", "1",
               "--total-steps", "200", "--set", "envs_per_worker=2", "--set", "n_steps=10",
               "--set", "epochs=2", "--set", "groups=names", "--run-dir", str(run_dir),
               "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    episodes = [r for r in read_metrics(run_dir) if "episode_return" in r]
    assert len(episodes) >= 10
    for r in episodes:
        adversaries = [r[f"return_adversary_{i}"] for i in range(3)]
        assert r["return_team_adversary"] == pytest.approx(sum(adversaries) / 3)
        assert r["return_team_leadadversary"] == pytest.approx(r["return_leadadversary_0"])
        assert "return_team_agent" in r
    video = tmp_path / "video"
    ev = cli("eval", str(run_dir), "--episodes", "2", "--video", str(video))
    assert ev.returncode == 0, ev.stderr
    assert "per team: leadadversary " in ev.stdout and ", agent " in ev.stdout
    result = json.loads((run_dir / "eval.json").read_text())
    assert set(result["teams"]) == {"leadadversary", "adversary", "agent"}
    assert all(len(t["returns"]) == 2 for t in result["teams"].values())
    assert len(list(video.glob("*.mp4"))) == 2
