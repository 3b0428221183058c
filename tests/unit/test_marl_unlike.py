"""Agents unlike each other: different action counts (``simple_world_comm_v3``'s leader has 20
actions, the others 5) share one ``MultiDiscrete`` whose extra actions are masked, in the
adapter and in mappo's policies (acting, learning, eval, export); and teams from the agents'
names, whose returns are logged and evaluated."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from mpe2 import simple_world_comm_v3

from mprl.errors import UsageError
from mprl.host.envs import make_env
from mprl.lib.marl import AgentBatch, masked_logits
from mprl.spaces import AgentBox, action_mask, team_of, teams_of
from mprl.tools.evaluate import _per_agent
from mprl_builtin.mappo.algorithm import MAPPOConfig, make_model

WORLD = "mpe2:simple_world_comm_v3(max_cycles=5)"
COUNTS = [20, 5, 5, 5, 5, 5]


def test_agents_with_different_action_counts_share_one_masked_multidiscrete(mprl_pm):
    env = make_env(mprl_pm, WORLD)
    twin = simple_world_comm_v3.parallel_env(max_cycles=5)
    assert env.action_space == gym.spaces.MultiDiscrete(COUNTS)
    mask = env.action_mask
    assert mask.shape == (6, 20) and mask[0].all()  # the leader has every action
    assert mask[1:, :5].all() and not mask[1:, 5:].any()  # the others their 5
    np.testing.assert_array_equal(action_mask(env.action_space), mask)
    env.reset(seed=2)
    twin.reset(seed=2)
    action = np.array([17, 4, 0, 1, 2, 3])  # the leader's 17 reaches the env as it is
    obs, _, _, _, info = env.step(action)
    twin_obs, twin_rewards, _, _, _ = twin.step(
        {a: int(action[i]) for i, a in enumerate(twin.possible_agents)}
    )
    np.testing.assert_allclose(obs[0, :34], twin_obs["leadadversary_0"])
    np.testing.assert_allclose(info["agent_rewards"], [twin_rewards[a] for a in twin.agents])


def test_an_action_an_agent_does_not_have_never_reaches_the_env(mprl_pm):
    env = make_env(mprl_pm, WORLD)
    env.reset(seed=0)
    stepped = []
    env.env.step = lambda actions: stepped.append(actions)  # what would reach the env
    with pytest.raises(ValueError, match=r"out of range \(adversary_0: 7 \(it has 5\)\)"):
        env.step(np.array([17, 7, 0, 0, 0, 0]))
    assert stepped == []


def test_one_action_count_for_all_needs_no_mask(mprl_pm):
    env = make_env(mprl_pm, "mpe2:simple_tag_v3")
    assert env.action_space == gym.spaces.MultiDiscrete([5] * 4) and env.action_mask is None
    assert action_mask(gym.spaces.Box(-1, 1, (2, 2))) is None


@pytest.mark.parametrize(
    ("agent", "team"),
    [
        ("adversary_0", "adversary"),
        ("agent_1", "agent"),
        ("leadadversary_0", "leadadversary"),
        ("red_team_12", "red_team"),
        ("speaker", "speaker"),  # no number: its own team
        ("agent_x", "agent_x"),
        ("_3", "_3"),
    ],
)
def test_an_agents_team_is_its_name_before_the_last_number(agent, team):
    assert team_of(agent) == team


def test_teams_keep_their_agents_rows_in_order():
    agents = simple_world_comm_v3.parallel_env().possible_agents
    assert teams_of(agents) == {
        "leadadversary": (0,),
        "adversary": (1, 2, 3),
        "agent": (4, 5),
    }


def _biased(core: str) -> torch.nn.Module:
    """mappo's model for COUNTS whose actors favour the actions only the leader has."""
    obs_space = AgentBox(
        [f"a_{i}" for i in range(6)], [4] * 6, gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
    )
    cfg = MAPPOConfig(hidden=(8,), core=core, core_size=8, share_params=False)
    model = make_model(obs_space, gym.spaces.MultiDiscrete(COUNTS), cfg)
    with torch.no_grad():
        for actor in model.actors:
            head = actor.head if core != "none" else actor[-1]
            head.bias[5:] = 50.0  # unmasked, every agent would pick 5..19
    return model


@pytest.mark.parametrize("core", ["none", "gru"])
def test_masked_actions_are_never_sampled_and_take_no_probability(core):
    torch.manual_seed(0)
    model = _biased(core)
    counts = torch.tensor(COUNTS)
    obs = torch.randn(64, 6, 4)
    if core == "none":
        out = model.policy(obs)
    else:
        out, _, _ = model.step(obs, torch.randn(64, 8), model.initial_state(64))
    dist = model.distribution(out)
    probs = dist.probs
    assert (probs[:, 1:, 5:] == 0).all() and (probs[:, 0, 5:] > 0).all()
    assert torch.isfinite(dist.entropy()).all()
    actions = torch.stack([dist.sample() for _ in range(50)])
    assert (actions < counts).all() and (actions[..., 0] >= 5).any()
    assert (dist.log_prob(actions[0]) > -1e3).all()  # sampled actions: finite log-probs
    # the learner's gradient through the masked logits is finite
    (dist.log_prob(actions[0]).sum() + dist.entropy().sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    for deterministic in (True, False):  # eval's act
        assert (torch.as_tensor(model.act(obs, deterministic)) < counts).all()
    exported = model.export_policy()  # mprl export
    state = [torch.zeros(64, 6, 8)] if core != "none" else []
    greedy = exported(obs, *state)
    greedy = greedy[0] if isinstance(greedy, tuple) else greedy
    assert (greedy < counts).all() and (greedy[:, 0] >= 5).all()
    assert "action_mask" not in model.state_dict()  # checkpoints are as they were


def test_masked_logits_leave_an_unmasked_policy_alone():
    logits = torch.randn(3, 2, 4)
    assert masked_logits(logits, None) is logits


class _Ctx:
    def __init__(self, pm, env_id):
        self.pm, self.env_id, self.episodes = pm, env_id, []

    def make_env(self, index):
        return make_env(self.pm, self.env_id)

    def log_episode(self, ret, length, **values):
        self.episodes.append((ret, length, values))

    def add_steps(self, n):
        pass


def test_each_teams_episode_return_is_logged_beside_each_agents(mprl_pm):
    ctx = _Ctx(mprl_pm, WORLD)
    batch = AgentBatch(ctx, n=1, gamma=0.99)
    rng = np.random.default_rng(0)
    for _ in range(5):
        batch.step(rng.integers(0, 5, size=(1, 6)))
    ((team, length, values),) = ctx.episodes
    assert length == 5
    each = [values[f"return_{a}"] for a in batch.agents]
    assert values["return_team_leadadversary"] == pytest.approx(each[0])
    assert values["return_team_adversary"] == pytest.approx(np.mean(each[1:4]))
    assert values["return_team_agent"] == pytest.approx(np.mean(each[4:]))
    assert team == pytest.approx(np.mean(each))
    spread = _Ctx(mprl_pm, "mpe2:simple_spread_v3(N=2, max_cycles=2)")  # one team: no team keys
    one = AgentBatch(spread, n=1, gamma=0.99)
    one.step(np.zeros((1, 2), np.int64))
    one.step(np.zeros((1, 2), np.int64))
    assert not any(k.startswith("return_team_") for k in spread.episodes[0][2])


def test_eval_tells_each_teams_return_where_there_are_several():
    agents = ("adversary_0", "adversary_1", "agent_0")
    result = _per_agent(agents, [[1.0, 3.0, -2.0], [0.0, 2.0, 4.0]])
    assert result["teams"] == {
        "adversary": {"mean_return": 1.5, "returns": [2.0, 1.0]},
        "agent": {"mean_return": 1.0, "returns": [-2.0, 4.0]},
    }
    assert "teams" not in _per_agent(("agent_0", "agent_1"), [[1.0, 2.0]])


def test_plot_metrics_agents_and_teams_take_their_own_returns():
    from mprl.tools.report import _collect

    record = {"return_adversary_0": 1.0, "return_agent_0": 2.0, "return_team_adversary": 1.0}
    agents: dict = {}
    _collect(agents, record, ["agents"], 10, 1.0)
    teams: dict = {}
    _collect(teams, record, ["teams"], 10, 1.0)
    assert set(agents) == {"return_adversary_0", "return_agent_0"}
    assert set(teams) == {"return_team_adversary"}


# groups: a network per group of agents ------------------------------------------------------

WORLD_AGENTS = (
    "leadadversary_0",
    "adversary_0",
    "adversary_1",
    "adversary_2",
    "agent_0",
    "agent_1",
)


def test_groups_are_the_teams_of_the_names_or_named_groups():
    from mprl_builtin.mappo.groups import model_groups

    assert model_groups("names", True, WORLD_AGENTS) == ((0,), (1, 2, 3), (4, 5))
    named = "hunters:leadadversary_0,adversary_0,adversary_1,adversary_2;prey:agent_1,agent_0"
    assert model_groups(named, True, WORLD_AGENTS) == ((0, 1, 2, 3), (5, 4))
    assert model_groups("", True, WORLD_AGENTS) == ((0, 1, 2, 3, 4, 5),)
    assert model_groups("", False, WORLD_AGENTS[:2]) == ((0,), (1,))


@pytest.mark.parametrize(
    ("groups", "share", "message"),
    [
        ("a:agent_0,agent_9", True, r"group 'a' names agent_9, which the env does not have"),
        ("a:agent_0;b:agent_0", True, r"agent_0 in two groups \('a' too\)"),
        ("a:agent_0", True, r"agents leadadversary_0, .* are in no group"),
        ("names", False, r"set one of them"),
    ],
)
def test_bad_groups_are_refused_naming_the_agents(groups, share, message):
    from mprl_builtin.mappo.groups import model_groups

    with pytest.raises(UsageError, match=message):
        model_groups(groups, share, WORLD_AGENTS)


@pytest.mark.parametrize("groups", ["a:b", "names;x", "a:x,,y", ":x"])
def test_a_groups_setting_that_does_not_parse_is_refused_by_the_config(groups):
    with pytest.raises(ValueError, match=r"give 'names'"):
        MAPPOConfig(groups=groups + ";" if groups == "a:b" else groups)


def _world_space():
    return AgentBox(WORLD_AGENTS, [4] * 6, gym.spaces.Box(-1.0, 1.0, (8,), np.float32))


@pytest.mark.parametrize("core", ["none", "gru"])
def test_each_group_has_its_networks_and_each_agent_is_run_by_its_groups(core):
    torch.manual_seed(0)
    groups = "prey:agent_1,agent_0;hunters:leadadversary_0,adversary_0,adversary_1,adversary_2"
    cfg = MAPPOConfig(hidden=(8,), core=core, core_size=8, groups=groups)
    model = make_model(_world_space(), gym.spaces.MultiDiscrete(COUNTS), cfg)
    assert len(model.actors) == len(model.critics) == 2
    obs, state = torch.randn(3, 6, 4), torch.randn(3, 8)
    ids = torch.eye(6).expand(3, 6, 6)
    net_of = [1, 1, 1, 1, 0, 0]  # the agents' groups' networks
    if core == "none":
        out = model._per_agent(model.actors, obs)
        x = torch.cat([obs, ids], -1)
        for i, g in enumerate(net_of):
            torch.testing.assert_close(out[:, i], model.actors[g](x[:, i]))
    else:
        h = torch.randn(2, 3, 6, 8)
        out, _, after = model.step(obs, state, h)
        x = torch.cat([obs, ids], -1)
        for i, g in enumerate(net_of):
            want, want_h = model.actors[g].step(x[:, i], h[:1, :, i])
            torch.testing.assert_close(masked_logits(want, model.action_mask[i]), out[:, i])
            torch.testing.assert_close(want_h, after[:1, :, i])
        # a replay of a sequence gives what stepping gave
        seq, dones = torch.randn(5, 3, 6, 4), (torch.rand(5, 3) < 0.3).float()
        states = torch.randn(5, 3, 8)
        replay = model.unroll(seq, states, h, dones)
        stepwise = model.unroll_stepwise(seq, states, h, dones)
        for got, want in zip(replay, stepwise, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class _UnlikeBoxes:
    """A parallel env whose two agents' continuous actions differ in shape."""

    possible_agents = ["arm_0", "leg_0"]
    agents: list = []
    metadata: dict = {}

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (2 if agent == "arm_0" else 3,), np.float32)


def test_continuous_actions_of_different_shapes_are_still_refused_naming_each():
    from mprl.lib.marl import AgentEnv

    with pytest.raises(UsageError, match=r"different shapes \(arm_0: \(2,\), leg_0: \(3,\)\)"):
        AgentEnv(_UnlikeBoxes(), "unlike-boxes")
