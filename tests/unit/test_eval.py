"""``python -m mprl eval``: a trained policy played from its checkpoint, through the CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from mprl.host.envs import make_env, play_episodes
from mprl.host.plugins import get_plugin_manager
from tests.conftest import cli


def _train(run_dir, *args: str) -> None:
    proc = cli("run", "--run-dir", str(run_dir), "--quiet", *args, timeout=280)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_a_solved_cartpole_policy_plays_as_well_in_eval_as_the_run_said(tmp_path):
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "a3c")
    proc = cli("eval", str(run_dir), "--episodes", "20")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["episodes"] == 20 and len(result["returns"]) == 20
    # the run played this policy for 10 sampled episodes (mean >= 475) before it stopped
    # solved; 20 other episodes may score a little lower, not much
    assert result["mean_return"] >= 450, result["returns"]
    assert f"return {result['mean_return']:.1f} ± {result['std_return']:.1f}" in proc.stdout
    assert "sampled actions" in proc.stdout
    proc = cli("eval", str(run_dir), "--episodes", "3", "--deterministic")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["deterministic"] is True and "deterministic" in proc.stdout


def test_eval_is_repeatable_for_a_seed_and_plays_box_actions(tmp_path):
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "ppo", "--env", "Pendulum-v1", "--total-steps", "4000")
    out = [tmp_path / f"eval{i}.json" for i in range(3)]
    for file, seed in zip(out, ("3", "3", "4"), strict=True):
        proc = cli("eval", str(run_dir / "checkpoints" / "last.pt"), "--episodes", "3",
                   "--seed", seed, "--out", str(file))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    first, again, other = (json.loads(f.read_text()) for f in out)
    assert first["lengths"] == [200, 200, 200]  # Pendulum's time limit: played to the end
    assert first["returns"] == again["returns"]  # same seed: same episodes, same sampled actions
    assert first["returns"] != other["returns"]
    assert first["env"] == "Pendulum-v1" and first["algorithm"] == "ppo"
    assert first["deterministic"] is False and first["env_steps_trained"] >= 4000


def test_episodes_played_side_by_side_are_the_episodes_played_one_by_one():
    # a policy that depends on each observation alone: how the episodes are spread over envs
    # and batched must not change any episode (the run's policy check plays 10 envs at once)
    def act(obs: torch.Tensor, deterministic: bool) -> np.ndarray:
        assert deterministic and obs.shape[1:] == (4,)
        return (obs[:, 3] > 0).long().numpy()  # episodes of 140-270 steps

    pm = get_plugin_manager()
    played = []
    for n_envs in (1, 3, 7):
        envs = [make_env(pm, "CartPole-v1", index=i) for i in range(n_envs)]
        played.append(play_episodes(envs, act, 7, True, seed=5))
        for env in envs:
            env.close()
    one_by_one, *together = played
    assert all(result == one_by_one for result in together)
    returns, lengths = one_by_one
    assert returns == [float(n) for n in lengths] and len(set(lengths)) > 1  # 7 episodes
    assert play_episodes([make_env(pm, "CartPole-v1")], act, 7, True, seed=6) != one_by_one


def test_eval_refuses_bad_input_naming_it(tmp_path):
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    proc = cli("eval", str(not_a_run))
    assert proc.returncode == 2
    assert f"no checkpoint at '{not_a_run}/checkpoints/last.pt'" in proc.stderr
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "a3c", "--workers", "1", "--total-steps", "500")
    proc = cli("eval", str(run_dir), "--episodes", "0")
    assert proc.returncode == 2 and "--episodes must be at least 1" in proc.stderr
    hidden = tmp_path / "hidden"  # moviepy made unimportable, as on a machine without it
    (hidden / "moviepy").mkdir(parents=True)
    (hidden / "moviepy" / "__init__.py").write_text("raise ImportError('not installed')\n")
    proc = cli("eval", str(run_dir), "--video", str(tmp_path / "video"),
               env={"PYTHONPATH": os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])})  # fmt: skip
    assert proc.returncode == 2 and 'pip install "mprl[video]"' in proc.stderr
    assert not (run_dir / "eval.json").exists()  # nothing half-done


def test_video_records_every_episode(tmp_path):
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "a3c", "--workers", "1", "--total-steps", "500")
    video = tmp_path / "video"
    proc = cli("eval", str(run_dir), "--episodes", "2", "--video", str(video))
    assert proc.returncode == 0, proc.stderr
    files = sorted(video.glob("*.mp4"))
    assert [f.name for f in files] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    assert all(f.stat().st_size > 1000 for f in files)
    assert json.loads((run_dir / "eval.json").read_text())["video_dir"] == str(video)
