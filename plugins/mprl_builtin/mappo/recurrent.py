"""rMAPPO: mappo's and ippo's actors and critics with a recurrent core (``--set core=gru`` or
``lstm``), as the MAPPO repository's ``R_Actor`` / ``R_Critic`` (Yu et al. 2022): each of them
an MLP, a GRU or LSTM cell, a linear head, with a hidden state of its own per agent.

The hidden state of a batch of ``B`` envs is ``[k, B, A, core_size]``: the actor's rows (h, and
c for an LSTM) then the critic's. The agent dimension folds into the batch: a shared network
(``share_params``) steps all ``B x A`` rows at once; per-agent networks step their agent's.
Workers carry it across steps, zero it where an episode ends and store it at the start of each
chunk of ``data_chunk_length`` steps; the learner replays each chunk from its stored state
(:class:`mprl.lib.sequences.Segments`: one ``nn.GRU`` / ``nn.LSTM`` call per network).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from mprl.lib.marl import agent_action_mask, masked_logits
from mprl.lib.norms import ValueNorm
from mprl.lib.sequences import Segments
from mprl.lib.torsos import encoder
from mprl.spaces import AgentBox
from mprl_builtin.mappo.groups import Groups, in_order, model_groups, take

__all__ = ["RecurrentAgentsModel", "hidden_spec"]


class _RecurrentNet(nn.Module):
    """An MLP over the inputs, a recurrent cell, a linear head (``R_Actor`` / ``R_Critic``)."""

    def __init__(self, n_in: int, cfg, n_out: int, out_gain: float) -> None:
        super().__init__()
        space = gym.spaces.Box(-np.inf, np.inf, (n_in,), np.float32)
        self.base, n_features = encoder(space, cfg.hidden, "mlp")
        self.cell = (nn.LSTMCell if cfg.core == "lstm" else nn.GRUCell)(n_features, cfg.core_size)
        for name, param in self.cell.named_parameters():
            (nn.init.orthogonal_ if "weight" in name else nn.init.zeros_)(param)
        self.head = nn.Linear(cfg.core_size, n_out)
        nn.init.orthogonal_(self.head.weight, out_gain)
        nn.init.zeros_(self.head.bias)

    def step(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of rows ``x [R, in]`` from ``h [k, R, size]``: ``(head output, next h)``."""
        features = self.base(x)
        if isinstance(self.cell, nn.LSTMCell):
            h = torch.stack(self.cell(features, (h[0], h[1])))
        else:
            h = self.cell(features, h[0]).unsqueeze(0)
        return self.head(h[0]), h

    def unroll(
        self, x: torch.Tensor, h: torch.Tensor, pieces: Segments
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [L, R, in]`` from ``h [k, R, size]``, reset at ``pieces``' episode ends."""
        outputs, last = pieces.run(self.cell, self.base(x), h)
        return self.head(outputs), last


def hidden_spec(cfg, n_agents: int, steps: int, envs: int) -> dict:
    """The rollout field ``hidden``: the actor's and critic's hidden states at the start of
    each chunk of ``data_chunk_length`` steps, ``[chunks, k, envs, agents, core_size]``."""
    if cfg.core == "none":
        return {}
    chunks = -(-steps // cfg.data_chunk_length)
    rows = 4 if cfg.core == "lstm" else 2
    return {"hidden": ((chunks, rows, envs, n_agents, cfg.core_size), torch.float32)}


def _step_agents(
    nets: nn.ModuleList, x: torch.Tensor, h: torch.Tensor, groups: Groups | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of every agent's net (or the shared one, over ``B x A`` rows; or each group's,
    over ``B x`` its agents' rows): ``x [B, A, in]`` (ids in) from ``h [rows, B, A, size]`` ->
    ``([B, A, out], next h)``."""
    b, a = x.shape[:2]
    if len(nets) == 1:
        out, h = nets[0].step(x.reshape(b * a, -1), h.reshape(h.shape[0], b * a, -1))
        return out.view(b, a, -1), h.view(h.shape[0], b, a, -1)
    if groups is not None:
        outs, hs = [], []
        for group, net in zip(groups, nets, strict=True):
            k = len(group)
            xg, hg = take(x, 1, group), take(h, 2, group)
            out, hg = net.step(xg.reshape(b * k, -1), hg.reshape(hg.shape[0], b * k, -1))
            outs.append(out.view(b, k, -1))
            hs.append(hg.view(hg.shape[0], b, k, -1))
        return in_order(torch.cat(outs, 1), 1, groups), in_order(torch.cat(hs, 2), 2, groups)
    steps = [net.step(x[:, i], h[:, :, i]) for i, net in enumerate(nets)]
    return torch.stack([o for o, _ in steps], 1), torch.stack([s for _, s in steps], 2)


class RecurrentAgentsModel(nn.Module):
    """Actors and critics of ``A`` agents with a recurrent core: the interface of
    :class:`~mprl_builtin.mappo.algorithm.AgentsModel` (``distribution``, ``to_env``,
    ``value_norm``, ``act``) with the hidden state in :meth:`step` and :meth:`unroll`."""

    def __init__(self, obs_space: AgentBox, act_space: gym.Space, cfg) -> None:
        super().__init__()
        self.n_agents, features = obs_space.shape
        self.discrete = isinstance(act_space, gym.spaces.MultiDiscrete)
        n_out = int(act_space.nvec.max()) if self.discrete else int(act_space.shape[1])
        # agents with fewer actions than the largest count: the others masked (not saved)
        self.register_buffer("action_mask", agent_action_mask(act_space), persistent=False)
        self.central = cfg.critic == "central"
        self.core_kind, self.core_size = cfg.core, cfg.core_size
        self.rows = 2 if cfg.core == "lstm" else 1  # of each network
        critic_in = (obs_space.state.shape[0] if self.central else features) + self.n_agents
        groups = model_groups(cfg.groups, cfg.share_params, obs_space.agents)
        #: each network's agents' rows, where networks serve groups of agents (``groups``)
        self.groups = groups if cfg.groups and 1 < len(groups) < self.n_agents else None
        copies = len(groups)
        actor_in = features + self.n_agents
        self.actors = nn.ModuleList(
            _RecurrentNet(actor_in, cfg, n_out, 0.01) for _ in range(copies)
        )
        self.critics = nn.ModuleList(_RecurrentNet(critic_in, cfg, 1, 1.0) for _ in range(copies))
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((self.n_agents, n_out), cfg.log_std_init))
            self.register_buffer("low", torch.as_tensor(act_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(act_space.high, dtype=torch.float32))
        self.register_buffer("eye", torch.eye(self.n_agents))
        self.value_norm = ValueNorm()
        self._acting: dict[int, torch.Tensor] = {}  # act's actor state, by env

    # the hidden state ---------------------------------------------------------------------

    def initial_state(self, n: int) -> torch.Tensor:
        """The hidden state of ``n`` envs at an episode's start: zeros ``[k, n, A, size]``."""
        device = self.eye.device
        return torch.zeros(2 * self.rows, n, self.n_agents, self.core_size, device=device)

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.eye.expand(*x.shape[:-1], self.n_agents)], -1)

    def _critic_inputs(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if self.central:
            x = state.unsqueeze(-2).expand(*state.shape[:-1], self.n_agents, state.shape[-1])
        else:
            x = obs
        return self._inputs(x)

    def _step(
        self, nets: nn.ModuleList, x: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, A, in]`` (ids in) from ``h [rows, B, A, size]``: ``([B, A, out], next h)``."""
        return _step_agents(nets, x, h, self.groups)

    def _unroll(
        self, nets: nn.ModuleList, x: torch.Tensor, h: torch.Tensor, dones: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [L, B, A, in]`` from ``h [rows, B, A, size]``, ``dones [L - 1, B]``."""
        length, b, a = x.shape[:3]
        if len(nets) == 1:
            pieces = Segments(dones.repeat_interleave(a, 1), length, b * a)
            out, h = nets[0].unroll(
                x.reshape(length, b * a, -1), h.reshape(-1, b * a, h.shape[-1]), pieces
            )
            return out.view(length, b, a, -1), h.view(h.shape[0], b, a, -1)
        if self.groups is not None:  # each group's net over B x its agents' rows
            outs, hs = [], []
            for group, net in zip(self.groups, nets, strict=True):
                k = len(group)
                pieces = Segments(dones.repeat_interleave(k, 1), length, b * k)
                hg = take(h, 2, group)
                out, hg = net.unroll(
                    take(x, 2, group).reshape(length, b * k, -1),
                    hg.reshape(-1, b * k, hg.shape[-1]),
                    pieces,
                )
                outs.append(out.view(length, b, k, -1))
                hs.append(hg.view(hg.shape[0], b, k, -1))
            groups = self.groups
            return in_order(torch.cat(outs, 2), 2, groups), in_order(torch.cat(hs, 2), 2, groups)
        pieces = Segments(dones, length, b)
        runs = [net.unroll(x[:, :, i], h[:, :, i], pieces) for i, net in enumerate(nets)]
        return torch.stack([o for o, _ in runs], 2), torch.stack([s for _, s in runs], 2)

    def step(
        self, obs: torch.Tensor, state: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of ``B`` envs: observations ``[B, A, F]``, global states ``[B, S]``,
        hidden ``[k, B, A, size]`` -> ``(policy outputs [B, A, n], normalised values [B, A],
        next hidden)``."""
        r = self.rows
        out, actor = self._step(self.actors, self._inputs(obs), hidden[:r])
        out = masked_logits(out, self.action_mask)
        value, critic = self._step(self.critics, self._critic_inputs(obs, state), hidden[r:])
        return out, value.squeeze(-1), torch.cat([actor, critic])

    def unroll(
        self, obs: torch.Tensor, state: torch.Tensor, hidden: torch.Tensor, dones: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Replay ``L`` steps of ``B`` envs from ``hidden`` (``[k, B, A, size]``, before
        ``obs[0]``): ``obs [L, B, A, F]``, ``state [L, B, S]``, ``dones[t]`` (``[>= L - 1,
        B]``) ended an episode after step ``t``, zeroing every agent's state before ``t + 1``.
        Returns policy outputs ``[L, B, A, n]``, normalised values ``[L, B, A]``, the hidden
        state after the last step."""
        r, length = self.rows, obs.shape[0]
        dones = dones[: length - 1]
        out, actor = self._unroll(self.actors, self._inputs(obs), hidden[:r], dones)
        out = masked_logits(out, self.action_mask)
        x = self._critic_inputs(obs, state)
        value, critic = self._unroll(self.critics, x, hidden[r:], dones)
        return out, value.squeeze(-1), torch.cat([actor, critic])

    def unroll_stepwise(
        self, obs: torch.Tensor, state: torch.Tensor, hidden: torch.Tensor, dones: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`unroll` one step at a time, as the workers act (the reference in tests)."""
        outs, values = [], []
        for t in range(obs.shape[0]):
            if t:
                hidden = hidden * (1.0 - dones[t - 1]).view(1, -1, 1, 1)
            out, value, hidden = self.step(obs[t], state[t], hidden)
            outs.append(out)
            values.append(value)
        return torch.stack(outs), torch.stack(values), hidden

    def critic_value(self, state: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Denormalised values ``[k, A]`` of global states ``[k, S]`` after critic hidden
        states ``[rows, k, A, size]`` (a central critic's: where a time limit cut episodes)."""
        x = self._critic_inputs(torch.empty(0), state)
        value, _ = self._step(self.critics, x, hidden)
        return self.value_norm.denormalize(value.squeeze(-1))

    # acting -------------------------------------------------------------------------------

    def distribution(self, out: torch.Tensor) -> torch.distributions.Distribution:
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        std = self.log_std.expand_as(out).exp()
        return torch.distributions.Independent(torch.distributions.Normal(out, std), 1)

    def to_env(self, actions: torch.Tensor) -> np.ndarray:
        if self.discrete:
            return actions.numpy()
        return torch.max(torch.min(actions, self.high), self.low).numpy()

    def begin_episode(self, env: int, playing: bool = True) -> None:
        """For :meth:`act`: env ``env`` starts an episode (its agents' states are zeroed) or,
        with ``playing`` false, plays no more (its row leaves :meth:`act`'s batches)."""
        if playing:
            self._acting[env] = self.initial_state(1)[: self.rows]
        else:
            self._acting.pop(env, None)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Every agent's action for a batch ``obs [B, A, features]``, as the env takes them,
        each env's agents' actor states kept here (the rows: the envs playing, by
        :meth:`begin_episode`, in index order; a batch of another size starts from zeros)."""
        if len(self._acting) != obs.shape[0]:
            self._acting = {j: self.initial_state(1)[: self.rows] for j in range(obs.shape[0])}
        envs = sorted(self._acting)
        with torch.no_grad():
            h = torch.cat([self._acting[j] for j in envs], 1)
            out, h = self._step(self.actors, self._inputs(obs.float()), h)
            out = masked_logits(out, self.action_mask)
            if deterministic:
                actions = out.argmax(-1) if self.discrete else out
            else:
                actions = self.distribution(out).sample()
        for row, j in enumerate(envs):
            self._acting[j] = h[:, row : row + 1]
        return self.to_env(actions)

    def export_policy(self) -> nn.Module:
        """``act(obs, deterministic=True)`` as a module of tensor operations only, for ``mprl
        export``: ``(obs [B, A, features], h [B, A, core_size], c [B, A, core_size])`` in (an
        LSTM; a GRU has no ``c``), ``(every agent's action, next h, next c)`` out; the actors'
        state only, zeros at an episode's start. It shares this model's parameters."""
        return _GreedyRecurrentAgents(self)


class GreedyAgents(nn.Module):
    """What a greedy export of an agents' model holds: its actors (shared), and copies of the
    agent ids, the action mask or the bounds. Its ``forward`` is the model kind's."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.actors = model.actors
        self.groups = model.groups
        self.register_buffer("eye", model.eye.detach().clone())
        self.discrete = model.discrete
        mask = model.action_mask
        self.register_buffer("action_mask", None if mask is None else mask.detach().clone())
        if not self.discrete:
            self.register_buffer("low", model.low.detach().clone())
            self.register_buffer("high", model.high.detach().clone())
        self.state_shapes: dict[str, tuple[int, ...]] = {}


class _GreedyRecurrentAgents(GreedyAgents):
    """Every agent's most likely action, its actor's state passed in and out."""

    def __init__(self, model: RecurrentAgentsModel) -> None:
        super().__init__(model)
        names = ("h", "c") if model.core_kind == "lstm" else ("h",)
        self.state_shapes = {name: (model.n_agents, model.core_size) for name in names}

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = obs.float()
        x = torch.cat([x, self.eye.expand(*x.shape[:-1], self.eye.shape[0])], -1)
        out, h = _step_agents(self.actors, x, torch.stack(state), self.groups)
        if self.discrete:
            actions = masked_logits(out, self.action_mask).argmax(-1)
        else:
            actions = torch.max(torch.min(out, self.high), self.low)
        return (actions, *h.unbind(0))
