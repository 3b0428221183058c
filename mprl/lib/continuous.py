"""Parts of off-policy algorithms for continuous (``Box``) actions, TD3's and SAC's: the built-in
``sac`` is made of them, and ``examples/mprl-td3`` is a whole TD3 that uses every one.

- **Networks** act in ``[-1, 1]``: :class:`DeterministicActor` (a tanh output) and
  :class:`TwinQ` (two Q networks over observation and action, :meth:`TwinQ.min` for the
  clipped double-Q target), both made of :func:`plain_mlp` layers.
- **Actions**: :func:`scale_action` maps ``[-1, 1]`` onto a ``Box``'s bounds (what the env
  takes), :func:`unscale_action` maps back; :func:`box_bounds` reads the bounds, which must be
  finite.
- **Exploration**: :class:`GaussianNoise` and :class:`OrnsteinUhlenbeckNoise` (one process per
  env, reset where its episode ends), drawn with a seeded generator in the actor's ``[-1, 1]``
  units; :func:`uniform_actions` for the warm-up before learning starts.
- **Target networks**: :func:`polyak_update` moves a target a fraction ``tau`` towards its
  source, in place; :class:`TargetNetwork` keeps a ``schema.Module`` field as a learner on any
  ``--device`` updates it (a copy on the GPU, loaded back into the field for checkpoints).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from mprl.lib.torsos import ACTIVATIONS

__all__ = [
    "DeterministicActor",
    "GaussianNoise",
    "OrnsteinUhlenbeckNoise",
    "TargetNetwork",
    "TwinQ",
    "box_bounds",
    "plain_mlp",
    "polyak_update",
    "scale_action",
    "uniform_actions",
    "unscale_action",
]


# -- networks ----------------------------------------------------------------------------------


def plain_mlp(
    n_in: int, hidden: Sequence[int], n_out: int, activation: str = "relu"
) -> nn.Sequential:
    """A multi-layer perceptron ``n_in -> hidden... -> n_out`` with PyTorch's default
    initialisation (``nn.Linear``'s: weights and biases uniform in ``+-1/sqrt(fan_in)``), as the
    TD3 and SAC authors' code and Stable-Baselines3 build their actors and critics: each hidden
    layer a linear layer followed by ``activation`` (``"relu"`` or ``"tanh"``,
    :data:`mprl.lib.torsos.ACTIVATIONS`), the output layer linear. Its layers are indexed
    ``0, 1, ...`` in that order (``net[-1]`` is the output layer), so the state dict's keys are
    ``0.weight, 0.bias, 2.weight, ...``.

    :func:`mprl.lib.torsos.mlp` is the other MLP, initialised as PPO's implementations do
    (orthogonal weights, zero biases, an output gain): the actor-critics' one.
    """
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(n_in, h), ACTIVATIONS[activation]()]
        n_in = h
    layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


class DeterministicActor(nn.Module):
    """A deterministic policy for ``n_act`` continuous actions: :func:`plain_mlp` over the
    flattened observations, then tanh, so every action is in ``[-1, 1]`` (TD3's and DDPG's
    actor; :func:`scale_action` gives the env's units).

    :param n_obs: observation size (observations ``[B, ...]`` are flattened to ``[B, n_obs]``).
    :param n_act: action size: ``forward`` returns ``[B, n_act]``.
    :param hidden: hidden layer sizes, e.g. ``(256, 256)``.
    :param activation: the hidden layers' activation, ``"relu"`` (TD3's) or ``"tanh"``.
    """

    def __init__(
        self, n_obs: int, n_act: int, hidden: Sequence[int], activation: str = "relu"
    ) -> None:
        super().__init__()
        self.net = plain_mlp(n_obs, hidden, n_act, activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, n_act]`` in ``[-1, 1]`` for observations ``[B, ...]``."""
        return torch.tanh(self.net(obs.flatten(1)))


class TwinQ(nn.Module):
    """Two Q networks over (observation, action), ``q1`` and ``q2``, each a :func:`plain_mlp`
    of ``n_obs + n_act`` inputs and one output (Fujimoto et al. 2018's clipped double Q, which
    TD3 and SAC share). Give it the actions in the units the replay buffer stores (the actor's
    ``[-1, 1]``).

    :param n_obs: observation size (observations ``[B, ...]`` are flattened).
    :param n_act: action size (actions ``[B, ...]`` are flattened).
    :param hidden: hidden layer sizes of each network.
    :param activation: the hidden layers' activation, ``"relu"`` or ``"tanh"``.
    """

    def __init__(
        self, n_obs: int, n_act: int, hidden: Sequence[int], activation: str = "relu"
    ) -> None:
        super().__init__()
        self.q1 = plain_mlp(n_obs + n_act, hidden, 1, activation)
        self.q2 = plain_mlp(n_obs + n_act, hidden, 1, activation)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two networks' values ``([B], [B])`` of a batch of (observation, action)."""
        x = torch.cat([obs.flatten(1), act.flatten(1)], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def min(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """The smaller of the two values ``[B]``: the clipped double-Q estimate that targets
        (and SAC's policy loss) use, against the overestimation of one network."""
        return torch.min(*self(obs, act))

    def first(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """``q1``'s values alone ``[B]``: what TD3's actor maximises."""
        return self.q1(torch.cat([obs.flatten(1), act.flatten(1)], -1)).squeeze(-1)


# -- actions -----------------------------------------------------------------------------------


def box_bounds(space: gym.Space) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)`` of a ``Box`` action space as float32 tensors of its shape, for
    :func:`scale_action` (register them as buffers of a model: they travel with it).

    :raises ValueError: not a ``Box``, or a bound is infinite (nothing maps ``[-1, 1]`` onto
        it: rescale the env's actions with a wrapper).
    """
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"continuous actions need a Box action space, not {space}")
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ValueError(
            f"the action space's bounds must be finite to scale actions onto them; these are "
            f"{space.low} .. {space.high} (rescale them with a wrapper)"
        )
    low = torch.as_tensor(space.low, dtype=torch.float32)
    return low, torch.as_tensor(space.high, dtype=torch.float32)


def _like(bound: Any, action: torch.Tensor) -> torch.Tensor:
    if isinstance(bound, torch.Tensor):  # (itself when it matches: a traced module's buffer)
        return bound.to(dtype=action.dtype, device=action.device)
    return torch.as_tensor(bound, dtype=action.dtype, device=action.device)


def scale_action(action: torch.Tensor, low: Any, high: Any, *, clip: bool = True) -> torch.Tensor:
    """Actions in ``[-1, 1]`` (a tanh actor's) mapped linearly onto ``[low, high]``, the bounds
    of a ``Box`` (``-1 -> low``, ``0 -> the middle``, ``1 -> high``): what the env takes.

    :param action: ``[..., *shape]``; ``low`` and ``high`` (tensors or arrays of the action
        space's shape, :func:`box_bounds`) broadcast against it.
    :param clip: clamp the result into ``[low, high]`` (the rounding at the bounds; noise that
        pushed an action out of ``[-1, 1]``).
    """
    low, high = _like(low, action), _like(high, action)
    scaled = low + (high - low) * (action + 1.0) / 2.0
    return torch.clamp(scaled, low, high) if clip else scaled


def unscale_action(action: torch.Tensor, low: Any, high: Any, *, clip: bool = True) -> torch.Tensor:
    """The inverse of :func:`scale_action`: actions in the env's ``[low, high]`` mapped onto
    ``[-1, 1]`` (actions from elsewhere, such as a demonstration, in the actor's units).

    :param clip: clamp the result into ``[-1, 1]``.
    """
    low, high = _like(low, action), _like(high, action)
    unscaled = 2.0 * (action - low) / (high - low) - 1.0
    return unscaled.clamp(-1.0, 1.0) if clip else unscaled


def uniform_actions(
    space: gym.spaces.Box,
    n: int,
    generator: torch.Generator | None = None,
    *,
    normalized: bool = False,
) -> torch.Tensor:
    """``n`` actions ``[n, *space.shape]`` (float32) drawn uniformly over a ``Box``: the warm-up
    of an off-policy worker before learning starts (SB3's ``learning_starts``).

    :param generator: draw with it (a worker's, seeded from ``ctx.seed``: a run repeats).
    :param normalized: the same draws in the actor's ``[-1, 1]`` units instead (what a replay
        buffer of a tanh actor's actions stores; :func:`scale_action` of them are the actions
        drawn without ``normalized``, for the same generator state).
    :raises ValueError: as :func:`box_bounds`, for an infinite bound.
    """
    low, high = box_bounds(space)
    drawn = torch.rand((n, *space.shape), generator=generator) * 2.0 - 1.0
    return drawn if normalized else scale_action(drawn, low, high)


# -- exploration noise -------------------------------------------------------------------------


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


class GaussianNoise:
    """Independent Gaussian exploration noise, ``N(0, sigma^2)`` per action and step (TD3's),
    for ``n`` envs at once. It keeps no state: :meth:`reset` is there so that it and
    :class:`OrnsteinUhlenbeckNoise` are used alike.

    :param n: envs (rows of each draw).
    :param shape: one action's shape (an int: its size).
    :param sigma: standard deviation in the actor's ``[-1, 1]`` units (0.1: a tenth of half the
        range), a number or a tensor per action dimension.
    :param generator: draw with it (seeded: a worker repeats).
    """

    def __init__(
        self,
        n: int,
        shape: int | Sequence[int],
        sigma: float | torch.Tensor = 0.1,
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        self.shape = (n, *_shape(shape))
        self.sigma, self.generator = torch.as_tensor(sigma, dtype=torch.float32), generator

    def sample(self) -> torch.Tensor:
        """Noise ``[n, *shape]`` for one step of every env."""
        return self.sigma * torch.randn(self.shape, generator=self.generator)

    def reset(self, envs: Iterable[int] | None = None) -> None:
        """Nothing: each draw is independent of the last."""


class OrnsteinUhlenbeckNoise:
    """Temporally correlated exploration noise (DDPG's, Lillicrap et al. 2016), one
    Ornstein-Uhlenbeck process per env: each :meth:`sample` moves every env's state
    ``x <- x + theta * (mu - x) * dt + sigma * sqrt(dt) * N(0, 1)`` and returns it, as
    Stable-Baselines3's ``OrnsteinUhlenbeckActionNoise`` does. The state is drawn back to
    ``mu`` (by a factor ``1 - theta * dt`` a step) and wanders about it with the stationary
    standard deviation ``sigma * sqrt(dt / (1 - (1 - theta * dt)^2))`` (about
    ``sigma / sqrt(2 * theta)``). Call :meth:`reset` with the envs whose episode ended, so each
    episode's noise starts afresh.

    :param n: envs, each with its own process.
    :param shape: one action's shape (an int: its size).
    :param sigma: the scale of the random steps, in the actor's ``[-1, 1]`` units.
    :param theta: how fast the state is pulled back to ``mu``.
    :param dt: the time step.
    :param mu: the mean the state reverts to.
    :param x0: the state after a reset (default 0, as SB3's).
    :param generator: draw with it (seeded: a worker repeats).
    """

    def __init__(
        self,
        n: int,
        shape: int | Sequence[int],
        sigma: float | torch.Tensor = 0.2,
        theta: float = 0.15,
        dt: float = 1e-2,
        mu: float | torch.Tensor = 0.0,
        *,
        x0: float | torch.Tensor = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        self.shape = (n, *_shape(shape))
        self.sigma = torch.as_tensor(sigma, dtype=torch.float32)
        self.mu = torch.as_tensor(mu, dtype=torch.float32)
        self.x0 = torch.as_tensor(x0, dtype=torch.float32)
        self.theta, self.dt, self.generator = theta, dt, generator
        #: every env's state ``[n, *shape]``
        self.state = torch.zeros(self.shape)
        self.reset()

    def sample(self) -> torch.Tensor:
        """Every env's state after one more step, ``[n, *shape]`` (a copy)."""
        step = torch.randn(self.shape, generator=self.generator)
        self.state += self.theta * (self.mu - self.state) * self.dt
        self.state += self.sigma * math.sqrt(self.dt) * step
        return self.state.clone()

    def reset(self, envs: Iterable[int] | None = None) -> None:
        """Set the state of ``envs`` (indices; default: every env) back to ``x0``."""
        if envs is None:
            self.state[:] = self.x0
            return
        rows = list(envs)
        if rows:
            self.state[rows] = self.x0


# -- target networks ---------------------------------------------------------------------------


def _tensors(module: nn.Module | Iterable[torch.Tensor]) -> tuple[list, list]:
    if isinstance(module, nn.Module):
        return list(module.parameters()), list(module.buffers())
    return list(module), []


@torch.no_grad()
def polyak_update(
    target: nn.Module | Iterable[torch.Tensor],
    source: nn.Module | Iterable[torch.Tensor],
    tau: float,
) -> None:
    """Move ``target`` a fraction ``tau`` towards ``source``, in place and without gradients:
    every parameter ``t <- (1 - tau) * t + tau * s`` (Polyak averaging: ``tau`` 0 leaves it,
    1 copies ``source``), and every buffer (running statistics, action bounds) copied, as
    Stable-Baselines3's ``polyak_update`` of a target network does. One fused
    ``torch._foreach_lerp_`` over all the parameters (a loop on a torch without it).

    ``target`` and ``source`` are modules of the same architecture (their parameters in the same
    order), or lists of tensors (parameters only), and live on the same device: the update
    runs there. A learner on a GPU updates its device copy of a ``schema.Module`` field, which
    stays on the CPU: :class:`TargetNetwork` keeps that copy.

    :raises ValueError: ``tau`` outside ``[0, 1]``; the two have a different number of
        parameters or buffers, or live on different devices.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau!r}")
    (t_params, t_buffers), (s_params, s_buffers) = _tensors(target), _tensors(source)
    if len(t_params) != len(s_params) or len(t_buffers) != len(s_buffers):
        raise ValueError(
            f"the target has {len(t_params)} parameters and {len(t_buffers)} buffers, the source "
            f"{len(s_params)} and {len(s_buffers)}: a target is a copy of its source"
        )
    if t_params and t_params[0].device != s_params[0].device:
        raise ValueError(
            f"the target is on {t_params[0].device} and the source on {s_params[0].device}: "
            "update a copy on the source's device (mprl.lib.continuous.TargetNetwork keeps one "
            "of a schema.Module field)"
        )
    if t_params:
        if hasattr(torch, "_foreach_lerp_"):
            torch._foreach_lerp_(t_params, s_params, tau)
        else:  # pragma: no cover (torch < 2.0)
            for t, s in zip(t_params, s_params, strict=True):
                t.lerp_(s, tau)
    for t, s in zip(t_buffers, s_buffers, strict=True):
        t.copy_(s)


def _device_of(module: nn.Module) -> torch.device:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


class TargetNetwork:
    """A target network kept in a ``schema.Module`` field, as a learner on any ``--device``
    updates it::

        target = TargetNetwork(ctx.state.target, ctx.device)  # in the train function
        ...
        next_q = target.module.critic.min(next_obs, next_actions)
        target.polyak(model, cfg.tau)  # after an update
        ...
        target.sync()  # before the train function returns: the last checkpoint holds it

    A ``schema.Module`` lives on the CPU whatever ``--device`` (docs/schema.md): in shared
    memory on the local backend, in the one process on the serial backend, in the train
    process on Ray. On the CPU, :attr:`module` is the field itself, updated in place, and
    every checkpoint holds the newest target. On a GPU, :attr:`module` is a copy of the field
    there (the learner's ``ctx.model`` is a copy there too), updated where it lives with no
    copy to the host per update; it is loaded back into the field every ``sync_every`` updates
    and at :meth:`sync`, so checkpoints hold it.

    :param field: the ``schema.Module`` field (``ctx.state.target``), or a submodule of it
        (``ctx.state.target.critic``).
    :param device: the learner's device (``ctx.device``).
    :param sync_every: updates (:meth:`polyak`, :meth:`copy_from`) between loads into the field,
        on a GPU.
    :param copy: keep a copy even on the field's device (``None``: only on another device).
    """

    def __init__(
        self,
        field: nn.Module,
        device: torch.device | str | None = None,
        *,
        sync_every: int = 100,
        copy: bool | None = None,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        device = torch.device("cpu" if device is None else device)
        self.field, self.sync_every = field, sync_every
        #: whether :attr:`module` is a copy of the field (on another device)
        self.copied = _device_of(field) != device if copy is None else copy
        #: the target network to compute with and update: the field, or its copy on ``device``
        self.module: nn.Module = _copy_to(field, device) if self.copied else field
        self._since = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The target network's ``forward``."""
        return self.module(*args, **kwargs)

    def polyak(self, source: nn.Module, tau: float) -> None:
        """:func:`polyak_update` of the target towards ``source`` (the learner's model, or the
        submodule the field is a copy of), where the target lives."""
        polyak_update(self.module, source, tau)
        self._updated()

    def copy_from(self, source: nn.Module) -> None:
        """Make the target a copy of ``source``'s weights (a hard update, DQN's)."""
        self.module.load_state_dict(source.state_dict())
        self._updated()

    def sync(self) -> None:
        """Load a copy's weights into the field now (nothing to do without a copy)."""
        self._since = 0
        if self.copied:
            self.field.load_state_dict(self.module.state_dict())

    def _updated(self) -> None:
        self._since += 1
        if self._since >= self.sync_every:
            self.sync()


def _copy_to(module: nn.Module, device: torch.device) -> nn.Module:
    return copy.deepcopy(module).to(device)
