"""The Ray backend (``--backend ray``): workers and the train process as Ray actors, on one
machine or across a cluster. Ray is an optional extra (``pip install "mprl[ray]"``); the backend
is always listed, and asking for it without Ray installed says what to install.

A built-in plugin, registered by its entry point like a third-party backend, and written on
the documented seam only (:mod:`mprl.backends.base`, ``supervisor``, ``child``, ``processes``)
and the transport's hub (:mod:`mprl.transport.hub`, ``client``). Importing it imports
neither Ray nor torch (its early start, :mod:`.start`, runs first); the backend is
:mod:`.backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mprl.hookspecs import hookimpl
from mprl_builtin.ray.options import RayOptions

__all__ = ["RayBackend", "RayOptions"]


def __getattr__(name: str) -> Any:
    if name == "RayBackend":
        from mprl_builtin.ray.backend import RayBackend

        return RayBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _ray() -> Any:
    from mprl_builtin.ray.backend import RayBackend

    return RayBackend()


@hookimpl
def mprl_register_backends(register: Callable[..., None]) -> None:
    register("ray", _ray, 'Ray actors on a cluster or this machine (pip install "mprl[ray]")')


@hookimpl
def mprl_register_options(register: Callable[[type], None]) -> None:
    register(RayOptions)
