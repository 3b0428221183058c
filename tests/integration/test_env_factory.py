"""A spawned run's workers make a plugin's env importing only that plugin: an unrelated plugin
installed beside it, broken on import, is imported by the main process alone."""

from __future__ import annotations

import os

from tests.conftest import cli, read_metrics, write_distribution
from tests.unit.test_env_factory import SPY


def test_spawned_workers_make_a_plugins_env_without_importing_the_others(installed, tmp_path):
    site = tmp_path / "spy-site"
    site.mkdir()
    write_distribution(site, "mprl-spy", {"spy": "mprl_spy"}, {"mprl_spy": SPY})
    marks = tmp_path / "imports.txt"
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), os.environ["PYTHONPATH"]]),
        "MPRL_SPY_FILE": str(marks),
    }
    run_dir = tmp_path / "run"
    proc = cli(
        "run", "--plugin", "probe", "--workers", "2", "--total-steps", "300", "--quiet",
        "--run-dir", str(run_dir), env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    imported = marks.read_text().split()
    assert len(imported) == 1  # the main process's import, no child's
    records = read_metrics(run_dir)
    # Corridor-v0 exists only through the test plugin's mprl_make_env: each worker made it (its
    # first record comes after), in a process of its own
    started = {r["rank"]: r["pid"] for r in records if "started" in r}
    assert sorted(started) == [0, 1] and imported[0] not in map(str, started.values())
    assert {r["episode_return"] for r in records if "episode_return" in r} == {10.0}
