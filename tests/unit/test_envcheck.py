"""What an env returns on its first steps is checked where every env comes from (the host's env
factory; the PettingZoo adapter agent by agent), naming the env, the field, the value and what
was expected; then the env's own methods are back. What the main process's one env shows
before the start refuses the run (exit 2, one line); the runs that meet it in a worker are in
tests/integration/test_faults_envs.py."""

from __future__ import annotations

import copy
import pickle
import re

import gymnasium as gym
import pytest

from mprl import timeline
from mprl.envcheck import FIRST_STEPS, EnvCheckError
from mprl.host.envs import make_env
from tests import faulty_envs
from tests.conftest import cli_here

SPACE = re.escape(
    "float32 numbers of shape (3,) (its observation space Box(-1.0, 1.0, (3,), float32))"
)

#: fault -> what the message says of it after "its "
SAID = {
    "nan_obs": rf"observation AT holds nan at index \[1\] \(\[ 0\. nan  ?0\.\]\); expected finite {SPACE}",
    "inf_obs": rf"observation AT holds -inf at index \[2\] .*; expected finite {SPACE}",
    "obs_shape": rf"observation AT has shape \(4,\) \(\[0\. 0\. 0\. 0\.\]\); expected {SPACE}",
    "obs_text": rf"observation AT is \['a' 'b' 'c'\] \(ndarray of <U1\); expected {SPACE}",
    "nan_reward": r"reward AT is nan; expected a finite number",
    "inf_reward": r"reward AT is inf; expected a finite number",
    "str_reward": r"reward AT is '1\.0' \(str\); expected a number",
    "array_reward": r"reward AT is \[1\. 1\.\] \(ndarray of shape \(2,\)\); expected a number",
    "none_terminated": r"terminated AT is None \(NoneType\); expected a bool",
    "list_info": r"info AT is \[\] \(list\); expected a dict",
}  # fmt: skip

#: the faults that a reset can return too
AT_RESET = ("nan_obs", "inf_obs", "obs_shape", "obs_text", "list_info")


def faulty(fault: str, at: int) -> str:
    return f"tests.faulty_envs:Faulty-v0(fault={fault!r}, at={at})"


def said(env_id: str, fault: str, at: int) -> str:
    when = "at reset" if at == 0 else f"at step {at}"
    return rf"environment {re.escape(repr(env_id))}: its " + SAID[fault].replace("AT", when)


@pytest.mark.parametrize("fault", sorted(SAID))
def test_an_env_returning_what_no_env_should_is_named_with_the_field_and_the_value(mprl_pm, fault):
    env_id = faulty(fault, 3)
    env = make_env(mprl_pm, env_id)
    env.reset(seed=1)
    env.step(0)
    env.step(1)
    with pytest.raises(EnvCheckError) as caught:
        env.step(0)
    message = str(caught.value)
    assert re.fullmatch(said(env_id, fault, 3), message), message
    assert "\n" not in message


@pytest.mark.parametrize("fault", [f for f in AT_RESET if f != "list_info"])
def test_a_reset_is_checked_too(mprl_pm, fault):
    env_id = faulty(fault, 0)
    env = make_env(mprl_pm, env_id)
    with pytest.raises(EnvCheckError, match=said(env_id, fault, 0)):
        env.reset()  # (a list for info: gymnasium's own checker refuses a first reset first)


def test_after_its_first_steps_an_env_steps_with_its_own_methods_and_is_no_longer_checked(
    mprl_pm,
):
    env = make_env(mprl_pm, faulty("nan_reward", FIRST_STEPS + 1))
    assert {"reset", "step"} <= set(vars(env))  # watched, on the instance
    env.reset()
    for _ in range(FIRST_STEPS):
        env.step(0)
    assert "step" not in vars(env) and "reset" not in vars(env)
    assert type(env).step.__get__(env) == env.step  # the class's own method again
    _, reward, *_ = env.step(0)  # the fault after the checked steps: not looked at
    assert reward != reward  # nan


def test_steps_are_counted_across_episodes(mprl_pm):
    env = make_env(mprl_pm, "CartPole-v1(max_episode_steps=2)")
    env.reset(seed=0)
    for step in range(1, FIRST_STEPS + 1):
        assert "step" in vars(env)
        *_, truncated, _ = env.step(0)
        if truncated:
            assert step % 2 == 0
            env.reset()
    assert "step" not in vars(env)


def test_a_copy_of_a_watched_env_checks_itself_not_the_original(mprl_pm):
    env = make_env(mprl_pm, faulty("inf_reward", 2))
    env.reset(seed=0)
    env.step(0)
    for twin in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        with pytest.raises(EnvCheckError, match="reward at step 2 is inf"):
            twin.step(0)
    with pytest.raises(EnvCheckError, match="reward at step 2 is inf"):
        env.step(0)  # the original took one step of its own before: its second


def test_a_wrapper_put_around_the_check_keeps_working_after_it(mprl_pm, monkeypatch, tmp_path):
    """``ctx.make_env`` wraps ``step`` once more with a timeline (``MPRL_TIMELINE``)."""
    monkeypatch.setenv(timeline.VARIABLE, str(tmp_path / "timeline.jsonl"))
    env = make_env(mprl_pm, "CartPole-v1")
    timeline.on_first_call(env, "step", "env-step")
    env.reset(seed=0)
    for _ in range(FIRST_STEPS + 2):
        env.step(0)
    assert "step" not in vars(env)
    assert (tmp_path / "timeline.jsonl").read_text().count("env-step") == 1


@pytest.mark.parametrize(
    ("plugin", "env_id", "message"),
    [
        *(("a3c", faulty(f, 1), said(faulty(f, 1), f, 1)) for f in sorted(SAID) if f != "list_info"),
        *(("a3c", faulty(f, 0), said(faulty(f, 0), f, 0)) for f in AT_RESET if f != "list_info"),
        # gymnasium's own checker (gym.make's) looks at the first reset and step first
        ("a3c", faulty("list_info", 0), r": its first reset failed: AssertionError: .*not a dictionary"),
        ("a3c", faulty("list_info", 1), r": its first step failed: AssertionError: .*must be a python dictionary"),
        ("mappo", "tests:faulty_envs(fault='nan_obs', at=0)",
         r"its observation of agent 'agent_1' at reset holds nan at index \[1\]"),
        ("mappo", "tests:faulty_envs(fault='str_reward', at=1)",
         r"its reward of agent 'agent_1' at step 1 is '1\.0' \(str\); expected a number"),
        ("mappo", "tests:faulty_envs(fault='obs_shape', at=1)",
         rf"its observation of agent 'agent_1' at step 1 has shape \(4,\) .*; expected {SPACE}"),
    ],
)  # fmt: skip
def test_what_the_main_processs_env_returns_first_refuses_the_run_in_one_line(
    tmp_path, capsys, plugin, env_id, message
):
    run_dir = tmp_path / "run"
    code, stderr = cli_here(capsys, "run", "--plugin", plugin, "--env", env_id, "--run-dir",
                            str(run_dir))  # fmt: skip
    assert code == 2, stderr
    *before, line = stderr.strip().splitlines()
    assert line.startswith(f"mprl: error: environment {env_id!r}: its "), stderr
    # one line of mprl's; gymnasium's own checker (gym.make's) may warn before it
    assert all("passive_env_checker.py" in x or x.startswith("  logger.") for x in before), stderr
    assert re.search(message, line), stderr
    assert "Traceback" not in stderr and "probability tensor" not in stderr
    assert not run_dir.exists()


def test_the_test_envs_are_good_envs_without_a_fault(mprl_pm):
    for env_id in ("tests.faulty_envs:Faulty-v0", "tests:faulty_envs"):
        env = make_env(mprl_pm, env_id)
        env.reset(seed=0)
        for _ in range(2 * faulty_envs.LENGTH):
            *_, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        assert "step" not in vars(env)
        assert isinstance(env, gym.Env)
