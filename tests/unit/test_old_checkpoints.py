"""Models as the code of commit c164ff9 saved them (before mprl.lib was split by concern and
mappo's value normalisation became mprl.lib.norms.ValueNorm; tests/compat/write_models.py
wrote them there) load into today's classes, strictly, and give the outputs they gave then: a
checkpoint of an earlier run resumes and plays as it did, its optimizer state on the same
parameters."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from mpe2 import simple_spread_v3

from mprl.lib.marl import AgentEnv
from mprl.lib.recurrent import RecurrentActorCritic
from mprl_builtin.mappo.algorithm import AgentsModel, MAPPOConfig
from tests.conftest import REPO

OLD = torch.load(REPO / "tests" / "compat" / "models-c164ff9.pt")
FLAT = gym.spaces.Box(-1, 1, (4,))


@pytest.mark.parametrize(
    ("name", "act", "core", "sde", "norm"),
    [
        ("lstm", gym.spaces.Discrete(3), "lstm", 0, True),
        ("gru_sde", gym.spaces.Box(-1, 1, (2,), np.float32), "gru", 3, False),
    ],
)
def test_a_recurrent_actor_critic_of_then_loads_and_acts_as_it_did(name, act, core, sde, norm):
    old = OLD[name]
    model = RecurrentActorCritic(FLAT, act, (8,), core, 4, normalize_obs=norm, sde_every=sde)
    model.load_state_dict(old["state_dict"])
    # an optimizer's state is by the parameters' order
    assert [n for n, _ in model.named_parameters()] == old["parameters"]
    with torch.no_grad():
        outputs = model.unroll(*old["inputs"])
    # the replay is one nn.LSTM / nn.GRU call now (was a loop of the cells): the same to rounding
    for now, then in zip(outputs, old["outputs"], strict=True):
        torch.testing.assert_close(now, then, rtol=0, atol=1e-6)


def test_a_recurrent_actor_critic_over_frames_has_the_names_and_shapes_it_had():
    frames = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)
    model = RecurrentActorCritic(frames, gym.spaces.Discrete(3), (8,), "lstm", 4)
    old = OLD["lstm_frames"]
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == old["shapes"]
    assert [n for n, _ in model.named_parameters()] == old["parameters"]


@pytest.mark.parametrize("name", ["mappo", "ippo"])
def test_a_mappo_model_of_then_loads_its_return_moments_into_its_value_norm(name):
    """mappo kept the returns' moments in a buffer ``ret_moments`` of its own; its critic's
    values come back as the same returns, and returns are standardised as they were."""
    old = OLD[name]
    env = AgentEnv(simple_spread_v3.parallel_env())
    model = AgentsModel(env.observation_space, env.action_space, MAPPOConfig(**old["config"]))
    model.load_state_dict(old["state_dict"])
    assert [n for n, _ in model.named_parameters()] == old["parameters"]
    obs, state, returns = old["inputs"]
    with torch.no_grad():
        values = model.value_norm.denormalize(model.value(obs, state))
    torch.testing.assert_close(values, old["outputs"][0])
    torch.testing.assert_close(model.value_norm(returns), old["outputs"][1])
