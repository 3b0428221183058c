"""mprl: a small plug-in framework for multi-process reinforcement learning in PyTorch.

Plugin authors need only what is exported here: the ``hookimpl`` marker, :class:`Algorithm`, the
shared-state declarations in :mod:`mprl.schema` (with the transport protocols of
:mod:`mprl.transport`), and the :class:`Context` their functions receive. ``mprl.run`` starts a
run from Python and ``mprl.load`` reads a checkpoint back; they load the host on first use, so
``import mprl`` in a plugin or a spawned process loads only this author's API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mprl import deprecated
from mprl.errors import ConfigError, MprlError, PluginError, RunFailed
from mprl.hookspecs import NAME, hookimpl, hookspec
from mprl.run_types import RunConfig, Summary
from mprl.version import __version__

if TYPE_CHECKING:
    from mprl import schema
    from mprl.algorithm import Algorithm
    from mprl.context import Context
    from mprl.host.loading import Checkpoint, load
    from mprl.host.runner import run

deprecated.install()  # the 0.1.0 modules that moved (mprl.plugins ...) import, with a warning

__all__ = [
    "NAME",
    "Algorithm",
    "Checkpoint",
    "ConfigError",
    "Context",
    "MprlError",
    "PluginError",
    "RunConfig",
    "RunFailed",
    "Summary",
    "__version__",
    "hookimpl",
    "hookspec",
    "load",
    "run",
    "schema",
]

#: the names loaded on first use, and their modules: ``import mprl`` stays free of torch, so
#: ``python -m mprl run`` can start its children's forkserver before it imports torch
#: (mprl/__main__.py); the host (``run``, ``load``) is loaded only by who uses it
_LAZY = {
    "Algorithm": "mprl.algorithm",
    "Context": "mprl.context",
    "schema": "mprl.schema",
    "run": "mprl.host.runner",
    "load": "mprl.host.loading",
    "Checkpoint": "mprl.host.loading",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__ == f"mprl.{name}" else getattr(module, name)
        if name not in ("run", "load", "Checkpoint"):  # mprl.run stays the function, not
            globals()[name] = value  # the module a later `import mprl.run...` would set
        return value
    if f"mprl.{name}" in deprecated.OLD_MODULES:  # 0.1.0's `import mprl` loaded them all
        return importlib.import_module(f"mprl.{name}")
    raise AttributeError(f"module 'mprl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
