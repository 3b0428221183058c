"""A3C: config, model and optimizer factories, and the worker loop."""

from __future__ import annotations

import copy

import attrs
import torch
from attrs import validators as v
from torch import nn

import mprl
from mprl.lib.envbatch import EnvBatch
from mprl.lib.nets import ActorCritic, ActorCriticConfig, annealed_lr

LOG_EVERY = 50  # updates between loss records: reporting must not cost more than learning


#: config by workload (``Algorithm.presets``), under the user's own values: A3C's Atari
#: settings (Mnih et al. 2016: t_max 5, entropy 0.01), Adam in place of shared RMSProp
PRESETS = {
    "atari": {
        "lr": 1e-4, "envs_per_worker": 8, "n_steps": 5, "gamma": 0.99, "entropy_coef": 0.01,
        "max_grad_norm": 40.0,
    },
}  # fmt: skip


@attrs.frozen
class A3CConfig(ActorCriticConfig):
    """A3C hyperparameters; the defaults solve CartPole-v1 on two cores."""

    n_steps: int = attrs.field(
        default=8, validator=v.ge(1), metadata={"help": "steps per environment between updates"}
    )


def _n_step_returns(
    rewards: torch.Tensor, dones: torch.Tensor, last_value: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Discounted returns over a (T, E) rollout, bootstrapped from ``last_value``."""
    returns = torch.empty_like(rewards)
    running = last_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        returns[t] = running
    return returns


def worker(ctx: mprl.Context) -> None:
    """Collect n-step rollouts and apply Hogwild updates until the run stops."""
    cfg: A3CConfig = ctx.config
    shared: ActorCritic = ctx.model  # type: ignore[assignment]
    optimizer = ctx.optimizer
    assert optimizer is not None
    local = copy.deepcopy(shared)
    shared_params = list(shared.parameters())
    envs = EnvBatch(ctx, cfg.envs_per_worker, cfg.gamma, normalize_reward=cfg.normalize_reward)
    n_envs, horizon = len(envs), cfg.n_steps
    obs_buf = torch.empty((horizon, *envs.obs.shape), dtype=envs.obs.dtype)
    rew_buf = torch.empty((horizon, n_envs))
    done_buf = torch.empty((horizon, n_envs))
    act_buf: torch.Tensor | None = None
    updates = 0

    while not ctx.should_stop():
        local.load_state_dict(shared.state_dict())
        for t in range(horizon):
            obs = envs.obs
            with torch.no_grad():
                out, _ = local(obs)
                actions = local.sample(out)
            if act_buf is None:
                act_buf = torch.empty((horizon, *actions.shape), dtype=actions.dtype)
            obs_buf[t] = obs
            act_buf[t] = actions
            rewards, dones = envs.step(local, actions)
            rew_buf[t] = torch.from_numpy(rewards)  # one write per step, not per env
            done_buf[t] = torch.from_numpy(dones)
        ctx.add_steps(horizon * n_envs)

        with torch.no_grad():
            last_value = local.value(envs.obs)
        returns = _n_step_returns(rew_buf, done_buf, last_value, cfg.gamma).flatten()
        out, values = local(obs_buf.flatten(0, 1))
        assert act_buf is not None
        logp, entropy = local.log_prob_entropy(out, act_buf.flatten(0, 1))
        advantages = (returns - values).detach()
        if cfg.normalize_advantages and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = -(logp * advantages).mean()
        value_loss = 0.5 * (returns - values).pow(2).mean()
        entropy_mean = entropy.mean()
        loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy_mean

        local.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(local.parameters(), cfg.max_grad_norm)
        for shared_p, local_p in zip(shared_params, local.parameters(), strict=True):
            shared_p.grad = local_p.grad  # Hogwild: this process's gradient, shared weights
        if cfg.anneal_steps:  # this process's copy of the groups; the run's steps decide
            for group in optimizer.param_groups:
                group["lr"] = annealed_lr(cfg, ctx.env_steps)
        optimizer.step()
        shared.observe(obs_buf)  # normalisation statistics, with normalize_obs (Hogwild too)
        updates += 1
        if updates % LOG_EVERY == 0:
            ctx.log(
                policy_loss=policy_loss.item(),
                value_loss=value_loss.item(),
                entropy=entropy_mean.item(),
                grad_norm=float(grad_norm),
            )
    envs.close()
