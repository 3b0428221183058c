"""The serial backend (``--serial``, ``--backend serial``): the processes of a run as
turn-taking threads of this one, for debugging and unit tests (see :mod:`.backend`).

A built-in plugin, registered like the local backend.
"""

from __future__ import annotations

from collections.abc import Callable

from mprl.backends.inprocess import InProcessManager
from mprl.backends.serial.backend import SerialBackend
from mprl.hookspecs import hookimpl

__all__ = ["InProcessManager", "SerialBackend"]


@hookimpl
def mprl_register_backends(register: Callable[..., None]) -> None:
    register(
        "serial", SerialBackend, "threads of this process taking turns (--serial): debugging, tests"
    )
