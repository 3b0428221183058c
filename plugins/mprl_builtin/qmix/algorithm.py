"""VDN and QMIX: value decomposition for cooperative multi-agent envs with discrete actions,
off-policy. One Q network serves every agent (parameter sharing, the agent's one-hot id appended
to its observation); workers act epsilon-greedily per agent with the newest published network
and add each team step to a replay buffer: every agent's observation and action, the global
state (``info["state"]``), the team reward, the next observations and state, and ``done`` (1.0
only where the episode terminated: a time limit's cut is bootstrapped). One train process
samples it at the declared replay ratio and regresses the mixed ``Q_tot(s, a)`` (the mixer:
:mod:`mprl_builtin.qmix.mixers`) on ``r + gamma * (1 - done) * Q_tot'(s', argmax a')``, the
target networks' (agents and mixer, a ``schema.Module`` copied every ``target_update``
updates), the next actions picked by the online agents (double Q, EPyMARL's default).

The agents are feed-forward and the buffer holds transitions, not episodes (EPyMARL and
BenchMARL's QMIX use GRU agents over replayed episodes): on fully observed tasks such as
``simple_spread`` that changes little; on partially observed ones it does.
"""

from __future__ import annotations

import copy
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
from mprl.lib.continuous import plain_mlp
from mprl.lib.marl import AgentBatch, agent_action_mask, masked_logits
from mprl.lib.nets import Adam, field_help
from mprl.lib.offpolicy import linear_schedule
from mprl_builtin.qmix.mixers import QMixer, VDNMixer

LOG_EVERY_UPDATES = 500  # the learner's report: by updates, not seconds (a serial run repeats)


@attrs.frozen
class VDNConfig:
    """VDN's hyperparameters (QMIX's too, which adds its mixer's widths); the defaults are
    EPyMARL's for MPE where they apply."""

    lr: float = attrs.field(
        default=5e-4, validator=v.gt(0.0), metadata=field_help("Adam learning rate")
    )
    buffer_size: int = attrs.field(
        default=200_000,
        metadata=field_help("replay capacity in team transitions (allocated whole, checkpointed)"),
    )
    learning_starts: int = attrs.field(
        default=2000,
        validator=v.ge(0),
        metadata=field_help("team transitions collected (random actions) before learning"),
    )
    batch_size: int = attrs.field(
        default=128, validator=v.ge(1), metadata=field_help("team transitions per update")
    )
    gamma: float = attrs.field(
        default=0.99, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    steps_per_update: int = attrs.field(
        default=16,
        validator=v.ge(1),
        metadata=field_help(
            "team env steps per round of gradient_steps updates; the workers run at most this "
            "many steps ahead of the learner"
        ),
    )
    gradient_steps: int = attrs.field(
        default=1,
        validator=v.ge(1),
        metadata=field_help(
            "updates per steps_per_update env steps: the replay ratio is gradient_steps * "
            "batch_size / steps_per_update transitions sampled per transition collected (8 by "
            "default)"
        ),
    )
    target_update: int = attrs.field(
        default=200,
        validator=v.ge(1),
        metadata=field_help("updates between copies of the agents and mixer into the targets"),
    )
    exploration_steps: int = attrs.field(
        default=50_000,
        validator=v.ge(0),
        metadata=field_help(
            "env steps (after learning_starts) over which epsilon falls linearly to its final "
            "value (EPyMARL's epsilon_anneal_time)"
        ),
    )
    exploration_initial_eps: float = attrs.field(
        default=1.0, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("epsilon at the start")
    )
    exploration_final_eps: float = attrs.field(
        default=0.05,
        validator=[v.ge(0.0), v.le(1.0)],
        metadata=field_help("epsilon after exploration_steps (and of act(deterministic=False))"),
    )
    max_grad_norm: float = attrs.field(
        default=10.0, validator=v.gt(0.0), metadata=field_help("gradient norm clip")
    )
    double: bool = attrs.field(
        default=True, metadata=field_help("double Q: the online agents pick the next actions")
    )
    envs_per_worker: int = attrs.field(
        default=1, validator=v.ge(1), metadata=field_help("environments each worker steps")
    )
    pull_every: int = attrs.field(
        default=8,
        validator=v.ge(1),
        metadata=field_help("worker steps between looks for newer weights"),
    )
    hidden: tuple[int, ...] = attrs.field(
        default=(128, 128),
        converter=tuple,
        validator=[v.min_len(1), v.deep_iterable(v.and_(v.instance_of(int), v.gt(0)))],
        metadata=field_help("hidden layer sizes of the agents' shared Q network"),
    )


@attrs.frozen
class QMIXConfig(VDNConfig):
    """QMIX's hyperparameters: VDN's and the mixing network's widths."""

    mixing_embed_dim: int = attrs.field(
        default=32, validator=v.ge(1), metadata=field_help("width of QMIX's mixing layer")
    )
    hypernet_embed: int = attrs.field(
        default=64, validator=v.ge(1), metadata=field_help("hidden width of QMIX's hypernetworks")
    )


def team_row(dims: schema.Dims) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """One team transition: every agent's ``obs`` / ``next_obs`` ``[A, features]`` and
    ``action`` ``[A]``, the global ``state`` / ``next_state`` ``[S]``, the team ``reward`` and
    ``done`` (1.0 where the episode terminated)."""
    obs = dims.observation_space
    agents = tuple(obs.shape[:1])
    state = tuple(obs.state.shape)
    return {
        "obs": (tuple(obs.shape), torch.float32),
        "state": (state, torch.float32),
        "action": (agents, torch.int64),
        "reward": ((), torch.float32),
        "next_obs": (tuple(obs.shape), torch.float32),
        "next_state": (state, torch.float32),
        "done": ((), torch.float32),
    }


def replay_ratio(dims: schema.Dims) -> float:
    """Team transitions sampled per transition collected."""
    c: VDNConfig = dims.config
    return c.gradient_steps * c.batch_size / c.steps_per_update


SCHEMA = schema.Schema(
    replay=schema.ReplayBuffer(
        capacity="config.buffer_size",
        row=team_row,
        replay_ratio=replay_ratio,
        learning_starts="config.learning_starts",
        max_lead="config.steps_per_update",
    ),
    weights=schema.Weights(),  # the learner's agents (and mixer), published to the workers
    target=schema.Module(),  # a copy of the model: the target agents and mixer, checkpointed
    updates=schema.Counter(),  # the learner's updates
)


class AgentsQ(nn.Module):
    """The agents' shared Q network (input: an agent's observation and its one-hot id) and the
    mixer (:class:`VDNMixer` or :class:`QMixer`); ``act`` plays the agents greedily."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, cfg: VDNConfig) -> None:
        super().__init__()
        self.n_agents, features = obs_space.shape
        n_actions = int(act_space.nvec.max())
        # agents with fewer actions than the largest count: the others masked (not saved)
        self.register_buffer("action_mask", agent_action_mask(act_space), persistent=False)
        self.register_buffer("eye", torch.eye(self.n_agents), persistent=False)
        self.agent = plain_mlp(features + self.n_agents, cfg.hidden, n_actions)
        self.mixer: nn.Module
        if isinstance(cfg, QMIXConfig):
            state_dim = int(obs_space.state.shape[0])
            self.mixer = QMixer(self.n_agents, state_dim, cfg.mixing_embed_dim, cfg.hypernet_embed)
        else:
            self.mixer = VDNMixer()
        self.eps = cfg.exploration_final_eps

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Every agent's Q values ``[..., A, n]`` for ``obs [..., A, features]``, the actions an
        agent does not have masked (never its argmax)."""
        return agent_q(self.agent, self.eye, self.action_mask, obs)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Every agent's greedy action ``[B, A]`` for ``obs [B, A, features]``, or epsilon-greedy
        with the final epsilon."""
        with torch.no_grad():
            q = self.q_values(obs)
        eps = 0.0 if deterministic else self.eps
        return agents_epsilon_greedy(q, self.action_mask, eps).numpy()

    def export_policy(self) -> nn.Module:
        """``act(obs, deterministic=True)`` as a module of tensor operations only, for ``mprl
        export``: ``obs [B, A, features]`` in, every agent's argmax ``[B, A]`` (int64) out; no
        mixer in it. It shares this model's parameters."""
        return _GreedyAgents(self)


def agent_q(
    net: nn.Module, eye: torch.Tensor, mask: torch.Tensor | None, obs: torch.Tensor
) -> torch.Tensor:
    """``obs [..., A, features]`` with each agent's one-hot id through the shared ``net``,
    masked: ``[..., A, n]``."""
    x = obs.float()
    x = torch.cat([x, eye.expand(*x.shape[:-1], eye.shape[0])], -1)
    return masked_logits(net(x), mask)


class _GreedyAgents(nn.Module):
    """Every agent's argmax of its Q values."""

    def __init__(self, model: AgentsQ) -> None:
        super().__init__()
        self.agent = model.agent
        self.register_buffer("eye", model.eye.detach().clone())
        mask = model.action_mask
        self.register_buffer("action_mask", None if mask is None else mask.detach().clone())
        self.state_shapes: dict[str, tuple[int, ...]] = {}

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return agent_q(self.agent, self.eye, self.action_mask, obs).argmax(-1)


def agents_epsilon_greedy(
    q: torch.Tensor,
    mask: torch.Tensor | None,
    eps: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Each agent's action ``[B, A]`` for ``q [B, A, n]``: its argmax, or with probability
    ``eps`` one of the actions it has (``mask [A, n]``), uniformly."""
    greedy = q.argmax(-1)
    if eps <= 0.0:
        return greedy
    b, a, n = q.shape
    have = torch.ones(a, n) if mask is None else mask.float()
    random = torch.multinomial(have.repeat(b, 1), 1, generator=generator).view(b, a)
    explore = torch.rand(b, a, generator=generator) < eps
    return torch.where(explore, random, greedy)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: VDNConfig) -> nn.Module:
    return AgentsQ(obs_space, act_space, config)


def make_optimizer(params: Any, config: VDNConfig) -> torch.optim.Optimizer:
    return Adam(params, lr=config.lr)


def epsilon(cfg: VDNConfig, env_steps: int) -> float:
    """1.0 (uniformly random actions) until ``learning_starts``, then falling linearly from
    ``exploration_initial_eps`` to ``exploration_final_eps`` over ``exploration_steps``."""
    if env_steps < cfg.learning_starts:
        return 1.0
    return linear_schedule(
        cfg.exploration_initial_eps,
        cfg.exploration_final_eps,
        cfg.exploration_steps,
        env_steps - cfg.learning_starts,
    )


class TeamSteps(AgentBatch):
    """A worker's multi-agent envs (:class:`mprl.lib.marl.AgentBatch`: episode logging, resets)
    stepped for replay: :meth:`transition` also returns where each episode stopped."""

    def transition(self, actions: np.ndarray) -> dict[str, torch.Tensor]:
        """Step every env once; the rows of the team transitions (:func:`team_row`, but the
        observations and actions, which the caller has): ``reward`` (the team's), ``next_obs``
        and ``next_state`` (where a step ended an episode: its last ones, not the next
        episode's) and ``done`` (1.0 where it terminated; 0.0 where a time limit cut it)."""
        n = self.n
        reward = np.zeros(n, np.float32)
        done = np.zeros(n, np.float32)
        next_obs, next_state, obs, states, alive = [], [], [], [], []
        for i, env in enumerate(self.envs):
            o, r, terminated, truncated, info = env.step(actions[i])
            reward[i] = r
            self.returns[i] += info["agent_rewards"]
            self.lengths[i] += 1
            next_obs.append(o)
            next_state.append(info["state"])
            if terminated or truncated:
                done[i] = float(terminated)
                self._log(i)
                o, info = env.reset()
            obs.append(o)
            states.append(info["state"])
            alive.append(info["alive"])
        self.obs = torch.as_tensor(np.stack(obs))
        self.state = torch.as_tensor(np.stack(states))
        self.alive = torch.as_tensor(np.stack(alive), dtype=torch.float32)
        self.beat()
        return {
            "reward": torch.from_numpy(reward),
            "next_obs": torch.as_tensor(np.stack(next_obs), dtype=torch.float32),
            "next_state": torch.as_tensor(np.stack(next_state), dtype=torch.float32),
            "done": torch.from_numpy(done),
        }


def worker(ctx: mprl.Context) -> None:
    """Act epsilon-greedily per agent over ``envs_per_worker`` envs with the newest published
    agents; every team transition goes to the replay buffer (whose ``add`` waits when the
    workers are ahead of the learner)."""
    cfg: VDNConfig = ctx.config
    weights, replay = ctx.state.weights, ctx.state.replay
    local = copy.deepcopy(ctx.model)
    version = -1
    generator = torch.Generator().manual_seed(ctx.seed)
    envs = TeamSteps(ctx, cfg.envs_per_worker, cfg.gamma)
    steps = 0
    try:
        while not ctx.should_stop():
            if steps % cfg.pull_every == 0:
                version = weights.pull(local, version)
            steps += 1
            obs, state = envs.obs.float(), envs.state.float()
            with torch.no_grad():
                q = local.q_values(obs)
            eps = epsilon(cfg, ctx.env_steps)
            actions = agents_epsilon_greedy(q, local.action_mask, eps, generator)
            rows = envs.transition(actions.numpy())
            replay.add(obs=obs, state=state, action=actions, **rows)
            ctx.add_steps(cfg.envs_per_worker)
    finally:
        envs.close()


def train(ctx: mprl.Context) -> None:
    """Sample at the declared replay ratio (``sample`` waits for the workers) and update."""
    cfg: VDNConfig = ctx.config
    replay, weights, target, updates = (
        ctx.state.replay, ctx.state.weights, ctx.state.target, ctx.state.updates,
    )  # fmt: skip
    model, optimizer = ctx.model, ctx.optimizer
    assert optimizer is not None
    # the targets this process updates, on its device; copied into the shared state's (which
    # checkpoints keep) at every copy
    target_net = copy.deepcopy(target).to(ctx.device)
    params = list(model.parameters())
    sampling = torch.Generator().manual_seed(ctx.seed)
    done = updates.value  # a resumed run counts on
    report: dict[str, torch.Tensor] = {}
    while (batch := replay.sample(cfg.batch_size, sampling)) is not None:
        batch = ctx.to_device(batch)
        q_tot = chosen_q_tot(model, batch)
        wanted = td_target(model, target_net, batch, cfg.gamma, cfg.double)
        loss = F.mse_loss(q_tot, wanted)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        with weights.publishing(model):  # the agents the workers act with: one new version
            optimizer.step()
        report = {"loss": loss.detach(), "q_tot": q_tot.detach().mean()}
        updates.add(1)
        done += 1
        if done % cfg.target_update == 0:
            target_net.load_state_dict(model.state_dict())
            target.load_state_dict(target_net.state_dict())
        if done % LOG_EVERY_UPDATES == 0:
            ctx.log(**{k: float(t) for k, t in report.items()}, updates=done)
    if report and done % LOG_EVERY_UPDATES:  # where the learner ended, in every run
        ctx.log(**{k: float(t) for k, t in report.items()}, updates=done)


def chosen_q_tot(model: AgentsQ, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Q_tot(s, a)`` ``[B]``: the agents' Q values of the actions taken, mixed."""
    q = model.q_values(batch["obs"]).gather(-1, batch["action"][..., None]).squeeze(-1)
    return model.mixer(q, batch["state"])


def td_target(
    model: AgentsQ,
    target: AgentsQ,
    batch: dict[str, torch.Tensor],
    gamma: float,
    double: bool = True,
) -> torch.Tensor:
    """``r + gamma * (1 - done) * Q_tot'(s', a')`` ``[B]``: the target agents' Q values of the
    next actions ``a'`` (each agent's argmax, by the online agents where ``double``) mixed by
    the target mixer over the next state; ``r`` alone where the episode terminated."""
    with torch.no_grad():
        next_q = target.q_values(batch["next_obs"])
        picker = model.q_values(batch["next_obs"]) if double else next_q
        best = next_q.gather(-1, picker.argmax(-1, keepdim=True)).squeeze(-1)
        bootstrap = target.mixer(best, batch["next_state"])
        return batch["reward"] + gamma * (1.0 - batch["done"]) * bootstrap
