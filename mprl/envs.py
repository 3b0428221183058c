"""Creating environments through the ``mprl_make_env`` hook, with errors that name the culprit."""

from __future__ import annotations

import gymnasium as gym

from mprl.errors import PluginError, UsageError
from mprl.plugins import PluginManager


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
        except gym.error.Error as exc:
            if impl.plugin_name == "mprl.builtin":
                raise UsageError(f"unknown gymnasium environment {env_id!r}: {exc}") from None
            raise PluginError(f"plugin {impl.plugin_name!r}: mprl_make_env failed: {exc}") from exc
        if env is None:
            continue
        if not isinstance(env, gym.Env):
            raise PluginError(
                f"plugin {impl.plugin_name!r}: mprl_make_env returned {type(env).__name__}, "
                "expected a gymnasium.Env or None"
            )
        return env
    raise UsageError(f"no plugin could create environment {env_id!r}")
