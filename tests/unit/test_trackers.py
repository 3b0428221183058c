"""The tracker plugins (``--wandb``, ``--mlflow``) without their libraries' services: the options
they own, the usage error for a missing library, a tracker failing mid-run (one warning line,
the run goes on), how a run's status ends the tracker run, and the shared helpers. The real
libraries, read back through their own readers: tests/integration/test_trackers.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import attrs
import pytest

import mprl
from mprl.errors import UsageError
from mprl.host.plugins import get_plugin_manager
from mprl.run_types import RunInfo
from mprl.tools.cli import main
from mprl_builtin import mlflow as mlflow_plugin
from mprl_builtin import tracking
from mprl_builtin import wandb as wandb_plugin

PLUGINS = {"wandb": wandb_plugin, "mlflow": mlflow_plugin}
OPTIONS = {"wandb": wandb_plugin.WandbOptions, "mlflow": mlflow_plugin.MlflowOptions}


def run_info(run_dir: Path, **options: Any) -> RunInfo:
    run = get_plugin_manager().run_options().build({"env": "CartPole-v1", **options})
    return RunInfo("a3c", "0.2.0", "a3c", None, run, run_dir, 475.0)


def test_each_tracker_owns_its_options_and_is_off_by_default():
    options = get_plugin_manager().run_options()
    assert {options.owners[k] for k in ("wandb", "wandb_mode", "wandb_dir")} == {"wandb"}
    assert {options.owners[k] for k in ("mlflow", "mlflow_uri", "mlflow_experiment")} == {"mlflow"}
    run = options.build({})
    assert run.of(wandb_plugin.WandbOptions).wandb is False
    assert run.of(mlflow_plugin.MlflowOptions).mlflow is False
    run = options.build({"wandb": True, "wandb_mode": "online", "mlflow_uri": "sqlite:///x.db"})
    assert run.of(wandb_plugin.WandbOptions) == wandb_plugin.WandbOptions(
        wandb=True, wandb_mode="online"
    )
    assert run.of(mlflow_plugin.MlflowOptions).mlflow_uri == "sqlite:///x.db"


def test_the_cli_reads_the_trackers_flags_and_refuses_a_mode_w_and_b_has_not(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "run options of plugin wandb" in out and "--wandb-mode STR" in out
    assert "run options of plugin mlflow" in out and "--mlflow-uri STR" in out
    assert main(["run", "--plugin", "a3c", "--wandb", "--wandb-mode", "onlin"]) == 2
    assert "field 'wandb_mode'" in capsys.readouterr().err
    assert main(["run", "--plugin", "a3c", "--mlflow", "--mlflow-experiment", ""]) == 2
    assert "field 'mlflow_experiment'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_without_its_flag_a_tracker_imports_nothing(name, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # `import NAME` would fail
    plugin = PLUGINS[name]
    run = run_info(tmp_path)
    start = plugin.mprl_run_start(run=run)  # a wrapper: the other plugins' run between
    next(start)
    with pytest.raises(StopIteration):
        start.send([])
    assert plugin.mprl_report_metrics(run=run, records=[{"step": 1, "x": 1.0}]) is None
    assert plugin.mprl_run_end(run=run, summary={"status": "finished"}) is None


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_missing_library_is_a_usage_error_before_anything_starts(name, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # as when the extra is not installed
    run_dir = tmp_path / "run"
    with pytest.raises(UsageError) as raised:  # before the other reporters start (tensorboard)
        mprl.run(
            "a3c", backend="serial", run_dir=run_dir, progress="none", tensorboard=True,
            **{name: True},
        )  # fmt: skip
    assert str(raised.value) == f'--{name} needs the {name} package: pip install "mprl[{name}]"'
    assert not run_dir.exists()  # no half-made run directory: the same command can be rerun


def test_a_tracker_that_cannot_start_takes_back_the_others_start(tmp_path, capsys):
    taken: list[str] = []
    tracking.started(tmp_path, "one", lambda: taken.append("one"))
    tracking.started(tmp_path, "two", lambda: 1 / 0)
    tracking.started(tmp_path / "other", "one", lambda: taken.append("other"))
    tracking.abort(tmp_path)
    assert taken == ["one"]
    assert capsys.readouterr().err.splitlines() == [
        "mprl: two: warning: taking back its run failed (ZeroDivisionError: division by zero)"
    ]
    tracking.abort(tmp_path)  # once only
    assert taken == ["one"]
    tracking.ended(tmp_path / "other", "one")  # a run that ended has nothing to take back
    tracking.abort(tmp_path / "other")
    assert taken == ["one"]


class BrokenWandbRun:
    """A W&B run whose every log fails, as on a full disk."""

    def __init__(self, sync_dir: Path) -> None:
        self.settings = types.SimpleNamespace(sync_dir=str(sync_dir))
        self.summary = types.SimpleNamespace(update=self.log)  # fails as log does
        self.finished: list[int] = []

    def log(self, values: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")

    def finish(self, exit_code: int) -> None:
        self.finished.append(exit_code)


class BrokenMlflowClient:
    """An MLflow client whose every log_batch fails, as on a locked or full store."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []

    def log_batch(self, run_id: str, **kw: Any) -> None:
        raise OSError(28, "No space left on device")

    def log_artifact(self, run_id: str, path: str, artifact_path: str) -> None:
        raise AssertionError("no checkpoint in this summary")

    def set_terminated(self, run_id: str, status: str) -> None:
        self.ended.append((run_id, status))


def broken(name: str, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Track the run at ``run_dir`` with a broken W&B run or MLflow client."""
    failures = tracking.Failures(name)
    if name == "wandb":
        monkeypatch.setitem(
            sys.modules, "wandb", types.SimpleNamespace(run=None, teardown=lambda: None)
        )
        tracked: Any = wandb_plugin._Tracked(BrokenWandbRun(run_dir / "w"), "offline", failures)
    else:
        entities = types.SimpleNamespace(Metric=lambda *a: a, RunTag=lambda *a: a)
        monkeypatch.setitem(sys.modules, "mlflow", types.SimpleNamespace(entities=entities))
        monkeypatch.setitem(sys.modules, "mlflow.entities", entities)  # mlflow itself runs `uname`
        tracked = mlflow_plugin._Tracked(
            BrokenMlflowClient(), "r1", "sqlite:///x.db", "e", failures
        )
    monkeypatch.setitem(PLUGINS[name]._runs, run_dir.resolve(), tracked)
    return tracked


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_failing_mid_run_is_one_warning_line_and_the_run_goes_on(
    name, tmp_path, monkeypatch, capsys
):
    tracked = broken(name, tmp_path, monkeypatch)
    plugin, run = PLUGINS[name], run_info(tmp_path)
    records = [{"source": "worker:0", "step": 10, "wall": 0.1, "episode_return": 9.0}]
    for _ in range(3):  # no exception reaches the run
        plugin.mprl_report_metrics(run=run, records=records)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"mprl: {name}: warning: logging metrics failed (OSError: [Errno 28] No space left on "
        "device); the run goes on, its records are in metrics.jsonl (further failures are "
        "counted, not shown)"
    ]
    summary = {"status": "interrupted", "exit_code": 130, "env_steps": 10, "checkpoint": None}
    plugin.mprl_run_end(run=run, summary=summary)
    err = capsys.readouterr().err.splitlines()
    assert f"mprl: {name}: 4 logging failures in all" in err  # the totals failed too
    if name == "wandb":  # stopped by SIGINT: W&B's run ends with the run's exit code
        assert tracked.run.finished == [130]
        assert err[-1] == f"mprl: wandb: offline run in {tmp_path / 'w'}; upload it with: " + (
            f"wandb sync {tmp_path / 'w'}"
        )
    else:
        assert tracked.client.ended == [("r1", "KILLED")]
    assert tmp_path.resolve() not in plugin._runs


@pytest.mark.parametrize(
    ("status", "ended"),
    [("finished", "FINISHED"), ("failed", "FAILED"), ("interrupted", "KILLED"), ("?", "FAILED")],
)
def test_the_run_s_status_ends_the_mlflow_run(status, ended):
    assert mlflow_plugin.STATUSES.get(status, "FAILED") == ended


def test_a_store_s_relative_path_is_kept_absolute_for_a_resume_from_elsewhere(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert mlflow_plugin._absolute("sqlite:///store/m.db") == f"sqlite:///{tmp_path}/store/m.db"
    assert (tmp_path / "store").is_dir()  # SQLite makes the file, not its folder
    assert mlflow_plugin._absolute(f"sqlite:///{tmp_path}/m.db") == f"sqlite:///{tmp_path}/m.db"
    assert mlflow_plugin._absolute("mlruns") == (tmp_path / "mlruns").as_uri()
    assert mlflow_plugin._absolute("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert mlflow_plugin.artifact_root(f"sqlite:///{tmp_path}/m.db") == str(tmp_path / "mlruns")
    assert mlflow_plugin.artifact_root("http://127.0.0.1:5000") is None  # the server's choice


def test_records_become_metrics_by_source():
    record = {
        "source": "trainer", "step": 300, "wall": 1.5, "policy_loss": 0.25, "updates": 3,
        "event": "x", "solved": True, "bad": float("nan"),
    }  # fmt: skip
    assert tracking.metrics(record) == {"trainer/policy_loss": 0.25, "trainer/updates": 3}
    assert tracking.metrics({"step": 1, "seconds": 2.0}) == {"main/seconds": 2.0}
    summary = {"env_steps": 10, "solved": True, "mean_return_100": None, "status": "finished"}
    assert tracking.totals(summary) == {"env_steps": 10, "solved": 1}


def test_parameters_are_the_run_s_config_json_flattened(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"plugin": "a3c", "plugin_distribution": "mprl", "run": {"workers": 2, "extra": {}},'
        ' "config": {"hidden": [64, 64]}}'
    )
    params = tracking.parameters(run_info(tmp_path))
    assert params["plugin_distribution"] == "mprl" and params["run_dir"] == str(tmp_path)
    assert tracking.flatten(params) == {
        "plugin": "a3c", "plugin_distribution": "mprl", "run.workers": 2, "run.extra": {},
        "config.hidden": [64, 64], "run_dir": str(tmp_path),
    }  # fmt: skip
    assert mlflow_plugin._text([64, 64]) == "[64, 64]" and mlflow_plugin._text(None) == "null"


def test_parameters_without_config_json_come_from_the_run(tmp_path):
    @attrs.frozen
    class Config:
        lr: float = 0.1

    run = attrs.evolve(run_info(tmp_path), config=Config())
    params = tracking.parameters(run)
    assert params["plugin"] == "a3c" and params["config"] == {"lr": 0.1}
    assert params["run"]["env"] == "CartPole-v1"


def test_an_artifact_name_is_made_of_what_trackers_take():
    assert tracking.artifact_name(Path("runs/a3c-mpe2:simple(N=3)-1")) == "a3c-mpe2-simple-N-3-1"
