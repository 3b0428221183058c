"""TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods")
as a third-party mprl plugin: off-policy continuous control, Pendulum-v1 by default.

Workers act with the newest published actor plus exploration noise and add every transition
to a replay buffer; one train process samples it at the replay ratio the schema declares and
runs TD3: twin critics against the smaller of two target values, the target actor's actions
smoothed with clipped noise, the actor and the target networks updated every
``policy_delay`` critic updates. The parts are mprl's (``mprl.lib.continuous``,
``mprl.lib.offpolicy``); this module only puts them together.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import attrs
import gymnasium as gym
import numpy as np
import torch
from attrs import validators as v
from torch import nn
from torch.nn import functional as F

import mprl
from mprl import schema
from mprl.errors import UsageError
from mprl.lib.continuous import (
    DeterministicActor,
    GaussianNoise,
    OrnsteinUhlenbeckNoise,
    TargetNetwork,
    TwinQ,
    box_bounds,
    scale_action,
    uniform_actions,
)
from mprl.lib.offpolicy import ReplayCollector
from mprl.lib.optim import Adam

__version__ = "0.1.0"

LOG_EVERY_UPDATES = 250  # the learner's report, by updates (a serial run repeats)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


# -- 1. the config: every hyperparameter, with its default and its --help line ------------------


@attrs.frozen
class TD3Config:
    """TD3's hyperparameters (``--set NAME=VALUE``); the defaults learn Pendulum-v1."""

    lr: float = attrs.field(default=1e-3, validator=v.gt(0.0), metadata=_help("Adam step size"))
    buffer_size: int = attrs.field(
        default=200_000, validator=v.ge(1), metadata=_help("replay capacity in transitions")
    )
    learning_starts: int = attrs.field(
        default=1000,
        validator=v.ge(0),
        metadata=_help("env steps of uniformly random actions before learning starts"),
    )
    batch_size: int = attrs.field(
        default=256, validator=v.ge(1), metadata=_help("transitions per update")
    )
    gamma: float = attrs.field(
        default=0.98, validator=[v.ge(0.0), v.le(1.0)], metadata=_help("discount factor")
    )
    tau: float = attrs.field(
        default=0.005,
        validator=[v.gt(0.0), v.le(1.0)],
        metadata=_help("target networks move this fraction towards the learnt ones"),
    )
    policy_delay: int = attrs.field(
        default=2,
        validator=v.ge(1),
        metadata=_help("critic updates per actor (and target) update"),
    )
    target_noise: float = attrs.field(
        default=0.2,
        validator=v.ge(0.0),
        metadata=_help("std of the noise on the target actor's actions (target smoothing)"),
    )
    target_noise_clip: float = attrs.field(
        default=0.5, validator=v.ge(0.0), metadata=_help("that noise is clipped to +- this")
    )
    noise: Literal["gaussian", "ou"] = attrs.field(
        default="gaussian",
        validator=v.in_(("gaussian", "ou")),
        metadata=_help("exploration noise: gaussian (TD3's) or ou (Ornstein-Uhlenbeck, DDPG's)"),
    )
    noise_sigma: float = attrs.field(
        default=0.1,
        validator=v.ge(0.0),
        metadata=_help("exploration noise scale, in the actor's [-1, 1] units"),
    )
    steps_per_update: int = attrs.field(
        default=1, validator=v.ge(1), metadata=_help("env steps per round of gradient_steps")
    )
    gradient_steps: int = attrs.field(
        default=1,
        validator=v.ge(1),
        metadata=_help("updates per steps_per_update env steps: the replay ratio"),
    )
    max_lead: int = attrs.field(
        default=200,
        validator=v.ge(1),
        metadata=_help("env steps the workers may run ahead of the learner before they wait"),
    )
    envs_per_worker: int = attrs.field(
        default=1, validator=v.ge(1), metadata=_help("environments each worker steps together")
    )
    hidden: tuple[int, ...] = attrs.field(
        default=(256, 256),
        converter=tuple,
        validator=[v.min_len(1), v.deep_iterable(v.and_(v.instance_of(int), v.gt(0)))],
        metadata=_help("hidden layer sizes of the actor and of each critic"),
    )


# -- 2. the shared state: a replay buffer at a declared ratio, weights, the target networks -----


def replay_ratio(dims: schema.Dims) -> float:
    """Transitions sampled per transition collected: ``gradient_steps`` batches every
    ``steps_per_update`` env steps (SB3's ``train_freq`` / ``gradient_steps``)."""
    c: TD3Config = dims.config
    return c.gradient_steps * c.batch_size / c.steps_per_update


SCHEMA = schema.Schema(
    # rows shaped by the spaces (obs, action, reward, next_obs, done); the backend keeps the
    # ratio: the learner's sample() waits for rows, a worker's add() waits when it is ahead
    replay=schema.ReplayBuffer(
        capacity="config.buffer_size",
        replay_ratio=replay_ratio,
        learning_starts="config.learning_starts",
        max_lead="config.max_lead",
    ),
    weights=schema.Weights(),  # the learner's model, published to the workers
    target=schema.Module(),  # a copy of the model: the target actor and critics, checkpointed
    updates=schema.Counter(),  # critic updates: the policy delay's phase, across a resume
)


# -- 3. the model: a tanh actor, twin critics, the action bounds --------------------------------


class TD3Model(nn.Module):
    """The actor and the twin critics; both work in ``[-1, 1]`` action units, which
    :meth:`to_env` scales to the action space's bounds. ``act`` plays it (``mprl eval``)."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, config: TD3Config) -> None:
        super().__init__()
        n_obs = int(np.prod(obs_space.shape))
        self.action_space = act_space
        n_act = int(np.prod(act_space.shape))
        self.actor = DeterministicActor(n_obs, n_act, config.hidden)
        self.critic = TwinQ(n_obs, n_act, config.hidden)
        low, high = box_bounds(act_space)  # a ValueError for infinite bounds
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.noise_sigma = config.noise_sigma

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions in ``[-1, 1]``, shaped as the action space: ``[B, *action_shape]``."""
        return self.actor(obs.float()).reshape(-1, *self.action_space.shape)

    def to_env(self, actions: torch.Tensor) -> np.ndarray:
        """Actions in ``[-1, 1]`` as the env takes them."""
        return scale_action(actions, self.low, self.high).cpu().numpy()

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """The actor's actions for a batch of observations, with Gaussian exploration noise
        unless ``deterministic``."""
        with torch.no_grad():
            actions = self.policy(obs)
            if not deterministic:
                actions = (actions + self.noise_sigma * torch.randn_like(actions)).clamp(-1, 1)
        return self.to_env(actions)

    def export_policy(self) -> nn.Module:
        """``act(obs, deterministic=True)`` as a module of tensor operations only, for
        ``mprl export``: the actor and the bounds, no critic. It shares the actor's weights."""
        return _GreedyActor(self)


class _GreedyActor(nn.Module):
    """Observations ``[B, *obs_shape]`` -> the actor's actions scaled to the bounds."""

    def __init__(self, model: TD3Model) -> None:
        super().__init__()
        self.actor, self.act_shape = model.actor, tuple(model.action_space.shape)
        self.register_buffer("low", model.low.detach().clone())
        self.register_buffer("high", model.high.detach().clone())
        self.state_shapes: dict[str, tuple[int, ...]] = {}  # feed-forward: no state

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        actions = self.actor(obs.float()).reshape(-1, *self.act_shape)
        return scale_action(actions, self.low, self.high)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: TD3Config) -> nn.Module:
    if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        raise UsageError(  # one line, exit 2, before anything starts
            f"td3 scales its actions onto the action space's bounds, which must be finite; these "
            f"are {act_space.low} .. {act_space.high} (rescale them with a wrapper)"
        )
    return TD3Model(obs_space, act_space, config)


def actor_optimizer(model: TD3Model, config: TD3Config) -> torch.optim.Optimizer:
    return Adam(model.actor.parameters(), lr=config.lr)


def critic_optimizer(model: TD3Model, config: TD3Config) -> torch.optim.Optimizer:
    return Adam(model.critic.parameters(), lr=config.lr)


# -- 4. the worker: act with the newest actor plus noise, every transition into the replay ------


def make_noise(config: TD3Config, n: int, shape: tuple[int, ...], generator: torch.Generator):
    """The exploration noise of ``n`` envs: Gaussian (TD3's) or Ornstein-Uhlenbeck."""
    if config.noise == "ou":
        return OrnsteinUhlenbeckNoise(n, shape, config.noise_sigma, generator=generator)
    return GaussianNoise(n, shape, config.noise_sigma, generator=generator)


def worker(ctx: mprl.Context) -> None:
    """Uniformly random actions for the first ``learning_starts`` env steps of the run, then
    the actor's plus noise; the replay stores them in ``[-1, 1]``, the envs get them scaled."""
    cfg: TD3Config = ctx.config
    weights = ctx.state.weights
    local: TD3Model = copy.deepcopy(ctx.model)  # type: ignore[assignment]
    version = -1
    generator = torch.Generator().manual_seed(ctx.seed)  # a seeded run repeats
    collector = ReplayCollector(ctx, ctx.state.replay, cfg.envs_per_worker, cfg.gamma)
    space = local.action_space
    noise = make_noise(cfg, cfg.envs_per_worker, space.shape, generator)
    try:
        while not ctx.should_stop():
            version = weights.pull(local, version)  # the newest actor, if there is a newer one
            if ctx.env_steps < cfg.learning_starts:
                actions = uniform_actions(space, collector.n, generator, normalized=True)
            else:
                with torch.no_grad():
                    actions = (local.policy(collector.obs) + noise.sample()).clamp(-1.0, 1.0)
            collector.step(actions, local.to_env(actions))  # add()s the rows, counts the steps
            noise.reset(collector.ended)  # each episode's noise starts afresh
    finally:
        collector.close()


# -- 5. the learner: TD3's update, at the declared replay ratio ---------------------------------


def train(ctx: mprl.Context) -> None:
    """Sample the replay buffer (``sample`` waits for the workers at the declared ratio and
    returns ``None`` once the run stops) and update the critics, every ``policy_delay``-th
    time the actor and the targets. ``should_stop`` is asked at every update too: a learner
    with rows to spare (ahead of the ratio) stops at once."""
    cfg: TD3Config = ctx.config
    replay, weights, updates = ctx.state.replay, ctx.state.weights, ctx.state.updates
    model: TD3Model = ctx.model  # type: ignore[assignment]  # (--device cuda: a copy there)
    # the target networks on this process's device (with --device cuda a copy there, loaded
    # into the shared field every LOG_EVERY_UPDATES updates, for checkpoints, and at the end)
    target = TargetNetwork(ctx.state.target, ctx.device, sync_every=LOG_EVERY_UPDATES)
    sampling = torch.Generator().manual_seed(ctx.seed)  # which rows
    smoothing = torch.Generator(device=ctx.device).manual_seed(ctx.seed + 1)  # target noise
    done = updates.value  # a resumed run goes on where it was in the policy delay
    report: dict[str, torch.Tensor] = {}
    while not ctx.should_stop():
        batch = replay.sample(cfg.batch_size, sampling)
        if batch is None:  # the run stops
            break
        actor_turn = (done + 1) % cfg.policy_delay == 0
        numbers = update(cfg, model, target, ctx.optimizers, ctx.to_device(batch), smoothing,
                         weights, actor_turn)  # fmt: skip
        report.update(numbers)  # (the actor's loss: of its last update)
        updates.add(1)
        done += 1
        if done % LOG_EVERY_UPDATES == 0:
            ctx.log(**{k: float(t) for k, t in report.items()}, updates=done)
    target.sync()  # the last checkpoint holds the newest target
    if report and done % LOG_EVERY_UPDATES:
        ctx.log(**{k: float(t) for k, t in report.items()}, updates=done)


def update(
    cfg: TD3Config,
    model: TD3Model,
    target: TargetNetwork,
    optimizers: dict[str, torch.optim.Optimizer],
    batch: dict[str, torch.Tensor],
    generator: torch.Generator,
    weights: Any,
    actor_turn: bool,
) -> dict[str, torch.Tensor]:
    """One TD3 update of the critics and, on ``actor_turn``, of the actor (published to the
    workers) and the target networks; its numbers, as tensors (read when logged)."""
    obs, next_obs = batch["obs"].flatten(1).float(), batch["next_obs"].flatten(1).float()
    actions = batch["action"].flatten(1)
    with torch.no_grad():  # the target: smoothed target actions, the smaller target value
        noise = torch.randn(actions.shape, generator=generator, device=actions.device)
        noise = (noise * cfg.target_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
        next_actions = (target.module.actor(next_obs) + noise).clamp(-1.0, 1.0)
        next_q = target.module.critic.min(next_obs, next_actions)
        wanted = batch["reward"] + cfg.gamma * (1.0 - batch["done"]) * next_q
    q1, q2 = model.critic(obs, actions)
    critic_loss = F.mse_loss(q1, wanted) + F.mse_loss(q2, wanted)
    optimizers["critic"].zero_grad()
    critic_loss.backward()
    optimizers["critic"].step()
    report = {"critic_loss": critic_loss.detach(), "q": q1.detach().mean()}
    if actor_turn:
        critic = list(model.critic.parameters())
        for p in critic:  # the actor's loss needs no gradients of the critics' weights
            p.requires_grad_(False)
        actor_loss = -model.critic.first(obs, model.actor(obs)).mean()
        optimizers["actor"].zero_grad()
        actor_loss.backward()
        for p in critic:
            p.requires_grad_(True)
        with weights.publishing(model):  # the actor the workers act with: one new version
            optimizers["actor"].step()
        target.polyak(model, cfg.tau)  # actor and critics, where the target lives
        report["actor_loss"] = actor_loss.detach()
    return report


# -- 6. registration ------------------------------------------------------------------------------

ALGORITHM = mprl.Algorithm(
    name="td3",
    config_cls=TD3Config,
    make_model=make_model,
    optimizers={"actor": actor_optimizer, "critic": critic_optimizer},
    schema=SCHEMA,
    worker=worker,
    train=train,
    action_spaces=(gym.spaces.Box,),  # continuous actions only: a Discrete env is refused
    observation_spaces=(gym.spaces.Box,),  # flat vectors: the networks are MLPs
    default_env="Pendulum-v1",
    description="TD3: workers fill a replay buffer, one learner with twin critics (Box actions)",
)


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(ALGORITHM)
