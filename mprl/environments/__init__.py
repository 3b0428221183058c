"""The env room: the environments mprl makes itself, a plugin the core registers by default
(:data:`mprl.host.plugins.DEFAULT_PLUGINS`) that reaches the host through the env hooks only:
gymnasium's registry (ids with keyword arguments, ``CartPole-v1``, ``module:Env-v0``), MuJoCo,
Atari (:mod:`.atari`), PettingZoo's parallel API (:mod:`.agents`) and EnvPool
(:mod:`.envpool`, ``--env-batch envpool``). It imports nothing of the host, the tools or
:mod:`mprl.lib`; :mod:`mprl.lib` builds on it.
"""

from __future__ import annotations

import ast
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


@hookimpl(trylast=True)
def mprl_make_env(env_id: str, render_mode: str | None) -> gym.Env:
    env_id, kwargs = split_env_id(env_id)
    if render_mode is not None:  # old envs take none
        kwargs["render_mode"] = render_mode
    parallel = agents.pettingzoo_module(env_id)
    if parallel is not None:
        return agents.make_parallel(env_id, parallel, kwargs)
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
