"""IMPALA: workers collect rollouts into rollout slots, one train process learns with V-trace
(Espeholt et al. 2018) and publishes weights back."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch
from attrs import validators as v
from torch import nn

import mprl
from mprl import schema
from mprl.lib.envbatch import EnvBatch, rollout_spec
from mprl.lib.nets import ActorCritic, ActorCriticConfig, annealed_lr, field_help
from mprl.lib.recurrent import core_field, core_size_field
from mprl.transport import RolloutSlots, WeightBroadcast

LOG_EVERY_S = 2.0  # how often the learner reports losses, rates and staleness
COUNT_EVERY_S = 1.0  # how often a worker publishes its rollout count to the Manager


#: config by workload (``Algorithm.presets``), under the user's own values
PRESETS = {
    # IMPALA's Atari settings (Espeholt et al. 2018, table G.1: unroll 20, entropy 0.01, clip
    # 40), with Adam in place of RMSProp at the lr of the "deep" network's runs, and one
    # rollout (160 samples) an update, not the paper's 640.
    # why: see benchmarks/README.md, "impala's Atari preset: one rollout an update"
    "atari": {
        "lr": 6e-4, "envs_per_worker": 8, "unroll": 20, "batch_rollouts": 1, "gamma": 0.99,
        "entropy_coef": 0.01, "value_coef": 0.5, "max_grad_norm": 40.0,
    },
    "mujoco": {
        "lr": 3e-4, "envs_per_worker": 4, "unroll": 64, "batch_rollouts": 2, "gamma": 0.99,
        "entropy_coef": 0.0, "max_grad_norm": 0.5, "normalize_obs": True,
        "normalize_reward": True, "log_std_init": -2.0,
    },
}  # fmt: skip


def _rollout(dims: schema.Dims) -> dict[str, Any]:
    """One rollout: ``unroll`` steps of ``envs_per_worker`` environments."""
    cfg: ImpalaConfig = dims.config
    return rollout_spec(
        dims.observation_space, dims.action_space, cfg.unroll, cfg.envs_per_worker, cfg
    )


@attrs.frozen
class ImpalaConfig(ActorCriticConfig):
    """IMPALA hyperparameters; the defaults solve CartPole-v1 on two cores."""

    lr: float = attrs.field(
        default=1.5e-3, validator=v.gt(0.0), metadata=field_help("Adam learning rate")
    )
    # Off: normalised advantages blow the noise of a solved policy (every return 500, every
    # advantage near 0) up to unit size, and the policy drifts off.
    # why: see benchmarks/README.md, "Advantage normalisation"
    normalize_advantages: bool = attrs.field(
        default=False, metadata=field_help("normalise advantages within each update")
    )

    envs_per_worker: int = attrs.field(
        default=16,
        validator=v.ge(1),
        metadata=field_help("environments each worker steps together"),
    )
    unroll: int = attrs.field(
        default=16, validator=v.ge(1), metadata=field_help("steps per environment in one rollout")
    )
    batch_rollouts: int = attrs.field(
        default=2,
        validator=v.ge(1),
        metadata=field_help("rollouts per learner update"),
    )
    slots_per_worker: int = attrs.field(
        default=2,
        validator=v.ge(1),
        metadata=field_help("rollout slots per worker (more: fewer waits, staler rollouts)"),
    )
    rho_bar: float = attrs.field(
        default=1.0, validator=v.gt(0.0), metadata=field_help("V-trace importance weight clip")
    )
    c_bar: float = attrs.field(
        default=1.0, validator=v.gt(0.0), metadata=field_help("V-trace trace-cutting clip")
    )
    # a recurrent core: V-trace runs over each env's rollout, the policy re-run over it from
    # the state stored at the rollout's start
    core: str = core_field()
    core_size: int = core_size_field()


SCHEMA = schema.Schema(
    rollouts=schema.Rollouts(_rollout, slots_per_worker="config.slots_per_worker"),
    weights=schema.Weights(),
    # small control state in the Manager, as in the hand-written main: never bulk data
    collected=schema.PerWorker(0),  # rollouts handed over, per worker
)


def worker(ctx: mprl.Context) -> None:
    """Step ``envs_per_worker`` environments with the newest published policy, one batched
    forward per step, and hand each rollout to the learner through a shared-memory slot."""
    cfg: ImpalaConfig = ctx.config
    rollouts: RolloutSlots = ctx.state.rollouts
    weights: WeightBroadcast = ctx.state.weights
    local: ActorCritic = copy.deepcopy(ctx.model)  # type: ignore[assignment]
    version = -1
    envs = EnvBatch(ctx, cfg.envs_per_worker, cfg.gamma, normalize_reward=cfg.normalize_reward)
    collected = ctx.state.collected[ctx.rank]  # a restarted worker counts on
    published = -COUNT_EVERY_S  # the first rollout is published at once
    while (index := rollouts.acquire()) is not None:
        version = weights.pull(local, version)
        slot = rollouts.slot(index)
        envs.rollout(local, slot)
        slot["version"].fill_(version)
        rollouts.commit(index)
        collected += 1
        if time.monotonic() - published >= COUNT_EVERY_S:
            # control state, one Manager round trip a second, not one per rollout
            # why: see benchmarks/README.md, "impala: the Manager counter once a second"
            ctx.state.collected[ctx.rank] = collected
            published = time.monotonic()
    ctx.state.collected[ctx.rank] = collected
    envs.close()


def vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets ``vs`` and policy-gradient advantages over a ``[T, N]`` rollout.

    ``log_rhos`` are log(target / behaviour) probabilities of the taken actions; ``discounts``
    are ``gamma * (1 - done)``; ``values`` are V(x_t) and ``bootstrap`` V(x_T).
    """
    with torch.no_grad():
        rhos = log_rhos.exp()
        clipped_rhos = rhos.clamp(max=rho_bar)
        cs = rhos.clamp(max=c_bar)
        next_values = torch.cat([values[1:], bootstrap.unsqueeze(0)])
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        acc = torch.zeros_like(bootstrap)
        vs_minus_v = torch.empty_like(values)
        for t in range(values.shape[0] - 1, -1, -1):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_v[t] = acc
        vs = vs_minus_v + values
        next_vs = torch.cat([vs[1:], bootstrap.unsqueeze(0)])
        advantages = clipped_rhos * (rewards + discounts * next_vs - values)
    return vs, advantages


def update(
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    cfg: ImpalaConfig,
    batch: Mapping[str, torch.Tensor],
    publishing: Callable[[nn.Module], contextlib.AbstractContextManager[Any]] = (
        lambda model: contextlib.nullcontext()
    ),
) -> dict[str, torch.Tensor]:
    """One V-trace update of ``model`` from ``batch`` (``take_batch``'s ``[T, B, E, ...]``
    fields); the optimizer step runs inside ``publishing(model)`` (the learner passes
    :meth:`~mprl.transport.WeightBroadcast.publishing`). Returns the losses, the entropy and
    the gradient norm."""
    obs = batch["obs"].flatten(1, 2)  # [T + 1, B * E, ...]
    actions = batch["action"].flatten(1, 2)
    t_len, n = actions.shape[:2]
    if "state" in batch:  # recurrent: each env's sequence replayed from its start state
        state, dones = batch["state"].flatten(1, 2), batch["done"].flatten(1, 2)
        out, values, _ = model.unroll(obs, state, dones)  # type: ignore[operator]
    else:
        out, values = model(obs.flatten(0, 1))
        out, values = out.view(t_len + 1, n, -1), values.view(t_len + 1, n)
    logp, entropy = model.log_prob_entropy(out[:-1], actions)
    discounts = cfg.gamma * (1.0 - batch["done"].flatten(1, 2))
    vs, advantages = vtrace(
        logp.detach() - batch["logp"].flatten(1, 2),
        discounts,
        batch["reward"].flatten(1, 2),
        values[:-1].detach(),
        values[-1].detach(),
        cfg.rho_bar,
        cfg.c_bar,
    )
    if cfg.normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -(logp * advantages).mean()
    value_loss = 0.5 * (vs - values[:-1]).pow(2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy_mean
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    with publishing(model):
        optimizer.step()
        model.observe(obs[:-1])  # normalisation statistics, with normalize_obs
    return {
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy_mean.detach(),
        "grad_norm": grad_norm,
    }


def train(ctx: mprl.Context) -> None:
    """Learn from batches of rollouts with V-trace; publish every update to the workers."""
    cfg: ImpalaConfig = ctx.config
    rollouts: RolloutSlots = ctx.state.rollouts
    weights: WeightBroadcast = ctx.state.weights
    model: ActorCritic = ctx.model  # type: ignore[assignment]
    optimizer = ctx.optimizer
    assert optimizer is not None
    last_log, updates_at_log = time.monotonic(), 0
    staleness: list[float] = []
    stats: dict[str, torch.Tensor] = {}
    while (batch := rollouts.take_batch(cfg.batch_rollouts)) is not None:
        batch = ctx.to_device(batch)  # --device: one copy to the GPU; on the CPU, as it is
        if cfg.anneal_steps:
            for group in optimizer.param_groups:
                group["lr"] = annealed_lr(cfg, ctx.env_steps)
        stats = update(model, optimizer, cfg, batch, weights.publishing)
        staleness.append(float(weights.version - 1 - batch["version"].float().mean()))
        now = time.monotonic()
        if now - last_log >= LOG_EVERY_S:
            report = {name: float(value) for name, value in stats.items()}
            _log_rates(ctx, report, weights.version, updates_at_log, now - last_log, staleness)
            last_log, updates_at_log, staleness = now, weights.version, []
    if staleness:  # the last stretch, so short runs report too
        report = {name: float(value) for name, value in stats.items()}
        seconds = time.monotonic() - last_log
        _log_rates(ctx, report, weights.version, updates_at_log, seconds, staleness)


def _log_rates(
    ctx: mprl.Context,
    report: dict[str, float],
    version: int,
    version_before: int,
    seconds: float,
    staleness: list[float],
) -> None:
    collected = list(ctx.state.collected)  # one round trip, every LOG_EVERY_S at most
    ctx.log(
        **report,
        rollouts_min=min(collected),
        rollouts_max=max(collected),
        updates=version,
        updates_per_s=(version - version_before) / max(seconds, 1e-9),
        staleness=sum(staleness) / len(staleness),
    )
