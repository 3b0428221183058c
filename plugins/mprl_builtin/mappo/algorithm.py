"""MAPPO and independent PPO for cooperative multi-agent envs (Yu et al. 2022, "The Surprising
Effectiveness of PPO in Cooperative Multi-Agent Games"): workers collect whole-team rollouts
``[T, envs, agents, ...]`` (:class:`mprl.lib.marl.AgentBatch`), one train process runs clipped
PPO with GAE per agent and publishes the new weights, as the ppo plugin does for one agent.

The actor sees its agent's own observation (and the agent's one-hot id); the critic sees the
global state (mappo, ``critic=central``) or the agent's own observation (ippo,
``critic=local``). ``share_params`` gives every agent the same actor and critic (the id tells
them apart) or each agent its own; ``groups`` gives each group of agents (the teams of their
names, or named groups) its own (:mod:`mprl_builtin.mappo.groups`).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch
from attrs import validators as v
from torch import nn
from torch.nn import functional as F

import mprl
from mprl import schema
from mprl.lib.marl import AgentBatch, agent_action_mask, agent_rollout_spec, masked_logits
from mprl.lib.nets import Adam, field_help, mlp
from mprl.lib.norms import ValueNorm
from mprl.lib.recurrent import core_field, core_size_field
from mprl.lib.sequences import chunk
from mprl.spaces import AgentBox
from mprl.transport import RolloutSlots, WeightBroadcast
from mprl_builtin.mappo.groups import Groups, check_groups, model_groups, run_groups
from mprl_builtin.mappo.recurrent import GreedyAgents, RecurrentAgentsModel, hidden_spec
from mprl_builtin.ppo import gae

LOG_EVERY_S = 2.0  # how often the learner reports losses and rates


@attrs.frozen
class MAPPOConfig:
    """MAPPO's hyperparameters; the defaults are the MAPPO paper's for MPE (its Table 13-14:
    lr 7e-4, 10 epochs of one minibatch, clip 0.2, gamma 0.99, GAE lambda 0.95, entropy 0.01,
    gradient norm 10, Huber value loss, value normalisation), with an MLP policy."""

    envs_per_worker: int = attrs.field(
        default=16,
        validator=v.ge(1),
        metadata=field_help("environments each worker steps together"),
    )
    n_steps: int = attrs.field(
        default=25, validator=v.ge(1), metadata=field_help("steps per environment per iteration")
    )
    gamma: float = attrs.field(
        default=0.99, validator=[v.gt(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    gae_lambda: float = attrs.field(
        default=0.95, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("GAE lambda")
    )
    lr: float = attrs.field(default=7e-4, validator=v.gt(0.0), metadata=field_help("Adam lr"))
    epochs: int = attrs.field(
        default=10, validator=v.ge(1), metadata=field_help("passes over each iteration's data")
    )
    minibatches: int = attrs.field(
        default=1, validator=v.ge(1), metadata=field_help("minibatches per pass")
    )
    clip: float = attrs.field(
        default=0.2, validator=v.gt(0.0), metadata=field_help("policy ratio clip range")
    )
    entropy_coef: float = attrs.field(
        default=0.01, validator=v.ge(0.0), metadata=field_help("weight of the entropy bonus")
    )
    value_coef: float = attrs.field(
        default=1.0, validator=v.ge(0.0), metadata=field_help("weight of the value loss")
    )
    huber_delta: float = attrs.field(
        default=10.0, validator=v.gt(0.0), metadata=field_help("the value loss's Huber delta")
    )
    max_grad_norm: float = attrs.field(
        default=10.0, validator=v.gt(0.0), metadata=field_help("gradient norm clip per update")
    )
    hidden: tuple[int, ...] = attrs.field(
        default=(64, 64),
        converter=tuple,
        validator=v.deep_iterable(v.and_(v.instance_of(int), v.gt(0))),
        metadata=field_help("hidden layer sizes of the actor and critic MLPs"),
    )
    critic: str = attrs.field(
        default="central",
        validator=v.in_(("central", "local")),
        metadata=field_help(
            "what the critic sees: central (the global state: MAPPO) or local (the agent's own "
            "observation: independent PPO)"
        ),
    )
    share_params: bool = attrs.field(
        default=True,
        metadata=field_help("one actor and critic for all agents (with an agent-id input)"),
    )
    groups: str = attrs.field(
        default="",
        validator=check_groups,
        metadata=field_help(
            "an actor and critic per group of agents: 'names' (a group per team of the agents' "
            "names: adversary_0, adversary_1 -> adversary) or 'group:agent,agent;group:agent'; "
            "empty: share_params decides"
        ),
    )
    value_norm: bool = attrs.field(
        default=True, metadata=field_help("learn values normalised by the returns' running std")
    )
    log_std_init: float = attrs.field(
        default=-0.5, metadata=field_help("continuous actions: the policy's log std at start")
    )
    # rMAPPO: a recurrent actor and critic, each with its own hidden state per agent
    core: str = core_field()
    core_size: int = core_size_field()
    data_chunk_length: int = attrs.field(
        default=10,
        validator=v.ge(1),
        metadata=field_help(
            "recurrent core: steps of each training chunk (the MAPPO repository's "
            "data_chunk_length); workers store the hidden state at each chunk's start, the "
            "learner replays each chunk from it"
        ),
    )


@attrs.frozen
class IPPOConfig(MAPPOConfig):
    """Independent PPO: MAPPO's settings with a critic on each agent's own observation."""

    critic: str = attrs.field(
        default="local",
        validator=v.in_(("central", "local")),
        metadata=field_help("what the critic sees: local (own observation) or central"),
    )


class AgentsModel(nn.Module):
    """Actors and critics of ``A`` agents: their inputs carry the agent's one-hot id; with
    ``share_params`` one network each serves every agent, else each agent has its own."""

    def __init__(self, obs_space: AgentBox, act_space: gym.Space, cfg: MAPPOConfig) -> None:
        super().__init__()
        self.n_agents, features = obs_space.shape
        self.discrete = isinstance(act_space, gym.spaces.MultiDiscrete)
        n_out = int(act_space.nvec.max()) if self.discrete else int(act_space.shape[1])
        # agents with fewer actions than the largest count: the others masked (not saved)
        self.register_buffer("action_mask", agent_action_mask(act_space), persistent=False)
        self.central = cfg.critic == "central"
        critic_in = (obs_space.state.shape[0] if self.central else features) + self.n_agents
        groups = model_groups(cfg.groups, cfg.share_params, obs_space.agents)
        #: each network's agents' rows, where networks serve groups of agents (``groups``)
        self.groups = groups if cfg.groups and 1 < len(groups) < self.n_agents else None
        copies = len(groups)
        self.actors = nn.ModuleList(
            mlp(features + self.n_agents, cfg.hidden, n_out, 0.01) for _ in range(copies)
        )
        self.critics = nn.ModuleList(mlp(critic_in, cfg.hidden, 1, 1.0) for _ in range(copies))
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((self.n_agents, n_out), cfg.log_std_init))
            self.register_buffer("low", torch.as_tensor(act_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(act_space.high, dtype=torch.float32))
        self.register_buffer("eye", torch.eye(self.n_agents))
        self.value_norm = ValueNorm()  # MAPPO's value normalisation (config field value_norm)
        ValueNorm.load_old_moments(self, "ret_moments", "value_norm")  # checkpoints before it

    def _per_agent(self, nets: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        return per_agent(nets, self.eye, x, self.groups)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits (or Gaussian means) ``[..., A, n]`` of ``obs [..., A, features]``; the
        actions an agent does not have masked (:func:`mprl.lib.marl.masked_logits`)."""
        return masked_logits(self._per_agent(self.actors, obs), self.action_mask)

    def value(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Each agent's normalised value ``[..., A]``; the critic sees ``state [..., S]``
        (central) or the agent's ``obs`` (local)."""
        if self.central:
            x = state.unsqueeze(-2).expand(*state.shape[:-1], self.n_agents, state.shape[-1])
        else:
            x = obs
        return self._per_agent(self.critics, x).squeeze(-1)

    def distribution(self, out: torch.Tensor) -> torch.distributions.Distribution:
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        std = self.log_std.expand_as(out).exp()
        return torch.distributions.Independent(torch.distributions.Normal(out, std), 1)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Every agent's action for a batch ``obs [B, A, features]``, as the env takes them."""
        with torch.no_grad():
            out = self.policy(obs.float())
            if deterministic:
                actions = out.argmax(-1) if self.discrete else out
            else:
                actions = self.distribution(out).sample()
        return self.to_env(actions)

    def to_env(self, actions: torch.Tensor) -> np.ndarray:
        if self.discrete:
            return actions.numpy()
        return torch.max(torch.min(actions, self.high), self.low).numpy()

    def export_policy(self) -> nn.Module:
        """``act(obs, deterministic=True)`` as a module of tensor operations only, for ``mprl
        export``: ``obs [B, A, features]`` in, every agent's action out (``[B, A]`` int64, or
        ``[B, A, n]`` clipped to the bounds); no critic in it. It shares this model's
        parameters."""
        return _GreedyAgents(self)


def per_agent(
    nets: nn.ModuleList, eye: torch.Tensor, x: torch.Tensor, groups: Groups | None = None
) -> torch.Tensor:
    """``x [..., A, in]`` with each agent's one-hot id (a row of ``eye``) through each agent's
    net, each group's (``groups``: the rows of each net's agents) or the shared one:
    ``[..., A, out]``."""
    x = torch.cat([x, eye.expand(*x.shape[:-1], eye.shape[0])], -1)
    if len(nets) == 1:
        return nets[0](x)
    if groups is not None:
        return run_groups(nets, groups, x, x.dim() - 2)
    return torch.stack([net(x[..., i, :]) for i, net in enumerate(nets)], -2)


class _GreedyAgents(GreedyAgents):
    """Every agent's most likely action: the argmax of its logits, or its Gaussian's mean
    clipped to the bounds."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = per_agent(self.actors, self.eye, obs.float(), self.groups)
        if self.discrete:
            return masked_logits(out, self.action_mask).argmax(-1)
        return torch.max(torch.min(out, self.high), self.low)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: MAPPOConfig) -> nn.Module:
    if config.core != "none":
        return RecurrentAgentsModel(obs_space, act_space, config)  # type: ignore[arg-type]
    return AgentsModel(obs_space, act_space, config)  # type: ignore[arg-type]


def make_optimizer(params: Any, config: MAPPOConfig) -> torch.optim.Optimizer:
    return Adam(params, lr=config.lr, eps=1e-5)


def _rollout(dims: schema.Dims) -> dict[str, Any]:
    cfg: MAPPOConfig = dims.config
    n_agents = dims.observation_space.shape[0]
    return {
        **agent_rollout_spec(
            dims.observation_space, dims.action_space, cfg.n_steps, cfg.envs_per_worker
        ),
        **hidden_spec(cfg, n_agents, cfg.n_steps, cfg.envs_per_worker),
    }


SCHEMA = schema.Schema(
    rollouts=schema.Rollouts(_rollout, slots_per_worker=1),  # one rollout per policy version
    weights=schema.Weights(),
)


def worker(ctx: mprl.Context) -> None:
    """Each iteration: wait for the newest weights, fill this worker's slot with ``n_steps``
    steps of ``envs_per_worker`` multi-agent envs, hand it over."""
    cfg: MAPPOConfig = ctx.config
    rollouts: RolloutSlots = ctx.state.rollouts
    weights: WeightBroadcast = ctx.state.weights
    local: AgentsModel = copy.deepcopy(ctx.model)  # type: ignore[assignment]
    envs = AgentBatch(ctx, cfg.envs_per_worker, cfg.gamma)

    def act(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = local.distribution(local.policy(obs))
        actions = dist.sample()
        return actions, dist.log_prob(actions)

    def value(states: torch.Tensor) -> torch.Tensor:  # a cut episode's last states: [k, A]
        if not local.central:  # a local critic needs the observations: no bootstrap value
            return torch.zeros(states.shape[0], local.n_agents)
        return local.value_norm.denormalize(local.value(torch.empty(0), states))

    hidden = local.initial_state(cfg.envs_per_worker) if cfg.core != "none" else None
    while (index := rollouts.acquire()) is not None:
        slot = rollouts.slot(index)
        if weights.wait(int(slot["version"])) is None:
            break
        version = weights.pull(local)
        if hidden is None:
            envs.rollout(act, value, slot)
        else:
            hidden = recurrent_rollout(envs, local, slot, hidden, cfg.data_chunk_length)
        slot["version"].fill_(version)
        rollouts.commit(index)
    envs.close()


def recurrent_rollout(
    envs: AgentBatch,
    model: RecurrentAgentsModel,
    slot: dict[str, torch.Tensor],
    hidden: torch.Tensor,
    chunk_length: int,
) -> torch.Tensor:
    """:meth:`AgentBatch.rollout` with a recurrent model: every agent's actor and critic
    hidden state ``hidden [k, envs, A, size]`` carried from step to step, zeroed where an
    episode ended, stored in ``slot["hidden"]`` at the start of each chunk of
    ``chunk_length`` steps. Returns the hidden state after the last step (the next rollout
    starts from it)."""
    steps = slot["action"].shape[0]
    r = model.rows
    for t in range(steps):
        if t % chunk_length == 0:
            slot["hidden"][t // chunk_length] = hidden
        slot["obs"][t] = envs.obs
        slot["state"][t] = envs.state
        slot["alive"][t] = envs.alive
        with torch.no_grad():
            out, _, hidden = model.step(envs.obs, envs.state, hidden)
            dist = model.distribution(out)
            actions = dist.sample()
            slot["action"][t] = actions
            slot["logp"][t] = dist.log_prob(actions)

        def value(states: torch.Tensor, after: torch.Tensor = hidden) -> torch.Tensor:
            if not model.central:  # a local critic needs the observations: no bootstrap
                return torch.zeros(states.shape[0], model.n_agents)
            return model.critic_value(states, after[r:, envs.cut])

        rewards, dones = envs.step(model.to_env(actions), value)
        slot["reward"][t] = torch.from_numpy(rewards)
        slot["done"][t] = torch.from_numpy(dones)
        hidden = hidden * (1.0 - torch.from_numpy(dones)).view(1, -1, 1, 1)
    slot["obs"][steps] = envs.obs
    slot["state"][steps] = envs.state
    envs.ctx.add_steps(steps * envs.n)
    return hidden


def train(ctx: mprl.Context) -> None:
    """Each iteration: every worker's rollout, ``epochs`` passes of clipped-PPO updates over
    them (each agent's advantages by GAE, losses over the agents that acted), the new
    weights published (which releases the workers)."""
    cfg: MAPPOConfig = ctx.config
    rollouts: RolloutSlots = ctx.state.rollouts
    weights: WeightBroadcast = ctx.state.weights
    model: AgentsModel = ctx.model  # type: ignore[assignment]
    optimizer = ctx.optimizer
    assert optimizer is not None
    generator = torch.Generator().manual_seed(ctx.seed)
    last_log, updates_at_log = time.monotonic(), weights.version
    report: dict[str, float] = {}
    while (batch := rollouts.take_batch(ctx.n_workers)) is not None:
        batch = ctx.to_device(batch)
        data = _prepare(cfg, model, batch) if cfg.core == "none" else _chunks(cfg, model, batch)
        with weights.publishing(model):
            report = _update(ctx, cfg, model, optimizer, data, generator) or report
        if time.monotonic() - last_log >= LOG_EVERY_S:
            now = time.monotonic()
            rate = (weights.version - updates_at_log) / max(now - last_log, 1e-9)
            ctx.log(**report, iterations_per_s=rate)
            last_log, updates_at_log = now, weights.version
    if weights.version > updates_at_log and report:  # the last stretch, so short runs report
        ctx.log(**report)


def _targets(
    cfg: MAPPOConfig, model: Any, flat: dict[str, torch.Tensor], values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages by GAE per agent (an episode's end stops them for all its agents) and the
    value targets ``[T, N, A]``, from the values ``[T + 1, N, A]``; the value normaliser
    learns the live agents' targets."""
    t_len, n, a = flat["reward"].shape
    dones = flat["done"].unsqueeze(-1).expand(t_len, n, a)
    advantages = gae(
        flat["reward"].reshape(t_len, -1), dones.reshape(t_len, -1), values.reshape(t_len + 1, -1),
        cfg.gamma, cfg.gae_lambda,
    ).view(t_len, n, a)  # fmt: skip
    returns = advantages + values[:-1]
    alive = flat["alive"] > 0
    if cfg.value_norm and alive.any():
        model.value_norm.update(returns[alive])
    return advantages, returns


def _prepare(
    cfg: MAPPOConfig, model: AgentsModel, batch: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The samples of one iteration, one row per (step, env): advantages and value targets
    by GAE per agent (an episode's end stops them for all its agents)."""
    # [T, workers, envs, ...] -> [T, workers x envs, ...]; the slots' versions left out
    flat = {k: t.flatten(1, 2) for k, t in batch.items() if t.dim() >= 3}
    with torch.no_grad():  # [T + 1, N, A]
        values = model.value_norm.denormalize(model.value(flat["obs"], flat["state"]))
    advantages, returns = _targets(cfg, model, flat, values)
    rows = {
        "obs": flat["obs"][:-1], "state": flat["state"][:-1], "action": flat["action"],
        "logp": flat["logp"], "advantage": advantages, "return": returns,
        "alive": flat["alive"],
    }  # fmt: skip
    return {k: t.flatten(0, 1) for k, t in rows.items()}


def _chunks(
    cfg: MAPPOConfig, model: RecurrentAgentsModel, batch: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The samples of one iteration for a recurrent model: the rollouts cut into chunks of
    ``data_chunk_length`` steps, ``[length, chunks, ...]`` (the last chunks of a rollout
    padded, their ``alive`` zero), each with the hidden state ``[k, chunks, A, size]`` the
    worker stored at its start, and the dones inside it. Advantages and value targets by GAE
    per agent, from values replayed over the whole rollouts."""
    hidden = batch["hidden"]  # [C, workers, k, envs, A, size]
    hidden = hidden.permute(2, 0, 1, 3, 4, 5).flatten(1, 3)  # [k, C x N, A, size]
    flat = {k: t.flatten(1, 2) for k, t in batch.items() if t.dim() >= 3 and k != "hidden"}
    n = flat["reward"].shape[1]
    with torch.no_grad():  # [T + 1, N, A], from the state at the rollouts' start (chunk 0)
        _, values, _ = model.unroll(flat["obs"], flat["state"], hidden[:, :n], flat["done"])
        values = model.value_norm.denormalize(values)
    advantages, returns = _targets(cfg, model, flat, values)
    rows = {
        "obs": flat["obs"][:-1], "state": flat["state"][:-1], "action": flat["action"],
        "logp": flat["logp"], "advantage": advantages, "return": returns,
        "alive": flat["alive"], "done": flat["done"],
    }  # fmt: skip
    data = {k: chunk(t, cfg.data_chunk_length) for k, t in rows.items()}
    data["hidden"] = hidden
    return data


def _update(
    ctx: mprl.Context,
    cfg: MAPPOConfig,
    model: AgentsModel,
    optimizer: torch.optim.Optimizer,
    data: dict[str, torch.Tensor],
    generator: torch.Generator,
) -> dict[str, float]:
    """``cfg.epochs`` passes of ``cfg.minibatches`` clipped-PPO minibatches; the last one's
    numbers. With a recurrent model the samples are chunks (:func:`_chunks`), each replayed
    from its stored hidden state."""
    recurrent = "hidden" in data
    size = data["obs"].shape[1 if recurrent else 0]
    mask = data["alive"]
    adv = data["advantage"]
    live = mask > 0
    if live.sum() > 1:  # normalised over the agents that acted
        adv = (adv - adv[live].mean()) / (adv[live].std() + 1e-8)
    targets = model.value_norm(data["return"]) if cfg.value_norm else data["return"]
    stats: dict[str, float] = {}
    replay_error = None  # the update's first minibatch: the workers' policy, not yet changed
    batch = math.ceil(size / cfg.minibatches)
    for _ in range(cfg.epochs):
        for index in torch.randperm(size, generator=generator).split(batch):
            if ctx.should_stop():
                return stats
            if recurrent:
                pick = {k: t[:, index] for k, t in data.items()}
                out, values, _ = model.unroll(
                    pick["obs"], pick["state"], pick["hidden"], pick["done"]
                )
                m, a, target = mask[:, index], adv[:, index], targets[:, index]
            else:
                pick = {k: t[index] for k, t in data.items()}
                out = model.policy(pick["obs"])
                values = model.value(pick["obs"], pick["state"])
                m, a, target = mask[index], adv[index], targets[index]
            denom = m.sum().clamp(min=1.0)
            dist = model.distribution(out)
            logp = dist.log_prob(pick["action"])
            ratio = (logp - pick["logp"]).exp()
            if replay_error is None:  # ratio 1: the replay reproduces what the workers did
                replay_error = ((logp - pick["logp"]).abs() * m).max().item()
            surrogate = torch.min(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a)
            policy_loss = -(surrogate * m).sum() / denom
            entropy = (dist.entropy() * m).sum() / denom
            error = F.huber_loss(values, target, reduction="none", delta=cfg.huber_delta)
            value_loss = (error * m).sum() / denom
            loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            stats = {
                "policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                "entropy": entropy.item(), "grad_norm": float(grad_norm),
                "clip_fraction": (((ratio - 1).abs() > cfg.clip).float() * m).sum().item()
                / denom.item(),
                "replay_logp_error": replay_error,
            }  # fmt: skip
    return stats
