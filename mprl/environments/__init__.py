"""The env room: the environments mprl makes itself, a plugin the core registers by default
(:data:`mprl.host.plugins.DEFAULT_PLUGINS`) that reaches the host through the env hooks only:
gymnasium's registry (ids with keyword arguments, ``CartPole-v1``, ``module:Env-v0``), MuJoCo,
Atari (:mod:`.atari`), PettingZoo's parallel API (:mod:`.agents`) and EnvPool
(:mod:`.envpool`, ``--env-batch envpool``). It imports nothing of the host, the tools or
:mod:`mprl.lib`; :mod:`mprl.lib` builds on it.
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

import gymnasium as gym

from mprl.environments import agents, envpool
from mprl.environments.atari import is_atari, make_atari
from mprl.errors import UsageError
from mprl.hookspecs import hookimpl
from mprl.run_types import RunConfig

#: what installs the MuJoCo physics of gymnasium's MuJoCo envs
MUJOCO_EXTRA = 'pip install "mprl[mujoco]"'

#: what an env id's arguments may be
LITERALS = (
    "its arguments must be key=value with Python literals (numbers, 'strings', True/False, "
    "None, and tuples, lists or dicts of those)"
)


@hookimpl(trylast=True)
def mprl_make_env(env_id: str, render_mode: str | None) -> gym.Env:
    name, kwargs = split_env_id(env_id)
    if render_mode is not None:  # old envs take none
        kwargs["render_mode"] = render_mode
    try:
        return _make(name, kwargs, env_id)
    except (UsageError, gym.error.Error, ImportError):
        raise  # said already, or the host's "unknown environment"
    except Exception as exc:
        if not kwargs:
            raise  # the env's own failure: its traceback
        # what the env says of the arguments it was given (N=0, max_episode_steps=-5)
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"environment {env_id!r} cannot be made with {given}: {type(exc).__name__}: {first}"
        ) from None


def _make(env_id: str, kwargs: dict[str, Any], given: str) -> gym.Env:
    """``env_id`` made with ``kwargs``; ``given`` is what the user called it (its arguments
    too), for messages."""
    parallel = agents.pettingzoo_module(env_id)
    if parallel is not None:
        return agents.make_parallel(env_id, parallel, kwargs, given)
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


@hookimpl(trylast=True)
def mprl_adapt_env(env: Any, env_id: str) -> gym.Env | None:
    return agents.adapt(env, env_id)


@hookimpl
def mprl_check_env(run: RunConfig) -> None:
    if run.env_batch == "envpool":
        envpool.check(run.env)


@hookimpl(trylast=True)
def mprl_env_workload(env_id: str) -> str | None:
    return workload(env_id)


def split_env_id(env_id: str) -> tuple[str, dict[str, Any]]:
    """``"mpe2:simple_spread_v3(N=5, max_cycles=50)"`` -> the id and the env's keyword
    arguments (Python literals: numbers, strings, booleans, None, tuples, lists, dicts); an id
    without parentheses has none. A bad argument list (parentheses that do not close once at
    the end, an argument without a name, one named twice, a value that is no literal) is a
    :class:`UsageError` naming the env and what is wrong."""
    name, paren, rest = env_id.partition("(")
    if not paren:
        return env_id, {}
    name = name.strip()
    where = f"environment {env_id!r}"
    example = f"e.g. {name or 'Env-v0'}(N=5, max_cycles=50)"
    if not name:
        raise UsageError(f"{where}: no environment id before its arguments, {example}")
    if not rest.endswith(")"):
        raise UsageError(f"{where}: keyword arguments go in parentheses at the end, {example}")
    bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", env_id)  # parentheses in strings left out
    if bare.count("(") != bare.count(")"):
        raise UsageError(
            f"{where}: its parentheses do not pair up ({bare.count('(')} '(' and "
            f"{bare.count(')')} ')'), {example}"
        )
    source = f"f({rest}"
    try:
        call = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        said = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
        raise UsageError(f"{where}: {LITERALS}: {said}") from None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        raise UsageError(f"{where}: its arguments must be one list in parentheses at the end, "
                         f"{example}")  # fmt: skip
    return name, _keywords(where, source, call)


def _keywords(where: str, source: str, call: ast.Call) -> dict[str, Any]:
    """The keyword arguments of ``call`` (parsed from ``source``), as Python values."""
    unnamed = [ast.get_source_segment(source, a) for a in call.args] + [
        f"**{ast.get_source_segment(source, k.value)}" for k in call.keywords if k.arg is None
    ]
    if unnamed:
        raise UsageError(f"{where}: name each argument (key=value); {unnamed[0]} has no name")
    kwargs: dict[str, Any] = {}
    for keyword in call.keywords:
        key = str(keyword.arg)
        if key in kwargs:
            raise UsageError(f"{where}: argument {key!r} is given twice")
        try:
            kwargs[key] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            text = ast.get_source_segment(source, keyword.value) or "?"
            raise UsageError(f"{where}: {LITERALS}: {key}={text} is not one") from None
    return kwargs


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


def workload(env_id: str) -> str | None:
    """``"atari"`` or ``"mujoco"`` when ``env_id`` is one of those (an :class:`Algorithm`'s
    ``presets`` are keyed so), else ``None``."""
    if is_atari(env_id):
        return "atari"
    spec = gym.registry.get(env_id)
    if spec is not None and str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        return "mujoco"
    return None
