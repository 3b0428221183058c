"""Atari games of ale-py (``ALE/Pong-v5``, ``PongNoFrameskip-v4``), with the preprocessing of
DQN and its successors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from mprl.errors import UsageError

#: what installs the Atari games (ale-py ships the ROMs; the preprocessing resizes with OpenCV)
ATARI_EXTRA = 'pip install "mprl[atari]"'


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` names an Atari game of ale-py (``ALE/Pong-v5``, ``PongNoFrameskip-v4``,
    ``Pong-v4``), installed or not."""
    if env_id.startswith("ALE/") or env_id.endswith(("NoFrameskip-v4", "NoFrameskip-v0")):
        return True
    spec = gym.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def _clip_reward(reward: Any) -> float:
    return float(np.sign(reward))


def make_atari(env_id: str, **kwargs: Any) -> gym.Env:
    """An Atari game with the standard preprocessing of DQN and its successors (as rl-zoo and
    cleanrl have it): up to 30 no-op starts, 4 frames skipped per step (rewards summed, the last
    two frames max-pooled), grey 84x84 uint8 frames, 4 of them stacked (``(4, 84, 84)``), and
    rewards clipped to their sign for learning. ``RecordEpisodeStatistics`` sits below the
    clipping, so the episode returns mprl logs are the raw game score. ``ALE/*-v5`` games keep
    their sticky actions (repeat probability 0.25), the ``NoFrameskip-v4`` ones have none."""
    try:
        import ale_py

        gym.register_envs(ale_py)
        env = gym.make(env_id, frameskip=1, **kwargs)  # the preprocessing skips frames itself
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False,
            grayscale_obs=True, scale_obs=False,
        )  # fmt: skip
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        missing = exc.name if isinstance(exc, ImportError) else "opencv-python"
        raise UsageError(
            f"environment {env_id!r} is an Atari game, and {missing} is not installed: "
            f"{ATARI_EXTRA}"
        ) from None
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.TransformReward(env, _clip_reward)
    return gym.wrappers.FrameStackObservation(env, 4)
