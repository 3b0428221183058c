"""The core's own plugin: default environment factory and the backends (local:
spawned processes; serial: turn-taking threads of this process, for debugging and tests).

Registered by :func:`mprl.plugins.get_plugin_manager` like any other plugin, so a third-party
plugin overrides either hook by returning a result first.
"""

from __future__ import annotations

import gymnasium as gym

from mprl import hookimpl
from mprl.backend import Backend


@hookimpl(trylast=True)
def mprl_make_env(env_id: str, render_mode: str | None) -> gym.Env:
    return gym.make(env_id, render_mode=render_mode)


@hookimpl(trylast=True)
def mprl_make_backend(name: str) -> Backend | None:
    if name == "local":
        from mprl.local import LocalBackend

        return LocalBackend()
    if name == "serial":
        from mprl.serial import SerialBackend

        return SerialBackend()
    return None
