"""PPO: workers collect synchronously into rollout slots, one train process runs clipped PPO
with GAE (Schulman et al. 2017) and publishes the new weights to all of them."""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import attrs
import torch
from attrs import validators as v
from torch import nn

import mprl
from mprl import schema
from mprl.lib.envbatch import EnvBatch, rollout_spec
from mprl.lib.nets import MIN_LR_FRACTION, ActorCritic, ActorCriticConfig, annealed_lr, field_help
from mprl.lib.recurrent import core_field, core_size_field, is_recurrent
from mprl.lib.sequences import chunk
from mprl.transport import RolloutSlots, WeightBroadcast

LOG_EVERY_S = 2.0  # how often the learner reports losses and rates


@attrs.frozen
class PPOConfig(ActorCriticConfig):
    """PPO hyperparameters; the defaults solve CartPole-v1 fast on two cores."""

    envs_per_worker: int = attrs.field(
        default=8, validator=v.ge(1), metadata=field_help("environments each worker steps together")
    )
    n_steps: int = attrs.field(
        default=32, validator=v.ge(1), metadata=field_help("steps per environment per iteration")
    )
    gamma: float = attrs.field(
        default=0.98, validator=[v.gt(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    gae_lambda: float = attrs.field(
        default=0.8, validator=[v.ge(0.0), v.le(1.0)], metadata=field_help("GAE lambda")
    )
    epochs: int = attrs.field(
        default=10, validator=v.ge(1), metadata=field_help("passes over each iteration's data")
    )
    minibatch_size: int = attrs.field(
        default=256, validator=v.ge(1), metadata=field_help("samples per gradient step")
    )
    clip: float = attrs.field(
        default=0.2, validator=v.gt(0.0), metadata=field_help("policy ratio clip range")
    )
    value_clip: float = attrs.field(
        default=0.0, validator=v.ge(0.0), metadata=field_help("value change clip range; 0: off")
    )
    entropy_coef: float = attrs.field(
        default=0.0, validator=v.ge(0.0), metadata=field_help("weight of the entropy bonus")
    )
    anneal_steps: int = attrs.field(
        default=150_000,
        validator=v.ge(0),
        metadata=field_help(
            f"env steps over which lr falls linearly to {MIN_LR_FRACTION:g} of itself; 0: constant"
        ),
    )
    reward_scale: float = attrs.field(
        default=1.0,
        validator=v.gt(0.0),
        metadata=field_help("rewards are multiplied by this to learn"),
    )
    # a recurrent core: each minibatch is chunks of data_chunk_length steps of the envs'
    # sequences (minibatch_size // data_chunk_length chunks), each replayed from the state at
    # its start
    core: str = core_field()
    core_size: int = core_size_field()
    data_chunk_length: int = attrs.field(
        default=8,
        validator=v.ge(0),
        metadata=field_help(
            "recurrent core: steps of each training sequence (chunks of the rollouts, each "
            "replayed from the hidden state at its start); 0: whole rollouts"
        ),
    )


#: config by workload (``Algorithm.presets``), under the user's own values
PRESETS = {
    # cleanrl's ppo_atari (Huang et al. 2022, "The 37 implementation details of PPO")
    "atari": {
        "lr": 2.5e-4, "envs_per_worker": 8, "n_steps": 128, "gamma": 0.99, "gae_lambda": 0.95,
        "epochs": 4, "minibatch_size": 256, "clip": 0.1, "value_clip": 0.1,
        "entropy_coef": 0.01, "value_coef": 0.5, "max_grad_norm": 0.5,
        "anneal_steps": 10_000_000,
    },
    # cleanrl's ppo_continuous_action (2 workers: its 2048-step batch; observations and rewards
    # normalised), starting from rl-zoo's log std of -2
    # why: see benchmarks/README.md, "ppo's MuJoCo preset: log std from -2"
    "mujoco": {
        "lr": 3e-4, "envs_per_worker": 1, "n_steps": 1024, "gamma": 0.99, "gae_lambda": 0.95,
        "epochs": 10, "minibatch_size": 64, "clip": 0.2, "entropy_coef": 0.0,
        "value_coef": 0.5, "max_grad_norm": 0.5, "anneal_steps": 1_000_000,
        "normalize_obs": True, "normalize_reward": True, "log_std_init": -2.0,
    },
}  # fmt: skip


def _rollout(dims: schema.Dims) -> dict[str, Any]:
    """One iteration's rollout of a worker: ``n_steps`` steps of ``envs_per_worker`` envs."""
    cfg: PPOConfig = dims.config
    return rollout_spec(
        dims.observation_space, dims.action_space, cfg.n_steps, cfg.envs_per_worker, cfg
    )


SCHEMA = schema.Schema(
    rollouts=schema.Rollouts(_rollout, slots_per_worker=1),  # one rollout per policy version
    weights=schema.Weights(),
)


def worker(ctx: mprl.Context) -> None:
    """Each iteration: wait for the learner's newest weights, fill this worker's slot with
    ``n_steps`` steps of ``envs_per_worker`` environments, hand it over."""
    cfg: PPOConfig = ctx.config
    rollouts: RolloutSlots = ctx.state.rollouts
    weights: WeightBroadcast = ctx.state.weights
    local: ActorCritic = copy.deepcopy(ctx.model)  # type: ignore[assignment]
    envs = EnvBatch(ctx, cfg.envs_per_worker, cfg.gamma, normalize_reward=cfg.normalize_reward)
    while (index := rollouts.acquire()) is not None:
        slot = rollouts.slot(index)
        # the barrier: a rollout per policy version, so wait for an update newer than the one
        # this slot last carried (the slot's version survives a restart of this worker)
        if weights.wait(int(slot["version"])) is None:
            break
        version = weights.pull(local)
        envs.rollout(local, slot)
        slot["version"].fill_(version)
        rollouts.commit(index)
    envs.close()


def gae(
    rewards: torch.Tensor, dones: torch.Tensor, values: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Generalised advantage estimates over a ``[T, N]`` rollout; ``values`` is ``[T + 1, N]``
    (the last row: the value after the last step). ``dones[t]`` ends an episode after step t."""
    advantages = torch.empty_like(rewards)
    acc = torch.zeros_like(values[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * values[t + 1] * live - values[t]
        acc = delta + gamma * lam * live * acc
        advantages[t] = acc
    return advantages


def train(ctx: mprl.Context) -> None:
    """Each iteration: take every worker's rollout, run ``epochs`` of clipped-PPO minibatch
    updates on them, publish the new weights (which releases the workers)."""
    cfg: PPOConfig = ctx.config
    rollouts: RolloutSlots = ctx.state.rollouts
    weights: WeightBroadcast = ctx.state.weights
    model: ActorCritic = ctx.model  # type: ignore[assignment]
    optimizer = ctx.optimizer
    assert optimizer is not None
    generator = torch.Generator().manual_seed(ctx.seed)
    cnn = getattr(model, "torso", None) is not None
    if not ctx.run.torch_threads and ctx.device.type == "cpu" and cnn:
        # synchronous: the workers wait while the learner updates (and it waits while they
        # collect), so a CNN's update may use every core; an MLP's minibatches are too small
        # to gain. why: see benchmarks/README.md, "PPO learner threads"
        torch.set_num_threads(os.cpu_count() or 1)
    last_log, updates_at_log = time.monotonic(), weights.version
    report: dict[str, float] = {}
    while (batch := rollouts.take_batch(ctx.n_workers)) is not None:
        batch = ctx.to_device(batch)  # --device: one copy to the GPU; on the CPU, as it is
        data = _data(cfg, model, batch)
        lr = annealed_lr(cfg, ctx.env_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with weights.publishing(model):
            stats = _update(ctx, cfg, model, optimizer, data, generator)
            model.observe(data[0])  # normalisation statistics, with normalize_obs
        report = stats or report  # none when the run stopped before its first minibatch
        report["lr"] = lr
        if time.monotonic() - last_log >= LOG_EVERY_S:
            last_log, updates_at_log = _log(ctx, report, weights.version, last_log, updates_at_log)
    if weights.version > updates_at_log:  # the last stretch, so short runs report too
        _log(ctx, report, weights.version, last_log, updates_at_log)


def _data(
    cfg: PPOConfig, model: ActorCritic, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """What the updates learn from: observations, actions, old log-probabilities, advantages,
    returns and old values, one row per sample; with a recurrent model, ``[L, C]`` sequences
    instead (the rollouts cut into chunks of ``data_chunk_length`` steps, :func:`_replay`),
    the dones, the start states ``[k, C, size]`` and the padding mask too."""
    obs = batch["obs"].flatten(1, 2)  # [T + 1, N, ...]
    dones = batch["done"].flatten(1, 2)
    t_len, n = dones.shape
    length = (cfg.data_chunk_length or t_len) if "state" in batch else t_len
    with torch.no_grad():
        if "state" in batch:
            values, starts = _replay(model, obs, batch["state"].flatten(1, 2), dones, length)
        else:
            values = model.value(obs.flatten(0, 1)).view(t_len + 1, n)
    rewards = batch["reward"].flatten(1, 2) * cfg.reward_scale
    advantages = gae(rewards, dones, values, cfg.gamma, cfg.gae_lambda)
    returns = advantages + values[:-1]
    actions, logp = batch["action"].flatten(1, 2), batch["logp"].flatten(1, 2)
    if "state" in batch:
        rows = (obs[:-1], actions, logp, advantages, returns, values[:-1], dones)
        valid = chunk(torch.ones_like(dones), length)  # 0: the padding of a last chunk
        return (*(chunk(r, length) for r in rows), valid, starts)
    return (
        obs[:-1].flatten(0, 1),
        actions.flatten(0, 1),
        logp.flatten(0, 1),
        advantages.flatten(),
        returns.flatten(),
        values[:-1].flatten(),
    )


def _replay(
    model: Any, obs: torch.Tensor, state: torch.Tensor, dones: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A recurrent model over the rollouts ``obs [T + 1, N, ...]`` from their start state
    ``[k, N, size]``, chunk by chunk of ``length`` steps: the values ``[T + 1, N]`` and the
    state at each chunk's start ``[k, C x N, size]`` (chunk ``c`` of env ``j`` at ``c x N +
    j``): what the worker's state was there, the policy being the worker's."""
    values, starts = [], []
    for begin in range(0, obs.shape[0], length):
        if begin:  # an episode that ended before the chunk starts it from zeros
            state = state * (1.0 - dones[begin - 1]).view(1, -1, 1)
        if begin < dones.shape[0]:
            starts.append(state)
        end = begin + length
        _, chunk_values, state = model.unroll(obs[begin:end], state, dones[begin:end])
        values.append(chunk_values)
    return torch.cat(values), torch.cat(starts, 1)


def _log(
    ctx: mprl.Context, report: dict[str, float], version: int, since: float, version_then: int
) -> tuple[float, int]:
    now = time.monotonic()
    ctx.log(**report, iterations_per_s=(version - version_then) / max(now - since, 1e-9))
    return now, version


def _update(
    ctx: mprl.Context,
    cfg: PPOConfig,
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    data: tuple[torch.Tensor, ...],
    generator: torch.Generator,
) -> dict[str, float]:
    """``cfg.epochs`` passes of minibatch updates; the last minibatch's numbers. With a
    recurrent model a minibatch is chunks of the env sequences, ``minibatch_size // L`` of
    them (their padding left out of the losses)."""
    recurrent = is_recurrent(model)
    size = data[0].shape[1] if recurrent else data[0].shape[0]
    per = max(1, cfg.minibatch_size // data[0].shape[0]) if recurrent else cfg.minibatch_size
    stats: dict[str, float] = {}
    for _ in range(cfg.epochs):
        order = torch.randperm(size, generator=generator).to(data[0].device)
        for index in order.split(per):
            if ctx.should_stop():  # an update of big batches takes seconds: stop in time
                return stats
            if recurrent:
                obs, *rest, dones, valid = (d[:, index] for d in data[:-1])
                state = data[-1][:, index]
                out, values, _ = model.unroll(obs, state, dones)  # type: ignore[operator]
                real = valid.flatten() > 0
                out, values = out.flatten(0, 1)[real], values.flatten()[real]
                samples = tuple(d.flatten(0, 1)[real] for d in rest)
            else:
                obs, *rest = (d[index] for d in data)
                out, values = model(obs)
                samples = tuple(rest)
            stats = _step(cfg, model, optimizer, out, values, *samples)
    return stats


def _step(
    cfg: PPOConfig,
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    out: torch.Tensor,
    values: torch.Tensor,
    *samples: torch.Tensor,
) -> dict[str, float]:
    """One clipped-PPO gradient step on a minibatch: the model's outputs and values, and the
    samples' actions, old log-probabilities, advantages, returns and old values."""
    actions, old_logp, advantages, returns, old_values = samples
    if cfg.normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    logp, entropy = model.log_prob_entropy(out, actions)
    ratio = (logp - old_logp).exp()
    policy_loss = -torch.min(
        ratio * advantages, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * advantages
    ).mean()
    value_error = (values - returns).pow(2)
    if cfg.value_clip:
        clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
        value_error = torch.max(value_error, (clipped - returns).pow(2))
    value_loss = 0.5 * value_error.mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy_mean
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return {
        "policy_loss": policy_loss.item(),
        "value_loss": value_loss.item(),
        "entropy": entropy_mean.item(),
        "grad_norm": float(grad_norm),
        "clip_fraction": ((ratio - 1).abs() > cfg.clip).float().mean().item(),
    }
