"""``python -m mprl eval``: a trained policy played from its checkpoint, through the CLI."""

from __future__ import annotations

import numpy as np
import torch

from mprl.host.envs import make_env, play_episodes
from mprl.host.plugins import get_plugin_manager


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
