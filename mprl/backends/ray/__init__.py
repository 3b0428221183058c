"""The Ray backend (``--backend ray``): workers and the train process as Ray actors, on one
machine or across a cluster. Ray is an optional extra (``pip install "mprl[ray]"``); the backend
is always listed, and asking for it without Ray installed says what to install.

A built-in plugin, registered by name like :mod:`mprl.backends.local`.
"""

from __future__ import annotations

from collections.abc import Callable

from mprl.backends.ray.backend import RayBackend
from mprl.backends.ray.cluster import RayOptions
from mprl.hookspecs import hookimpl

__all__ = ["RayBackend", "RayOptions"]


@hookimpl
def mprl_register_backends(register: Callable[..., None]) -> None:
    register("ray", RayBackend, 'Ray actors on a cluster or this machine (pip install "mprl[ray]")')


@hookimpl
def mprl_register_options(register: Callable[[type], None]) -> None:
    register(RayOptions)
