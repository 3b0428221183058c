"""mappo learns Cooperative Navigation: its team return rises clearly above a random team's,
measured on the same env in the same test; so does rMAPPO (``core=gru``)."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.conftest import cli, read_metrics
from tests.slow import random_team_return

ENV = "mpe2:simple_spread_v3(N=3, max_cycles=25)"


@pytest.mark.timeout(900)  # (the run's own bound: 120k steps took 300 s beside a full suite)
@pytest.mark.parametrize("core", ["none", "gru"])  # gru: rMAPPO, chunks of 10 steps
def test_mappo_beats_a_random_team_on_cooperative_navigation(tmp_path, core):
    run_dir = tmp_path / "run"
    proc = cli("run", "--plugin", "mappo", "--env", ENV, "--workers", "2", "--seed", "1",
               "--total-steps", "120000", "--set", f"core={core}", "--run-dir", str(run_dir),
               "--quiet", timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    episodes = [r["episode_return"] for r in read_metrics(run_dir) if "episode_return" in r]
    first, last = statistics.fmean(episodes[:300]), statistics.fmean(episodes[-300:])
    random = random_team_return(3, 300)
    assert abs(first - random) < 3.0, (first, random)  # it starts as a random team does
    assert last > random + 4.0, (first, last, random)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 120000
