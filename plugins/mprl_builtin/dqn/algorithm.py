"""DQN: workers act epsilon-greedily with the newest published Q network over a batch of
environments (:class:`mprl.lib.offpolicy.ReplayCollector`) and add every transition to a replay
buffer; one train process samples it and runs double DQN (van Hasselt et al. 2016: the online
network picks the next action, a target network values it) with optional n-step returns.

The replay ratio is declared, not written: the buffer's ``replay_ratio`` is ``gradient_steps *
batch_size / steps_per_update`` rows sampled per row collected (SB3's ``train_freq`` /
``gradient_steps``) from ``learning_starts`` rows on, so the learner's ``sample`` waits when it is
level with the workers, and a worker's ``add`` waits when the workers are ``steps_per_update``
rows ahead of the learner. The backend keeps it, on every backend.

The defaults are rl-zoo's CartPole-v1 DQN (``hyperparams/dqn.yml``), with double DQN on (SB3's
DQN has none). rl-zoo updates the target every 10 env steps, but its learner trains in bursts
of 128 updates every 256 steps, so each burst learns against the target of its start: here the
learner updates between the workers' steps, and the target is copied every
``target_update`` = 128 updates, which is the same.
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
from mprl.lib.nets import Adam, field_help
from mprl.lib.offpolicy import ReplayCollector, epsilon_greedy, linear_schedule, nstep_row

LOG_EVERY_UPDATES = 500  # the learner's report: by updates, not seconds (a serial run repeats)


@attrs.frozen
class DQNConfig:
    """DQN hyperparameters; the defaults are rl-zoo's for CartPole-v1."""

    lr: float = attrs.field(
        default=2.3e-3, validator=v.gt(0.0), metadata=field_help("Adam learning rate")
    )
    buffer_size: int = attrs.field(  # (its size is checked by the schema, naming the field)
        default=100_000,
        metadata=field_help("replay capacity in transitions (allocated whole, checkpointed)"),
    )
    learning_starts: int = attrs.field(
        default=1000,
        validator=v.ge(0),
        metadata=field_help("transitions collected (uniformly random actions) before learning"),
    )
    batch_size: int = attrs.field(
        default=64, validator=v.ge(1), metadata=field_help("transitions per update")
    )
    gamma: float = attrs.field(
        default=0.99, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    steps_per_update: int = attrs.field(  # was train_freq: mprl.deprecated.RENAMED_FIELDS
        default=256,
        validator=v.ge(1),
        metadata=field_help(
            "env steps per round of gradient_steps updates (SB3's train_freq); the workers run "
            "at most this many steps ahead of the learner"
        ),
    )
    gradient_steps: int = attrs.field(
        default=128,
        validator=v.ge(1),
        metadata=field_help(
            "updates per steps_per_update env steps: the replay ratio is gradient_steps * "
            "batch_size / steps_per_update transitions sampled per transition collected (32 by "
            "default)"
        ),
    )
    target_update: int = attrs.field(
        default=128,
        validator=v.ge(1),
        metadata=field_help("updates between copies of the Q network into the target network"),
    )
    exploration_steps: int = attrs.field(
        default=8000,
        validator=v.ge(0),
        metadata=field_help(
            "env steps over which epsilon falls linearly to its final value (rl-zoo: 0.16 of 5e4)"
        ),
    )
    exploration_initial_eps: float = attrs.field(
        default=1.0, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("epsilon at the start")
    )
    exploration_final_eps: float = attrs.field(
        default=0.04,
        validator=[v.ge(0.0), v.le(1.0)],
        metadata=field_help("epsilon after exploration_steps (and of act(deterministic=False))"),
    )
    max_grad_norm: float = attrs.field(
        default=10.0, validator=v.gt(0.0), metadata=field_help("gradient norm clip (SB3's 10)")
    )
    double: bool = attrs.field(
        default=True, metadata=field_help("double DQN: the online network picks the next action")
    )
    n_step: int = attrs.field(
        default=1, validator=v.ge(1), metadata=field_help("rewards summed per transition")
    )
    envs_per_worker: int = attrs.field(
        default=1, validator=v.ge(1), metadata=field_help("environments each worker steps")
    )
    pull_every: int = attrs.field(
        default=8,
        validator=v.ge(1),
        metadata=field_help(
            "worker steps between looks for newer weights (the learner publishes after every "
            "update: copying each costs the learner's CPU)"
        ),
    )
    hidden: tuple[int, ...] = attrs.field(
        default=(256, 256),
        converter=tuple,
        validator=[v.min_len(1), v.deep_iterable(v.and_(v.instance_of(int), v.gt(0)))],
        metadata=field_help("hidden layer sizes of the Q network"),
    )


def replay_ratio(dims: schema.Dims) -> float:
    """Transitions sampled per transition collected: ``gradient_steps * batch_size /
    steps_per_update`` (SB3's ``train_freq``)."""
    c: DQNConfig = dims.config
    return c.gradient_steps * c.batch_size / c.steps_per_update


SCHEMA = schema.Schema(
    replay=schema.ReplayBuffer(
        capacity="config.buffer_size",
        row=nstep_row,  # the transition and its bootstrap discount (n-step returns)
        replay_ratio=replay_ratio,
        learning_starts="config.learning_starts",
        max_lead="config.steps_per_update",
    ),
    weights=schema.Weights(),  # the learner's Q network, published to the workers
    target=schema.Module(),  # a copy of the model: the target network, checkpointed
    updates=schema.Counter(),  # the learner's updates
)


class QNetwork(nn.Module):
    """An MLP of Q values, one per action; ``act`` plays it (``mprl eval``, "solved")."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, config: DQNConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        n_in = int(np.prod(obs_space.shape))
        for h in config.hidden:
            layers += [nn.Linear(n_in, h), nn.ReLU()]
            n_in = h
        layers.append(nn.Linear(n_in, int(act_space.n)))
        self.q = nn.Sequential(*layers)
        self.eps = config.exploration_final_eps

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs.reshape(obs.shape[0], -1).float())

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """The greedy actions, or epsilon-greedy with the final epsilon."""
        with torch.no_grad():
            q = self(obs)
        return epsilon_greedy(q, 0.0 if deterministic else self.eps).numpy()

    def export_policy(self) -> nn.Module:
        """The greedy action (``act(obs, deterministic=True)``) as a module of tensor
        operations only, for ``mprl export``; it shares this network's parameters."""
        return _GreedyQ(self.q)


class _GreedyQ(nn.Module):
    """Observations ``[B, *obs_shape]`` -> the argmax of the Q values ``[B]`` (int64)."""

    def __init__(self, q: nn.Module) -> None:
        super().__init__()
        self.q = q
        self.state_shapes: dict[str, tuple[int, ...]] = {}

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs.reshape(obs.shape[0], -1).float()).argmax(1)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: DQNConfig) -> nn.Module:
    return QNetwork(obs_space, act_space, config)


def make_optimizer(params: Any, config: DQNConfig) -> torch.optim.Optimizer:
    params = list(params)
    try:
        return Adam(params, lr=config.lr, fused=True)
    except RuntimeError:  # torch < 2.4: no fused Adam on CPU
        return Adam(params, lr=config.lr)


def epsilon(cfg: DQNConfig, env_steps: int) -> float:
    """Uniformly random actions until ``learning_starts``, then SB3's linear schedule."""
    if env_steps < cfg.learning_starts:
        return 1.0
    return linear_schedule(
        cfg.exploration_initial_eps, cfg.exploration_final_eps, cfg.exploration_steps, env_steps
    )


def worker(ctx: mprl.Context) -> None:
    """Act epsilon-greedily over ``envs_per_worker`` envs with the newest published Q network;
    every transition goes to the replay buffer (whose ``add`` waits when the workers are
    ahead of the learner)."""
    cfg: DQNConfig = ctx.config
    weights = ctx.state.weights
    local = copy.deepcopy(ctx.model)
    version = -1
    generator = torch.Generator().manual_seed(ctx.seed)
    collector = ReplayCollector(
        ctx, ctx.state.replay, cfg.envs_per_worker, cfg.gamma, n_step=cfg.n_step, discount=True
    )
    steps = 0
    try:
        while not ctx.should_stop():
            if steps % cfg.pull_every == 0:
                version = weights.pull(local, version)
            steps += 1
            with torch.no_grad():
                q = local(collector.obs)
            collector.step(epsilon_greedy(q, epsilon(cfg, ctx.env_steps), generator))
    finally:
        collector.close()


def train(ctx: mprl.Context) -> None:
    """Sample at the declared replay ratio (``sample`` waits for the workers) and update."""
    cfg: DQNConfig = ctx.config
    replay, weights, target, updates = (
        ctx.state.replay, ctx.state.weights, ctx.state.target, ctx.state.updates,
    )  # fmt: skip
    model, optimizer = ctx.model, ctx.optimizer
    assert optimizer is not None
    # the target this process updates, on its device; copied into the shared state's (which
    # checkpoints keep) at every copy
    target_net = copy.deepcopy(target).to(ctx.device)
    params = list(model.parameters())
    sampling = torch.Generator().manual_seed(ctx.seed)
    done = updates.value  # a resumed run counts on
    report: dict[str, torch.Tensor] = {}
    while (batch := replay.sample(cfg.batch_size, sampling)) is not None:
        report = _update(cfg, model, target_net, optimizer, params, ctx.to_device(batch), weights)
        updates.add(1)
        done += 1
        if done % cfg.target_update == 0:
            target_net.load_state_dict(model.state_dict())
            target.load_state_dict(target_net.state_dict())
        if done % LOG_EVERY_UPDATES == 0:
            ctx.log(**{k: float(t) for k, t in report.items()}, updates=done)
    if report and done % LOG_EVERY_UPDATES:  # where the learner ended, in every run
        ctx.log(**{k: float(t) for k, t in report.items()}, updates=done)


def _update(
    cfg: DQNConfig,
    model: nn.Module,
    target: nn.Module,
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    batch: dict[str, torch.Tensor],
    weights: Any,
) -> dict[str, torch.Tensor]:
    """One (double) DQN update on ``batch``; its numbers, as tensors."""
    q = model(batch["obs"]).gather(1, batch["action"][:, None]).squeeze(1)
    with torch.no_grad():
        next_q = target(batch["next_obs"])
        if cfg.double:
            best = model(batch["next_obs"]).argmax(1, keepdim=True)
        else:
            best = next_q.argmax(1, keepdim=True)
        bootstrap = next_q.gather(1, best).squeeze(1)
        wanted = batch["reward"] + batch["discount"] * (1.0 - batch["done"]) * bootstrap
    loss = F.smooth_l1_loss(q, wanted)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    with weights.publishing(model):  # the Q network the workers act with: one new version
        optimizer.step()
    return {"loss": loss.detach(), "q": q.detach().mean()}
