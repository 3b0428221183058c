"""Actor-critic networks for Discrete (categorical) and Box (diagonal Gaussian) action spaces
over flat or image observations (:class:`ActorCritic`, :func:`make_model`): for algorithm
plugins to build on (the built-in a3c, impala and ppo use them).

The parts they are made of have modules of their own, and every name of them still imports
from here: the networks over observations (:mod:`mprl.lib.torsos`), the shared config
(:mod:`mprl.lib.configs`), the optimizer (:mod:`mprl.lib.optim`) and the normalisers
(:mod:`mprl.lib.norms`).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from mprl.errors import ConfigError
from mprl.lib.configs import MIN_LR_FRACTION, ActorCriticConfig, field_help
from mprl.lib.norms import ObsNorm, merge_moments
from mprl.lib.optim import Adam, annealed_lr, make_optimizer
from mprl.lib.torsos import (
    ACTIVATIONS,
    TORSOS,
    ImageScale,
    _init,
    channels_last,
    encoder,
    impala_cnn,
    is_image,
    mlp,
    nature_cnn,
    resolve_torso,
)

__all__ = [  # this module's own, and the names of its parts that have always imported from here
    "ACTIVATIONS",
    "MIN_LR_FRACTION",
    "TORSOS",
    "ActorCritic",
    "ActorCriticConfig",
    "Adam",
    "ImageScale",
    "ObsNorm",
    "annealed_lr",
    "channels_last",
    "field_help",
    "impala_cnn",
    "is_image",
    "make_model",
    "make_optimizer",
    "merge_moments",
    "mlp",
    "nature_cnn",
    "resolve_torso",
]


class ActorCritic(nn.Module):
    """A policy and a value function; ``forward`` gives (logits or Gaussian mean, value).

    Over flat observations the policy and the value are separate MLPs (``torso="mlp"``);
    over images they share a convolutional torso (``nature`` or ``impala``) that takes the
    uint8 frames as they are and scales them itself. :meth:`policy` and :meth:`value` run one side.
    With ``normalize_obs``, flat observations are standardised first (:class:`ObsNorm`,
    ``self.obs_norm``, which the learner updates).
    """

    def __init__(
        self,
        obs_space: gym.Space,
        act_space: gym.Space,
        hidden: tuple[int, ...],
        torso: str = "auto",
        normalize_obs: bool = False,
        sde_every: int = 0,
        *,
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        n_act = int(act_space.n) if self.discrete else int(np.prod(act_space.shape))
        if sde_every and self.discrete:
            raise ConfigError(
                f"config field 'sde_every': state-dependent exploration is for continuous "
                f"actions, and these are {act_space}; use --set sde_every=0"
            )
        self.n_act, self.sde_every = n_act, sde_every
        self._noise: torch.Tensor | None = None  # gSDE: each env's exploration matrix
        self._noise_age = 0
        self.torso_kind = resolve_torso(obs_space, torso)
        if normalize_obs and self.torso_kind != "mlp":
            raise ConfigError(
                "config field 'normalize_obs': image observations are scaled to [0, 1] already; "
                "use --set normalize_obs=false"
            )
        self.obs_norm = ObsNorm(tuple(obs_space.shape)) if normalize_obs else None
        if self.torso_kind == "mlp":
            n_obs = int(np.prod(obs_space.shape))
            self.pi = mlp(n_obs, hidden, n_act, 0.01, activation)
            self.v = mlp(n_obs, hidden, 1, 1.0, activation)
            self.torso = None
        else:
            self.torso, n_features = encoder(obs_space, hidden, self.torso_kind)
            self.pi_head = _init(nn.Linear(n_features, n_act), 0.01)
            self.v_head = _init(nn.Linear(n_features, 1), 1.0)
        if sde_every:  # one log std per (latent feature, action): Raffin et al.'s gSDE (2021)
            latent = self.pi[-1].in_features if self.torso is None else self.pi_head.in_features
            self.log_std = nn.Parameter(torch.full((latent, n_act), log_std_init))
        elif not self.discrete:
            self.log_std = nn.Parameter(torch.full((n_act,), log_std_init))
        if not self.discrete:
            self.register_buffer("low", torch.as_tensor(act_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(act_space.high, dtype=torch.float32))

    def observe(self, obs: torch.Tensor) -> None:
        """Fold a batch of observations into the normalisation statistics (with
        ``normalize_obs``; else nothing). The learner calls it as it publishes an update, so the
        workers get the statistics with the weights."""
        if self.obs_norm is not None:
            self.obs_norm.update(obs)

    def _in(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.torso is None:
            obs = self._in(obs)
            return self._pi(obs, self.pi), self.v(obs).squeeze(-1)
        features = self.torso(obs)
        return self._pi(features, self.pi_head), self.v_head(features).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's output alone, what acting needs: logits, or the Gaussian's mean (with
        gSDE, the mean and then the latent features its noise is a function of)."""
        if self.torso is None:
            return self._pi(self._in(obs), self.pi)
        return self._pi(self.torso(obs), self.pi_head)

    def _pi(self, x: torch.Tensor, net: nn.Module) -> torch.Tensor:
        if not self.sde_every:
            return net(x)
        if net is self.pi:  # the MLP's last hidden layer is the latent of the noise
            x = net[:-1](x)
            net = net[-1]
        return torch.cat([net(x), x.detach()], -1)

    def _gaussian(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and standard deviation of the action distribution of a policy output."""
        if not self.sde_every:
            return out, self.log_std.exp().expand_as(out)
        mean, latent = out[..., : self.n_act], out[..., self.n_act :]
        variance = latent.pow(2) @ self.log_std.exp().pow(2)
        return mean, (variance + 1e-6).sqrt()

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """The value of each observation of a batch, ``[B]``."""
        if self.torso is None:
            return self.v(self._in(obs)).squeeze(-1)
        return self.v_head(self.torso(obs)).squeeze(-1)

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        """Actions drawn for a batch of policy outputs. With gSDE (``sde_every`` k) the noise
        is each env's latent features times its own exploration matrix, drawn anew every k
        calls: exploration that is smooth in time and a function of the state."""
        if self.discrete:
            return torch.multinomial(torch.softmax(out, -1), 1).squeeze(-1)
        if not self.sde_every:
            return out + self.log_std.exp() * torch.randn_like(out)
        mean, latent = out[..., : self.n_act], out[..., self.n_act :]
        rows = latent.reshape(-1, latent.shape[-1])
        noise = self._noise
        if noise is None or len(noise) != len(rows) or self._noise_age >= self.sde_every:
            std = self.log_std.detach().exp()
            noise = self._noise = std * torch.randn(len(rows), *std.shape, device=std.device)
            self._noise_age = 0
        self._noise_age += 1
        return mean + (rows.unsqueeze(-2) @ noise).squeeze(-2).view(mean.shape)

    def log_prob_entropy(
        self, out: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            logp = torch.log_softmax(out, -1)
            chosen = logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return chosen, -(logp.exp() * logp).sum(-1)
        mean, std = self._gaussian(out)
        log_std = std.log()
        z = (actions - mean) / std
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)
        return logp, entropy

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations, as the env takes them: sampled, or the most
        likely (argmax / the Gaussian's mean) when ``deterministic``. ``mprl eval`` uses it."""
        with torch.no_grad():
            return self.env_actions(self.policy(obs), deterministic)

    def env_actions(self, out: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """:meth:`act` from the policy's outputs ``out``: actions as the env takes them, sampled
        or the most likely."""
        with torch.no_grad():
            if not deterministic:
                actions = self.sample(out)
            else:
                actions = out.argmax(-1) if self.discrete else out[..., : self.n_act]
        return self.to_env(actions)

    def to_env(self, actions: torch.Tensor) -> np.ndarray:
        """Actions as the env takes them (Box actions clipped to the bounds)."""
        if self.discrete:
            return actions.cpu().numpy()
        return torch.max(torch.min(actions, self.high), self.low).cpu().numpy()

    def export_policy(self) -> nn.Module:
        """:meth:`act` with ``deterministic=True`` as a module of tensor operations only, for
        ``mprl export``: observations ``[B, *obs_shape]`` in, the env's actions ``[B, ...]``
        out (argmax, or the Gaussian's mean clipped to the bounds). It shares this model's
        parameters."""
        return _GreedyPolicy(self)


class _GreedyPolicy(nn.Module):
    """An :class:`ActorCritic`'s most likely action (``act(obs, deterministic=True)``): only
    the policy's side of the model, so an export holds no value network."""

    def __init__(self, model: ActorCritic) -> None:
        super().__init__()
        self.state_shapes: dict[str, tuple[int, ...]] = {}  # feed-forward: no state
        self.obs_norm = model.obs_norm
        # gSDE's policy output is the mean and then its features: the mean is the net's own
        self.net = model.pi if model.torso is None else nn.Sequential(model.torso, model.pi_head)
        self.discrete = model.discrete
        if not self.discrete:
            self.register_buffer("low", model.low.detach().clone())
            self.register_buffer("high", model.high.detach().clone())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        out = self.net(obs)
        if self.discrete:
            return out.argmax(-1)
        return torch.max(torch.min(out, self.high), self.low)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: ActorCriticConfig) -> nn.Module:
    """An :class:`ActorCritic` with the config's network fields (an ``Algorithm.make_model``):
    ``hidden``, ``torso``, ``normalize_obs``, ``sde_every``, ``activation``, ``log_std_init``;
    a config without the later ones (a plugin's own, written before them) gets their defaults."""
    return ActorCritic(
        obs_space,
        act_space,
        config.hidden,
        getattr(config, "torso", "auto"),
        getattr(config, "normalize_obs", False),
        getattr(config, "sde_every", 0),
        activation=getattr(config, "activation", "tanh"),
        log_std_init=getattr(config, "log_std_init", 0.0),
    )
