"""The TensorBoard reporter plugin (``--tensorboard``) through real runs of the CLI: what it writes
(read back with TensorBoard's own reader), that it is off by default, and the usage error when the
``tensorboard`` package is missing."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

import mprl
from tests.conftest import cli, read_metrics

MISSING = '--tensorboard needs the tensorboard package: pip install "mprl[tensorboard]"'
RUN = ["run", "--plugin", "a3c", "--workers", "1", "--quiet"]


def _numeric_tags(records: list[dict]) -> Counter:
    """``SOURCE/NAME`` -> how many records hold a numeric ``NAME`` (what the plugin must write)."""
    return Counter(
        f"{r['source']}/{k}"
        for r in records
        for k, v in r.items()
        if k not in ("step", "wall") and isinstance(v, int | float) and not isinstance(v, bool)
    )


@pytest.fixture
def no_tensorboard(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import tensorboard`` fails, as when the extra is not installed."""
    fake = tmp_path / "fake-site" / "tensorboard"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named tensorboard')\n")
    path = os.pathsep.join(p for p in [str(fake.parent), os.environ.get("PYTHONPATH", "")] if p)
    return {"PYTHONPATH": path}


def test_every_numeric_value_is_written_at_its_step(tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    run_dir = tmp_path / "run"
    proc = cli(*RUN, "--total-steps", "4000", "--run-dir", str(run_dir), "--tensorboard")
    assert proc.returncode == 0, proc.stderr
    acc = event_accumulator.EventAccumulator(
        str(run_dir / "tensorboard"), size_guidance={"scalars": 0}, purge_orphaned_data=False
    ).Reload()
    records = read_metrics(run_dir)
    expected = _numeric_tags(records)
    tags = set(acc.Tags()["scalars"])
    assert tags == set(expected)  # no tag for step, wall, event names, messages or paths
    assert {tag: len(acc.Scalars(tag)) for tag in tags} == dict(expected)
    assert "worker:0/policy_loss" in tags and "main/seconds" in tags  # a loss, a main record

    episodes = [r for r in records if r["source"] == "worker:0" and "episode_return" in r]
    scalars = acc.Scalars("worker:0/episode_return")
    assert len(scalars) == len(episodes) > 10
    assert [s.step for s in scalars] == [r["step"] for r in episodes]
    assert [s.value for s in scalars] == pytest.approx([r["episode_return"] for r in episodes])
    walls = [s.wall_time - scalars[0].wall_time for s in scalars]
    assert walls == pytest.approx([r["wall"] - episodes[0]["wall"] for r in episodes], abs=1e-3)
    mains = [r for r in records if "mean_return_100" in r]
    if mains:  # main's progress record comes every 5 s; a fast machine may finish sooner
        assert acc.Scalars("main/mean_return_100")[-1].value == pytest.approx(
            mains[-1]["mean_return_100"]
        )


def test_off_by_default_and_needs_no_tensorboard(tmp_path, no_tensorboard):
    run_dir = tmp_path / "run"
    proc = cli(*RUN, "--total-steps", "200", "--run-dir", str(run_dir), env=no_tensorboard)
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "summary.json").exists()
    assert not (run_dir / "tensorboard").exists()
    listing = cli("plugins", env=no_tensorboard).stdout  # the plugin loads without the package
    assert f"tensorboard  (mprl {mprl.__version__})" in listing and "FAILED" not in listing


def test_missing_package_is_a_usage_error_before_anything_starts(tmp_path, no_tensorboard):
    run_dir = tmp_path / "run"
    proc = cli(*RUN, "--run-dir", str(run_dir), "--tensorboard", env=no_tensorboard)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"mprl: error: {MISSING}"]
    assert not run_dir.exists()  # no half-made run directory: the same command can be rerun
