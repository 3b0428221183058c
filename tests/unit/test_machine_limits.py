"""What a machine can hold, checked before a run starts (memory for its processes, a note on a
crowded machine), and the episodes a run sums up past its metrics' budget."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mprl.backends.local import preflight
from mprl.errors import UsageError
from mprl.host.monitor import EpisodeThinning
from mprl.tools.report import read_run
from tests.conftest import (
    cli_here,
)


def probe(run_dir: Path, *settings: str, steps: int = 10**9, workers: int = 2) -> list[str]:
    args = ["--plugin", "probe", "--workers", str(workers), "--quiet", "--run-dir", str(run_dir)]
    args += ["--total-steps", str(steps), "--set", "step_sleep=0.002"]
    for setting in settings:
        args += ["--set", setting]
    return args


# too many workers for the machine, and "interrupted" whatever happened after the stop
def test_more_workers_than_the_memory_holds_is_refused_before_anything_starts(
    installed, tmp_path, capsys
):
    code, err = cli_here(capsys, "run", *probe(tmp_path / "run", workers=1000))
    assert code == 2 and "Use fewer workers (--workers" in err and "MiB each" in err, err
    assert not (tmp_path / "run").exists()


def test_memory_and_core_notes_before_a_crowded_run():
    each = preflight.CHILD_BYTES
    with pytest.raises(UsageError, match=r"more than the 0.9 GiB this machine has available"):
        preflight.check_memory(10, available=int(5.8 * each))
    notes = preflight.check_memory(10, available=11 * each)
    assert [n for n in notes if "1.6 GiB of the 1.7 GiB available: the machine may start" in n]
    cores = os.cpu_count() or 1
    assert any(f"on {cores} cores" in n for n in preflight.check_memory(4 * cores + 1, 10**15))
    assert preflight.check_memory(2, available=10**15) == []


# a long fast run writes a bounded stream of episode records
def test_episodes_past_the_budget_are_summed_up_per_source_and_read_back_weighted(tmp_path):
    thin = EpisodeThinning(full=False, rate=0.0, burst=3, every_s=3600)
    episodes = [
        {"source": f"worker:{i % 2}", "step": 10 * i, "wall": float(i), "episode_return": float(i),
         "episode_length": i}
        for i in range(9)
    ]  # fmt: skip
    kept = [e for e in episodes if thin.keep(e)]
    assert kept == episodes[:3] and thin.due() == []  # not due yet
    summed = {r["source"]: r for r in thin.due(force=True)}
    assert summed["worker:1"] == {
        "source": "worker:1", "step": 70, "wall": 7.0, "episode_return": 5.0,
        "episode_length": 5.0, "episode_count": 3, "episode_return_min": 3.0,
        "episode_return_max": 7.0,
    }  # fmt: skip
    assert summed["worker:0"]["episode_count"] == 3 and thin.due(force=True) == []
    assert all(EpisodeThinning(full=True, rate=0, burst=0).keep(e) for e in episodes)
    # the run's tools read a summed-up record as that many episodes
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines = [*kept, *summed.values()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert len(read_run(run_dir).episodes) == 9
