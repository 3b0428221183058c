"""``python -m mprl plot`` and ``python -m mprl runs`` on real run directories."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib.image
import pytest

from mprl.tools.report import build_figure, list_runs, plot_runs, read_run
from tests.conftest import cli, cli_here


def _aged(path: Path, seconds: float = 600) -> None:
    """Make a file look last written ``seconds`` ago."""
    old = time.time() - seconds
    os.utime(path, (old, old))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two short real runs on CartPole-v1, made once: runs/a3c-short and runs/ppo-short."""
    root = tmp_path_factory.mktemp("runs")

    def run(plugin: str) -> subprocess.CompletedProcess[str]:
        return cli(
            "run", "--plugin", plugin, "--workers", "1", "--total-steps", "4000",
            "--run-dir", str(root / f"{plugin}-short"), "--quiet",
        )  # fmt: skip

    with ThreadPoolExecutor(2) as pool:  # side by side: most of a short run is start-up
        results = list(pool.map(run, ["a3c", "ppo"]))
    for result in results:
        assert result.returncode == 0, result.stderr
    _aged(root / "a3c-short" / "config.json", 700)  # started first: `runs` lists oldest first
    _aged(root / "ppo-short" / "config.json", 600)
    return root


def test_read_run_reads_config_summary_and_episodes(runs):
    run = read_run(runs / "a3c-short")
    assert run.label == "a3c-short"
    assert run.plugin == "a3c" and run.env == "CartPole-v1"
    assert run.reward_threshold == 475.0
    assert run.summary is not None and run.summary["status"] == "finished"
    assert len(run.episodes) == run.summary["episodes"] > 0
    steps = [s for s, _, _ in run.episodes]
    assert 0 < steps[-1] <= run.summary["env_steps"]
    assert all(r > 0 for _, _, r in run.episodes)  # CartPole: +1 per step


def test_plot_writes_a_png_of_both_runs(runs, tmp_path):
    out = tmp_path / "curves.png"
    result = cli("plot", str(runs / "a3c-short"), str(runs / "ppo-short"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout
    image = matplotlib.image.imread(out)
    assert image.shape[0] >= 300 and image.shape[1] >= 600 and image.shape[2] in (3, 4)
    assert 10_000 < out.stat().st_size < 2_000_000
    assert image[..., :3].std() > 0.01  # not a blank canvas


def test_default_output_is_learning_curves_png_in_the_current_directory(runs, tmp_path):
    result = cli("plot", str(runs / "a3c-short"), "--window", "10", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000


def test_figure_has_a_line_per_run_labels_and_the_threshold(runs):
    a3c, ppo = read_run(runs / "a3c-short"), read_run(runs / "ppo-short")
    fig = build_figure([a3c, ppo], window=20)
    by_steps, by_wall = fig.axes
    _, labels = by_steps.get_legend_handles_labels()
    assert labels[:2] == ["a3c-short", "ppo-short"]
    assert any("475" in label and "CartPole-v1" in label for label in labels)
    assert by_steps.get_xlabel() == "env steps" and by_wall.get_xlabel() == "wall time (s)"
    assert "20" in by_steps.get_ylabel()
    for ax in (by_steps, by_wall):
        dashed = [
            line for line in ax.get_lines()
            if line.get_linestyle() == "--" and set(line.get_ydata()) == {475.0}
        ]  # fmt: skip
        assert len(dashed) == 1
        curves = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
        assert [len(c.get_xdata()) for c in curves] == [len(a3c.episodes), len(ppo.episodes)]
    # the step panel's x values are the episodes' env steps; y is the moving mean
    curve = by_steps.get_lines()[0]
    assert list(curve.get_xdata()) == [s for s, _, _ in a3c.episodes]
    returns = [r for _, _, r in a3c.episodes]
    assert curve.get_ydata()[-1] == pytest.approx(sum(returns[-20:]) / 20)

    fig = build_figure([a3c, ppo], labels=["first", "second"])
    assert fig.axes[0].get_legend_handles_labels()[1][:2] == ["first", "second"]


def test_svg_output_from_the_suffix(runs, tmp_path):
    out = plot_runs([runs / "ppo-short"], tmp_path / "curves.svg", labels=["ppo"])
    assert out == tmp_path / "curves.svg"
    assert out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()


def test_a_truncated_last_metrics_line_is_skipped(runs, tmp_path):
    d = tmp_path / "killed"
    shutil.copytree(runs / "a3c-short", d)
    (d / "summary.json").unlink()
    complete = len(read_run(d).episodes)
    with (d / "metrics.jsonl").open("a") as f:
        f.write('{"source": "worker:0", "step": 99999, "episode_ret')
    run = read_run(d)
    assert len(run.episodes) == complete and run.summary is None
    out = plot_runs([d], tmp_path / "killed.png")
    assert out.stat().st_size > 10_000


def test_plot_usage_errors_exit_2(runs, tmp_path, capsys):
    run = str(runs / "a3c-short")
    cases = [
        (["plot", str(tmp_path / "nope")], "is not a run directory"),
        (["plot", run, "--label", "a", "--label", "b"], "2 --label given for 1 run directories"),
        (["plot", run, "--window", "0"], "--window must be >= 1, got 0"),
        (["plot", run, "-o", str(tmp_path / "x.docx")], "unknown image format '.docx'; use one of"),
        (["plot", run, "-o", str(tmp_path / "no" / "x.png")], "does not exist; create it or give another -o"),
    ]  # fmt: skip
    for args, message in cases:
        code, stderr = cli_here(capsys, *args)
        assert code == 2 and message in stderr, (args, stderr)


def test_missing_matplotlib_says_how_to_install_it(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import` sees when it is absent
    code, stderr = cli_here(capsys, "plot", str(runs / "a3c-short"), "-o", str(tmp_path / "x.png"))
    assert code == 2
    assert 'pip install "mprl[plot]"' in stderr


def test_runs_lists_both_runs_finished(runs):
    result = cli("runs", str(runs))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "RUN", "DIR", "PLUGIN", "ENV", "ENV", "STEPS", "WALL", "BEST", "RETURN", "SOLVED", "STATUS",
    ]  # fmt: skip
    assert len(lines) == 3
    for line, plugin in zip(lines[1:], ("a3c", "ppo"), strict=True):  # oldest first
        cells = line.split()
        assert cells[0] == str(runs / f"{plugin}-short")
        assert cells[1:3] == [plugin, "CartPole-v1"]
        assert cells[-2:] == ["no", "finished"]
    summary = json.loads((runs / "a3c-short" / "summary.json").read_text())
    assert f"{summary['env_steps']:,}" in lines[1]
    assert f"{summary['best_return']:.1f}" in lines[1]


def test_runs_without_summary_are_incomplete_or_running(runs, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(runs / "a3c-short", root / "group" / "killed")
    shutil.copytree(runs / "ppo-short", root / "done")
    (root / "group" / "killed" / "summary.json").unlink()
    with (root / "group" / "killed" / "metrics.jsonl").open("a") as f:
        f.write('{"source": "worker:0", "step": 12')  # killed mid-line
    (root / "empty").mkdir()
    (root / "a" / "b" / "c" / "d").mkdir(parents=True)  # too deep to look into

    killed_dir = root / "group" / "killed"
    rows = {Path(r["run_dir"]).name: r for r in list_runs(root)}
    assert rows["killed"]["status"] == "incomplete"  # its lock is free: no process is in it
    with (killed_dir / ".lock").open("r+") as lock:  # a process holds it: it is running
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("4242\n")
        lock.flush()
        assert {Path(r["run_dir"]).name: r for r in list_runs(root)}["killed"]["status"] == (
            "running (pid 4242)"
        )
    (killed_dir / ".lock").unlink()  # a run directory of an mprl without locks: mtimes tell
    rows = {Path(r["run_dir"]).name: r for r in list_runs(root)}
    assert rows["killed"]["status"] == "running?"  # metrics written just now
    _aged(root / "group" / "killed" / "metrics.jsonl")
    rows = {Path(r["run_dir"]).name: r for r in list_runs(root)}
    assert set(rows) == {"killed", "done"}
    killed = rows["killed"]
    assert killed["status"] == "incomplete" and killed["solved"] is None
    assert killed["plugin"] == "a3c" and killed["env"] == "CartPole-v1"
    summary = json.loads((runs / "a3c-short" / "summary.json").read_text())
    assert killed["best_return"] == summary["best_return"]
    assert 0 < killed["env_steps"] <= summary["env_steps"]
    assert rows["done"]["status"] == "finished"

    result = cli("runs", str(root))
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "killed" in x)
    assert line.split()[0] == str(root / "group" / "killed")
    assert line.split()[-2:] == ["-", "incomplete"]


def test_runs_shows_what_can_be_read_of_a_run_with_a_damaged_config(runs, tmp_path):
    done = tmp_path / "runs" / "done"
    shutil.copytree(runs / "ppo-short", done)
    (done / "config.json").write_text("{not json")
    (row,) = list_runs(tmp_path / "runs")
    summary = json.loads((done / "summary.json").read_text())
    assert row["plugin"] == "ppo" and row["env"] == "CartPole-v1"  # from summary.json
    assert row["status"] == "finished" and row["env_steps"] == summary["env_steps"]
    assert read_run(done).episodes  # and it still plots
