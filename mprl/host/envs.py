"""Environments as the host gets them: through the env hooks (``mprl_make_env``,
``mprl_adapt_env``, ``mprl_check_env``, ``mprl_env_workload``), with errors that name the
culprit; the env factory a run's processes use; an env id from a checkpoint trusted or not; and
episodes played with a policy. The environments themselves are the env room's
(:mod:`mprl.environments`, a plugin registered by default) or a plugin's."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pickle
import sysconfig
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from mprl.context import derive_seed
from mprl.envcheck import EnvCheckError, check_first_steps
from mprl.errors import PluginError, UsageError
from mprl.run_types import RunConfig
from mprl.schema import obs_dtype

if TYPE_CHECKING:
    from mprl.host.plugins import PluginManager

#: the core's env plugin (one of :data:`mprl.host.plugins.DEFAULT_PLUGINS`): gymnasium's
#: registry, Atari, MuJoCo, PettingZoo, EnvPool
ENV_PLUGIN = "mprl.environments"


def imports_code(env_id: str) -> bool:
    """Whether making ``env_id`` imports a module first (gymnasium's ``module:Env-v0`` ids)."""
    return ":" in env_id


def _installed(module: str) -> bool:
    """Whether ``module`` is installed in this Python's site-packages (``pip install mpe2``), not
    found in the working directory or on a path a file could point at."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return False
    origin = getattr(spec, "origin", None)
    if not origin:
        return False
    site = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return any(Path(origin).resolve().is_relative_to(Path(p).resolve()) for p in site)


def check_trusted(env_id: str, source: str, given: str | None) -> None:
    """Refuse an env id read from ``source`` (a checkpoint) that would import a module to be
    made, unless the user gave the same id or the module is installed in site-packages (``pip
    install mpe2``): opening a file from elsewhere must not run code."""
    module = env_id.split(":", 1)[0]
    trusted = module.split(".")[0] == "mprl" or _installed(module)  # mprl.lib.pomdp: ours
    if imports_code(env_id) and given != env_id and not trusted:
        raise UsageError(
            f"{source} names the environment {env_id!r}, which imports the Python module "
            f"{module!r} to be made: that runs code from wherever {module!r} is found. If you "
            f"trust it, say so by giving the env yourself: --env {env_id}"
        )


def make_env(
    pm: PluginManager,
    env_id: str,
    *,
    seed: int = 0,
    rank: int = -1,
    index: int = 0,
    render_mode: str | None = None,
) -> gym.Env:
    """Ask the plugins for ``env_id``; the first non-None answer wins (the built-in is last)."""
    return _make(pm, env_id, seed=seed, rank=rank, index=index, render_mode=render_mode)[0]


def _make(
    pm: PluginManager,
    env_id: str,
    *,
    seed: int = 0,
    rank: int = -1,
    index: int = 0,
    render_mode: str | None = None,
) -> tuple[gym.Env, str]:
    """:func:`make_env`'s env, and the name of the plugin that made it; what it returns on its
    first steps is checked (:func:`mprl.envcheck.check_first_steps`)."""
    kwargs = {"seed": seed, "rank": rank, "index": index, "render_mode": render_mode}
    for impl in reversed(pm.hook.mprl_make_env.get_hookimpls()):
        try:
            env = pm.call_one("mprl_make_env", impl.plugin, env_id=env_id, **kwargs)
        except (gym.error.Error, ImportError) as exc:
            if impl.plugin_name == ENV_PLUGIN:
                raise UsageError(f"unknown gymnasium environment {env_id!r}: {exc}") from None
            raise PluginError(f"plugin {impl.plugin_name!r}: mprl_make_env failed: {exc}") from exc
        if env is None:
            continue
        if not isinstance(env, gym.Env):
            try:
                env = pm.hook.mprl_adapt_env(env=env, env_id=env_id) or env
            except UsageError as exc:
                what = f"{type(env).__name__} for {env_id!r}"
                raise PluginError(
                    f"plugin {impl.plugin_name!r}: mprl_make_env returned {what}: {exc}"
                ) from None
        if not isinstance(env, gym.Env):
            raise PluginError(
                f"plugin {impl.plugin_name!r}: mprl_make_env returned {type(env).__name__}, "
                "expected a gymnasium.Env or None"
            )
        return check_first_steps(env, env_id), impl.plugin_name
    raise UsageError(f"no plugin could create environment {env_id!r}")


def try_env(env: gym.Env, env_id: str) -> None:
    """Reset ``env`` (one :func:`make_env` made) and take a step with a random action, in the
    main process before anything starts: what the check of its first steps finds there
    (:class:`mprl.envcheck.EnvCheckError`), or gymnasium's own check of an env's first reset
    and step (an ``AssertionError``), refuses the run (:class:`UsageError`). Anything else the
    env's code raises is left to the workers, which meet it too and report it with its
    traceback."""
    method = "reset"
    try:
        env.reset()
        method = "step"
        env.step(env.action_space.sample())
    except EnvCheckError as exc:
        raise UsageError(str(exc)) from None
    except (AssertionError, gym.error.Error) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"environment {env_id!r}: its first {method} failed: {type(exc).__name__}: {first}"
        ) from None
    except Exception:
        pass


def check_env(pm: PluginManager, run: RunConfig) -> None:
    """Every plugin's ``mprl_check_env`` of ``run``: a :class:`UsageError` refuses the run; any
    other error names its plugin."""
    for impl in reversed(pm.hook.mprl_check_env.get_hookimpls()):
        try:
            pm.call_one("mprl_check_env", impl.plugin, run=run)
        except UsageError:
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin {impl.plugin_name!r}: mprl_check_env failed: {type(exc).__name__}: {exc}"
            ) from exc


def workload(pm: PluginManager, env_id: str) -> str | None:
    """Which workload ``env_id`` is (``"atari"``, ``"mujoco"``, ...: the key of an algorithm's
    ``presets``), as the plugins say; ``None`` when none knows."""
    return pm.hook.mprl_env_workload(env_id=env_id)


class EnvFactory:
    """``factory(env_id, seed=, rank=, index=)``: :func:`make_env` with the run's plugins, for
    :class:`mprl.Context`. It remembers which plugin made each env id in this process; pickled
    into a spawned process, it brings only that plugin there, imported by name, and the core's
    env plugin: a child loads no other plugin, so a broken or slow one costs it nothing. An id
    gymnasium made from an entry of its registry that a plugin added as it was imported is added
    to the child's registry too. An id not made here, or a plugin that cannot be imported by name
    (an object registered in code), gets every installed plugin there (the run's blocked ones
    left out)."""

    def __init__(self, pm: PluginManager) -> None:
        self._pm: PluginManager | None = pm
        self.blocked = tuple(pm.blocked_names())
        #: env id -> (plugin name, what imports it: ``module`` or ``module:attribute``), or
        #: None where the plugin cannot be imported by name
        self.makers: dict[str, tuple[str, str] | None] = {}
        #: env id -> the gymnasium registry's entry its env was made from
        self.specs: dict[str, Any] = {}
        self._children: dict[tuple[str, str] | None, PluginManager] = {}

    def __call__(self, env_id: str, **kwargs: Any) -> gym.Env:
        if self._pm is None:
            return self._in_child(env_id, kwargs)
        env, plugin = _make(self._pm, env_id, **kwargs)
        if env_id not in self.makers:
            self.makers[env_id] = _importable(self._pm, plugin)
            spec = gym.registry.get(getattr(env.spec, "id", None) or "")
            try:
                pickle.dumps(spec)  # it goes to the children with this factory
                self.specs[env_id] = spec
            except Exception:  # an entry with kwargs of its own: the child imports everything
                self.makers[env_id] = None
        return env

    def _in_child(self, env_id: str, kwargs: dict[str, Any]) -> gym.Env:
        pm = self._plugins_for(env_id)
        try:
            return _make(pm, env_id, **kwargs)[0]
        except UsageError:
            spec = self.specs.get(env_id)
            if spec is None or spec.id in gym.registry:
                raise
            gym.registry[spec.id] = spec  # the main process's, added there by a plugin's import
            return _make(pm, env_id, **kwargs)[0]

    def _plugins_for(self, env_id: str) -> PluginManager:
        """In a spawned process: the plugins that made ``env_id`` in the main process."""
        from mprl.host.plugins import get_plugin_manager

        maker = self.makers.get(env_id)
        if maker not in self._children:
            if maker is None:
                pm = get_plugin_manager(blocked=self.blocked)
            else:
                pm = get_plugin_manager(autoload=False, builtins=False, blocked=self.blocked)
                for name, where in {ENV_PLUGIN: ENV_PLUGIN, maker[0]: maker[1]}.items():
                    if not pm.is_blocked(name):
                        pm.register(_load(where), name=name)
            self._children[maker] = pm
        return self._children[maker]

    def __getstate__(self) -> dict[str, Any]:
        state = {"blocked": self.blocked, "makers": self.makers, "specs": self.specs}
        return {**state, "_pm": None, "_children": {}}


def _importable(pm: PluginManager, name: str) -> tuple[str, str] | None:
    """``(name, what imports plugin name)``: its entry point's value, or its module's name."""
    plugin = pm.get_plugin(name)
    if name in pm.entry_points:
        return name, pm.entry_points[name]
    if isinstance(plugin, ModuleType) and plugin.__name__ != "__main__":
        return name, plugin.__name__
    return None


def _load(where: str) -> Any:
    """The object at ``module`` or ``module:attribute.path`` (an entry point's value)."""
    module, _, path = where.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def play_episodes(
    envs: Sequence[gym.Env],
    act: Callable[[torch.Tensor, bool], Any],
    episodes: int,
    deterministic: bool,
    seed: int,
) -> tuple[list[float], list[int]]:
    """Play ``episodes`` whole episodes with ``act(obs_batch, deterministic) -> actions`` (a
    model's ``act``), the ``envs`` stepped together with one batched ``act`` per step; each
    env starts the next unplayed episode when its own ends. Episode ``i`` is reset with a seed
    derived from ``seed`` and ``i``. Returns each episode's return (the raw score where
    ``RecordEpisodeStatistics`` tells it) and length, in episode order.
    """
    steps = playing_episodes(envs, act, episodes, deterministic, seed)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def playing_episodes(
    envs: Sequence[gym.Env],
    act: Callable[[torch.Tensor, bool], Any],
    episodes: int,
    deterministic: bool,
    seed: int,
) -> Generator[None, None, tuple[list[float], list[int]]]:
    """:func:`play_episodes` a step at a time: a generator that yields after each batched step
    and returns what :func:`play_episodes` returns, for a caller that plays in slices (the
    evaluation episodes, between the run's supervision ticks)."""
    returns, lengths = [0.0] * episodes, [0] * episodes
    playing: list[int | None] = [None] * len(envs)  # the episode each env is in
    obs: list[Any] = [None] * len(envs)
    started = 0
    # a recurrent policy's model keeps each env's state: it starts again with each episode
    begin = getattr(getattr(inspect.unwrap(act), "__self__", None), "begin_episode", None)

    def start(j: int) -> None:
        nonlocal started
        playing[j] = started if started < episodes else None
        if begin is not None:
            begin(j, playing[j] is not None)
        if playing[j] is not None:
            obs[j], _ = envs[j].reset(seed=derive_seed(seed, started))
            started += 1

    dtype = obs_dtype(envs[0].observation_space)
    for j in range(len(envs)):
        start(j)
    while active := [j for j, episode in enumerate(playing) if episode is not None]:
        batch = torch.as_tensor(np.stack([obs[j] for j in active]), dtype=dtype)
        for j, action in zip(active, act(batch, deterministic), strict=True):
            obs[j], reward, terminated, truncated, info = envs[j].step(action)
            episode = playing[j]
            returns[episode] += float(reward)
            lengths[episode] += 1
            if terminated or truncated:
                if "episode" in info:  # the raw score, under a wrapper that clips rewards
                    returns[episode] = float(info["episode"]["r"])
                start(j)
        yield
    return returns, lengths
