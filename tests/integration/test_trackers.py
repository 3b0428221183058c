"""The experiment trackers (``--wandb``, ``--mlflow``) through real runs of the CLI, read back
through each library's own reader: a W&B offline run with ``wandb leet inspect`` (the records of
its ``.wandb`` file) and ``wandb sync --dry-run`` (what ``wandb sync`` would upload), an MLflow
run with ``MlflowClient``. One run with both trackers, its resume into the same tracker runs,
and a failed run ending failed in both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mprl_builtin import tracking
from tests.conftest import clean_stderr, cli, read_metrics

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

RUN = ["run", "--plugin", "a3c", "--serial", "--quiet", "--wandb", "--mlflow"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store (SQLite) for the module's runs, its tables made once here (MLflow's
    migrations take seconds); each test's runs go to an experiment of its own."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()
    return uri


@pytest.fixture
def trackers(tmp_path: Path, store: str) -> dict[str, str]:
    """An environment in which W&B keeps its staging, cache and settings under the test's own
    folder (not the home directory), and MLflow's store is the module's."""
    home = tmp_path / "wandb-home"
    return {
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "MLFLOW_TRACKING_URI": store,
    }


def wandb_cli(*args: str, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def wandb_records(offline_run: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """The records of an offline run's ``.wandb`` file, as W&B's own inspector reads them."""
    out = wandb_cli("leet", "inspect", "--json", str(offline_run), env=env)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wandb_summary(offline_run: Path, env: dict[str, str]) -> dict[str, Any]:
    out = wandb_cli("leet", "inspect", "--summary", "--json", str(offline_run), env=env)
    return json.loads(out[out.index("{") :])


def expected_rows(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """(env step, ``SOURCE/NAME`` values) of each record that has numeric values."""
    return [(r["step"], tracking.metrics(r)) for r in records if tracking.metrics(r)]


def history_rows(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    rows = []
    for r in records:
        if r["type"] == "history":
            item = r["history"]["item"]
            values = {k: v for k, v in item.items() if not k.startswith("_") and k != "env_step"}
            rows.append((item["env_step"], values))
    return rows


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def check_wandb_session(
    offline_run: Path, session_records: list[dict], summary: dict, env: dict[str, str]
) -> dict[str, Any]:
    """One session's offline run holds that session's metrics, the run's config and totals, the
    final checkpoint as a model artifact, and ended as the run did; returns its summary."""
    records = wandb_records(offline_run, env)
    assert history_rows(records) == expected_rows(session_records)
    [artifact] = [r["artifact"] for r in records if r["type"] == "artifact"]
    assert artifact["type"] == "model" and artifact["name"].endswith("-model")
    [entry] = artifact["manifest"]["contents"]
    assert entry["path"] == "last.pt"
    assert int(entry["size"]) == Path(summary["checkpoint"]["path"]).stat().st_size
    assert json.loads(artifact["metadata"])["env_steps"] == summary["env_steps"]
    [end] = [r["exit"] for r in records if r["type"] == "exit"]
    assert end.get("exit_code", 0) == summary["exit_code"]
    return wandb_summary(offline_run, env)


def check_mlflow(uri: str, run_id: str, run_dir: Path, summary: dict) -> Any:
    """The MLflow run, as MlflowClient reads it: every metric record at its step, the run's
    parameters and totals, the checkpoint artifact, the status."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_run(run_id)
    counts = Counter()
    values: dict[str, list[tuple[int, float]]] = {}
    for step, row in expected_rows(read_metrics(run_dir)):
        for key, value in row.items():
            counts[key] += 1
            values.setdefault(key, []).append((step, float(value)))
    assert set(found.data.metrics) == set(counts) | set(tracking.TOTALS)
    for key, expected in values.items():
        history = client.get_metric_history(run_id, key)
        assert sorted((m.step, m.value) for m in history) == sorted(expected), key
    assert found.data.metrics["env_steps"] == summary["env_steps"]
    assert found.data.metrics["episodes"] == summary["episodes"]
    assert found.data.tags["mprl.status"] == summary["status"]
    assert found.data.tags["mprl.session"] == str(summary["session"])
    artifacts = [a.path for a in client.list_artifacts(run_id, "checkpoints")]
    assert artifacts == ["checkpoints/last.pt"]
    store = Path(uri.removeprefix("sqlite:///")).parent
    assert found.info.artifact_uri.startswith(str(store / "mlruns"))  # beside the store
    return found


def test_a_run_and_its_resume_are_one_wandb_run_and_one_mlflow_run(tmp_path, trackers):
    run_dir = tmp_path / "run"
    proc = cli(*RUN, "--total-steps", "3000", "--run-dir", str(run_dir), env=trackers)
    assert proc.returncode == 0, proc.stderr
    clean_stderr(proc.stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    first = read_metrics(run_dir)
    config = json.loads((run_dir / "config.json").read_text())

    # W&B: one offline run, the line that says how to upload it, and `wandb sync` would
    [offline] = offline_runs(run_dir)
    assert f"mprl: wandb: offline run in {offline}; upload it with: wandb sync {offline}" in (
        proc.stderr
    )
    got = check_wandb_session(offline, first, summary, trackers)
    assert got["state"] == "finished" and got["project"] == "mprl" and got["name"] == "run"
    for key in ("plugin", "plugin_version", "plugin_distribution", "mprl_version", "algorithm"):
        assert got["config"][key] == config[key]
    assert got["config"]["run"]["env"] == "CartPole-v1" and got["config"]["run"]["seed"] == 0
    assert got["config"]["config"]["lr"] == config["config"]["lr"]
    assert got["summary"]["env_steps"] == summary["env_steps"] and got["summary"]["solved"] is False
    assert got["summary"]["status"] == "finished"
    wandb_id = json.loads((run_dir / "wandb-run.json").read_text())["id"]
    assert got["run_id"] == wandb_id
    assert "Would sync 1 run" in wandb_cli("sync", "--dry-run", str(offline), env=trackers)

    # MLflow: the run in the store, its parameters flat
    ids = json.loads((run_dir / "mlflow-run.json").read_text())
    assert ids["tracking_uri"] == trackers["MLFLOW_TRACKING_URI"]
    assert f"mprl: mlflow: run {ids['run_id']} in experiment 'mprl'" in proc.stderr
    found = check_mlflow(ids["tracking_uri"], ids["run_id"], run_dir, summary)
    assert found.info.status == "FINISHED" and found.info.run_name == "run"
    params = found.data.params
    assert params["plugin_distribution"] == "mprl" and params["run.workers"] == "2"
    assert params["run.backend"] == "serial" and params["config.hidden"] == "[64, 64]"
    assert params["mprl_version"] == config["mprl_version"]

    # the resume goes on in the same tracker runs, at the env steps where it left off
    proc = cli("run", "--resume", str(run_dir), "--total-steps", "6000", "--quiet", env=trackers)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["session"] == 1
    second = read_metrics(run_dir)[len(first) :]
    earlier, later = offline_runs(run_dir)
    assert earlier == offline
    got = check_wandb_session(later, second, summary, trackers)
    assert got["run_id"] == wandb_id and got["state"] == "finished"
    [start] = [r["run"] for r in wandb_records(later, trackers) if r["type"] == "run"]
    assert start["resume"] is True
    assert "Would sync 1 run" in wandb_cli("sync", "--dry-run", str(later), env=trackers)
    found = check_mlflow(ids["tracking_uri"], ids["run_id"], run_dir, summary)
    assert found.info.status == "FINISHED"
    assert json.loads((run_dir / "mlflow-run.json").read_text()) == ids


def test_a_failed_run_ends_failed_in_both_trackers(installed, tmp_path, trackers):
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "probe", "--serial", "--workers", "1", "--quiet", "--wandb",
        "--mlflow", "--mlflow-experiment", "failed", "--run-dir", str(run_dir),
        "--total-steps", "100000",
        "--set", "fault=raise", "--set", "fault_at_step=200", env=trackers,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    [offline] = offline_runs(run_dir)
    got = wandb_summary(offline, trackers)
    assert got["state"] == "failed" and got["exit_code"] == 1
    assert got["summary"]["status"] == "failed"

    from mlflow.tracking import MlflowClient

    ids = json.loads((run_dir / "mlflow-run.json").read_text())
    found = MlflowClient(tracking_uri=ids["tracking_uri"]).get_run(ids["run_id"])
    assert found.info.status == "FAILED"
    assert found.data.tags["mprl.status"] == "failed"
    assert found.data.tags["mprl.exit_code"] == "1"


def test_a_tracker_that_cannot_start_refuses_the_run_and_takes_back_the_other(
    tmp_path, trackers, monkeypatch
):
    """MLflow starts first, then W&B cannot (online, no login): the run is refused before
    anything starts, the MLflow run is deleted and the run directory removed, so the same
    command can be rerun."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    proc = cli(
        *RUN, "--wandb-mode", "online", "--mlflow-experiment", "refused", "--run-dir",
        str(run_dir), env=trackers,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        "mprl: error: --wandb: W&B could not start a run (UsageError: No API key configured."
    )
    assert not run_dir.exists()

    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=trackers["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("refused")
    assert client.search_runs([experiment.experiment_id]) == []  # none left active
    [deleted] = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)
    assert deleted.info.lifecycle_stage == "deleted"
