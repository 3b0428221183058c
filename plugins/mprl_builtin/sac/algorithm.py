"""SAC: workers act with the newest published policy and fill a replay buffer; one train process
samples it and runs Soft Actor-Critic (Haarnoja et al. 2018: twin Q networks with target copies,
a tanh-squashed Gaussian policy, the entropy coefficient tuned to a target entropy).

The parts are :mod:`mprl.lib.continuous`'s: the twin critics (:class:`TwinQ`), their target
copies (:class:`TargetNetwork`: updated on the learner's device), actions scaled from [-1, 1]
onto the bounds (:func:`scale_action`), the warm-up's uniform actions (:func:`uniform_actions`).

The replay ratio is declared (the buffer's ``replay_ratio``, as the built-in dqn's): the learner
makes ``gradient_steps`` updates per ``steps_per_update`` env steps collected after
``learning_starts`` (SB3's ``train_freq`` / ``gradient_steps``), so its ``sample`` waits for
data when it is level with the workers, and a worker's ``add`` waits when the workers are
``max_lead`` env steps ahead. The backend keeps it, on every backend. On the serial backend that
is SB3's loop; on the others the workers keep ``max_lead`` steps of work ready for a learner that
is slower than they are.
"""

from __future__ import annotations

import copy
import math
import time
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
from mprl.lib.continuous import TargetNetwork, TwinQ, plain_mlp, scale_action, uniform_actions
from mprl.lib.nets import Adam, field_help

LOG_EVERY_UPDATES = 250  # the learner's report: by updates, not seconds (a serial run repeats)
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SB3's clamp of the policy's log standard deviation


def _ent_coef(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"'{attribute.name}' must be 'auto' or a number >= 0, got {value!r}")


@attrs.frozen
class SACConfig:
    """SAC hyperparameters; the defaults are Stable-Baselines3's (but the replay capacity)."""

    lr: float = attrs.field(
        default=3e-4, validator=v.gt(0.0), metadata=field_help("Adam learning rate of all three")
    )
    buffer_size: int = attrs.field(
        default=300_000,
        validator=v.ge(1),
        metadata=field_help(
            "replay capacity in transitions (SB3: 1e6); allocated whole in shared memory and "
            "saved in every checkpoint, so a run shorter than this behaves as with SB3's"
        ),
    )
    learning_starts: int = attrs.field(
        default=1000,
        validator=v.ge(0),
        metadata=field_help("env steps of uniformly random actions before learning starts"),
    )
    batch_size: int = attrs.field(
        default=256, validator=v.ge(1), metadata=field_help("transitions per update")
    )
    tau: float = attrs.field(
        default=0.005,
        validator=[v.gt(0.0), v.le(1.0)],
        metadata=field_help("target networks move this fraction towards the critics per update"),
    )
    gamma: float = attrs.field(
        default=0.99, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    steps_per_update: int = attrs.field(
        default=1,
        validator=v.ge(1),
        metadata=field_help("env steps per round of gradient_steps updates (SB3's train_freq)"),
    )
    gradient_steps: int = attrs.field(
        default=1,
        validator=v.ge(1),
        metadata=field_help("updates per steps_per_update env steps (the replay ratio)"),
    )
    max_lead: int = attrs.field(
        default=200,
        validator=v.ge(1),
        metadata=field_help(
            "env steps the workers may collect beyond the learner's pace before they wait for it"
        ),
    )
    ent_coef: Literal["auto"] | float = attrs.field(
        default="auto",
        validator=_ent_coef,
        metadata=field_help("entropy coefficient alpha: 'auto' (tuned) or a fixed number"),
    )
    init_ent_coef: float = attrs.field(
        default=1.0, validator=v.gt(0.0), metadata=field_help("alpha to start from when 'auto'")
    )
    target_entropy: float | None = attrs.field(
        default=None,
        metadata=field_help("the entropy 'auto' tunes alpha towards (default: -dim(actions))"),
    )
    hidden: tuple[int, ...] = attrs.field(
        default=(256, 256),
        converter=tuple,
        validator=[v.min_len(1), v.deep_iterable(v.and_(v.instance_of(int), v.gt(0)))],
        metadata=field_help("hidden layer sizes of the policy and of each Q network"),
    )


#: config values by workload (``Algorithm.presets``), under the user's own: rl-zoo's SAC on
#: MuJoCo (HalfCheetah, Hopper, Walker2d, Ant, Humanoid) is SB3's defaults but these
PRESETS = {"mujoco": {"learning_starts": 10_000}}


def replay_ratio(dims: schema.Dims) -> float:
    """Transitions sampled per transition collected: ``gradient_steps * batch_size /
    steps_per_update`` (SB3's ``train_freq``)."""
    c: SACConfig = dims.config
    return c.gradient_steps * c.batch_size / c.steps_per_update


SCHEMA = schema.Schema(
    replay=schema.ReplayBuffer(
        capacity="config.buffer_size",  # rows shaped by the spaces
        replay_ratio=replay_ratio,
        learning_starts="config.learning_starts",
        max_lead="config.max_lead",
    ),
    weights=schema.Weights(),  # the learner's model, published to the workers
    target=schema.Module(),  # a copy of the model: its critic is the target critic
    updates=schema.Counter(),  # the learner's updates
)


class Actor(nn.Module):
    """A tanh-squashed diagonal Gaussian policy; actions in [-1, 1] (scaled by the model)."""

    def __init__(self, n_obs: int, n_act: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.body = plain_mlp(n_obs, hidden[:-1], hidden[-1])
        self.mu = nn.Linear(hidden[-1], n_act)
        self.log_std = nn.Linear(hidden[-1], n_act)

    def forward(
        self,
        obs: torch.Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Squashed actions ``[B, n_act]`` (reparameterised: gradients flow through them) and
        their log-probabilities ``[B]``."""
        latent = F.relu(self.body(obs))
        mu = self.mu(latent)
        log_std = self.log_std(latent).clamp(LOG_STD_MIN, LOG_STD_MAX)
        if deterministic:
            noise = torch.zeros_like(mu)
        else:
            noise = torch.randn(mu.shape, generator=generator, dtype=mu.dtype, device=mu.device)
        u = mu + log_std.exp() * noise
        gauss = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        # log |d tanh(u) / du| = log(1 - tanh(u)^2), in a form that is stable for large |u|
        squash = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
        return torch.tanh(u), (gauss - squash).sum(-1)


class SACModel(nn.Module):
    """The policy, the twin critics and log(alpha); ``act`` plays it (``mprl eval``)."""

    def __init__(
        self, obs_space: gym.spaces.Box, act_space: gym.spaces.Box, config: SACConfig
    ) -> None:
        super().__init__()
        n_obs = int(np.prod(obs_space.shape))
        self.act_shape = tuple(act_space.shape)
        n_act = int(np.prod(self.act_shape))
        self.actor = Actor(n_obs, n_act, config.hidden)
        self.critic = TwinQ(n_obs, n_act, config.hidden)  # over (observation, squashed action)
        self.log_alpha = nn.Parameter(torch.full((1,), math.log(config.init_ent_coef)))
        low = torch.as_tensor(act_space.low, dtype=torch.float32).flatten()
        high = torch.as_tensor(act_space.high, dtype=torch.float32).flatten()
        self.register_buffer("low", low)
        self.register_buffer("high", high)

    @staticmethod
    def flat(obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1).float()

    def to_env(self, squashed: torch.Tensor) -> np.ndarray:
        """Squashed actions ``[B, n_act]`` as the env takes them: ``[B, *action_shape]``."""
        actions = scale_action(squashed, self.low, self.high)  # clamped: rounding at the bounds
        return actions.reshape(-1, *self.act_shape).numpy()

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations: sampled, or tanh(mean) when ``deterministic``."""
        with torch.no_grad():
            squashed, _ = self.actor(self.flat(obs), deterministic)
        return self.to_env(squashed)

    def export_policy(self) -> nn.Module:
        """``act(obs, deterministic=True)`` (tanh of the mean, scaled to the bounds) as a
        module of tensor operations only, for ``mprl export``: no critic in it. It shares
        this model's parameters."""
        return _GreedyActor(self)


class _GreedyActor(nn.Module):
    """Observations ``[B, *obs_shape]`` -> the actions ``[B, *action_shape]`` of a tanh-squashed
    Gaussian's mean, as :meth:`SACModel.to_env` scales them."""

    def __init__(self, model: SACModel) -> None:
        super().__init__()
        self.body, self.mu = model.actor.body, model.actor.mu
        self.register_buffer("low", model.low.detach().clone())
        self.register_buffer("high", model.high.detach().clone())
        self.act_shape = model.act_shape
        self.state_shapes: dict[str, tuple[int, ...]] = {}

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        squashed = torch.tanh(self.mu(F.relu(self.body(SACModel.flat(obs)))))
        return scale_action(squashed, self.low, self.high).reshape(-1, *self.act_shape)


def make_model(obs_space: gym.Space, act_space: gym.Space, config: SACConfig) -> nn.Module:
    if not isinstance(act_space, gym.spaces.Box):  # the algorithm's action_spaces refuse it first
        raise UsageError(f"sac needs continuous (Box) actions, not {type(act_space).__name__}")
    if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        raise UsageError(
            "sac squashes its actions into the action space's bounds, which must be finite; "
            f"these are {act_space.low} .. {act_space.high} (rescale them with a wrapper)"
        )
    return SACModel(obs_space, act_space, config)


def _adam(params: Any, config: SACConfig) -> torch.optim.Optimizer:
    params = list(params)
    try:
        return Adam(params, lr=config.lr, fused=True)
    except RuntimeError:  # torch < 2.4: no fused Adam on CPU
        return Adam(params, lr=config.lr)


def actor_optimizer(model: SACModel, config: SACConfig) -> torch.optim.Optimizer:
    return _adam(model.actor.parameters(), config)


def critic_optimizer(model: SACModel, config: SACConfig) -> torch.optim.Optimizer:
    return _adam(model.critic.parameters(), config)


def alpha_optimizer(model: SACModel, config: SACConfig) -> torch.optim.Optimizer:
    return _adam([model.log_alpha], config)


def worker(ctx: mprl.Context) -> None:
    """Step one env with the newest published policy (uniformly random actions for the first
    ``learning_starts`` env steps of the run); every transition goes to the replay buffer
    (whose ``add`` waits while the workers are ``max_lead`` env steps ahead of the learner)."""
    cfg: SACConfig = ctx.config
    replay, weights = ctx.state.replay, ctx.state.weights
    local: SACModel = copy.deepcopy(ctx.model)  # type: ignore[assignment]
    version = -1
    generator = torch.Generator().manual_seed(ctx.seed)
    env = ctx.make_env()
    n_act = int(np.prod(env.action_space.shape))
    obs, _ = env.reset()
    episode_return, length = 0.0, 0
    try:
        while not ctx.should_stop():
            version = weights.pull(local, version)
            obs_t = SACModel.flat(torch.as_tensor(obs)[None])
            if ctx.env_steps < cfg.learning_starts:  # in [-1, 1], as the policy's
                squashed = uniform_actions(env.action_space, 1, generator, normalized=True)
                squashed = squashed.reshape(1, n_act)
            else:
                with torch.no_grad():
                    squashed, _ = local.actor(obs_t, generator=generator)
            action = local.to_env(squashed)[0]
            nxt, reward, terminated, truncated, _ = env.step(action)
            replay.add(
                obs=torch.as_tensor(obs)[None],
                action=squashed.reshape(1, *env.action_space.shape),  # in [-1, 1]
                reward=torch.tensor([float(reward)]),
                next_obs=torch.as_tensor(nxt)[None],
                done=torch.tensor([float(terminated)]),  # a truncated episode bootstraps
            )
            ctx.add_steps(1)
            episode_return, length, obs = episode_return + float(reward), length + 1, nxt
            if terminated or truncated:
                ctx.log_episode(episode_return, length)
                (obs, _), episode_return, length = env.reset(), 0.0, 0
    finally:
        env.close()


def train(ctx: mprl.Context) -> None:
    """Sample the replay buffer at the declared replay ratio (``sample`` waits for the workers,
    and returns ``None`` once the run stops) and update critics, policy and alpha."""
    cfg: SACConfig = ctx.config
    replay, weights, updates = ctx.state.replay, ctx.state.weights, ctx.state.updates
    model: SACModel = ctx.model  # type: ignore[assignment]  # (--device: a copy there)
    optimizers = ctx.optimizers
    # the target critics, updated on this process's device: on a GPU a copy there, loaded into
    # the shared state's (which checkpoints keep) every LOG_EVERY_UPDATES updates and at the end
    target = TargetNetwork(ctx.state.target.critic, ctx.device, sync_every=LOG_EVERY_UPDATES)
    sampling = torch.Generator().manual_seed(ctx.seed)  # which rows (on the CPU)
    noise = torch.Generator(device=ctx.device).manual_seed(ctx.seed + 1)  # the policy's samples
    n_act = int(np.prod(model.act_shape))
    target_entropy = -float(n_act) if cfg.target_entropy is None else cfg.target_entropy
    critic_params = list(model.critic.parameters())
    report: dict[str, torch.Tensor] = {}
    last_log, updates_at_log = time.monotonic(), updates.value
    while not ctx.should_stop():  # (and at once when the learner has rows to spare)
        batch = replay.sample(cfg.batch_size, sampling)  # waits while level with the workers
        if batch is None:  # the run stops
            break
        report = _update(cfg, model, optimizers, target, critic_params,
                         ctx.to_device(batch), target_entropy, noise, weights, updates)  # fmt: skip
        if updates.value % LOG_EVERY_UPDATES == 0:
            last_log, updates_at_log = _log(ctx, report, updates.value, last_log, updates_at_log)
    target.sync()  # the newest target critics in the shared state, for the last checkpoint
    if report and updates.value > updates_at_log:  # the last stretch, so short runs report too
        _log(ctx, report, updates.value, last_log, updates_at_log)


def _log(
    ctx: mprl.Context, report: dict[str, torch.Tensor], done: int, since: float, done_then: int
) -> tuple[float, int]:
    now = time.monotonic()
    rate = (done - done_then) / max(now - since, 1e-9)
    numbers = {name: float(value) for name, value in report.items()}  # (a GPU waits here only)
    ctx.log(**numbers, updates=done, updates_per_s=rate)
    return now, done


def _update(
    cfg: SACConfig,
    model: SACModel,
    optimizers: dict[str, torch.optim.Optimizer],
    target: TargetNetwork,
    critic_params: list[torch.Tensor],
    batch: dict[str, torch.Tensor],
    target_entropy: float,
    generator: torch.Generator,
    weights: Any,
    updates: Any,
) -> dict[str, torch.Tensor]:
    """One SAC update (in SB3's order: alpha, critics, policy, targets); its numbers."""
    obs, next_obs = model.flat(batch["obs"]), model.flat(batch["next_obs"])
    actions = batch["action"].reshape(obs.shape[0], -1)
    rewards, dones = batch["reward"], batch["done"]

    squashed, logp = model.actor(obs, generator=generator)
    if cfg.ent_coef == "auto":
        alpha = model.log_alpha.detach().exp()
        alpha_loss = -(model.log_alpha * (logp.detach() + target_entropy)).mean()
        optimizers["alpha"].zero_grad()
        alpha_loss.backward()
        optimizers["alpha"].step()
    else:
        alpha = torch.tensor(float(cfg.ent_coef), device=obs.device)
        alpha_loss = torch.zeros((), device=obs.device)

    with torch.no_grad():
        next_squashed, next_logp = model.actor(next_obs, generator=generator)
        next_q = target.module.min(next_obs, next_squashed)
        wanted = rewards + cfg.gamma * (1.0 - dones) * (next_q - alpha * next_logp)
    q1, q2 = model.critic(obs, actions)
    critic_loss = 0.5 * (F.mse_loss(q1, wanted) + F.mse_loss(q2, wanted))
    optimizers["critic"].zero_grad()
    critic_loss.backward()
    optimizers["critic"].step()

    for p in critic_params:  # the policy's loss needs no gradients of the critics' weights
        p.requires_grad_(False)
    q_pi = model.critic.min(obs, squashed)
    actor_loss = (alpha * logp - q_pi).mean()
    optimizers["actor"].zero_grad()
    actor_loss.backward()
    for p in critic_params:
        p.requires_grad_(True)
    with weights.publishing(model):  # the policy the workers act with: one new version
        optimizers["actor"].step()
        updates.add(1)  # counted before the version shows: a worker woken by it sees it

    target.polyak(model.critic, cfg.tau)  # in place, where the target lives
    return {  # tensors: read when logged, so a GPU is not waited for after every update
        "critic_loss": critic_loss.detach(),
        "actor_loss": actor_loss.detach(),
        "alpha": alpha,
        "alpha_loss": alpha_loss.detach(),
        "entropy": -logp.detach().mean(),
        "q": q1.detach().mean(),
    }
