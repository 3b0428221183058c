"""The CLI as a user runs it: a subprocess, exit codes, messages, the run directory."""

from __future__ import annotations

import re

import pytest

from tests.conftest import (
    cli_here,
)

#: the installed plugins a message lists: the built-ins and this suite's, in order, with any
#: others installed beside them (the examples, a user's, a broken one) in their places
BUILT_IN = ("a3c", "docs-dqn", "dqn", "impala", "ippo", "mappo", "ppo", "probe", "sac")
LISTED = "installed: " + ", ".join(rf"(?:[\w.-]+, )*?{re.escape(n)}" for n in BUILT_IN) + r"\b"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plugin", "nope"], r"unknown plugin/algorithm 'nope'; " + LISTED),
        (["--plugin", "a3c", "--env", "NoSuchEnv-v3"], r"unknown gymnasium environment 'NoSuchEnv-v3'"),
        (["--plugin", "a3c", "--env", "Switches-v0"], r"'a3c' does not support the action space of 'Switches-v0' \(MultiBinary\); it supports: Discrete, Box"),
        (["--plugin", "a3c", "--set", "lr=-1"], r"a3c config: field 'lr': 'lr' must be > 0.0: -1.0"),
        (["--plugin", "a3c", "--set", "lrr=0.1"], r"unknown field 'lrr'; known fields: .*lr"),
        (["--plugin", "a3c", "--set", "n_steps=many"], r"field 'n_steps' expects int, got 'many'"),
        (["--plugin", "a3c", "--workers", "0"], r"field 'workers': 'workers' must be >= 1: 0"),
        (["--plugin", "a3c", "--workers", "two"], r"run option: field 'workers' expects int, got 'two'"),
        (["--plugin", "broken"], r"entry point broken = mprl_brokenplugin in distribution mprl-brokenplugin 0.1.0\) failed to import: ImportError: needs the frobnicator"),
        (["--plugin", "a3c", "-p", "no:a3c"], r"plugin 'a3c' is blocked"),
        ([], r"run needs --plugin NAME \(or --resume RUN_DIR\); " + LISTED),
        # the second fault matrix, case 9: values that crashed a run or a worker
        (["--plugin", "a3c", "--seed", "18446744073709551616"], r"field 'seed': 'seed' must be <= 4294967295"),
        (["--plugin", "a3c", "--seed", "1e30"], r"field 'seed' expects int, got 1e\+30"),
        (["--plugin", "a3c", "--torch-threads", "100000"], r"field 'torch_threads': 'torch_threads' must be <= 256"),
        (["--plugin", "a3c", "--set", "lr=inf"], r"a3c config: field 'lr' must be a finite number, got inf"),
        (["--plugin", "a3c", "--set", "entropy_coef=nan"], r"field 'entropy_coef' must be a finite number, got nan"),
        (["--plugin", "ppo", "--set", "n_steps=1e30"], r"ppo config: field 'n_steps' expects int, got 1e\+30"),
        (["--plugin", "a3c", "--set", "hidden=[100000,100000]"], r"its model has 20,001,500,003 parameters \(74\.5 GiB\).*Make it smaller"),
        # case 10: an observation space the built-in MLPs cannot take
        (["--plugin", "impala", "--env", "Rooms-v0"], r"'impala' does not support the observation space of 'Rooms-v0' \(Dict\); it supports: Box; flatten it with a wrapper \(gymnasium.wrappers.FlattenObservation\)"),
        # multi-agent envs: the plugin and the env must agree on agents; AEC-only envs refused
        (["--plugin", "ppo", "--env", "mpe2:simple_spread_v3"], r"algorithm 'ppo' takes single-agent environments, and 'mpe2:simple_spread_v3' has 3 agents \(agent_0, agent_1, agent_2\): run a multi-agent algorithm \(--plugin mappo or ippo"),
        (["--plugin", "mappo", "--env", "CartPole-v1"], r"algorithm 'mappo' takes multi-agent environments \(PettingZoo's parallel API, e.g. --env mpe2:simple_spread_v3\), and 'CartPole-v1' has one agent"),
        (["--plugin", "mappo", "--env", "mpe2:simple_spread_v3(N=two)"], r"environment 'mpe2:simple_spread_v3\(N=two\)': its arguments must be key=value with Python literals"),
        (["--plugin", "mappo", "--env", "mpe2:simple_spread_v3(bogus=1)"], r"environment 'mpe2:simple_spread_v3\(bogus=1\)' cannot be made with bogus=1: TypeError: .*unexpected keyword argument 'bogus'"),
        (["--plugin", "a3c", "--set", "core=lstm"], r"unknown field 'core'"),
        # case 12: a missing module of a module:Env id is a usage error
        (["--plugin", "a3c", "--env", "no_such_module_xyz:Foo-v0"], r"unknown gymnasium environment 'no_such_module_xyz:Foo-v0': No module named 'no_such_module_xyz'"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_clear_line_and_starts_nothing(
    installed, tmp_path, capsys, args, message
):
    run_dir = tmp_path / "run"
    code, stderr = cli_here(capsys, "run", *args, "--run-dir", str(run_dir))
    assert code == 2, stderr
    assert re.search(message, stderr), stderr
    assert "Traceback" not in stderr
    assert not run_dir.exists()


def test_unreadable_config_files_name_the_file(installed, tmp_path, capsys):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"lr = 0.01\n\xff\xfe")
    for path, message in ((binary, "is not UTF-8 text"), (tmp_path, "is a directory")):
        code, err = cli_here(capsys, "run", "--plugin", "a3c", "--config", str(path))
        assert code == 2 and f"config file '{path}' {message}" in err and "Traceback" not in err
