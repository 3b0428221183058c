"""MuJoCo through the CLI: observation normalisation in a real run, its statistics checkpointed
and used by ``mprl eval``."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mprl.testing import run_serial

needs_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None, reason='needs mujoco: pip install "mprl[mujoco]"'
)


@needs_mujoco
def test_mujoco_ppo_normalises_observations_and_eval_uses_the_statistics(tmp_path):
    from mprl.tools.evaluate import evaluate

    config = {"n_steps": 64, "epochs": 1}
    result = run_serial(
        "ppo", env="HalfCheetah-v5", total_steps=256, config=config, run_dir=tmp_path / "run"
    )
    model = result.model
    assert model.obs_norm is not None
    # every observation the learner learned from was folded in: 64 steps of 1 env an update
    updates = result.state.weights.version
    assert updates >= 2 and int(model.obs_norm.count) == 64 * updates
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert torch.equal(saved["model"]["obs_norm.mean"], model.obs_norm.mean)
    assert float(saved["model"]["obs_norm.var"].min()) > 0
    # the workers act with the statistics the learner published with the weights
    worker = next(c for c in result.contexts if c.role == "worker")
    assert int(worker.model.obs_norm.count) == int(model.obs_norm.count)
    played = evaluate(tmp_path / "run", episodes=1, out=tmp_path / "eval.json")
    assert played["lengths"] == [1000]
