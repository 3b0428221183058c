"""mprl.lib.recurrent: the recurrent actor-critic (``core=lstm|gru``) of ppo and impala, the
workers' recurrent rollout (hidden state carried, reset at episode ends, stored at the
rollout's start), the learners' replay of the stored sequences, act's per-env state for
``mprl eval``, and mprl.lib.pomdp's CartPoleNoVelocity-v1."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import mprl_builtin.impala.algorithm as impala
import mprl_builtin.ppo.algorithm as ppo
from mprl.errors import ConfigError
from mprl.host.config import build
from mprl.lib import recurrent
from mprl.lib.envbatch import EnvBatch, rollout_spec
from mprl.lib.nets import ActorCritic
from mprl.lib.pomdp import NO_VELOCITY
from mprl.lib.recurrent import RecurrentActorCritic, make_model
from tests.conftest import cli_here

ENV = f"mprl.lib.pomdp:{NO_VELOCITY}"


class Ctx:
    """The part of a Context EnvBatch and the learners use: time-limited POMDP CartPoles."""

    def __init__(self, limit: int) -> None:
        self.limit, self.episodes, self.steps = limit, [], 0

    def make_env(self, index: int) -> gym.Env:
        env = gym.make(ENV, max_episode_steps=self.limit)
        env.reset(seed=index)
        return env

    def log_episode(self, episode_return: float, episode_length: int) -> None:
        self.episodes.append((episode_return, episode_length))

    def add_steps(self, n: int) -> None:
        self.steps += n

    def should_stop(self) -> bool:
        return False


def _setup(config, limit: int, envs: int, steps: int):
    torch.manual_seed(0)
    space = gym.make(ENV).observation_space
    model = make_model(space, gym.spaces.Discrete(2), config)
    batch = EnvBatch(Ctx(limit), envs, config.gamma)
    spec = rollout_spec(space, gym.spaces.Discrete(2), steps, envs, config)
    slot = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}
    return model, batch, slot


def _taken(slot: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One rollout as ``take_batch`` hands it over: each field stacked along a new dim 1."""
    return {name: value.clone().unsqueeze(1) for name, value in slot.items()}


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_ppo_minibatches_replay_the_workers_log_probs(core, monkeypatch):
    """ppo's update re-runs each minibatch of env sequences from the stored start state, the
    dones zeroing it inside: the log-probabilities are the ones the worker recorded."""
    cfg = ppo.PPOConfig(core=core, n_steps=24, envs_per_worker=6, minibatch_size=48, epochs=1)
    model, envs, slot = _setup(cfg, limit=9, envs=6, steps=24)  # episodes end inside
    envs.rollout(model, slot)
    envs.rollout(model, slot)  # a second one: it starts from a state that is not zero
    assert slot["state"].abs().sum() > 0 and slot["done"].sum() >= 6
    data = ppo._data(cfg, model, _taken(slot))
    seen = []

    def step(cfg, model, optimizer, out, values, actions, old_logp, *rest):
        seen.append((model.log_prob_entropy(out, actions)[0], old_logp))
        return {}

    monkeypatch.setattr(ppo, "_step", step)
    ppo._update(Ctx(9), cfg, model, None, data, torch.Generator().manual_seed(1))
    assert len(seen) == 3  # 6 sequences of 24, 2 a minibatch (48 samples)
    for logp, recorded in seen:
        assert logp.shape == (48,)
        torch.testing.assert_close(logp, recorded, rtol=0, atol=0)


@pytest.mark.parametrize(("core", "chunk"), [("gru", 5), ("lstm", 0)])
def test_ppo_chunks_padded_or_whole_replay_the_workers_log_probs(core, chunk, monkeypatch):
    """Chunks of 5 steps of 24-step rollouts (the last of each padded: the padding is left out
    of the losses) or whole rollouts (``data_chunk_length=0``), each replayed from the state at
    its start: every real sample once an epoch, at the worker's log-probability."""
    cfg = ppo.PPOConfig(core=core, n_steps=24, envs_per_worker=6, minibatch_size=45, epochs=1,
                        data_chunk_length=chunk)  # fmt: skip
    model, envs, slot = _setup(cfg, limit=9, envs=6, steps=24)
    envs.rollout(model, slot)
    envs.rollout(model, slot)
    data = ppo._data(cfg, model, _taken(slot))
    assert data[0].shape[:2] == ((5, 30) if chunk else (24, 6))
    seen = []

    def step(cfg, model, optimizer, out, values, actions, old_logp, *rest):
        seen.append((model.log_prob_entropy(out, actions)[0], old_logp))
        return {}

    monkeypatch.setattr(ppo, "_step", step)
    ppo._update(Ctx(9), cfg, model, None, data, torch.Generator().manual_seed(1))
    assert sum(len(logp) for logp, _ in seen) == 24 * 6  # every real sample, no padding
    for logp, recorded in seen:
        torch.testing.assert_close(logp, recorded, rtol=0, atol=1e-6)
    replayed = torch.cat([r for _, r in seen]).sort().values
    torch.testing.assert_close(replayed, slot["logp"].flatten().sort().values, rtol=0, atol=0)


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_impala_update_replays_the_workers_log_probs(core, monkeypatch):
    """impala's V-trace sees log(target / behaviour) = 0 for an unchanged policy: the policy
    re-run over each sequence from its stored state gives the worker's log-probabilities."""
    cfg = impala.ImpalaConfig(core=core, unroll=20, envs_per_worker=4)
    model, envs, slot = _setup(cfg, limit=7, envs=4, steps=20)
    envs.rollout(model, slot)
    envs.rollout(model, slot)
    assert slot["state"].abs().sum() > 0 and slot["done"].sum() >= 4
    seen = []
    real = impala.vtrace
    monkeypatch.setattr(
        impala, "vtrace", lambda log_rhos, *a: seen.append(log_rhos) or real(log_rhos, *a)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    impala.update(model, optimizer, cfg, _taken(slot))
    assert seen[0].shape == (20, 4)
    torch.testing.assert_close(seen[0], torch.zeros(20, 4), rtol=0, atol=0)


def test_hidden_state_is_zero_where_an_episode_ended_and_stored_at_the_rollout_start():
    cfg = ppo.PPOConfig(core="lstm", n_steps=4, envs_per_worker=3)
    model, envs, slot = _setup(cfg, limit=4, envs=3, steps=4)
    envs.rollout(model, slot)
    assert torch.equal(slot["state"], torch.zeros(4, 3, 64))  # a fresh batch: zeros
    assert slot["done"][-1].tolist() == [1.0, 1.0, 1.0]  # every episode ended at the last step
    assert torch.equal(envs.state, torch.zeros(4, 3, 64))  # so the next starts from zero
    model_ff, envs_ff, slot_ff = _setup(cfg, limit=3, envs=3, steps=4)  # one step into the next
    envs_ff.rollout(model_ff, slot_ff)
    assert (envs_ff.state.abs().sum(-1) > 0).all()
    carried = envs_ff.state.clone()
    envs_ff.rollout(model_ff, slot_ff)
    assert torch.equal(slot_ff["state"], carried)  # the start state is what the last left


def test_the_worker_resets_the_state_to_what_a_fresh_episode_starts_with():
    """The step after an episode's end acts exactly as the first step of a fresh batch would."""
    cfg = impala.ImpalaConfig(core="gru", unroll=3, envs_per_worker=2)
    model, envs, slot = _setup(cfg, limit=2, envs=2, steps=3)
    envs.rollout(model, slot)  # ends after step 1: step 2 starts a new episode
    assert slot["done"][1].tolist() == [1.0, 1.0]
    with torch.no_grad():
        out, _, _ = model.step(slot["obs"][2], model.initial_state(2))
        logp = model.log_prob_entropy(out, slot["action"][2])[0]
    assert torch.equal(logp, slot["logp"][2])


def test_act_keeps_each_envs_state_and_begin_episode_zeroes_it():
    torch.manual_seed(0)
    model = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3), (8,), "lstm")
    obs = torch.randn(5, 3, 2)
    for j in range(3):
        model.begin_episode(j)
    state = model.initial_state(3)
    for t in range(5):
        model.act(obs[t], deterministic=True)
        _, _, state = model.step(obs[t], state)
    kept = torch.cat([model._acting[j] for j in range(3)], 1)
    torch.testing.assert_close(kept, state, rtol=0, atol=0)
    model.begin_episode(1)  # env 1 starts again; env 2 plays no more
    model.begin_episode(2, playing=False)
    model.act(obs[0, :2], deterministic=True)
    _, _, fresh = model.step(obs[0, 1:2], model.initial_state(1))
    torch.testing.assert_close(model._acting[1], fresh, rtol=0, atol=1e-6)  # a batch of 1
    assert sorted(model._acting) == [0, 1]
    actions = model.act(obs[0, :1], deterministic=True)  # another batch size: fresh zeros
    assert actions.shape == (1,) and sorted(model._acting) == [0]


def test_core_none_is_the_feed_forward_model_and_spec():
    cfg = ppo.PPOConfig()
    space = gym.spaces.Box(-1, 1, (4,))
    assert type(make_model(space, gym.spaces.Discrete(2), cfg)) is ActorCritic
    assert "state" not in rollout_spec(space, gym.spaces.Discrete(2), 5, 3, cfg)
    assert "state" not in rollout_spec(space, gym.spaces.Discrete(2), 5, 3)
    gru = impala.ImpalaConfig(core="gru", core_size=7)
    assert recurrent.state_spec(gru, space, 3) == {"state": ((2, 3, 7), torch.float32)}
    frames = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)  # one core, shared
    assert recurrent.state_spec(gru, frames, 3) == {"state": ((1, 3, 7), torch.float32)}


def test_continuous_actions_and_gsde_have_a_recurrent_model():
    cfg = ppo.PPOConfig(core="gru", sde_every=4, hidden=(16,), core_size=8)
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    model = make_model(gym.spaces.Box(-1, 1, (3,)), box, cfg)
    out, values, _ = model.unroll(torch.randn(5, 4, 3), model.initial_state(4), torch.zeros(5, 4))
    actions = model.sample(out)
    logp, _ = model.log_prob_entropy(out, actions)
    assert actions.shape == (5, 4, 2) and logp.shape == values.shape == (5, 4)
    assert model.act(torch.randn(4, 3)).shape == (4, 2)


@pytest.mark.parametrize("plugin", ["a3c", "dqn", "sac"])
def test_core_on_a_plugin_without_recurrence_exits_2_naming_ppo_and_impala(plugin, capsys):
    code, err = cli_here(capsys, "run", "--plugin", plugin, "--set", "core=lstm", "--quiet")
    assert code == 2 and "unknown field 'core'" in err and "--plugin ppo or impala" in err


def test_core_is_a_field_of_ppo_and_impala_only():
    with pytest.raises(ConfigError, match="ppo or impala"):
        build(ActorCriticLike, {"core": "lstm"}, "a3c config")
    with pytest.raises(ConfigError, match="'core'"):
        build(ppo.PPOConfig, {"core": "rnn"}, "ppo config")
    assert build(impala.ImpalaConfig, {"core": "gru"}).core == "gru"


ActorCriticLike = ppo.ActorCriticConfig


def test_cartpole_no_velocity_observes_position_and_angle_only():
    env = gym.make(ENV)
    full = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    ref, _ = full.reset(seed=3)
    assert env.observation_space.shape == (2,) and np.array_equal(obs, ref[[0, 2]])
    assert env.spec.max_episode_steps == 500 and env.spec.reward_threshold == 475.0
