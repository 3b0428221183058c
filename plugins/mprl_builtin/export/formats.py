"""The two formats a policy is written in, and how each is read back to be checked:
TorchScript (``torch.jit.trace``, read with ``torch.jit.load``) and ONNX (the TorchScript-based
exporter with a dynamic batch axis, read with ``onnxruntime``)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from mprl.errors import UsageError
from mprl_builtin.export.policy import ExportFailed, Policy, Runner

#: the formats, and the suffix of each one's file
SUFFIXES = {"torchscript": ".pt", "onnx": ".onnx"}
#: the TorchScript archive's extra file, and the ONNX metadata key, that hold the metadata
METADATA_FILE, METADATA_KEY = "mprl.json", "mprl"
#: ONNX's operator set: 17 runs on onnxruntime 1.14 (2023) and later
OPSET = 17
MISSING_ONNX = '--format onnx needs the onnx package: pip install "mprl[onnx]"'


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without torch's warnings that TorchScript and its ONNX exporter are deprecated (the
    formats asked for are theirs); a tracer's warning about the module still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", message=".*feature will be removed")
        yield


def write(policy: Policy, fmt: str, path: Path) -> str:
    """Write ``policy`` to ``path`` in ``fmt``; the format in words (``ONNX opset 17``).
    :raises ExportFailed: the module cannot be traced or exported."""
    try:
        if fmt == "torchscript":
            return _write_torchscript(policy, path)
        return _write_onnx(policy, path)
    except (UsageError, ExportFailed):
        raise
    except Exception as exc:
        text = (str(exc).strip().splitlines() or [""])[0]
        raise ExportFailed(
            f"{policy.who}: its policy could not be written as {fmt}: "
            f"{type(exc).__name__}{f': {text}' if text else ''}"
        ) from None


def _write_torchscript(policy: Policy, path: Path) -> str:
    # parameters that need no gradient: a player's outputs are plain tensors (.numpy() works)
    module = copy.deepcopy(policy.module).requires_grad_(False)
    with torch.no_grad(), _quiet():
        traced = torch.jit.trace(module, policy.example, check_trace=False)
        extra = {METADATA_FILE: json.dumps(policy.metadata(), indent=1)}
        torch.jit.save(traced, str(path), _extra_files=extra)
    return "TorchScript"


def _write_onnx(policy: Policy, path: Path) -> str:
    try:
        import onnx
    except ImportError:
        raise UsageError(MISSING_ONNX) from None
    names_in = [t.name for t in policy.inputs]
    names_out = [t.name for t in policy.outputs]
    # the TorchScript-based exporter: the graph the torchscript format holds too, written in
    # a fraction of a second (torch.export's takes seconds for these small graphs)
    dynamo = "dynamo" in inspect.signature(torch.onnx.export).parameters  # torch >= 2.5
    legacy = {"dynamo": False} if dynamo else {}
    with torch.no_grad(), _quiet():
        torch.onnx.export(
            policy.module, policy.example, str(path), input_names=names_in,
            output_names=names_out, opset_version=OPSET,
            dynamic_axes={name: {0: "batch"} for name in names_in + names_out}, **legacy,
        )  # fmt: skip
    model = onnx.load(str(path))
    model.doc_string = (
        f"{policy.checkpoint.algorithm} policy on {policy.checkpoint.run.env}, exported by mprl: "
        "deterministic actions; a recurrent state starts at zeros"
    )
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(policy.metadata(), indent=1)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return f"ONNX opset {OPSET}"


def runner(fmt: str, path: Path) -> Runner | None:
    """What plays the file at ``path`` (arrays in, arrays out); ``None`` for an ONNX file
    where onnxruntime is not installed."""
    if fmt == "torchscript":
        with _quiet():
            module = torch.jit.load(str(path))

        def run_torchscript(*inputs: np.ndarray) -> list[np.ndarray]:
            with torch.no_grad():
                out = module(*(torch.as_tensor(x) for x in inputs))
            return [o.numpy() for o in (out if isinstance(out, tuple | list) else (out,))]

        return run_torchscript
    try:
        import onnxruntime
    except ImportError:
        return None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run_onnx(*inputs: np.ndarray) -> list[np.ndarray]:
        return session.run(None, dict(zip(names, inputs, strict=True)))

    return run_onnx
