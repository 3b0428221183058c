"""Checkpoints: what a run saves, and reading one back to resume it.

A checkpoint is a ``torch.save`` file of tensors and plain data only, so it loads with
``weights_only=True``: opening a file from elsewhere cannot run code. It is written atomically
(see :func:`mprl.rundir.atomic_write`): a crash mid-write leaves the previous one intact.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mprl.errors import UsageError

FORMAT = "mprl-checkpoint"
VERSION = 1
REQUIRED = (
    "plugin", "algorithm", "config", "run", "model", "optimizer", "steps", "stats", "session",
)  # fmt: skip


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


def checkpoint_path(path: str | Path) -> Path:
    """``RUN_DIR`` → ``RUN_DIR/checkpoints/last.pt``; a file path is taken as it is."""
    p = Path(path)
    return p / "checkpoints" / "last.pt" if p.is_dir() else p


def load(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """Read and check a checkpoint; every problem is a :class:`UsageError` naming the file."""
    file = checkpoint_path(path)
    if not file.exists():
        where = "run directory" if Path(path).is_dir() else "file"
        raise UsageError(
            f"no checkpoint at {str(file)!r} (from the {where} {str(path)!r}); give a run "
            "directory written by `python -m mprl run`, or a checkpoint file"
        )
    try:
        data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many kinds on damaged input
        text = str(exc).strip()
        if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in text:
            raise UsageError(
                f"checkpoint {str(file)!r} is not an mprl checkpoint: it holds Python objects, "
                "not just tensors and plain data"
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
    if data.get("version", 0) > VERSION:
        raise UsageError(
            f"checkpoint {str(file)!r} has format version {data.get('version')}, newer than this "
            f"mprl ({VERSION}) reads; upgrade mprl (pip install -U mprl)"
        )
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise UsageError(f"checkpoint {str(file)!r} is incomplete: no {', '.join(missing)}")
    return file, data
