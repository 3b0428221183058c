"""Writes models-c164ff9.pt: state dicts of mprl.lib's recurrent actor-critic and of mappo's
model as the code of commit c164ff9 wrote them (before mprl.lib was split by concern and mappo's
value normalisation became mprl.lib.norms.ValueNorm), with inputs and the outputs they gave, for
tests/unit/test_old_checkpoints.py. It was run on that commit, so the file is what a checkpoint
of then holds; run on a later one it shows what that one writes::

    git worktree add /tmp/old c164ff9
    cd /tmp/old && PYTHONPATH=.:plugins python /path/to/tests/compat/write_models.py OUT.pt
"""

from __future__ import annotations

import sys

import gymnasium as gym
import mprl_mappo.algorithm as mappo
import numpy as np
import torch

from mprl.host.envs import make_env
from mprl.host.plugins import get_plugin_manager
from mprl.lib.recurrent import RecurrentActorCritic

FLAT = gym.spaces.Box(-1, 1, (4,))
RECURRENT = {  # name: (action space, core, sde_every, normalize_obs)
    "lstm": (gym.spaces.Discrete(3), "lstm", 0, True),
    "gru_sde": (gym.spaces.Box(-1, 1, (2,), np.float32), "gru", 3, False),
}


def main(out: str) -> None:
    torch.manual_seed(0)
    models = {}
    for name, (act, core, sde, norm) in RECURRENT.items():
        model = RecurrentActorCritic(FLAT, act, (8,), core, 4, normalize_obs=norm, sde_every=sde)
        model.observe(torch.randn(20, 4))
        obs, dones = (
            torch.randn(5, 2, 4),
            torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]] + [[0.0, 0.0]] * 2),
        )
        state = torch.randn(model.state_rows, 2, 4)
        with torch.no_grad():
            outputs = model.unroll(obs, state, dones)
        models[name] = {
            "state_dict": model.state_dict(),
            "parameters": [n for n, _ in model.named_parameters()],
            "inputs": (obs, state, dones),
            "outputs": outputs,
        }
    frames = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)  # too big to keep: names and shapes
    model = RecurrentActorCritic(frames, gym.spaces.Discrete(3), (8,), "lstm", 4)
    models["lstm_frames"] = {
        "shapes": {k: tuple(v.shape) for k, v in model.state_dict().items()},
        "parameters": [n for n, _ in model.named_parameters()],
    }
    env = make_env(get_plugin_manager(), "mpe2:simple_spread_v3")
    space = env.observation_space
    for name, cfg in [
        ("mappo", mappo.MAPPOConfig(hidden=(8,))),
        ("ippo", mappo.IPPOConfig(hidden=(8,), share_params=False)),
    ]:
        model = mappo.AgentsModel(space, env.action_space, cfg)
        model.observe_returns(torch.randn(100) * 3 + 2)
        obs, state = torch.randn(4, *space.shape), torch.randn(4, space.state.shape[0])
        returns = torch.randn(6) * 3
        with torch.no_grad():
            outputs = (model.denormalize(model.value(obs, state)), model.normalize(returns))
        models[name] = {
            "state_dict": model.state_dict(),
            "parameters": [n for n, _ in model.named_parameters()],
            "config": {"hidden": (8,), "share_params": cfg.share_params, "critic": cfg.critic},
            "inputs": (obs, state, returns),
            "outputs": outputs,
        }
    torch.save(models, out)


if __name__ == "__main__":
    main(sys.argv[1])
