"""An off-policy algorithm on the schema's transport alone (tests/plugins/mprl_docs_dqn.py): a replay
buffer sized from the config and shaped by the spaces, a target network and an update counter in
the shared state, all kept across a resume; serial and spawned runs."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from mprl import kinds, schema
from mprl.errors import SchemaError
from mprl.transport.memory import MemoryBuilder
from tests.conftest import cli_here
from tests.plugins import mprl_docs_dqn


def snapshot(decl, builder, dims):
    """What a checkpoint keeps of field ``decl`` built with ``builder`` (mprl.kinds)."""
    handler = kinds.of(decl)
    return handler.snapshot(decl, handler.build(decl, builder, dims))


SMALL = {"buffer_size": 1000, "learning_starts": 200, "target_every": 50, "batch_size": 32}


def test_dqn_learns_from_its_replay_buffer_in_serial_mode(mprl_pm, mprl_serial):
    mprl_pm.register(mprl_docs_dqn)
    a, b = (
        # (1,200 steps: 600 a worker, past its ring of 500; some 250 updates, 5 target copies)
        mprl_serial("docs-dqn", workers=2, total_steps=1200, seed=5, config=SMALL)
        for _ in "ab"
    )
    state = a.state
    assert state.replay.capacity == 1000 and state.replay.size() == 1000  # both rings full
    assert state.replay.buffers["obs"].shape == (1000, 4)  # CartPole's observations
    assert state.replay.buffers["action"].dtype == torch.int64
    assert 0 < state.updates.value == state.weights.version  # every update was published
    logged = [r["updates"] for r in a.records if "updates" in r]
    assert logged and all(u % 50 == 0 for u in logged)
    # the target network is the model as of the last copy, not its initial weights
    spaces = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2)
    initial = mprl_docs_dqn.make_model(*spaces, mprl_docs_dqn.DQNConfig())
    assert not torch.equal(state.target[0].weight, initial[0].weight)
    assert a.episode_returns == b.episode_returns  # a serial run repeats for a seed


def test_a_replay_buffer_can_stay_out_of_checkpoints():
    kept, skipped = schema.ReplayBuffer(capacity=8), schema.ReplayBuffer(8, checkpoint=False)
    dims = schema.Dims(2, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    builder = MemoryBuilder(None, torch.nn.Linear(1, 1), None, share=False, sleep=True)
    assert snapshot(kept, builder, dims) is not None
    assert snapshot(skipped, builder, dims) is None


def test_sizes_from_the_config_are_checked_before_anything_starts(installed, capsys):
    code, err = cli_here(capsys, "run", "--plugin", "docs-dqn", "--set", "buffer_size=0")
    assert code == 2
    assert "shared-state field 'replay' (ReplayBuffer): size 'config.buffer_size' is 0" in err
    dims = schema.Dims(
        2, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), mprl_docs_dqn.DQNConfig()
    )
    with pytest.raises(SchemaError, match=r"size 'config\.buffer_sise': the config has no field"):
        kinds.check_dims(schema.Schema(replay=schema.ReplayBuffer("config.buffer_sise")), dims)
    with pytest.raises(SchemaError, match=r"'config\.2x' must be an int, 'workers', 'all'"):
        schema.Schema(t=schema.Tensor(shape=("config.2x",)))
