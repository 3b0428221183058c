"""The plugin manager and hooks, in isolation: fresh managers, plugins registered inline."""

from __future__ import annotations

import json
import sys

import attrs
import gymnasium as gym
import pytest
import torch

import mprl
from mprl.errors import PluginError, UsageError
from mprl.host.envs import make_env
from mprl.host.plugins import get_plugin_manager
from tests.conftest import HERE, cli_here, write_distribution
from tests.plugins.mprl_testplugin import Corridor


@attrs.frozen
class TinyConfig:
    size: int = 3


def tiny_model(obs_space, act_space, config):
    return torch.nn.Linear(4, config.size)


def tiny_worker(ctx):
    pass


def algorithm(name: str = "tiny") -> mprl.Algorithm:
    return mprl.Algorithm(
        name=name, config_cls=TinyConfig, make_model=tiny_model, worker=tiny_worker
    )


class Registers:
    def __init__(self, *algos: mprl.Algorithm) -> None:
        self.algos = algos

    @mprl.hookimpl
    def mprl_register_algorithms(self, register):
        for algo in self.algos:
            register(algo)


def test_inline_plugin_registers_an_algorithm(pm):
    pm.register(Registers(algorithm("tiny")), name="mine")
    plugin_name, algo = pm.algorithm("tiny")
    assert plugin_name == "mine"
    assert algo.config_cls is TinyConfig
    assert {i.name: i.algorithms for i in pm.info()}["mine"] == ("tiny",)


def test_unknown_algorithm_lists_installed(pm):
    pm.register(Registers(algorithm("tiny"), algorithm("other")), name="mine")
    with pytest.raises(
        PluginError, match=r"unknown plugin/algorithm 'nope'; installed: other, tiny"
    ):
        pm.algorithm("nope")


def test_two_plugins_with_the_same_algorithm_name_are_refused(pm):
    pm.register(Registers(algorithm("tiny")), name="first")
    pm.register(Registers(algorithm("tiny"), algorithm("other")), name="second")
    with pytest.raises(PluginError) as e:
        pm.algorithm("tiny")
    assert str(e.value) == (
        "algorithm 'tiny' is registered by more than one plugin: 'first' (registered in code) "
        "and 'second' (registered in code), so none of them is usable; to choose one, block the "
        "other with -p no:first or -p no:second (MPRL_BLOCK_PLUGINS=NAME), or uninstall it"
    )
    assert pm.conflict_messages() == [str(e.value)]
    assert pm.algorithm("other")[0] == "second"  # the rest is usable


def test_a_plugin_name_selects_its_only_algorithm_and_not_one_of_several(pm):
    pm.register(Registers(algorithm("tiny")), name="tiny-plugin")
    pm.register(Registers(algorithm("a"), algorithm("b")), name="pair")
    assert pm.algorithm("tiny-plugin") == pm.algorithm("tiny")
    with pytest.raises(PluginError, match=r"plugin 'pair' registers several algorithms: a, b"):
        pm.algorithm("pair")


def test_registering_something_else_names_plugin_and_hook(pm):
    class Wrong:
        @mprl.hookimpl
        def mprl_register_algorithms(self, register):
            register({"name": "tiny"})

    pm.register(Wrong(), name="wrong-plugin")
    pm.register(Registers(algorithm("tiny")), name="fine")
    assert list(pm.algorithms()) == ["tiny"]  # one broken plugin disables only itself
    with pytest.raises(PluginError, match=r"'wrong-plugin' .* register\(\) with dict"):
        pm.algorithm("wrong-plugin")


def test_a_bad_declaration_in_a_registration_hook_names_the_plugin(pm):
    class Lambda:
        @mprl.hookimpl
        def mprl_register_algorithms(self, register):
            register(
                mprl.Algorithm(
                    name="x", config_cls=TinyConfig, make_model=tiny_model, worker=lambda c: None
                )
            )

    pm.register(Lambda(), name="lambda-plugin")
    with pytest.raises(
        PluginError,
        match=r"^plugin 'lambda-plugin' \(registered in code\) failed to register what it "
        r"provides: algorithm 'x': worker '.*<lambda>' cannot be sent to spawned processes: "
        r"define it with `def` at the top level",
    ):
        pm.algorithm("lambda-plugin")
    with pytest.raises(
        PluginError, match=r"unknown plugin/algorithm 'x'; installed: none; plugin "
    ):
        pm.algorithm("x")  # by the name it meant to register: what failed is said too


def test_a_hook_that_raises_is_reported_with_its_plugin(pm):
    class Raises:
        @mprl.hookimpl
        def mprl_register_algorithms(self, register):
            raise KeyError("oops")

    pm.register(Raises(), name="raiser")
    with pytest.raises(PluginError, match=r"'raiser' .* failed to register .*: KeyError: 'oops'"):
        pm.algorithm("raiser")


def test_misspelt_hook_fails_loudly_naming_the_plugin(pm):
    class Misspelt:
        @mprl.hookimpl
        def mprl_register_algorithm(self, register):
            pass

    pm.register(Misspelt(), name="typo")
    with pytest.raises(
        PluginError, match=r"'typo'.*mprl_register_algorithm.*mprl_register_algorithms"
    ):
        pm.check()


def test_hook_with_unknown_argument_is_rejected_at_registration(pm):
    class BadArgs:
        @mprl.hookimpl
        def mprl_make_env(self, env_name):
            return None

    with pytest.raises(PluginError, match=r"env_name"):
        pm.register(BadArgs(), name="badargs")


def test_make_env_firstresult_plugin_wins_and_builtin_is_fallback(pm):
    class Envs:
        @mprl.hookimpl
        def mprl_make_env(self, env_id, rank):
            return Corridor() if env_id == "Corridor-v0" else None

    pm.register(Envs(), name="envs")
    assert isinstance(make_env(pm, "Corridor-v0"), Corridor)
    cartpole = make_env(pm, "CartPole-v1")
    assert cartpole.spec is not None and cartpole.spec.id == "CartPole-v1"
    cartpole.close()


def test_make_env_wrong_type_names_the_plugin(pm):
    class BadEnv:
        @mprl.hookimpl
        def mprl_make_env(self, env_id):
            return "CartPole-v1"

    pm.register(BadEnv(), name="bad-env")
    with pytest.raises(PluginError, match=r"'bad-env': mprl_make_env returned str"):
        make_env(pm, "CartPole-v1")


def test_unknown_env_id_is_a_usage_error(pm):
    with pytest.raises(UsageError, match=r"unknown gymnasium environment 'NoSuchEnv-v3'"):
        make_env(pm, "NoSuchEnv-v3")


def test_entry_points_load_and_a_broken_one_is_reported_not_raised(installed):
    pm = get_plugin_manager()
    assert pm.algorithm("probe")[0] == "testplugin"
    assert pm.algorithm("a3c")[0] == "a3c"  # the built-in plugin is an entry point too
    (failed,) = [f for f in pm.failed if f.name == "broken"]
    message = failed.message()
    assert "mprl_brokenplugin" in message and "mprl-brokenplugin" in message
    assert "ImportError: needs the frobnicator package" in message
    with pytest.raises(PluginError, match="frobnicator"):
        pm.algorithm("broken")
    assert pm.distribution_of("testplugin") == ("mprl-testplugin", "0.1.0")


def test_blocked_plugin_is_not_loaded(installed, monkeypatch):
    pm = get_plugin_manager(blocked=["testplugin"])
    assert "probe" not in pm.algorithms()
    monkeypatch.setenv("MPRL_BLOCK_PLUGINS", "testplugin,a3c,impala,ppo")
    pm = get_plugin_manager()
    assert not {"probe", "a3c", "impala", "ppo"} & set(pm.algorithms())  # others may be installed
    assert set(pm.blocked_names()) == {"testplugin", "a3c", "impala", "ppo"}


def test_autoload_can_be_disabled(installed, monkeypatch):
    monkeypatch.setenv("MPRL_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert get_plugin_manager().algorithms() == {}


def test_tracing_prints_hook_calls(pm, monkeypatch, capsys):
    monkeypatch.setenv("MPRL_TRACE", "1")
    traced = get_plugin_manager(autoload=False)
    make_env(traced, "CartPole-v1").close()
    assert "mprl_make_env" in capsys.readouterr().err


def test_wrong_algorithm_declarations_are_refused_at_registration():
    with pytest.raises(PluginError, match="lambda"):
        mprl.Algorithm(
            name="x", config_cls=TinyConfig, make_model=tiny_model, worker=lambda ctx: None
        )

    def nested(ctx):
        pass

    with pytest.raises(PluginError, match="top level"):
        mprl.Algorithm(name="x", config_cls=TinyConfig, make_model=tiny_model, worker=nested)

    class NotAttrs:
        pass

    with pytest.raises(PluginError, match="must be an attrs class"):
        mprl.Algorithm(name="x", config_cls=NotAttrs, make_model=tiny_model, worker=tiny_worker)

    @attrs.frozen
    class LocalConfig:
        a: int = 1

    with pytest.raises(PluginError, match="picklable"):
        mprl.Algorithm(name="x", config_cls=LocalConfig, make_model=tiny_model, worker=tiny_worker)

    @attrs.frozen
    class NoDefault:
        a: int

    with pytest.raises(PluginError, match="needs a default for every field"):
        mprl.Algorithm(name="x", config_cls=NoDefault, make_model=tiny_model, worker=tiny_worker)

    with pytest.raises(PluginError, match="Schema"):
        mprl.Algorithm(
            name="x", config_cls=TinyConfig, make_model=tiny_model, worker=tiny_worker, schema={}
        )


def test_supports_checks_the_action_space():
    algo = algorithm()
    assert algo.supports(gym.spaces.Discrete(2))
    assert not algo.supports(gym.spaces.MultiBinary(2))


# -- one name, two distributions: a third-party `dqn` beside the built-in one ------------------

#: what choosing between the two says, wherever one of them is asked for
DQN_CONFLICT = (
    f"plugin 'dqn' is installed by more than one distribution: mprl {mprl.__version__} "
    "(mprl_builtin.dqn) and mprl-dqn 0.1.0 (mprl_dqn), so none of them is loaded; to choose one, "
    "block the other with -p no:mprl:dqn or -p no:mprl-dqn:dqn (MPRL_BLOCK_PLUGINS=DIST:dqn), "
    "or uninstall it"
)


def test_a_plugin_name_two_distributions_install_loads_neither(third_party_dqn):
    pm = get_plugin_manager()
    assert not pm.has_plugin("dqn") and "mprl_dqn" not in sys.modules  # not even imported
    assert pm.plugin_conflicts["dqn"].owners == (
        ("mprl", mprl.__version__, "mprl_builtin.dqn"),
        ("mprl-dqn", "0.1.0", "mprl_dqn"),
    )
    with pytest.raises(PluginError) as err:
        pm.algorithm("dqn")
    assert str(err.value) == DQN_CONFLICT
    assert pm.conflict_messages() == [DQN_CONFLICT]
    assert pm.algorithm("ppo")[0] == "ppo"  # the other plugins are usable
    with pytest.raises(
        PluginError, match=r"unknown plugin/algorithm 'dqn-plus'.*; plugin 'dqn' is"
    ):
        pm.algorithm("dqn-plus")  # what the hidden plugin might have registered


def test_mprl_plugins_shows_the_conflict_and_run_refuses_it_starting_nothing(
    third_party_dqn, tmp_path, capsys
):
    from mprl.tools.cli import main

    assert main(["plugins"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert f"CONFLICT {DQN_CONFLICT}" in listing
    assert not [line for line in listing if line.startswith("dqn ")]  # listed as neither
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plugin_conflicts"]["dqn"] == [
        ["mprl", mprl.__version__, "mprl_builtin.dqn"],
        ["mprl-dqn", "0.1.0", "mprl_dqn"],
    ]
    # a unit test starts no process: the refusal comes before anything would
    code, err = cli_here(capsys, "run", "--plugin", "dqn", "--run-dir", str(tmp_path / "run"))
    assert (code, err) == (2, f"mprl: error: {DQN_CONFLICT}\n")
    assert not (tmp_path / "run").exists()
    with pytest.raises(PluginError, match=r"^plugin 'dqn' is installed by more than one"):
        mprl.run("dqn", run_dir=tmp_path / "run", progress="none")
    assert not (tmp_path / "run").exists()


THIRD_PARTY = ("mprl-dqn", "0.1.0", "mprl_dqn")
BUILT_IN = ("mprl", mprl.__version__, "mprl_builtin.dqn")


@pytest.mark.parametrize(
    ("block", "chosen"),
    [
        ("-p no:mprl:dqn", THIRD_PARTY),
        ("MPRL_BLOCK_PLUGINS=MPRL:dqn", THIRD_PARTY),  # names compare as pip compares them
        ("-p no:mprl-dqn:dqn", BUILT_IN),
        ("MPRL_BLOCK_PLUGINS=mprl_DQN:dqn", BUILT_IN),
    ],
)
def test_blocking_one_distribution_s_plugin_loads_the_other(
    third_party_dqn, monkeypatch, block, chosen
):
    if block.startswith("-p no:"):
        pm = get_plugin_manager(blocked=[block.removeprefix("-p no:")])
    else:
        monkeypatch.setenv("MPRL_BLOCK_PLUGINS", block.partition("=")[2])
        pm = get_plugin_manager()
    dist, version, module = chosen
    plugin, algo = pm.algorithm("dqn")
    assert plugin == "dqn" and pm.plugin_conflicts == {} and pm.conflict_messages() == []
    assert pm.distribution_of("dqn") == (dist, version) and pm.entry_points["dqn"] == module
    assert algo.config_cls.__module__.startswith(module)  # the chosen one's code
    assert ("mprl_dqn" in sys.modules) == (module == "mprl_dqn")  # the other: not imported


def test_the_third_party_s_own_code_runs_and_its_run_records_its_distribution(
    third_party_dqn, tmp_path, capsys
):
    """The bug a user found: the built-in's code ran under the third party's name and version,
    and the third party's own run could not be loaded (``unknown field 'anneal_steps'``)."""
    chosen = get_plugin_manager(blocked=["mprl:dqn"])
    run_dir = tmp_path / "run"
    summary = mprl.run(
        "dqn", plugins=chosen, backend="serial", workers=1, total_steps=100, run_dir=run_dir,
        env="CartPole-v1", progress="none",
    )  # fmt: skip
    assert summary.status == "finished" and summary.env_steps >= 100
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["plugin"], config["plugin_distribution"], config["plugin_version"]) == (
        "dqn",
        "mprl-dqn",
        "0.1.0",
    )
    assert config["config"] == {"anneal_steps": 100}  # the third party's config class
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("third_party_steps" in r for r in records)  # its worker ran
    loaded = mprl.load(run_dir, plugins=chosen)
    assert loaded.data["plugin_distribution"] == "mprl-dqn" and loaded.config.anneal_steps == 100
    # with both installed and neither chosen, loading it says so, naming both
    with pytest.raises(UsageError) as err:
        mprl.load(run_dir)
    assert str(err.value) == (
        f"checkpoint {str(run_dir / 'checkpoints' / 'last.pt')!r} was written by algorithm 'dqn' "
        f"of plugin 'dqn' (distribution 'mprl-dqn' 0.1.0): {DQN_CONFLICT}"
    )
    code, out = cli_here(capsys, "eval", str(run_dir), "--episodes", "1")
    assert (code, out) == (2, f"mprl: error: {err.value}\n")
    code, _ = cli_here(capsys, "eval", str(run_dir), "--episodes", "1", "-p", "no:mprl:dqn")
    assert code == 0


def test_one_algorithm_name_of_two_distributions_is_a_conflict_naming_both(tmp_path, monkeypatch):
    source = (HERE / "plugins" / "third_party_dqn.py").read_text()
    extra = {"mprl_dqn_extra": source}  # plugin dqn-extra, registering an algorithm named dqn
    write_distribution(tmp_path, "mprl-dqn-extra", {"dqn-extra": "mprl_dqn_extra"}, extra)
    monkeypatch.syspath_prepend(str(tmp_path))
    message = (
        f"algorithm 'dqn' is registered by more than one plugin: 'dqn' (mprl {mprl.__version__}) "
        "and 'dqn-extra' (mprl-dqn-extra 0.1.0), so none of them is usable; to choose one, block "
        "the other with -p no:dqn or -p no:dqn-extra (MPRL_BLOCK_PLUGINS=NAME), or uninstall it"
    )
    try:
        pm = get_plugin_manager()
        assert pm.conflict_messages() == [message]
        with pytest.raises(PluginError) as err:
            pm.algorithm("dqn")
        assert str(err.value) == message
        chosen = get_plugin_manager(blocked=["dqn"])
        assert chosen.algorithm("dqn")[0] == "dqn-extra"
        assert chosen.distribution_of("dqn-extra") == ("mprl-dqn-extra", "0.1.0")
    finally:
        sys.modules.pop("mprl_dqn_extra", None)
