"""TensorBoard reporter, a built-in plugin (registered through the ``mprl`` entry point).

With ``--tensorboard`` (or ``tensorboard = true`` in the ``[run]`` table) every numeric value of
every metric record is written to ``RUN_DIR/tensorboard`` as the scalar ``SOURCE/NAME``
(``worker:0/episode_return``, ``trainer/policy_loss``, ``main/mean_return_100``) at the record's
env ``step``. It needs the optional ``tensorboard`` package (``pip install "mprl[tensorboard]"``).
Without the flag the hooks return at once and nothing heavy is imported. All hooks run in the
main process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

import mprl
from mprl.errors import UsageError

__version__ = "0.1.0"

MISSING = '--tensorboard needs the tensorboard package: pip install "mprl[tensorboard]"'
FLUSH_SECS = 5  # the writer flushes its queue to disk at least this often
AXES = ("step", "wall")  # the x axes of every record, not values of their own

_writers: dict[Path, Any] = {}  # run directory -> SummaryWriter
_wall0: dict[Path, float] = {}  # run directory -> epoch time of the records' wall == 0


@attrs.frozen
class TensorBoardOptions:
    """This plugin's run option (``--tensorboard``, ``tensorboard = true`` in ``[run]``)."""

    tensorboard: bool = attrs.field(
        default=False,
        metadata={
            "help": "write TensorBoard event files to RUN_DIR/tensorboard "
            '(pip install "mprl[tensorboard]")'
        },
    )


@mprl.hookimpl
def mprl_register_options(register: Callable[[type], None]) -> None:
    register(TensorBoardOptions)


@mprl.hookimpl
def mprl_run_start(run):
    """Open the writer; fail with a usage error (before any process starts) if the package is
    missing. This is the first hook that sees the run options; nothing runs yet."""
    if not run.run.of(TensorBoardOptions).tensorboard:
        return
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError(MISSING) from None
    _writers[run.run_dir] = SummaryWriter(
        str(run.run_dir / "tensorboard"), max_queue=1000, flush_secs=FLUSH_SECS
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@mprl.hookimpl
def mprl_report_metrics(run, records: Sequence[Mapping[str, Any]]):
    """Write each numeric value of each record at ``global_step=step``; strings (events) and
    bools are skipped. ``wall`` (seconds since the run started, continued on resume) becomes the
    walltime, anchored to the clock when the first record of this session arrives."""
    writer = _writers.get(run.run_dir)
    if writer is None:
        return
    for record in records:
        wall = float(record.get("wall", 0.0))
        wall0 = _wall0.setdefault(run.run_dir, time.time() - wall)
        for name, value in record.items():
            if name not in AXES and _is_number(value):
                tag = f"{record.get('source', 'main')}/{name}"
                writer.add_scalar(tag, value, record.get("step"), walltime=wall0 + wall)


@mprl.hookimpl
def mprl_run_end(run):
    """Flush and close the writer."""
    writer = _writers.pop(run.run_dir, None)
    _wall0.pop(run.run_dir, None)
    if writer is not None:
        writer.close()
