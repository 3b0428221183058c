"""Environments through the ``mprl_make_env`` hook, with errors that name the culprit; and the
built-in implementation of that hook (gymnasium's registry), a plugin registered by default."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sysconfig
import warnings
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from mprl.context import derive_seed
from mprl.errors import PluginError, UsageError
from mprl.hookspecs import hookimpl
from mprl.schema import obs_dtype

if TYPE_CHECKING:
    from mprl.host.plugins import PluginManager


#: what installs the Atari games (ale-py ships the ROMs; the preprocessing resizes with OpenCV)
ATARI_EXTRA = 'pip install "mprl[atari]"'
#: what installs the MuJoCo physics of gymnasium's MuJoCo envs
MUJOCO_EXTRA = 'pip install "mprl[mujoco]"'


@hookimpl(trylast=True)
def mprl_make_env(env_id: str, render_mode: str | None) -> gym.Env:
    env_id, kwargs = split_env_id(env_id)
    if render_mode is not None:  # old envs take none
        kwargs["render_mode"] = render_mode
    parallel = pettingzoo_module(env_id)
    if parallel is not None:
        return make_parallel(env_id, parallel, kwargs)
    if is_atari(env_id):
        return make_atari(env_id, **kwargs)
    try:
        if workload(env_id) == "mujoco":
            _mujoco_warnings_to_python()
        return gym.make(env_id, **kwargs)
    except (gym.error.DependencyNotInstalled, ImportError) as exc:
        # gymnasium says DependencyNotInstalled; a module of it imported earlier, an ImportError
        if "mujoco" in str(exc).lower():
            raise UsageError(f"environment {env_id!r} runs on MuJoCo: {MUJOCO_EXTRA}") from None
        raise


def split_env_id(env_id: str) -> tuple[str, dict[str, Any]]:
    """``"mpe2:simple_spread_v3(N=5, max_cycles=50)"`` -> the id and the env's keyword
    arguments (Python literals: numbers, strings, booleans, None, tuples); an id without
    parentheses has none. A bad argument list is a :class:`UsageError` naming it."""
    name, paren, rest = env_id.partition("(")
    if not paren:
        return env_id, {}
    where = f"environment {env_id!r}"
    if not rest.endswith(")"):
        raise UsageError(f"{where}: keyword arguments go in parentheses at the end, e.g. "
                         f"{name.strip()}(N=5, max_cycles=50)")  # fmt: skip
    try:
        call = ast.parse(f"f({rest}", mode="eval").body
        assert isinstance(call, ast.Call)
        if call.args:
            raise UsageError(f"{where}: name each argument (key=value)")
        return name.strip(), {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except (SyntaxError, ValueError) as exc:
        raise UsageError(
            f"{where}: its arguments must be key=value with Python literals (numbers, "
            f"'strings', True/False, None): {exc}"
        ) from None


def pettingzoo_module(env_id: str) -> Any:
    """The module of a PettingZoo env named ``package:env`` (``mpe2:simple_spread_v3``,
    ``pettingzoo.sisl:multiwalker_v9``), or ``None`` when ``env_id`` names none (a gymnasium
    ``module:Env-v0`` id is gymnasium's)."""
    package, colon, name = env_id.partition(":")
    if not colon or not name.isidentifier():
        return None
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ImportError as exc:
        if exc.name is None or f"{package}.{name}".startswith(exc.name):
            return None  # no such module: gymnasium's id, or a typo gymnasium reports
        raise UsageError(
            f"environment {env_id!r} needs the package {exc.name!r}, which is not installed: "
            f"pip install {exc.name.split('.')[0]} (or the env family's extra, e.g. "
            f'pip install "pettingzoo[{package.split(".")[-1]}]")'
        ) from None
    return module if hasattr(module, "parallel_env") or hasattr(module, "env") else None


def make_parallel(env_id: str, module: Any, kwargs: dict[str, Any]) -> gym.Env:
    """The PettingZoo env ``module.parallel_env(**kwargs)`` as one gymnasium env
    (:class:`mprl.lib.marl.AgentEnv`); an AEC-only module is refused, saying how to convert."""
    from mprl.lib.marl import AEC_FIX, AgentEnv

    if not hasattr(module, "parallel_env"):
        raise UsageError(f"environment {env_id!r} has only PettingZoo's AEC API: {AEC_FIX}")
    try:
        env = module.parallel_env(**kwargs)
    except TypeError as exc:
        raise UsageError(f"environment {env_id!r}: {exc}") from None
    return AgentEnv(env, env_id)


def _mujoco_warnings_to_python() -> None:
    """MuJoCo's warnings through Python's ``warnings`` (shown once), instead of MuJoCo's own
    way: printed, and appended to ``MUJOCO_LOG.TXT`` in the working directory of the run."""
    try:
        import mujoco
    except ImportError:
        return  # gymnasium says what is missing
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_warn)


def _warn(message: str) -> None:
    if "deprecated" in message:
        return  # in an env's model file (gymnasium's own have one): not the user's to act on
    warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` names an Atari game of ale-py (``ALE/Pong-v5``, ``PongNoFrameskip-v4``,
    ``Pong-v4``), installed or not."""
    if env_id.startswith("ALE/") or env_id.endswith(("NoFrameskip-v4", "NoFrameskip-v0")):
        return True
    spec = gym.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def workload(env_id: str) -> str | None:
    """``"atari"`` or ``"mujoco"`` when ``env_id`` is one of those (an :class:`Algorithm`'s
    ``presets`` are keyed so), else ``None``."""
    if is_atari(env_id):
        return "atari"
    spec = gym.registry.get(env_id)
    if spec is not None and str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        return "mujoco"
    return None


def _clip_reward(reward: Any) -> float:
    return float(np.sign(reward))


def make_atari(env_id: str, **kwargs: Any) -> gym.Env:
    """An Atari game with the standard preprocessing of DQN and its successors (as rl-zoo and
    cleanrl have it): up to 30 no-op starts, 4 frames skipped per step (rewards summed, the last
    two frames max-pooled), grey 84x84 uint8 frames, 4 of them stacked (``(4, 84, 84)``), and
    rewards clipped to their sign for learning. ``RecordEpisodeStatistics`` sits below the
    clipping, so the episode returns mprl logs are the raw game score. ``ALE/*-v5`` games keep
    their sticky actions (repeat probability 0.25), the ``NoFrameskip-v4`` ones have none."""
    try:
        import ale_py

        gym.register_envs(ale_py)
        env = gym.make(env_id, frameskip=1, **kwargs)  # the preprocessing skips frames itself
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False,
            grayscale_obs=True, scale_obs=False,
        )  # fmt: skip
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        missing = exc.name if isinstance(exc, ImportError) else "opencv-python"
        raise UsageError(
            f"environment {env_id!r} is an Atari game, and {missing} is not installed: "
            f"{ATARI_EXTRA}"
        ) from None
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.TransformReward(env, _clip_reward)
    return gym.wrappers.FrameStackObservation(env, 4)


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
    kwargs = {
        "env_id": env_id, "seed": seed, "rank": rank, "index": index, "render_mode": render_mode,
    }  # fmt: skip
    for impl in reversed(pm.hook.mprl_make_env.get_hookimpls()):
        try:
            env = pm.call_one("mprl_make_env", impl.plugin, **kwargs)
        except (gym.error.Error, ImportError) as exc:
            if impl.plugin_name == __name__:
                raise UsageError(f"unknown gymnasium environment {env_id!r}: {exc}") from None
            raise PluginError(f"plugin {impl.plugin_name!r}: mprl_make_env failed: {exc}") from exc
        if env is None:
            continue
        env = _as_gym(env, env_id, impl.plugin_name)
        if not isinstance(env, gym.Env):
            raise PluginError(
                f"plugin {impl.plugin_name!r}: mprl_make_env returned {type(env).__name__}, "
                "expected a gymnasium.Env or None"
            )
        return env
    raise UsageError(f"no plugin could create environment {env_id!r}")


def _as_gym(env: Any, env_id: str, plugin: str) -> Any:
    """A PettingZoo env a plugin returned, as mprl takes it: a parallel one adapted, an AEC
    one refused (saying how to convert it)."""
    from mprl.lib import marl

    if marl.is_aec(env):
        raise PluginError(
            f"plugin {plugin!r}: mprl_make_env returned the PettingZoo AEC env "
            f"{type(env).__name__} for {env_id!r}: {marl.AEC_FIX}"
        )
    return marl.AgentEnv(env, env_id) if marl.is_parallel_env(env) else env


class EnvFactory:
    """``factory(env_id, seed=, rank=, index=)``: :func:`make_env` with the run's plugins, for
    :class:`mprl.Context`. Pickled into a spawned process, it builds a plugin manager there on
    first use (installed plugins, the run's blocked ones left out)."""

    def __init__(self, pm: PluginManager) -> None:
        self._pm: PluginManager | None = pm
        self.blocked = tuple(pm.blocked_names())

    def __call__(self, env_id: str, **kwargs: Any) -> gym.Env:
        if self._pm is None:
            from mprl.host.plugins import get_plugin_manager

            self._pm = get_plugin_manager(blocked=self.blocked)
        return make_env(self._pm, env_id, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"_pm": None, "blocked": self.blocked}


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
