"""Checkpoints: what a run saves (:func:`payload`), and reading one back (:func:`load`).

A checkpoint is a ``torch.save`` file of tensors and plain data only, so it loads with
``weights_only=True``: opening a file from elsewhere cannot run code. It is written atomically
(see :func:`mprl.host.rundir.atomic_write`): a crash mid-write leaves the previous one intact.
:func:`load` checks the whole file before anything uses it, so a damaged or foreign checkpoint
is refused naming the file and the field, before the run directory is touched.
"""

from __future__ import annotations

import errno
import pickle
import random
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mprl.errors import UsageError
from mprl.version import __version__

if TYPE_CHECKING:
    from mprl.host.plugins import PluginManager

FORMAT = "mprl-checkpoint"
VERSION = 2  # 2: transport state (the weights' version) is part of shared_state
#: every field a checkpoint has, and what it must be
FIELDS: dict[str, type | tuple[type, ...]] = {
    "plugin": str, "algorithm": str, "config": dict, "run": dict, "model": dict,
    "optimizer": (dict, type(None)), "steps": list, "stats": dict, "session": int,
    "shared_state": dict, "rng": dict, "env_steps": int, "episodes": int,
}  # fmt: skip
STATS: dict[str, type | tuple[type, ...]] = {
    "episodes": int, "returns": list, "best_return": (int, float), "wall_s": (int, float),
}  # fmt: skip
RNG = ("torch", "numpy", "python")


def rng_states() -> dict[str, Any]:
    """The main process's torch, numpy and ``random`` generator states, as plain data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": random.getstate(),
    }


def set_rng_states(states: Mapping[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["gauss"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def distribution(pm: PluginManager, plugin: str) -> str | None:
    """The distribution that installs ``plugin`` (``mprl`` for the built-in ones); ``None`` for
    one registered in code."""
    dist, version = pm.distribution_of(plugin)
    return None if version == "-" else dist


def payload(
    *,
    plugin: str,
    plugin_version: str,
    algorithm: str,
    config: Mapping[str, Any],
    run: Mapping[str, Any],
    session: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    optimizers: Mapping[str, torch.optim.Optimizer],
    steps: list[int],
    stats: Mapping[str, Any],
    shared_state: Mapping[str, Any],
    plugin_distribution: str | None = None,
) -> dict[str, Any]:
    """Everything a checkpoint holds: what ran (plugin, algorithm, configs, versions), the
    learning state (model, optimizer, shared state), the counters and the RNG states."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "mprl_version": __version__,
        "plugin": plugin,
        "plugin_version": plugin_version,
        "plugin_distribution": plugin_distribution,
        "algorithm": algorithm,
        "config": dict(config),
        "run": dict(run),
        "session": session,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "optimizers": {name: opt.state_dict() for name, opt in optimizers.items()},
        "env_steps": sum(steps),
        "episodes": int(stats["episodes"]),
        "steps": steps,
        "stats": dict(stats),
        "shared_state": dict(shared_state),
        "rng": rng_states(),
        "time": time.time(),
    }


def checkpoint_path(path: str | Path) -> Path:
    """``RUN_DIR`` → ``RUN_DIR/checkpoints/last.pt``; a file path is taken as it is."""
    p = Path(path)
    return p / "checkpoints" / "last.pt" if p.is_dir() else p


def resumed_run_dir(file: Path) -> Path:
    """The run directory that resuming checkpoint ``file`` in place continues: ``RUN_DIR`` of
    ``RUN_DIR/checkpoints/last.pt``. Any other file (a snapshot kept beside it, a copy from
    elsewhere) is refused: the resumed run would overwrite the run's newer ``last.pt`` and
    its ``config.json``; it resumes into a new run directory (``--run-dir``)."""
    if file.name == "last.pt" and file.parent.name == "checkpoints":
        return file.parent.parent
    if file.parent.name == "checkpoints":
        why = (
            f"it is not its run's last checkpoint ({str(file.parent / 'last.pt')!r}), which "
            "resuming it there would overwrite with older work"
        )
    else:
        why = "it is not the last checkpoint of a run directory (RUN_DIR/checkpoints/last.pt)"
    raise UsageError(
        f"cannot resume checkpoint {str(file)!r} in place: {why}; give --run-dir NEW_DIR to "
        "resume it into a new run directory"
    )


def _check_fields(
    file: Path, data: Mapping[str, Any], fields: Mapping[str, Any], where: str
) -> None:
    for key, kind in fields.items():
        if key not in data:
            raise UsageError(f"checkpoint {str(file)!r} is incomplete: it has no {where}{key!r}")
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            raise UsageError(
                f"checkpoint {str(file)!r} is damaged: {where}{key!r} is "
                f"{type(value).__name__}, not {names}"
            )


#: how a file ``torch.save`` writes begins (a zip archive), and how a pickle of protocol 2 to 5
#: does (``pickle.dump``, ``torch.save(..., _use_new_zipfile_serialization=False)``)
ZIP_MAGIC = b"PK\x03\x04"
PICKLE_MAGIC = tuple(bytes([0x80, protocol]) for protocol in range(2, 6))


def _check_kind(file: Path) -> None:
    """Refuse a plain pickle before torch reads it: it is no checkpoint mprl writes (a zip
    archive), and torch would only say how to load it unsafely."""
    try:
        with open(file, "rb") as f:
            head = f.read(4)
    except OSError:
        return  # torch.load says why
    if not head.startswith(ZIP_MAGIC) and head.startswith(PICKLE_MAGIC):
        raise UsageError(
            f"checkpoint {str(file)!r} is not an mprl checkpoint: it is a plain Python pickle "
            "(pickle.dump, or torch.save's legacy format), not the zip archive of an mprl "
            "checkpoint, and mprl does not read one"
        )


def _refusal(text: str) -> str:
    """What torch's safe loader (``weights_only=True``) found in a file it refused: the line
    after ``WeightsUnpickler error:`` (``Unsupported operand 149``), without torch's advice."""
    _, found, rest = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in rest.splitlines() if line.strip()] if found else []
    return lines[0] if lines and "weights_only" not in lines[0] else ""


def load(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """Read and check a checkpoint; every problem is a :class:`UsageError` naming the file."""
    try:
        file = checkpoint_path(path)
        found = file.exists()
        where = "run directory" if Path(path).is_dir() else "file"
    except OSError as exc:  # a name longer than the file system allows, a loop of links
        raise UsageError(f"cannot read checkpoint {str(path)!r}: {exc.strerror or exc}") from None
    if not found:
        raise UsageError(
            f"no checkpoint at {str(file)!r} (from the {where} {str(path)!r}); give a run "
            "directory written by `python -m mprl run`, or a checkpoint file"
        )
    _check_kind(file)
    try:
        with warnings.catch_warnings():  # torch's about the file's pickle protocol, and such
            warnings.simplefilter("ignore")
            data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many kinds on damaged input
        # unreadable, not damaged; but EINVAL: torch's zip reader seeking past a cut file's end
        if isinstance(exc, OSError) and exc.errno not in (None, errno.EINVAL):
            raise UsageError(f"cannot read checkpoint {str(file)!r}: {exc.strerror}") from None
        text = str(exc).strip()
        if isinstance(exc, pickle.UnpicklingError) and "unsupported global" in text.lower():
            raise UsageError(
                f"checkpoint {str(file)!r} is not an mprl checkpoint: it holds Python objects "
                "(code), not just tensors and plain data, and mprl never loads those"
            ) from None
        if "weights_only" in text:  # torch's safe loader refused it: never its advice
            detail = _refusal(text)
            raise UsageError(
                f"checkpoint {str(file)!r} is not an mprl checkpoint: torch's safe loader cannot "
                f"read it{f' ({detail})' if detail else ''}, and mprl reads checkpoints only "
                "with that one"
            ) from None
        first = text.splitlines()[0] if text else type(exc).__name__
        raise UsageError(
            f"checkpoint {str(file)!r} is truncated or corrupt ({first}); mprl writes "
            "checkpoints atomically, so this file was not written by mprl or was damaged later"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(
            f"checkpoint {str(file)!r} is not an mprl checkpoint (a torch file without "
            f"format={FORMAT!r})"
        )
    if not isinstance(data.get("version", 0), int) or data.get("version", 0) > VERSION:
        raise UsageError(
            f"checkpoint {str(file)!r} has format version {data.get('version')}, newer than this "
            f"mprl ({VERSION}) reads; upgrade mprl (pip install -U mprl)"
        )
    if data.get("version") == 1:  # transport state was kept apart then
        data["shared_state"] = {
            **(data.get("extra_state") or {}),
            **(data.get("shared_state") or {}),
        }
    _check_fields(file, data, FIELDS, "")
    _check_fields(file, data["stats"], STATS, "stats.")
    _check_fields(file, data["rng"], dict.fromkeys(RNG, object), "rng.")
    return file, data
