"""Recurrent actor-critics (an LSTM or GRU core, ``--set core=lstm``) and how workers collect
with them: for algorithm plugins to build on (the built-in ppo and impala use them).

The hidden state is carried across steps in the worker, zeroed where an episode ends, and the
state at each rollout's start is stored in the rollout slot (the field ``state`` of
:func:`state_spec`), so the learner replays every env's rollout as one sequence from it
(truncated backpropagation through time over the rollout), the episode ends resetting the
state inside the sequence exactly as in the worker.
"""

from __future__ import annotations

from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch
from attrs import validators as v
from torch import nn

from mprl.lib import nets
from mprl.lib.configs import field_help
from mprl.lib.nets import ActorCritic
from mprl.lib.norms import ObsNorm
from mprl.lib.sequences import Segments
from mprl.lib.torsos import encoder, is_image

__all__ = [
    "CORES",
    "RecurrentActorCritic",
    "core_field",
    "core_size_field",
    "is_recurrent",
    "make_model",
    "state_spec",
]

#: the cores a model can have (config field ``core``); ``none``: the feed-forward ActorCritic
CORES = ("none", "lstm", "gru")


def core_field() -> Any:
    """The config field ``core`` (an attrs field) of a plugin with recurrent policies."""
    return attrs.field(
        default="none",
        validator=v.in_(CORES),
        metadata=field_help(
            "recurrent core after the observation network: lstm or gru (hidden state carried "
            "across steps, sequences replayed by the learner); none: feed-forward"
        ),
    )


def core_size_field() -> Any:
    """The config field ``core_size`` (an attrs field): the recurrent core's hidden size."""
    return attrs.field(
        default=64, validator=v.ge(1), metadata=field_help("hidden size of the recurrent core")
    )


def is_recurrent(model: Any) -> bool:
    """Whether ``model`` carries a hidden state (a :class:`RecurrentActorCritic`)."""
    return isinstance(model, RecurrentActorCritic)


def _rows(core: str, obs_space: gym.Space) -> int:
    """``k`` of the state ``[k, N, core_size]``: 2 (h, c) for an LSTM, 1 for a GRU, twice that
    over flat observations (the policy and the value have a core each)."""
    return (2 if core == "lstm" else 1) * (1 if is_image(obs_space) else 2)


class _Tower(nn.Module):
    """An observation encoder and a recurrent cell after it."""

    def __init__(self, encoder: nn.Module, n_features: int, core: str, size: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.cell = (nn.LSTMCell if core == "lstm" else nn.GRUCell)(n_features, size)
        for name, param in self.cell.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param)
            else:
                nn.init.zeros_(param)


class RecurrentActorCritic(nn.Module):
    """Observations -> encoder (:func:`mprl.lib.torsos.encoder`: an MLP of ``hidden``, or the
    image torso) -> an LSTM or GRU cell of ``core_size`` -> the heads. Over flat observations
    the policy and the value have an encoder and a core each (as :class:`ActorCritic` has an
    MLP each: the value's loss does not pull the policy's memory); over images they share them.
    The heads are an :class:`ActorCritic` of no hidden layer over the cores' outputs
    (``self.heads``): its linear policy and value heads, its action distributions and gSDE;
    :meth:`sample`, :meth:`log_prob_entropy` and :meth:`to_env` are its.

    The state is a tensor ``[k, N, core_size]`` (:attr:`state_rows`: each core's h and c for
    an LSTM, its h for a GRU). :meth:`step` acts one step, :meth:`unroll` replays sequences.
    :meth:`act` (``mprl eval``'s contract) keeps each env's state itself; :meth:`begin_episode`
    zeroes one env's state.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        act_space: gym.Space,
        hidden: tuple[int, ...],
        core: str = "lstm",
        core_size: int = 64,
        *,
        torso: str = "auto",
        normalize_obs: bool = False,
        sde_every: int = 0,
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        if core not in CORES[1:]:
            raise ValueError(f"core {core!r} is not one of {', '.join(CORES[1:])}")
        self.core_kind, self.core_size = core, core_size
        self.state_rows = _rows(core, obs_space)
        self.towers = nn.ModuleList(
            _Tower(*encoder(obs_space, hidden, torso, activation), core, core_size)
            for _ in range(1 if is_image(obs_space) else 2)
        )
        self.torso = self.towers[0].encoder if is_image(obs_space) else None  # ppo's check
        self.obs_norm = ObsNorm(tuple(obs_space.shape)) if normalize_obs else None
        # the heads after the cores: checkpoints hold the parameters by these names
        # (heads.pi.0.weight, ...) and optimizer states by their order
        latent = gym.spaces.Box(-np.inf, np.inf, (core_size,), np.float32)
        self.heads = ActorCritic(
            latent, act_space, (), "mlp", False, sde_every, log_std_init=log_std_init
        )
        self.discrete, self.n_act = self.heads.discrete, self.heads.n_act
        self._acting: dict[int, torch.Tensor] = {}  # act's state, by env

    def initial_state(self, n: int) -> torch.Tensor:
        """The state of ``n`` envs at an episode's start: zeros ``[k, n, core_size]``."""
        device = next(self.parameters()).device
        return torch.zeros(self.state_rows, n, self.core_size, device=device)

    def observe(self, obs: torch.Tensor) -> None:
        """Fold a batch of observations into the normalisation statistics (``normalize_obs``)."""
        if self.obs_norm is not None:
            self.obs_norm.update(obs)

    def _encode(self, tower: _Tower, obs: torch.Tensor) -> torch.Tensor:
        """Features of observations ``[..., *obs_shape]`` -> ``[..., n_features]``."""
        if self.torso is None:
            return tower.encoder(obs)
        lead = obs.shape[:-3]
        return tower.encoder(obs.reshape(-1, *obs.shape[-3:])).view(*lead, -1)

    def _cell(self, tower: _Tower, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if self.core_kind == "lstm":
            return torch.stack(tower.cell(x, (state[0], state[1])))
        return tower.cell(x, state[0]).unsqueeze(0)

    def _heads(self, latent: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy output, value)`` from each tower's output (the first: the policy's)."""
        return self.heads.policy(latent[0]), self.heads.value(latent[-1])

    def step(
        self, obs: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of ``N`` envs: ``(policy output, value, next state)``."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        k = self.state_rows // len(self.towers)
        states = [
            self._cell(tower, self._encode(tower, obs), state[i * k : (i + 1) * k])
            for i, tower in enumerate(self.towers)
        ]
        out, value = self._heads([s[0] for s in states])
        return out, value, torch.cat(states) if len(states) > 1 else states[0]

    def unroll(
        self, obs: torch.Tensor, state: torch.Tensor, dones: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Replay ``L`` steps of ``N`` envs from ``state`` (``[k, N, core_size]``, the state
        before ``obs[0]``): ``obs`` is ``[L, N, ...]``; ``dones[t]`` (``[>= L - 1, N]``) ended
        an episode after step ``t``, so the state is zeroed before step ``t + 1``, as the
        worker did. Returns the policy outputs ``[L, N, ...]``, values ``[L, N]`` and the
        state after the last step.

        One ``nn.GRU`` / ``nn.LSTM`` call per core over every episode piece of the sequences
        (:class:`Segments`), not a Python loop over steps: what the worker computed step by
        step, to float rounding."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        pieces = Segments(dones[: obs.shape[0] - 1], obs.shape[0], obs.shape[1])
        k = self.state_rows // len(self.towers)
        latent, last = [], []
        for i, tower in enumerate(self.towers):
            outputs, rows = pieces.run(
                tower.cell, self._encode(tower, obs), state[i * k : (i + 1) * k]
            )
            latent.append(outputs)
            last.append(rows)
        out, values = self._heads(latent)
        return out, values, torch.cat(last)

    def unroll_stepwise(
        self, obs: torch.Tensor, state: torch.Tensor, dones: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`unroll` one step at a time with the cells, as the worker acts: the reference
        the batched replay is checked against (tests, ``benchmarks/recurrent.py``)."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        live = 1.0 - dones.to(state.dtype).unsqueeze(-1)
        k = self.state_rows // len(self.towers)
        latent, last = [], []
        for i, tower in enumerate(self.towers):
            features, rows, outputs = self._encode(tower, obs), state[i * k : (i + 1) * k], []
            for t in range(obs.shape[0]):
                if t:
                    rows = rows * live[t - 1]
                rows = self._cell(tower, features[t], rows)
                outputs.append(rows[0])
            latent.append(torch.stack(outputs))
            last.append(rows)
        out, values = self._heads(latent)
        return out, values, torch.cat(last)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy output, value)`` of one step of ``N`` envs from a zero state."""
        out, value, _ = self.step(obs, self.initial_state(obs.shape[0]))
        return out, value

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        """Actions drawn for a batch of policy outputs (:meth:`ActorCritic.sample`)."""
        return self.heads.sample(out)

    def log_prob_entropy(
        self, out: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions``, entropies (:meth:`ActorCritic.log_prob_entropy`)."""
        return self.heads.log_prob_entropy(out, actions)

    def to_env(self, actions: torch.Tensor) -> np.ndarray:
        """Actions as the env takes them (:meth:`ActorCritic.to_env`)."""
        return self.heads.to_env(actions)

    def begin_episode(self, env: int, playing: bool = True) -> None:
        """For :meth:`act`: env ``env`` starts an episode (its state is zeroed) or, with
        ``playing`` false, plays no more (its row leaves :meth:`act`'s batches)."""
        if playing:
            self._acting[env] = self.initial_state(1)
        else:
            self._acting.pop(env, None)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations, as the env takes them, each env's state kept
        here: the rows are the envs playing (:meth:`begin_episode`) in index order. A batch of
        another size than the envs known starts from zero states, one env per row."""
        if len(self._acting) != obs.shape[0]:
            self._acting = {j: self.initial_state(1) for j in range(obs.shape[0])}
        envs = sorted(self._acting)
        with torch.no_grad():
            state = torch.cat([self._acting[j] for j in envs], 1)
            out, _, state = self.step(obs, state)
        for row, j in enumerate(envs):
            self._acting[j] = state[:, row : row + 1]
        return self.heads.env_actions(out, deterministic)

    def export_policy(self) -> nn.Module:
        """:meth:`act` with ``deterministic=True`` as a module of tensor operations only, for
        ``mprl export``: ``(obs [B, *obs_shape], h [B, core_size], c [B, core_size])`` in
        (an LSTM; a GRU has no ``c``), ``(actions, next h, next c)`` out. Only the policy's
        core: its state is the first rows of :meth:`step`'s; an episode starts from zeros.
        Its ``state_shapes`` names the state tensors and each env's shape. It shares this
        model's parameters."""
        return _GreedyRecurrentPolicy(self)


class _GreedyRecurrentPolicy(nn.Module):
    """A :class:`RecurrentActorCritic`'s most likely action, its policy core's state passed in
    and out: ``forward(obs, h[, c]) -> (action, h[, c])``."""

    def __init__(self, model: RecurrentActorCritic) -> None:
        super().__init__()
        tower = model.towers[0]  # the policy's (over images, the one both share)
        self.obs_norm = model.obs_norm
        self.encoder, self.cell = tower.encoder, tower.cell
        self.lstm = model.core_kind == "lstm"
        self.head = model.heads.export_policy()
        names = ("h", "c") if self.lstm else ("h",)
        self.state_shapes = {name: (model.core_size,) for name in names}

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        features = self.encoder(obs)
        if self.lstm:
            h, c = self.cell(features, (state[0], state[1]))
            return self.head(h), h, c
        h = self.cell(features, state[0])
        return self.head(h), h


def make_model(obs_space: gym.Space, act_space: gym.Space, config: Any) -> nn.Module:
    """A :class:`RecurrentActorCritic` where ``config.core`` names one (``lstm``, ``gru``), else
    :func:`mprl.lib.nets.make_model`'s :class:`ActorCritic` (an ``Algorithm.make_model``)."""
    core = getattr(config, "core", "none")
    if core == "none":
        return nets.make_model(obs_space, act_space, config)
    return RecurrentActorCritic(
        obs_space,
        act_space,
        config.hidden,
        core,
        getattr(config, "core_size", 64),
        torso=getattr(config, "torso", "auto"),
        normalize_obs=getattr(config, "normalize_obs", False),
        sde_every=getattr(config, "sde_every", 0),
        activation=getattr(config, "activation", "tanh"),
        log_std_init=getattr(config, "log_std_init", 0.0),
    )


def state_spec(
    config: Any, obs_space: gym.Space, envs: int
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The rollout spec's field ``state`` (the hidden state at the rollout's start,
    ``[k, envs, core_size]``) for a config with a recurrent ``core``; none for ``core=none``."""
    core = getattr(config, "core", "none")
    if core == "none":
        return {}
    shape = (_rows(core, obs_space), envs, getattr(config, "core_size", 64))
    return {"state": (shape, torch.float32)}
