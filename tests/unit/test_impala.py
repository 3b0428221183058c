"""The impala plugin: V-trace, its update, and real runs through the CLI (a worker killed and
restarted, no Manager call per step)."""

from __future__ import annotations

import contextlib

import gymnasium as gym
import pytest
import torch

from mprl.lib.nets import make_model, make_optimizer
from mprl_builtin.impala.algorithm import ImpalaConfig, update, vtrace


def _naive_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar):
    """V-trace as written in the paper (eq. 1): a sum over the rest of the rollout."""
    rhos = log_rhos.exp()
    t_len = rewards.shape[0]
    all_values = torch.cat([values, bootstrap.unsqueeze(0)])
    vs = torch.empty_like(values)
    for s in range(t_len):
        total = values[s].clone()
        for t in range(s, t_len):
            trace = torch.ones_like(bootstrap)
            for i in range(s, t):
                trace = trace * discounts[i] * rhos[i].clamp(max=c_bar)
            delta = rhos[t].clamp(max=rho_bar) * (
                rewards[t] + discounts[t] * all_values[t + 1] - all_values[t]
            )
            total = total + trace * delta
        vs[s] = total
    return vs


def test_vtrace_matches_the_paper_and_on_policy_returns():
    g = torch.Generator().manual_seed(0)
    t_len, n = 7, 4
    log_rhos = torch.randn(t_len, n, generator=g)
    discounts = 0.9 * (torch.rand(t_len, n, generator=g) > 0.2).float()
    rewards, values = torch.randn(t_len, n, generator=g), torch.randn(t_len, n, generator=g)
    bootstrap = torch.randn(n, generator=g)
    vs, _ = vtrace(log_rhos, discounts, rewards, values, bootstrap, 1.0, 0.9)
    expected = _naive_vtrace(log_rhos, discounts, rewards, values, bootstrap, 1.0, 0.9)
    assert torch.allclose(vs, expected, atol=1e-5)
    # on-policy (rho = 1): V-trace targets are the bootstrapped discounted returns
    vs, adv = vtrace(torch.zeros(t_len, n), discounts, rewards, values, bootstrap)
    returns, running = torch.empty_like(rewards), bootstrap
    for t in range(t_len - 1, -1, -1):
        running = rewards[t] + discounts[t] * running
        returns[t] = running
    assert torch.allclose(vs, returns, atol=1e-5)
    next_vs = torch.cat([vs[1:], bootstrap.unsqueeze(0)])
    assert torch.allclose(adv, rewards + discounts * next_vs - values, atol=1e-5)


def test_impala_update_learns_the_rewarded_action_and_steps_inside_publishing():
    # a batch laid out as take_batch gives it ([T, B, E, ...]), collected on-policy: action 0
    # earns 1, action 1 nothing, and no episode ends
    cfg = ImpalaConfig(unroll=8, envs_per_worker=4, batch_rollouts=2, entropy_coef=0.0, lr=1e-2)
    obs_space = gym.spaces.Box(-1.0, 1.0, (3,))
    torch.manual_seed(0)
    model = make_model(obs_space, gym.spaces.Discrete(2), cfg)
    optimizer = make_optimizer(model.parameters(), cfg)
    obs = torch.rand(cfg.unroll + 1, cfg.batch_rollouts, cfg.envs_per_worker, 3) * 2 - 1

    def p_rewarded() -> float:
        with torch.no_grad():
            return float(torch.softmax(model.policy(obs), -1)[..., 0].mean())

    def weights() -> list[torch.Tensor]:
        return [p.detach().clone() for p in model.parameters()]

    steps: list[bool] = []  # per update: the weights changed inside publishing(), and only there
    published = weights()

    @contextlib.contextmanager
    def publishing(of: torch.nn.Module):
        assert of is model
        nonlocal published
        before = weights()
        yield
        unchanged = all(map(torch.equal, published, before))
        published = weights()
        steps.append(unchanged and not all(map(torch.equal, before, published)))

    start = p_rewarded()
    for _ in range(30):
        with torch.no_grad():
            out = model.policy(obs[:-1].flatten(0, 2))
        actions = model.sample(out)
        logp, _ = model.log_prob_entropy(out, actions)
        actions, logp = actions.view(obs[:-1].shape[:3]), logp.view(obs[:-1].shape[:3])
        batch = {
            "obs": obs, "action": actions, "logp": logp, "reward": (actions == 0).float(),
            "done": torch.zeros_like(logp),
        }  # fmt: skip
        stats = update(model, optimizer, cfg, batch, publishing)
        assert set(stats) == {"policy_loss", "value_loss", "entropy", "grad_norm"}
    assert steps == [True] * 30
    assert 0.4 < start < 0.6 and p_rewarded() > 0.9


@pytest.mark.parametrize(
    ("algorithm", "shape"),
    [("impala", {"envs_per_worker": 4, "unroll": 16}), ("a3c", {"envs_per_worker": 4})],
)
def test_the_learning_rate_anneals_over_env_steps_to_the_floor(algorithm, shape):
    """``anneal_steps``: the lr falls with the run's env steps, to 5% of ``lr`` (where it
    stays, so a long run learns on). The processes that step the optimizer (impala's learner,
    a3c's Hogwild workers) set it on their own copy of the groups; it follows from the env
    steps, so a resumed run sets it again."""
    from mprl.lib.nets import MIN_LR_FRACTION, annealed_lr
    from mprl.testing import run_serial

    cfg = ImpalaConfig(lr=1e-3, anneal_steps=10_000)
    assert annealed_lr(cfg, 0) == 1e-3 and annealed_lr(cfg, 2_500) == pytest.approx(7.5e-4)
    assert annealed_lr(cfg, 10**6) == pytest.approx(1e-3 * MIN_LR_FRACTION)
    assert annealed_lr(ImpalaConfig(lr=1e-3), 10**6) == 1e-3  # 0: constant
    config = {"lr": 1e-3, "anneal_steps": 2048, **shape}
    result = run_serial(algorithm, total_steps=4096, config=config)  # twice anneal_steps
    learner = "trainer" if algorithm == "impala" else "worker"
    stepping = [c.optimizer for c in result.contexts if c.role == learner]
    assert stepping and all(
        opt.param_groups[0]["lr"] == pytest.approx(1e-3 * MIN_LR_FRACTION) for opt in stepping
    )
