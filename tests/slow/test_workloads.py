"""The workloads' learning runs, in this process: Atari frames with clipped rewards (with
gymnasium and with EnvPool stepping the game), each built-in plugin on Atari frames and eval of its
checkpoint, PPO's gSDE, and EnvPool solving CartPole-v1 like gymnasium's envs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mprl.lib.nets import ActorCritic
from mprl.testing import run_serial
from tests.unit.test_workloads import FRAMES, _Worker, needs_atari


@needs_atari
@pytest.mark.parametrize("way", ["gym", "envpool"])
def test_atari_learns_from_clipped_rewards_and_logs_the_raw_score(way):
    """Space Invaders pays 5 to 30 points an alien: the rewards written for learning are their
    sign, the returns logged are the game's score; the same with EnvPool stepping the game."""
    torch.manual_seed(0)  # the actions sampled: the same game every time (unseeded, it failed once)
    ctx = _Worker("ALE/SpaceInvaders-v5")
    env = ctx.make_env(0)
    assert env.observation_space == FRAMES
    model = ActorCritic(env.observation_space, env.action_space, (64,))
    envs = ctx.batch(way, 2)
    assert envs.obs.dtype == torch.uint8 and envs.obs.shape == (2, 4, 84, 84)
    kills = np.zeros(2)  # clipped rewards summed per env: one per alien shot
    while not ctx.episodes:
        rewards, dones = envs.step(model, model.sample(model.policy(envs.obs)))
        assert set(np.unique(rewards)) <= {0.0, 1.0}  # Space Invaders only pays
        kills += rewards
    score, length = ctx.episodes[0]
    ended = np.flatnonzero(dones)[0]  # the env whose episode that was (logged in env order)
    assert length > 100 and kills[ended] > 0
    # learning saw one per kill; the logged score is the game's points, 5 or more per kill
    assert score >= 5 * kills[ended] and score % 5 == 0
    envs.close()
    env.close()


@needs_atari
@pytest.mark.parametrize("algorithm", ["a3c", "impala", "ppo"])
def test_each_built_in_plugin_learns_from_atari_frames_and_eval_plays_the_checkpoint(
    algorithm, tmp_path
):
    from mprl.tools.evaluate import evaluate

    config = {
        "a3c": {"envs_per_worker": 2, "n_steps": 8},
        "impala": {"envs_per_worker": 2, "unroll": 8},
        "ppo": {"envs_per_worker": 2, "n_steps": 8, "epochs": 1, "minibatch_size": 16},
    }[algorithm]
    result = run_serial(
        algorithm, env="ALE/Pong-v5", total_steps=160, config=config, run_dir=tmp_path / "run"
    )
    assert result.model.torso_kind == "nature"
    rollouts = getattr(result.state, "rollouts", None)
    if rollouts is not None:  # frames stay uint8 in the slots
        assert rollouts.slot(0)["obs"].dtype == torch.uint8
    if algorithm != "a3c":  # the learner reported finite losses
        losses = [r["value_loss"] for r in result.records if "value_loss" in r]
        assert losses and all(np.isfinite(losses))
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert saved["config"]["torso"] == "auto"
    played = evaluate(tmp_path / "run", episodes=1, out=tmp_path / "eval.json")
    assert played["episodes"] == 1 and -21 <= played["returns"][0] <= 21
    assert json.loads((tmp_path / "eval.json").read_text())["returns"] == played["returns"]


def test_ppo_with_gsde_learns_its_std_matrix_and_eval_plays_the_checkpoint(tmp_path):
    """``--set sde_every=4`` through a whole run: workers act with gSDE noise and the learner
    updates the std matrix, which the checkpoint holds and ``mprl eval`` plays with (sampled,
    and the mean alone)."""
    from mprl.tools.evaluate import evaluate

    config = {"sde_every": 4, "envs_per_worker": 2, "n_steps": 128, "epochs": 2}
    result = run_serial(
        "ppo", env="Pendulum-v1", total_steps=2048, config=config, run_dir=tmp_path / "run"
    )
    assert result.model.log_std.shape == (64, 1)  # a std per (feature, action)
    assert result.model.log_std.abs().sum() > 0  # learned: it starts at zeros
    assert len(result.episode_returns) >= 8  # 200-step episodes of 4 envs
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert torch.equal(saved["model"]["log_std"], result.model.log_std)
    for deterministic in (False, True):
        played = evaluate(tmp_path / "run", episodes=1, deterministic=deterministic)
        assert played["lengths"] == [200]


def test_a_run_with_envpool_solves_cartpole_like_one_with_gym():
    pytest.importorskip("envpool")
    result = run_serial("ppo", env="CartPole-v1", env_batch="envpool", total_steps=60_000, seed=1)
    returns = result.episode_returns
    assert result.summary.solved or np.mean(returns[-20:]) > 300, np.mean(returns[-20:])
    # episodes of CartPole pay 1 a step: each logged return is its length, up to the limit
    assert all(1 <= r <= 500 and r == int(r) for r in returns)
