"""mprl: a small plug-in framework for multi-process reinforcement learning in PyTorch.

Plugin authors need only what is exported here: the ``hookimpl`` marker, :class:`Algorithm`, the
shared-state declarations in :mod:`mprl.schema`, and the :class:`Context` their functions receive.
"""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

NAME = "mprl"
hookspec = pluggy.HookspecMarker(NAME)
hookimpl = pluggy.HookimplMarker(NAME)

from mprl import schema  # noqa: E402
from mprl.algorithm import Algorithm  # noqa: E402
from mprl.context import Context  # noqa: E402
from mprl.errors import ConfigError, MprlError, PluginError, RunFailed  # noqa: E402
from mprl.runner import RunConfig, Summary, run  # noqa: E402

__all__ = [
    "NAME",
    "Algorithm",
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
    "run",
    "schema",
]
