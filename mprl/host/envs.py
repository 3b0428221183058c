"""Environments through the ``mprl_make_env`` hook, with errors that name the culprit; and the
built-in implementation of that hook (gymnasium's registry), a plugin registered by default."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from mprl.context import derive_seed
from mprl.errors import PluginError, UsageError
from mprl.hookspecs import hookimpl

if TYPE_CHECKING:
    from mprl.host.plugins import PluginManager


@hookimpl(trylast=True)
def mprl_make_env(env_id: str, render_mode: str | None) -> gym.Env:
    if render_mode is None:  # older envs take no render_mode at all
        return gym.make(env_id)
    return gym.make(env_id, render_mode=render_mode)


def imports_code(env_id: str) -> bool:
    """Whether making ``env_id`` imports a module first (gymnasium's ``module:Env-v0`` ids)."""
    return ":" in env_id


def check_trusted(env_id: str, source: str, given: str | None) -> None:
    """Refuse an env id read from ``source`` (a checkpoint) that would import a module to be
    made, unless the user gave the same id: opening a file from elsewhere must not run code."""
    if imports_code(env_id) and given != env_id:
        module = env_id.split(":", 1)[0]
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
        if not isinstance(env, gym.Env):
            raise PluginError(
                f"plugin {impl.plugin_name!r}: mprl_make_env returned {type(env).__name__}, "
                "expected a gymnasium.Env or None"
            )
        return env
    raise UsageError(f"no plugin could create environment {env_id!r}")


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
    derived from ``seed`` and ``i``. Returns each episode's return and length, in episode order.
    """
    returns, lengths = [0.0] * episodes, [0] * episodes
    playing: list[int | None] = [None] * len(envs)  # the episode each env is in
    obs: list[Any] = [None] * len(envs)
    started = 0

    def start(j: int) -> None:
        nonlocal started
        playing[j] = started if started < episodes else None
        if playing[j] is not None:
            obs[j], _ = envs[j].reset(seed=derive_seed(seed, started))
            started += 1

    for j in range(len(envs)):
        start(j)
    while active := [j for j, episode in enumerate(playing) if episode is not None]:
        batch = torch.as_tensor(np.stack([np.asarray(obs[j], dtype=np.float32) for j in active]))
        for j, action in zip(active, act(batch, deterministic), strict=True):
            obs[j], reward, terminated, truncated, _ = envs[j].step(action)
            episode = playing[j]
            returns[episode] += float(reward)
            lengths[episode] += 1
            if terminated or truncated:
                start(j)
    return returns, lengths
