"""One export: the output path checked before anything is loaded, the checkpoint loaded, its
policy written to a temporary file beside the output, played back against the model's ``act``,
then moved into place (so a failed export leaves nothing, and never half a file)."""

from __future__ import annotations

import os
from pathlib import Path

import attrs

import mprl
from mprl.errors import UsageError
from mprl.host.plugins import PluginManager
from mprl_builtin.export import formats
from mprl_builtin.export.policy import Policy, TensorInfo, policy_of
from mprl_builtin.export.policy import check as check_policy


@attrs.frozen
class Exported:
    """What :func:`export_run` wrote."""

    path: Path
    format: str
    #: the format in words (``TorchScript``, ``ONNX opset 17``) and the file's size in bytes
    kind: str
    size: int
    algorithm: str
    plugin: str
    env: str
    env_steps: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    state_shapes: dict[str, tuple[int, ...]]
    #: what was checked against the model's act(), in words; why not, where it was not
    checked: str


def export_run(
    source: str | Path,
    out: str | Path | None = None,
    *,
    fmt: str | None = None,
    force: bool = False,
    env: str | None = None,
    plugins: PluginManager | None = None,
) -> Exported:
    """Write the policy of a run's last checkpoint (a run directory) or of a checkpoint file as a
    TorchScript or ONNX file that plays it without mprl: observations in, the actions of
    ``act(obs, deterministic=True)`` out (a recurrent policy: its state in and out).

    :param out: the file to write (default: ``RUN_DIR/policy.pt`` or ``policy.onnx``).
    :param fmt: ``torchscript`` or ``onnx`` (default: ``onnx`` for an ``out`` ending in
        ``.onnx``, else ``torchscript``).
    :param force: overwrite an existing ``out``.
    :param env: the checkpoint's env id, as trust for one that imports a module (as ``mprl.load``).
    :raises mprl.errors.UsageError: bad input (nothing written): not a run, no checkpoint,
        ``out`` exists or its directory does not, a model without ``export_policy``.
    :raises ExportFailed: the plugin's export is broken (nothing written).
    """
    src = Path(source)
    if not src.exists():
        raise UsageError(f"{str(src)!r} does not exist: give a run directory or a checkpoint file")
    if src.is_dir() and not (src / "checkpoints").is_dir() and not (src / "config.json").exists():
        raise UsageError(
            f"{str(src)!r} is not a run directory: it has no config.json and no checkpoints/ "
            "(give a run directory written by `python -m mprl run`, or a checkpoint file)"
        )
    fmt = fmt or ("onnx" if out is not None and str(out).endswith(".onnx") else "torchscript")
    path = output_path(src, out, fmt, force)
    ckpt = mprl.load(src, env=env, plugins=plugins)
    policy = policy_of(ckpt)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        kind = formats.write(policy, fmt, temp)
        checked = _checked(policy, fmt, temp)
        if path.exists() and not force:  # written meanwhile by someone else
            raise UsageError(f"{str(path)!r} exists; give --force to overwrite it")
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return Exported(
        path=path, format=fmt, kind=kind, size=path.stat().st_size, algorithm=ckpt.algorithm,
        plugin=ckpt.plugin, env=ckpt.run.env, env_steps=ckpt.env_steps, inputs=policy.inputs,
        outputs=policy.outputs, state_shapes=policy.state_shapes, checked=checked,
    )  # fmt: skip


def _checked(policy: Policy, fmt: str, path: Path) -> str:
    run = formats.runner(fmt, path)
    if run is None:
        return 'not checked: onnxruntime is not installed (pip install "mprl[onnx]")'
    return check_policy(policy, run)


def output_path(source: Path, out: str | Path | None, fmt: str, force: bool) -> Path:
    """The file to write, checked: its directory exists, nothing is there (unless ``force``:
    a file), and its suffix does not name the other format."""
    suffix = formats.SUFFIXES[fmt]
    if out is None:
        if source.is_dir():
            run_dir = source
        elif source.parent.name == "checkpoints":
            run_dir = source.parent.parent
        else:
            run_dir = source.parent
        path = run_dir / f"policy{suffix}"
    else:
        path = Path(out)
        other = {s: f for f, s in formats.SUFFIXES.items() if f != fmt}
        if path.suffix in other:
            raise UsageError(
                f"-o {str(path)!r} names a {other[path.suffix]} file, and --format is {fmt}: "
                f"give -o FILE{suffix} or --format {other[path.suffix]}"
            )
    where = f"cannot write {str(path)!r}: directory {str(path.parent)!r}"
    if not path.parent.is_dir():
        raise UsageError(f"{where} does not exist")
    if path.is_dir():
        raise UsageError(f"cannot write {str(path)!r}: it is a directory")
    if path.exists() or path.is_symlink():
        if not force:
            raise UsageError(f"{str(path)!r} exists; give --force to overwrite it")
        if not path.is_file():
            raise UsageError(f"cannot overwrite {str(path)!r}: it is not a regular file")
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"{where} is not writable")
    return path
