"""MLflow tracker, a built-in plugin (registered through the ``mprl`` entry point).

With ``--mlflow`` (or ``mlflow = true`` in the ``[run]`` table) a run is an MLflow run in the
experiment ``--mlflow-experiment`` of the tracking store ``--mlflow-uri``: the run's config and
metadata (``config.json``: plugin, its version and distribution, algorithm, mprl's version, the
run options as ``run.NAME`` and the algorithm's config as ``config.NAME``) are its parameters;
every numeric value of every metric record is the metric ``SOURCE/NAME``
(``worker:0/episode_return``, ``trainer/policy_loss``, ``main/mean_return_100``) at
``step`` = the record's env step; the run's totals (``env_steps``, ``episodes``,
``mean_return_100``, ``solved`` ...) are metrics at the last step, the final checkpoint an
artifact under ``checkpoints/``, and the MLflow run ends FINISHED, FAILED or KILLED (stopped by
a signal), with ``mprl.status`` and ``mprl.stop_reason`` as tags.

The store is ``--mlflow-uri``; empty, ``MLFLOW_TRACKING_URI``, else MLflow's default (a SQLite
file ``mlflow.db`` in the working directory), which ``mlflow ui`` in that directory shows. An
experiment the plugin makes in a SQLite store keeps its artifacts in ``mlruns`` beside the
database file. A resumed run (``--resume``) goes on with the same MLflow run, its id and
store kept in ``RUN_DIR/mlflow-run.json``.

It needs the optional ``mlflow`` package (``pip install "mprl[mlflow]"``); without ``--mlflow``
the hooks return at once and nothing heavy is imported. All hooks run in the main process, and
none of them stops a run once it started: a failure is one warning line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

import mprl
from mprl.errors import UsageError
from mprl_builtin import tracking

__version__ = "0.1.0"

NAME = "mlflow"
MISSING = '--mlflow needs the mlflow package: pip install "mprl[mlflow]"'
ID_FILE = "mlflow-run.json"  # in the run directory: the MLflow run a resumed run goes on with
#: MLflow's limits: values per log_batch call, characters per parameter value
METRICS_PER_BATCH, PARAMS_PER_BATCH, PARAM_CHARS = 1000, 100, 6000
#: how the run's status ends the MLflow run
STATUSES = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}

_runs: dict[Path, _Tracked] = {}  # run directory -> its MLflow run


@attrs.frozen
class MlflowOptions:
    """This plugin's run options (``--mlflow``, ``--mlflow-uri`` ...; ``[run]`` keys too)."""

    mlflow: bool = attrs.field(
        default=False,
        metadata={
            "help": "track the run with MLflow: parameters, metrics by source, the final "
            'checkpoint (pip install "mprl[mlflow]")'
        },
    )
    mlflow_uri: str = attrs.field(
        default="",
        metadata={
            "help": "MLflow tracking store (sqlite:///PATH.db, http://HOST:PORT); empty: "
            "MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory"
        },
    )
    mlflow_experiment: str = attrs.field(
        default="mprl",
        validator=attrs.validators.min_len(1),
        metadata={"help": "MLflow experiment (made if missing)"},
    )


@attrs.define
class _Tracked:
    client: Any  # mlflow.tracking.MlflowClient
    run_id: str
    uri: str
    experiment: str
    failures: tracking.Failures
    wall0: float | None = None  # epoch time of the records' wall == 0


@mprl.hookimpl
def mprl_register_options(register: Callable[[type], None]) -> None:
    register(MlflowOptions)


@mprl.hookimpl(wrapper=True)
def mprl_run_start(run):
    """Start (or, for a resumed run, go on with) the MLflow run and log its parameters, once
    every other plugin's ``mprl_run_start`` went through (so that none of them refuses the run
    after it started); fail with a usage error, before any process starts, if the package is
    missing (checked before the others run) or the store cannot be used."""
    options = run.run.of(MlflowOptions)
    if not options.mlflow:
        return (yield)
    try:
        import mlflow
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise UsageError(MISSING) from None
    result = yield
    _start(mlflow, MlflowClient, run, options)
    return result


def _start(mlflow: Any, client_class: type, run: Any, options: MlflowOptions) -> None:
    params = tracking.parameters(run)
    run_dir = Path(run.run_dir).resolve()
    before = (tracking.load_id(run_dir, ID_FILE) or {}) if params.get("session") else {}
    uri = options.mlflow_uri or before.get("tracking_uri") or mlflow.get_tracking_uri()
    try:
        uri = _absolute(uri)
        client = client_class(tracking_uri=uri)
        resumed = before.get("run_id") if before.get("tracking_uri") == uri else None
        status = _resume(client, resumed)
        run_id = resumed if status else _create(client, uri, options.mlflow_experiment, run)
        _log_parameters(client, run_id, params)
    except Exception as exc:  # a store it cannot open, a server it cannot reach
        tracking.abort(run_dir)  # a tracker that started before this one
        raise UsageError(
            f"--mlflow: MLflow could not start a run in {uri} ({tracking.one_line(exc)})"
        ) from None
    tracked = _Tracked(client, run_id, uri, options.mlflow_experiment, tracking.Failures(NAME))
    _runs[run_dir] = tracked
    tracking.started(run_dir, NAME, lambda: _undo(run_dir, status))
    try:
        tracking.save_id(run_dir, ID_FILE, {"run_id": run_id, "tracking_uri": uri})
    except OSError as exc:
        tracked.failures(f"keeping the run id in {ID_FILE} (for --resume)", exc)


def _undo(run_dir: Path, status: str | None) -> None:
    """Take back a start that another tracker's failed start made moot (the run is refused): a
    new MLflow run is deleted, a resumed one gets its status back."""
    tracked = _runs.pop(run_dir, None)
    if tracked is None:
        return
    if status:
        tracked.client.set_terminated(tracked.run_id, status)
    else:
        tracked.client.delete_run(tracked.run_id)
        (run_dir / ID_FILE).unlink(missing_ok=True)


def _absolute(uri: str) -> str:
    """``uri`` with a relative SQLite file or plain path made absolute (a resumed run may start
    elsewhere), the SQLite file's folder made."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    if uri.startswith(prefix):
        Path(uri[len(prefix) :]).parent.mkdir(parents=True, exist_ok=True)
    if uri and ":" not in uri:  # a folder: MLflow's file store
        return Path(uri).resolve().as_uri()
    return uri


def _resume(client: Any, run_id: str | None) -> str | None:
    """Set the resumed run's MLflow run running again; returns the status it had, None when
    there is none to go on with."""
    if not run_id:
        return None
    try:
        status = client.get_run(run_id).info.status
    except Exception:  # deleted since, or another store: a new MLflow run
        return None
    client.update_run(run_id, status="RUNNING")
    return status


def artifact_root(uri: str) -> str | None:
    """Where a new experiment of a SQLite store keeps its artifacts: ``mlruns`` beside the
    database file (for MLflow's default store, its own default, ``./mlruns``), not in whatever
    folder the run was started from; other stores choose themselves (None)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    return str(Path(uri[len(prefix) :]).parent / "mlruns")  # a path, as MLflow's own default


def _create(client: Any, uri: str, experiment: str, run: Any) -> str:
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        experiment_id = found.experiment_id
    else:
        try:
            experiment_id = client.create_experiment(
                experiment, artifact_location=artifact_root(uri)
            )
        except Exception:  # made meanwhile by a run beside this one
            experiment_id = client.get_experiment_by_name(experiment).experiment_id
    made = client.create_run(
        experiment_id,
        run_name=Path(run.run_dir).resolve().name,
        tags={
            "mlflow.source.name": "mprl",
            "mprl.plugin": run.plugin,
            "mprl.algorithm": run.algorithm,
            "mprl.env": str(run.run.env),
            "mprl.run_dir": str(Path(run.run_dir).resolve()),
        },
    )
    return made.info.run_id


def _log_parameters(client: Any, run_id: str, params: Mapping[str, Any]) -> None:
    """Every parameter, as text; a resumed run keeps the values its first session logged
    (MLflow's parameters do not change): only new ones are added."""
    from mlflow.entities import Param

    have = client.get_run(run_id).data.params
    flat = tracking.flatten(params)
    new = [Param(key, _text(value)) for key, value in sorted(flat.items()) if key not in have]
    for at in range(0, len(new), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=new[at : at + PARAMS_PER_BATCH])


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:PARAM_CHARS]


@mprl.hookimpl
def mprl_report_metrics(run, records: Sequence[Mapping[str, Any]]):
    """Log each record's numeric values as ``SOURCE/NAME`` at ``step`` = its env step and at the
    time of its ``wall``."""
    tracked = _runs.get(Path(run.run_dir).resolve())
    if tracked is None:
        return
    try:
        from mlflow.entities import Metric

        batch = []
        for record in records:
            step = record.get("step")
            if not tracking.is_number(step):
                continue
            wall = float(record.get("wall", 0.0))
            if tracked.wall0 is None:
                tracked.wall0 = time.time() - wall
            stamp = int((tracked.wall0 + wall) * 1000)
            batch += [
                Metric(key, float(value), stamp, int(step))
                for key, value in tracking.metrics(record).items()
            ]
        _log_metrics(tracked, batch)
    except Exception as exc:
        tracked.failures("logging metrics", exc)


def _log_metrics(tracked: _Tracked, metrics: list[Any]) -> None:
    for at in range(0, len(metrics), METRICS_PER_BATCH):
        tracked.client.log_batch(tracked.run_id, metrics=metrics[at : at + METRICS_PER_BATCH])


@mprl.hookimpl
def mprl_run_end(run, summary: Mapping[str, Any]):
    """The totals as metrics at the last step, the status as tags, the final checkpoint as an
    artifact, and the MLflow run ended FINISHED, FAILED or KILLED."""
    tracked = _runs.pop(Path(run.run_dir).resolve(), None)
    tracking.ended(Path(run.run_dir).resolve(), NAME)
    if tracked is None:
        return
    client, run_id = tracked.client, tracked.run_id
    try:
        from mlflow.entities import Metric, RunTag

        step, now = int(summary.get("env_steps") or 0), int(time.time() * 1000)
        totals = [Metric(k, float(v), now, step) for k, v in tracking.totals(summary).items()]
        tags = [
            RunTag(f"mprl.{name}", str(summary.get(name)))
            for name in ("status", "stop_reason", "exit_code", "session")
        ]
        client.log_batch(run_id, metrics=totals, tags=tags)
        checkpoint = tracking.checkpoint_of(summary)
        if checkpoint is not None:
            client.log_artifact(run_id, str(checkpoint), artifact_path="checkpoints")
    except Exception as exc:
        tracked.failures("logging the totals and checkpoint", exc)
    try:
        client.set_terminated(run_id, STATUSES.get(str(summary.get("status")), "FAILED"))
    except Exception as exc:
        tracked.failures("ending the MLflow run", exc)
    if tracked.failures.count > 1:
        tracking.say(NAME, f"{tracked.failures.count} logging failures in all")
    tracking.say(
        NAME,
        f"run {run_id} in experiment {tracked.experiment!r} of {tracked.uri}; see it with: "
        f"mlflow ui --backend-store-uri {tracked.uri}",
    )
