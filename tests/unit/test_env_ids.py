"""An env id with arguments (``CartPole-v1(max_episode_steps=100)``,
``mpe2:simple_spread_v3(N=3)``) that cannot be read, or that the env refuses, is one line naming
the env and what is wrong, exit 2, nothing started: the CLI in this process."""

from __future__ import annotations

import re

import pytest

from mprl.environments import split_env_id
from mprl.errors import UsageError
from tests.conftest import cli_here


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        # the argument list, as mprl reads it
        ("CartPole-v1(x=1), (1)", r"its arguments must be one list in parentheses at the end, e.g. CartPole-v1\(N=5"),
        ("CartPole-v1(max_episode_steps=5) (x=1)", "its arguments must be one list in parentheses at the end"),
        ("CartPole-v1((max_episode_steps=5)", r"its parentheses do not pair up \(2 '\(' and 1 '\)'\)"),
        ("CartPole-v1(max_episode_steps=5))", r"its parentheses do not pair up \(1 '\(' and 2 '\)'\)"),
        ("CartPole-v1(max_episode_steps=5", "keyword arguments go in parentheses at the end"),
        ("CartPole-v1(max_episode_steps=5)x", "keyword arguments go in parentheses at the end"),
        ("(max_episode_steps=5)", "no environment id before its arguments"),
        ("CartPole-v1(5)", "name each argument \\(key=value\\); 5 has no name"),
        ("CartPole-v1(*steps)", r"name each argument \(key=value\); \*steps has no name"),
        ("CartPole-v1(**{'max_episode_steps': 5})", r"\*\*\{'max_episode_steps': 5\} has no name"),
        ("CartPole-v1(max_episode_steps=5, max_episode_steps=6)", "argument 'max_episode_steps' is given twice"),
        ("CartPole-v1(max_episode_steps=int('5'))", r"with Python literals .*: max_episode_steps=int\('5'\) is not one"),
        ("CartPole-v1(max_episode_steps=five)", "max_episode_steps=five is not one"),
        ("CartPole-v1(max_episode_steps=)", "with Python literals .*: invalid syntax"),
        # the env's own word on the arguments it was given
        ("CartPole-v1(x=1)", r"cannot be made with x=1: TypeError: .*unexpected keyword argument 'x'"),
        ("CartPole-v1(max_episode_steps=-5)", r"cannot be made with max_episode_steps=-5: ValueError: .*max_episode_steps.* positive"),
        ("mpe2:simple_spread_v3(N=0)", r"cannot be made with N=0: ValueError: zero-size array"),
        ("mpe2:simple_spread_v3(N=-1)", r"cannot be made with N=-1: ValueError"),
        ("mpe2:simple_spread_v3(N=2.5)", r"cannot be made with N=2.5: TypeError: 'float' object cannot be interpreted as an integer"),
        ("mpe2:simple_spread_v3(bogus=1)", "cannot be made with bogus=1: TypeError: .*unexpected keyword argument 'bogus'"),
    ],
)  # fmt: skip
def test_bad_env_arguments_are_one_line_naming_the_env_exit_2_and_start_nothing(
    tmp_path, capsys, env_id, message
):
    run_dir = tmp_path / "run"
    plugin = "mappo" if env_id.startswith("mpe2:") else "a3c"
    code, stderr = cli_here(capsys, "run", "--plugin", plugin, "--env", env_id, "--run-dir",
                            str(run_dir))  # fmt: skip
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mprl: error: environment {env_id!r}"), stderr
    assert re.search(message, lines[0]), stderr
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("env_id", "name", "kwargs"),
    [
        ("CartPole-v1()", "CartPole-v1", {}),
        ("CartPole-v1 (max_episode_steps=5,)", "CartPole-v1", {"max_episode_steps": 5}),
        ("Foo-v0(name='a(b', other=\"c)d\")", "Foo-v0", {"name": "a(b", "other": "c)d"}),
        ("Foo-v0(t=[1, (2, 3)], d={'k': -1.5}, n=None)", "Foo-v0", {"t": [1, (2, 3)], "d": {"k": -1.5}, "n": None}),
    ],
)  # fmt: skip
def test_good_argument_lists_are_read_as_python_literals(env_id, name, kwargs):
    assert split_env_id(env_id) == (name, kwargs)


def test_an_argument_list_is_never_evaluated(tmp_path):
    marker = tmp_path / "ran"
    env_id = f"CartPole-v1(x=open({str(marker)!r}, 'w'))"
    with pytest.raises(UsageError, match="is not one"):
        split_env_id(env_id)
    assert not marker.exists()
