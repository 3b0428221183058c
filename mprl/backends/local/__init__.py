"""The local backend (``--backend local``, the default): spawned processes on this machine.

A built-in plugin: :func:`mprl.host.plugins.get_plugin_manager` registers this module like any
other plugin, and it registers the backend ``"local"``.
"""

from __future__ import annotations

from collections.abc import Callable

from mprl.backends.local.backend import LocalBackend, LocalOptions
from mprl.hookspecs import hookimpl

__all__ = ["LocalBackend", "LocalOptions"]


@hookimpl
def mprl_register_backends(register: Callable[..., None]) -> None:
    register("local", LocalBackend, "spawned processes on this machine (the default)")


@hookimpl
def mprl_register_options(register: Callable[[type], None]) -> None:
    register(LocalOptions)
