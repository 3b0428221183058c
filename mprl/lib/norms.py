"""Running normalisers: statistics of a stream folded in batch by batch (Chan et al.'s parallel
update, :func:`merge_moments`), for algorithm plugins to build on.

- :class:`ObsNorm` standardises a network's inputs (``normalize_obs``);
- :class:`ValueNorm` is the same running standardiser over one number, the returns: a critic
  learns the standardised returns and its outputs are turned back into returns (MAPPO's value
  normalisation);
- :class:`ReturnNorm` scales a worker's rewards by a running std of their discounted return
  (``normalize_reward``): numpy, in the worker, not part of the model.

ObsNorm and ValueNorm keep their statistics as buffers: they travel with the model's weights to
the workers, into checkpoints and into ``mprl eval``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch
from torch import nn


def merge_moments(
    mean: Any, var: Any, count: Any, batch_mean: Any, batch_var: Any, n: int
) -> tuple:
    """Running ``(mean, var, count)`` with a batch's mean and variance folded in (Chan et
    al.'s parallel update): plain arithmetic, so tensors and numpy values alike."""
    total = count + n
    delta = batch_mean - mean
    var = (var * count + batch_var * n + delta**2 * count * n / total) / total
    return mean + delta * n / total, var, total


class ObsNorm(nn.Module):
    """Observations standardised by a running mean and variance (Chan et al.'s parallel
    update), kept as buffers: they travel with the model's weights to the workers, into
    checkpoints and into ``mprl eval``. Only :meth:`update` changes them (the learner calls it
    with each batch); until then it passes observations through unchanged."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Fold a batch ``[..., *shape]`` of observations into the statistics."""
        batch = obs.reshape(-1, *self.mean.shape).to(self.mean.dtype)
        merged = merge_moments(
            self.mean, self.var, self.count, batch.mean(0), batch.var(0, unbiased=False), len(batch)
        )
        for buffer, value in zip((self.mean, self.var, self.count), merged, strict=True):
            buffer.copy_(value)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        std = (self.var + 1e-8).sqrt().to(obs.dtype)
        normed = ((obs - self.mean.to(obs.dtype)) / std).clamp(-self.clip, self.clip)
        # nothing seen yet: the identity (chosen on the device: no sync of a GPU learner)
        return torch.where(self.count > 0, normed, obs)


class ValueNorm(ObsNorm):
    """The returns' running mean and variance (MAPPO's value normalisation, Yu et al. 2022):
    the critic learns ``norm(returns)`` (standardised, unclipped) and :meth:`denormalize` turns
    its outputs back into returns. An :class:`ObsNorm` of one number: :meth:`update` folds in a
    batch of returns; until the first, both ways are the identity.

    A model that kept these moments by hand before, as one buffer ``[mean, var, count]``,
    loads its earlier checkpoints with :meth:`load_old_moments`."""

    def __init__(self) -> None:
        super().__init__((), clip=math.inf)

    def denormalize(self, value: torch.Tensor) -> torch.Tensor:
        """Values learnt standardised, as returns."""
        std = (self.var + 1e-8).sqrt().to(value.dtype)
        return value * std + self.mean.to(value.dtype)

    @staticmethod
    def load_old_moments(model: nn.Module, old: str, name: str) -> None:
        """Let ``model`` load state dicts written before it had this ValueNorm (its attribute
        ``name``): their buffer ``old``, ``[mean, var, count]``, becomes this one's buffers."""
        hook = functools.partial(_old_moments, old=old, name=name)  # picklable, unlike a closure
        model.register_load_state_dict_pre_hook(hook)


def _old_moments(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any, old: str, name: str
) -> None:
    moments = state_dict.pop(prefix + old, None)
    if moments is not None:
        for key, value in zip(("mean", "var", "count"), moments.tolist(), strict=True):
            state_dict[f"{prefix}{name}.{key}"] = torch.tensor(value, dtype=torch.float64)


class ReturnNorm:
    """Rewards divided by a running standard deviation of the discounted return, then clipped
    (the reward scaling of SB3's ``VecNormalize`` and gymnasium's ``NormalizeReward``): the
    value targets of MuJoCo's tasks, whose returns run to the thousands, stay near unit size.
    The statistics are the worker's own and start again with it (a restart, a resume).

    :param n: how many environments (one discounted return each).
    :param gamma: the discount of the return.
    """

    def __init__(self, n: int, gamma: float, clip: float = 10.0) -> None:
        self.gamma, self.clip = gamma, clip
        self.ret = np.zeros(n)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """``rewards`` scaled; ``dones`` end those envs' returns."""
        self.ret = self.ret * self.gamma + rewards
        self.mean, self.var, self.count = merge_moments(
            self.mean, self.var, self.count, self.ret.mean(), self.ret.var(), len(self.ret)
        )
        self.ret[dones] = 0.0
        scaled = rewards / np.sqrt(self.var + 1e-8)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)
