"""The env factory a run's processes get (``ctx.make_env``): pickled as a spawned process gets
it, it imports only the plugin that made the run's env in the main process (and the core's env
plugin), never every installed plugin; and the env hooks the host asks through."""

from __future__ import annotations

import pickle
import sys
import textwrap

import gymnasium as gym
import pytest

import mprl
from mprl.errors import PluginError, UsageError
from mprl.host.envs import ENV_PLUGIN, EnvFactory, check_env, make_env, workload
from mprl.host.plugins import get_plugin_manager
from mprl.testing import plugin_manager
from tests.conftest import write_distribution

#: a plugin that has nothing to do with the run: it notes each process that imports it, then
#: fails to import (as a plugin whose dependency is missing does)
SPY = textwrap.dedent("""\
    import os

    with open(os.environ["MPRL_SPY_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    raise RuntimeError("the spy is broken")
""")


@pytest.fixture
def spy(installed, tmp_path, monkeypatch):
    """The test plugins (``Corridor-v0`` is ``testplugin``'s) and the spy installed; the file
    the spy writes to."""
    root = tmp_path / "spy-site"
    root.mkdir()
    write_distribution(root, "mprl-spy", {"spy": "mprl_spy"}, {"mprl_spy": SPY})
    monkeypatch.syspath_prepend(str(root))
    marks = tmp_path / "imports.txt"
    monkeypatch.setenv("MPRL_SPY_FILE", str(marks))
    return marks


def test_a_child_imports_only_the_plugin_that_made_the_env(spy, monkeypatch):
    pm = get_plugin_manager()  # the main process: every installed plugin, the spy failing
    assert spy.read_text().count("\n") == 1 and "spy" in {f.name for f in pm.failed}
    factory = EnvFactory(pm)
    assert type(factory("Corridor-v0").unwrapped).__name__ == "Corridor"
    assert type(factory("CartPole-v1", seed=1).unwrapped).__name__ == "CartPoleEnv"
    assert factory("OldStyle-v0").spec.id == "OldStyle-v0"  # testplugin registers it on import
    assert factory.makers == {
        "Corridor-v0": ("testplugin", "mprl_testplugin"),
        "CartPole-v1": (ENV_PLUGIN, ENV_PLUGIN),
        "OldStyle-v0": (ENV_PLUGIN, ENV_PLUGIN),  # gymnasium made it, from its registry
    }
    spy.unlink()

    child = pickle.loads(pickle.dumps(factory))  # what a spawned worker unpickles
    env = child("Corridor-v0", seed=3, rank=0, index=1)
    assert type(env.unwrapped).__name__ == "Corridor" and env.observation_space.shape == (1,)
    assert child("CartPole-v1", rank=1).spec.id == "CartPole-v1"
    monkeypatch.delitem(gym.registry, "OldStyle-v0")  # as in a process that never imported it
    assert type(child("OldStyle-v0").unwrapped).__name__ == "Corridor"  # the entry came along
    assert not spy.exists()  # no process but the main one imported the spy
    loaded = {
        key: sorted(n for n, _ in pm_.list_name_plugin()) for key, pm_ in child._children.items()
    }
    assert loaded == {
        ("testplugin", "mprl_testplugin"): sorted([ENV_PLUGIN, "testplugin"]),
        (ENV_PLUGIN, ENV_PLUGIN): [ENV_PLUGIN],
    }


def test_an_env_id_the_main_process_never_made_gets_every_plugin_in_a_child(spy):
    child = pickle.loads(pickle.dumps(EnvFactory(get_plugin_manager())))
    spy.unlink()
    assert type(child("Switches-v0").unwrapped).__name__ == "Switches"  # found all the same
    assert spy.exists()  # by loading every installed plugin, as before


def test_an_env_plugin_registered_in_code_as_an_object_is_looked_for_everywhere(pm):
    class Envs:
        @mprl.hookimpl
        def mprl_make_env(self, env_id):
            return gym.make("CartPole-v1") if env_id == "Pole-v0" else None

    pm.register(Envs(), name="envs")
    factory = EnvFactory(pm)
    factory("Pole-v0")
    assert factory.makers == {"Pole-v0": None}  # not importable by name: no shortcut


def test_the_env_hooks_the_host_asks_name_the_plugin_that_failed(monkeypatch):
    class Checks:
        @mprl.hookimpl
        def mprl_check_env(self, run):
            if run.env == "Bad-v0":
                raise KeyError("oops")

        @mprl.hookimpl
        def mprl_env_workload(self, env_id):
            return "corridors" if env_id.startswith("Corridor") else None

    pm = plugin_manager()
    pm.register(Checks(), name="checks")
    check_env(pm, mprl.RunConfig(env="CartPole-v1"))
    with pytest.raises(
        PluginError, match=r"plugin 'checks': mprl_check_env failed: KeyError: 'oops'"
    ):
        check_env(pm, mprl.RunConfig(env="Bad-v0"))
    monkeypatch.setitem(sys.modules, "envpool", None)  # not installed
    with pytest.raises(UsageError, match=r"--env-batch envpool: EnvPool is not installed"):
        check_env(pm, mprl.RunConfig(env="CartPole-v1", env_batch="envpool"))  # the env room's
    assert workload(pm, "Corridor-v0") == "corridors"
    assert workload(pm, "ALE/Pong-v5") == "atari" and workload(pm, "CartPole-v1") is None


def test_a_value_no_plugin_adapts_is_refused_naming_the_plugin():
    class Odd:
        @mprl.hookimpl
        def mprl_make_env(self, env_id):
            return object() if env_id == "Odd-v0" else None

    pm = plugin_manager(Odd())
    with pytest.raises(PluginError, match=r"mprl_make_env returned object, expected a gymnasium"):
        make_env(pm, "Odd-v0")
