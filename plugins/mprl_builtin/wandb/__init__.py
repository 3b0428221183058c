"""Weights & Biases tracker, a built-in plugin (registered through the ``mprl`` entry point).

With ``--wandb`` (or ``wandb = true`` in the ``[run]`` table) a run is a W&B run: the run's
config and metadata (``config.json``: plugin, its version and distribution, algorithm, mprl's
version, the run options under ``run`` and the algorithm's config under ``config``) are its
config; every numeric value of every metric record is logged as ``SOURCE/NAME``
(``worker:0/episode_return``, ``trainer/policy_loss``, ``main/mean_return_100``) against
``env_step``, the record's env step; the run's totals (``env_steps``, ``episodes``,
``mean_return_100``, ``solved``, ``status`` ...) go to its summary, the final checkpoint is an
artifact of type ``model``, and the W&B run ends with the run's exit code (0 finished, 1 failed,
130 / 143 stopped).

``--wandb-mode offline`` (the default) needs no network and no login: the run is written under
``--wandb-dir`` (the run directory by default) and uploaded later with ``wandb sync PATH``, the
path the run prints at its end. ``online`` uploads as it runs (``wandb login`` first). A resumed
run (``--resume``) goes on with the same W&B run id, kept in ``RUN_DIR/wandb-run.json``.

It needs the optional ``wandb`` package (``pip install "mprl[wandb]"``); without ``--wandb``
the hooks return at once and nothing heavy is imported. All hooks run in the main process, and
none of them stops a run once it started: a failure is one warning line.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

import mprl
from mprl.errors import UsageError
from mprl_builtin import tracking

__version__ = "0.1.0"

NAME = "wandb"
MISSING = '--wandb needs the wandb package: pip install "mprl[wandb]"'
MODES = ("offline", "online")
ID_FILE = "wandb-run.json"  # in the run directory: the W&B run a resumed run goes on with
STEP = "env_step"  # the x axis of every metric

_runs: dict[Path, _Tracked] = {}  # run directory -> its W&B run


@attrs.frozen
class WandbOptions:
    """This plugin's run options (``--wandb``, ``--wandb-project`` ...; ``[run]`` keys too)."""

    wandb: bool = attrs.field(
        default=False,
        metadata={
            "help": "track the run with Weights & Biases: config, metrics by source, the final "
            'checkpoint (pip install "mprl[wandb]")'
        },
    )
    wandb_project: str = attrs.field(
        default="mprl", validator=attrs.validators.min_len(1), metadata={"help": "W&B project"}
    )
    wandb_entity: str = attrs.field(
        default="", metadata={"help": "W&B entity (a user or team); empty: your default one"}
    )
    wandb_mode: str = attrs.field(
        default="offline",
        validator=attrs.validators.in_(MODES),
        metadata={
            "help": "offline: written to disk, uploaded later by `wandb sync`; online: "
            "uploaded as it runs (`wandb login` first)"
        },
    )
    wandb_dir: str = attrs.field(
        default="",
        metadata={"help": "where W&B writes (a wandb/ folder in it); empty: the run directory"},
    )


@attrs.define
class _Tracked:
    run: Any  # the wandb.sdk.wandb_run.Run
    mode: str
    failures: tracking.Failures


@mprl.hookimpl
def mprl_register_options(register: Callable[[type], None]) -> None:
    register(WandbOptions)


@mprl.hookimpl(wrapper=True)
def mprl_run_start(run):
    """Start (or, for a resumed run, go on with) the W&B run, once every other plugin's
    ``mprl_run_start`` went through (so that none of them refuses the run after it started);
    fail with a usage error, before any process starts, if the package is missing (checked
    before the others run) or W&B cannot start a run."""
    options = run.run.of(WandbOptions)
    if not options.wandb:
        return (yield)
    try:
        import wandb
    except ImportError:
        raise UsageError(MISSING) from None
    result = yield
    _start(wandb, run, options)
    return result


def _start(wandb: Any, run: Any, options: WandbOptions) -> None:
    params = tracking.parameters(run)
    run_dir = Path(run.run_dir).resolve()
    root = Path(options.wandb_dir).expanduser().resolve() if options.wandb_dir else run_dir
    before = tracking.load_id(run_dir, ID_FILE) if params.get("session") else None
    same = bool(before) and before.get("project") == options.wandb_project
    made = not (root / "wandb").exists()
    try:
        started = wandb.init(
            project=options.wandb_project,
            entity=options.wandb_entity or None,
            dir=str(root),
            mode=options.wandb_mode,
            id=before["id"] if same else None,
            resume="allow" if same else None,
            name=run_dir.name,
            job_type="train",
            tags=[run.algorithm, str(run.run.env)[:64]],
            config=params,
            allow_val_change=True,  # a resumed run's options may differ (--resume-drop)
            reinit="create_new",  # beside a run of the caller's own (mprl.run in a notebook)
            settings=wandb.Settings(console="off", silent=True),  # mprl's terminal stays its own
        )
        started.define_metric(STEP, hidden=True)
        started.define_metric("*", step_metric=STEP)
    except Exception as exc:  # no login for online, a bad entity, no network
        if made:  # the same command can be rerun into the same run directory
            shutil.rmtree(root / "wandb", ignore_errors=True)
        tracking.abort(run_dir)  # a tracker that started before this one
        raise UsageError(f"--wandb: W&B could not start a run ({tracking.one_line(exc)})") from None
    tracked = _Tracked(started, options.wandb_mode, tracking.Failures(NAME))
    _runs[run_dir] = tracked
    tracking.started(run_dir, NAME, lambda: _undo(wandb, run_dir, root / "wandb", made, same))
    try:
        tracking.save_id(run_dir, ID_FILE, {"id": started.id, "project": options.wandb_project})
    except OSError as exc:
        tracked.failures(f"keeping the run id in {ID_FILE} (for --resume)", exc)
    if options.wandb_mode == "online":
        tracking.say(NAME, f"run {started.url}")


def _undo(wandb: Any, run_dir: Path, folder: Path, made: bool, resumed: bool) -> None:
    """Take back a start that another tracker's failed start made moot (the run is refused):
    the W&B run ends, what this session wrote goes, so the same command can be rerun."""
    tracked = _runs.pop(run_dir, None)
    if tracked is None:
        return
    session = Path(tracked.run.settings.sync_dir)
    tracked.run.finish(exit_code=2)
    if wandb.run is None:
        wandb.teardown()
    shutil.rmtree(folder if made else session, ignore_errors=True)
    if not resumed:
        (run_dir / ID_FILE).unlink(missing_ok=True)


@mprl.hookimpl
def mprl_report_metrics(run, records: Sequence[Mapping[str, Any]]):
    """Log each record's numeric values as ``SOURCE/NAME`` at ``env_step`` = its ``step``."""
    tracked = _runs.get(Path(run.run_dir).resolve())
    if tracked is None:
        return
    try:
        for record in records:
            values = tracking.metrics(record)
            if values and tracking.is_number(record.get("step")):
                tracked.run.log({**values, STEP: record["step"]})
    except Exception as exc:
        tracked.failures("logging metrics", exc)


@mprl.hookimpl
def mprl_run_end(run, summary: Mapping[str, Any]):
    """The totals into the summary, the final checkpoint as a ``model`` artifact, and the W&B
    run ended with the run's exit code; for an offline run, the ``wandb sync`` line."""
    tracked = _runs.pop(Path(run.run_dir).resolve(), None)
    tracking.ended(Path(run.run_dir).resolve(), NAME)
    if tracked is None:
        return
    import wandb

    wb = tracked.run
    try:
        wb.summary.update(
            {
                **tracking.totals(summary),
                "solved": bool(summary.get("solved")),
                "status": summary.get("status"),
                "stop_reason": summary.get("stop_reason"),
            }
        )
        checkpoint = tracking.checkpoint_of(summary)
        if checkpoint is not None:
            _log_checkpoint(wandb, wb, run, summary, checkpoint)
    except Exception as exc:
        tracked.failures("logging the summary and checkpoint", exc)
    try:
        wb.finish(exit_code=int(summary.get("exit_code", 1)))
        if wandb.run is None:  # no run of the caller's own: W&B's service process ends now
            wandb.teardown()
    except Exception as exc:
        tracked.failures("ending the W&B run", exc)
    _say_end(tracked)


def _log_checkpoint(wandb: Any, wb: Any, run: Any, summary: Mapping[str, Any], path: Path) -> None:
    artifact = wandb.Artifact(
        f"{tracking.artifact_name(run.run_dir)}-model",
        type="model",
        description=f"mprl checkpoint: {run.algorithm} on {run.run.env}",
        metadata={
            "plugin": run.plugin,
            "algorithm": run.algorithm,
            "env": run.run.env,
            "env_steps": summary.get("env_steps"),
            "status": summary.get("status"),
            "session": summary.get("session"),
        },
    )
    artifact.add_file(str(path), name=path.name)
    wb.log_artifact(artifact, aliases=["latest", f"session-{summary.get('session', 0)}"])


def _say_end(tracked: _Tracked) -> None:
    if tracked.failures.count > 1:
        tracking.say(NAME, f"{tracked.failures.count} logging failures in all")
    if tracked.mode == "offline":
        where = Path(tracked.run.settings.sync_dir)
        tracking.say(NAME, f"offline run in {where}; upload it with: wandb sync {where}")
