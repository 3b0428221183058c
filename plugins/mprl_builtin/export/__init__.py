"""``python -m mprl export``: a trained policy as a TorchScript or ONNX file that plays it without
mprl; a built-in plugin that adds its command through the ``mprl_register_commands`` hook, as a
third-party one would, and uses only mprl's public names.

What is exported is what the checkpoint's model gives from ``export_policy()``: a
``torch.nn.Module`` computing ``act(obs, deterministic=True)`` in tensor operations (the models
of ``mprl.lib`` and of the built-in algorithms have one; docs/export.md says how to write one).
It is traced, written, read back and played against ``act`` on sampled observations before the
file is moved into place.

The modules: :mod:`.command` (the arguments, what it prints), :mod:`.exporter` (one export:
paths, load, write, check, move), :mod:`.policy` (the policy module, its inputs and outputs,
the check), :mod:`.formats` (TorchScript and ONNX, written and read back).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import mprl
from mprl_builtin.export import command

__version__ = "0.1.0"
__all__ = ["ExportFailed", "Exported", "TensorInfo", "export_run"]
#: the Python API, imported when first used (it imports torch; the command line need not)
_LAZY = {
    "ExportFailed": "policy", "Exported": "exporter", "TensorInfo": "policy",
    "export_run": "exporter",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@mprl.hookimpl
def mprl_register_commands(register: Callable[..., None]) -> None:
    register("export", command.HELP, command.add_arguments, command.run)
