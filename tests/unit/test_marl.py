"""Multi-agent envs (PettingZoo's parallel API through mprl.lib.marl) and the mappo/ippo plugins,
in this process: the env adapter against the PettingZoo env it wraps, the rollout a worker
writes, the learner's first pass, and serial runs of both algorithms."""

from __future__ import annotations

import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch
from mpe2 import simple_adversary_v3, simple_spread_v3

import mprl
from mprl.environments import split_env_id
from mprl.errors import PluginError, UsageError
from mprl.host.envs import make_env
from mprl.lib.marl import AgentBatch, AgentEnv, agent_rollout_spec
from mprl.spaces import AgentBox, agents_of
from mprl.testing import run_serial


@pytest.mark.parametrize(
    ("env_id", "name", "kwargs"),
    [
        ("CartPole-v1", "CartPole-v1", {}),
        (
            "mpe2:simple_spread_v3(N=5, max_cycles=50)",
            "mpe2:simple_spread_v3",
            {"N": 5, "max_cycles": 50},
        ),
        (
            "mpe2:simple_spread_v3(continuous_actions=True, local_ratio=0.25)",
            "mpe2:simple_spread_v3",
            {"continuous_actions": True, "local_ratio": 0.25},
        ),
        ("Foo-v0(name='a b', n=None, t=(1, 2))", "Foo-v0", {"name": "a b", "n": None, "t": (1, 2)}),
    ],
)
def test_an_env_id_carries_the_envs_keyword_arguments(env_id, name, kwargs):
    assert split_env_id(env_id) == (name, kwargs)


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("mpe2:simple_spread_v3(5)", "name each argument"),
        ("mpe2:simple_spread_v3(N=5", "keyword arguments go in parentheses at the end"),
        ("mpe2:simple_spread_v3(N=__import__('os'))", "Python literals"),
    ],
)
def test_a_bad_argument_list_is_refused_naming_the_env(env_id, message):
    with pytest.raises(UsageError, match=message) as caught:
        split_env_id(env_id)
    assert env_id.split("(")[0] in str(caught.value)


def test_the_adapter_is_the_parallel_env_with_an_agent_dimension(mprl_pm):
    env = make_env(mprl_pm, "mpe2:simple_spread_v3(N=4, max_cycles=7)")
    twin = simple_spread_v3.parallel_env(N=4, max_cycles=7)
    obs, info = env.reset(seed=3)
    twin_obs, _ = twin.reset(seed=3)
    space = env.observation_space
    assert isinstance(space, AgentBox) and agents_of(space) == tuple(twin.possible_agents)
    assert space.shape == (4, twin.observation_space("agent_0").shape[0])
    assert env.action_space == gym.spaces.MultiDiscrete([5] * 4)
    np.testing.assert_allclose(obs, np.stack([twin_obs[a] for a in twin.possible_agents]))
    np.testing.assert_allclose(info["state"], twin.state())
    rng = np.random.default_rng(0)
    for t in range(7):
        action = rng.integers(0, 5, size=4)
        obs, reward, terminated, truncated, info = env.step(action)
        twin_obs, twin_rewards, _, _, _ = twin.step(
            {a: int(action[i]) for i, a in enumerate(twin.possible_agents)}
        )
        each = np.array([twin_rewards[a] for a in twin.possible_agents], np.float32)
        np.testing.assert_allclose(info["agent_rewards"], each)
        assert reward == pytest.approx(float(each.mean()))  # the team's: the agents' mean
        np.testing.assert_allclose(obs, np.stack([twin_obs[a] for a in twin.possible_agents]))
        assert (terminated, truncated) == (False, t == 6)  # MPE cuts every agent at max_cycles
    assert not info["alive"].any()


def test_agents_observing_different_sizes_are_padded_rows(mprl_pm):
    env = make_env(mprl_pm, "mpe2:simple_adversary_v3")
    twin = simple_adversary_v3.parallel_env()
    obs, _ = env.reset(seed=1)
    twin_obs, _ = twin.reset(seed=1)
    assert env.observation_space.sizes == (8, 10, 10)
    np.testing.assert_allclose(obs[0, :8], twin_obs["adversary_0"])
    assert not obs[0, 8:].any()  # the adversary's shorter row, zero-padded
    np.testing.assert_allclose(env.state(), twin.state())  # MPE's own global state


def test_an_aec_only_env_is_refused_with_the_conversion(mprl_pm, tmp_path, monkeypatch):
    (tmp_path / "aeconly").mkdir()
    (tmp_path / "aeconly" / "__init__.py").write_text("")
    (tmp_path / "aeconly" / "turns_v0.py").write_text(
        textwrap.dedent("""
            from mpe2 import simple_spread_v3
            def env(**kwargs):
                return simple_spread_v3.env(**kwargs)
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(UsageError, match=r"only PettingZoo's AEC API: .*aec_to_parallel"):
            make_env(mprl_pm, "aeconly:turns_v0")
    finally:
        sys.modules.pop("aeconly.turns_v0", None)
        sys.modules.pop("aeconly", None)


class _PettingZooEnvs:
    """A plugin's mprl_make_env returning PettingZoo envs as they are."""

    @mprl.hookimpl
    def mprl_make_env(self, env_id):
        if env_id == "parallel-spread":
            return simple_spread_v3.parallel_env(N=2)
        if env_id == "aec-spread":
            return simple_spread_v3.env(N=2)
        return None


def test_a_plugin_may_return_a_parallel_env_but_not_an_aec_one():
    from mprl.testing import plugin_manager

    pm = plugin_manager(_PettingZooEnvs())
    env = make_env(pm, "parallel-spread")
    assert isinstance(env, AgentEnv) and agents_of(env.observation_space) == ("agent_0", "agent_1")
    with pytest.raises(
        PluginError,
        match=r"returned \w+ for 'aec-spread': it is a PettingZoo AEC env .*aec_to_parallel",
    ):
        make_env(pm, "aec-spread")


class _Ctx:
    """What AgentBatch reads of a worker's Context."""

    def __init__(self, pm, env_id):
        self.pm, self.env_id, self.episodes = pm, env_id, []

    def make_env(self, index):
        env = make_env(self.pm, self.env_id)
        env.reset(seed=index)
        return env

    def log_episode(self, ret, length, **values):
        self.episodes.append((ret, length, values))

    def add_steps(self, n):
        pass


def test_a_rollout_holds_every_agents_step_and_bootstraps_the_time_limit(mprl_pm):
    env_id = "mpe2:simple_spread_v3(N=3, max_cycles=4)"
    ctx = _Ctx(mprl_pm, env_id)
    batch = AgentBatch(ctx, n=2, gamma=0.5)
    space, actions = batch.envs[0].observation_space, batch.envs[0].action_space
    spec = agent_rollout_spec(space, actions, steps=6, envs=2)
    slot = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in spec.items()}
    assert slot["obs"].shape == (7, 2, 3, 18) and slot["state"].shape == (7, 2, 54)

    def act(obs):
        return torch.zeros(obs.shape[:2], dtype=torch.int64), torch.full(obs.shape[:2], -1.6)

    def value(states):  # every cut episode's last state is worth 10 to each agent
        return torch.full((states.shape[0], 3), 10.0)

    batch.rollout(act, value, slot)
    assert slot["done"][:, 0].tolist() == [0, 0, 0, 1, 0, 0]  # 4 steps an episode
    assert len(ctx.episodes) == 2
    team, length, per_agent = ctx.episodes[0]
    assert length == 4 and set(per_agent) == {"return_agent_0", "return_agent_1", "return_agent_2"}
    assert team == pytest.approx(np.mean(list(per_agent.values())))
    # the logged returns are the env's; the rollout's last reward adds gamma * value
    learned = slot["reward"][:4, 0].sum(0)
    np.testing.assert_allclose(learned, np.array(list(per_agent.values())) + 5.0, rtol=1e-5)
    assert slot["alive"].all()  # every agent acts until the time limit


@pytest.mark.parametrize("algorithm", ["mappo", "ippo"])
def test_mappo_and_ippo_run_serially_and_log_each_agents_return(algorithm):
    result = run_serial(
        algorithm, env="mpe2:simple_spread_v3(N=2, max_cycles=10)", total_steps=400, workers=2,
        config={"envs_per_worker": 2, "n_steps": 10, "epochs": 2},
    )  # fmt: skip
    episodes = [r for r in result.records if "episode_return" in r]
    assert len(episodes) >= 30  # 400 steps of 10-step episodes
    for record in episodes:
        each = [record["return_agent_0"], record["return_agent_1"]]
        assert record["episode_return"] == pytest.approx(np.mean(each))
    losses = [r for r in result.records if "policy_loss" in r]
    assert losses and all(np.isfinite(r["value_loss"]) for r in losses)
    assert result.model.central is (algorithm == "mappo")


def test_the_learners_first_minibatch_replays_the_workers_log_probabilities(mprl_pm):
    """Before any update the learner's policy is the workers': its ratio is exactly 1."""
    from mprl_builtin.mappo.algorithm import MAPPOConfig, _prepare, make_model

    cfg = MAPPOConfig(envs_per_worker=2, n_steps=5)
    ctx = _Ctx(mprl_pm, "mpe2:simple_spread_v3(N=3, max_cycles=25)")
    batch = AgentBatch(ctx, n=2, gamma=cfg.gamma)
    env = batch.envs[0]
    model = make_model(env.observation_space, env.action_space, cfg)
    spec = agent_rollout_spec(env.observation_space, env.action_space, 5, 2)
    slot = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in spec.items()}

    def act(obs):
        dist = model.distribution(model.policy(obs))
        actions = dist.sample()
        return actions, dist.log_prob(actions)

    batch.rollout(act, None, slot)
    data = _prepare(cfg, model, {k: t.unsqueeze(1) for k, t in slot.items()})  # one worker
    logp = model.distribution(model.policy(data["obs"])).log_prob(data["action"])
    torch.testing.assert_close(logp, data["logp"])
    assert data["obs"].shape == (10, 3, 18) and data["advantage"].shape == (10, 3)


def test_an_env_module_missing_a_dependency_names_it(mprl_pm, tmp_path, monkeypatch):
    (tmp_path / "needsdeps").mkdir()
    (tmp_path / "needsdeps" / "__init__.py").write_text("")
    (tmp_path / "needsdeps" / "game_v0.py").write_text("import no_such_physics_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(
            UsageError,
            match=r"needs the package 'no_such_physics_xyz', which is not installed: pip install no_such_physics_xyz",
        ):
            make_env(mprl_pm, "needsdeps:game_v0")
    finally:
        sys.modules.pop("needsdeps", None)


def test_grid_observations_are_flattened_rows(mprl_pm):
    env = make_env(mprl_pm, "pettingzoo.sisl:pursuit_v5(n_pursuers=3, n_evaders=2, max_cycles=5)")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 7 * 7 * 3) and env.observation_space.sizes == (147, 147, 147)


class _Relay:
    """A PettingZoo-style parallel env of two agents where ``runner`` finishes after 2 steps
    and ``walker`` plays 4: each gets 1.0 a step it plays."""

    possible_agents = ["runner", "walker"]
    metadata: dict = {}
    render_mode = None

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents)  # a finished agent is not asked to act
        self.t += 1
        done = {a: (a == "runner" and self.t >= 2) or self.t >= 4 for a in self.agents}
        obs = {a: np.full(2, self.t / 4, np.float32) for a in self.agents}
        rewards = dict.fromkeys(self.agents, 1.0)
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not done[a]]
        return obs, rewards, done, dict.fromkeys(done, False), infos

    def close(self):
        pass


class _RelayEnvs:
    @mprl.hookimpl
    def mprl_make_env(self, env_id):
        return _Relay() if env_id == "relay" else None


def test_an_agent_that_finishes_early_is_masked_out_of_the_rollout_and_the_loss():
    from mprl.testing import plugin_manager
    from mprl_builtin.mappo.algorithm import MAPPOConfig, _prepare, make_model

    pm = plugin_manager(_RelayEnvs())
    ctx = _Ctx(pm, "relay")
    batch = AgentBatch(ctx, n=1, gamma=0.9)
    env = batch.envs[0]
    spec = agent_rollout_spec(env.observation_space, env.action_space, 4, 1)
    slot = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in spec.items()}

    def act(obs):
        return torch.zeros(obs.shape[:2], dtype=torch.int64), torch.zeros(obs.shape[:2])

    batch.rollout(act, None, slot)
    assert slot["alive"][:, 0, 0].tolist() == [1, 1, 0, 0]  # runner: 2 steps, then out
    assert slot["alive"][:, 0, 1].tolist() == [1, 1, 1, 1]
    assert slot["reward"][:, 0, 0].tolist() == [1, 1, 0, 0]
    assert slot["obs"][3, 0, 0].abs().sum() == 0  # a finished agent sees zeros (after its last)
    assert slot["done"][:, 0].tolist() == [0, 0, 0, 1]
    team, length, per_agent = ctx.episodes[0]
    assert (length, per_agent) == (4, {"return_runner": 2.0, "return_walker": 4.0})
    assert team == 3.0  # the agents' mean
    cfg = MAPPOConfig()
    model = make_model(env.observation_space, env.action_space, cfg)
    data = _prepare(cfg, model, {k: t.unsqueeze(1) for k, t in slot.items()})
    assert data["alive"].tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]


def test_per_agent_parameters_give_each_agent_its_own_actor_and_critic():
    result = run_serial(
        "mappo", env="mpe2:simple_spread_v3(N=3, max_cycles=10)", total_steps=200, workers=1,
        config={"envs_per_worker": 2, "n_steps": 10, "epochs": 1, "share_params": False},
    )  # fmt: skip
    model = result.model
    assert len(model.actors) == len(model.critics) == 3
    first, second = (dict(a.named_parameters()) for a in model.actors[:2])
    assert not torch.equal(first["0.weight"], second["0.weight"])  # initialised, learned apart
