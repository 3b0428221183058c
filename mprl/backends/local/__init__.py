"""The local backend (``--backend local``, the default): spawned processes on this machine.

A built-in plugin: :func:`mprl.host.plugins.get_plugin_manager` registers this module like any
other plugin, and it registers the backend ``"local"``. Importing it imports no torch (its
forkserver starts first: :mod:`.forkserver`); the backend itself is :mod:`.backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mprl.backends.local.forkserver import LocalOptions
from mprl.hookspecs import hookimpl

__all__ = ["LocalBackend", "LocalOptions"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from mprl.backends.local.backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _local() -> Any:
    from mprl.backends.local.backend import LocalBackend

    return LocalBackend()


@hookimpl
def mprl_register_backends(register: Callable[..., None]) -> None:
    register("local", _local, "spawned processes on this machine (the default)")


@hookimpl
def mprl_register_options(register: Callable[[type], None]) -> None:
    register(LocalOptions)
