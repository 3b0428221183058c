"""rMAPPO (mappo and ippo with ``core=gru|lstm``), in this process: the workers' per-agent
hidden states (carried, zeroed at episode ends, stored at each chunk's start), the learner's
chunked replay of them (its log-probabilities are the workers' before the first update, across
episode ends inside chunks), and act's per-env, per-agent state for ``mprl eval``."""

from __future__ import annotations

import pytest
import torch

from mprl.host.envs import make_env
from mprl.lib.marl import AgentBatch
from mprl_builtin.mappo.algorithm import (
    MAPPOConfig,
    _chunks,
    _rollout,
    _update,
    make_model,
    recurrent_rollout,
)
from mprl_builtin.mappo.recurrent import RecurrentAgentsModel

ENV = "mpe2:simple_spread_v3(N=3, max_cycles=6)"  # 6-step episodes: ends inside 4-step chunks


class _Ctx:
    def __init__(self, pm):
        self.pm, self.episodes, self.steps = pm, [], 0

    def make_env(self, index):
        env = make_env(self.pm, ENV)
        env.reset(seed=index)
        return env

    def log_episode(self, ret, length, **values):
        self.episodes.append((ret, length))

    def add_steps(self, n):
        self.steps += n

    def should_stop(self):
        return False


class _Dims:
    def __init__(self, env, config):
        self.observation_space, self.action_space, self.config = (
            env.observation_space,
            env.action_space,
            config,
        )


def _collect(pm, cfg, workers=2, rollouts=2):
    """``rollouts`` rollouts of each of ``workers`` workers; the last, as take_batch gives it."""
    torch.manual_seed(0)
    batches = [AgentBatch(_Ctx(pm), cfg.envs_per_worker, cfg.gamma) for _ in range(workers)]
    env = batches[0].envs[0]
    model = make_model(env.observation_space, env.action_space, cfg)
    spec = _rollout(_Dims(env, cfg))
    slots = [{k: torch.zeros(s, dtype=d) for k, (s, d) in spec.items()} for _ in batches]
    hidden = [model.initial_state(cfg.envs_per_worker) for _ in batches]
    for _ in range(rollouts):
        for i, (envs, slot) in enumerate(zip(batches, slots, strict=True)):
            hidden[i] = recurrent_rollout(envs, model, slot, hidden[i], cfg.data_chunk_length)
    batch = {k: torch.stack([s[k] for s in slots], 1) for k in slots[0]}
    return model, batch


@pytest.mark.parametrize(
    ("core", "critic", "share_params"),
    [("gru", "central", True), ("lstm", "central", True), ("gru", "local", False)],
)
def test_the_learner_replays_each_chunk_as_the_workers_acted(mprl_pm, core, critic, share_params):
    cfg = MAPPOConfig(
        core=core, critic=critic, share_params=share_params, core_size=16, hidden=(32,),
        envs_per_worker=3, n_steps=10, data_chunk_length=4, epochs=1, minibatches=2,
    )  # fmt: skip
    model, batch = _collect(mprl_pm, cfg)
    assert batch["hidden"].shape == (3, 2, 4 if core == "lstm" else 2, 3, 3, 16)
    assert batch["hidden"][0].abs().sum() > 0  # the second rollout starts from a carried state
    assert batch["done"].sum() >= 6  # 6-step episodes end inside the chunks
    data = _chunks(cfg, model, batch)
    assert data["obs"].shape == (4, 3 * 6, 3, 18)  # 3 chunks of 6 rollouts, 4 steps each
    assert data["done"][:-1].sum() > 0  # an episode ends inside a chunk, not only at its end
    with torch.no_grad():
        out, _, _ = model.unroll(data["obs"], data["state"], data["hidden"], data["done"])
    logp = model.distribution(out).log_prob(data["action"])
    live = data["alive"] > 0
    assert live.sum() == 10 * 6 * 3  # every real step of every agent; the padding not
    torch.testing.assert_close(logp[live], data["logp"][live], rtol=0, atol=1e-5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = _update(_Ctx(mprl_pm), cfg, model, optimizer, data, torch.Generator().manual_seed(0))
    assert stats["replay_logp_error"] < 1e-5  # the ratio is 1 before the first update


def test_the_worker_stores_the_hidden_state_at_each_chunks_start(mprl_pm):
    cfg = MAPPOConfig(core="gru", core_size=8, hidden=(16,), envs_per_worker=2, n_steps=10,
                      data_chunk_length=4)  # fmt: skip
    model, batch = _collect(mprl_pm, cfg, workers=1, rollouts=1)
    slot = {k: t[:, 0] for k, t in batch.items()}
    assert torch.equal(slot["hidden"][0], torch.zeros_like(slot["hidden"][0]))  # a fresh worker
    with torch.no_grad():
        for c, start in enumerate([4, 8]):
            _, _, hidden = model.unroll_stepwise(
                slot["obs"][:start], slot["state"][:start], slot["hidden"][0], slot["done"]
            )
            hidden = hidden * (1.0 - slot["done"][start - 1]).view(1, -1, 1, 1)
            torch.testing.assert_close(slot["hidden"][c + 1], hidden, rtol=0, atol=1e-6)
    assert slot["done"][5].tolist() == [1.0, 1.0]
    assert slot["hidden"][2].abs().sum() > 0  # after the episode's end at step 5, carried again


@pytest.mark.parametrize("share_params", [True, False])
def test_the_agents_models_batched_replay_is_the_step_by_step_one(mprl_pm, share_params):
    env = make_env(mprl_pm, ENV)
    cfg = MAPPOConfig(core="lstm", core_size=8, hidden=(16,), share_params=share_params)
    model = make_model(env.observation_space, env.action_space, cfg)
    torch.manual_seed(2)
    obs, state = torch.randn(9, 4, 3, 18), torch.randn(9, 4, 54)
    hidden = torch.randn(4, 4, 3, 8)
    dones = torch.zeros(9, 4)
    dones[[2, 3], 1] = 1.0
    dones[0, 2] = 1.0
    batched = model.unroll(obs, state, hidden, dones)
    stepwise = model.unroll_stepwise(obs, state, hidden, dones)
    for now, then in zip(batched, stepwise, strict=True):
        torch.testing.assert_close(now, then, rtol=0, atol=1e-5)


def test_act_keeps_each_envs_agents_states_and_begin_episode_zeroes_them(mprl_pm):
    env = make_env(mprl_pm, ENV)
    model = make_model(env.observation_space, env.action_space, MAPPOConfig(core="gru"))
    assert isinstance(model, RecurrentAgentsModel)
    torch.manual_seed(0)
    obs = torch.randn(3, 2, 3, 18)
    for j in range(2):
        model.begin_episode(j)
    first = model.act(obs[0], deterministic=True)
    model.act(obs[1], deterministic=True)
    assert model._acting[0].abs().sum() > 0 and model._acting[0].shape == (1, 1, 3, 64)
    model.begin_episode(0)  # env 0 starts again: it acts as at its first step
    model.begin_episode(1)
    assert (model.act(obs[0], deterministic=True) == first).all()
    assert first.shape == (2, 3)


def test_a_feed_forward_mappo_keeps_its_rollout_and_model():
    cfg = MAPPOConfig()
    assert cfg.core == "none" and cfg.data_chunk_length == 10
    assert "hidden" not in _rollout(type("D", (), {"config": cfg, **_spaces()})())


def _spaces():
    from mpe2 import simple_spread_v3

    from mprl.lib.marl import AgentEnv

    env = AgentEnv(simple_spread_v3.parallel_env())
    return {"observation_space": env.observation_space, "action_space": env.action_space}
