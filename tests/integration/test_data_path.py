"""The data of one run followed from the command line to each process and back: an algorithm
config value (--set) and a run option a plugin registers (--probe-tag) reach every worker and
the train process, and what they log comes back to metrics.jsonl, on the local and serial
backends (Ray: tests/slow/ray_cluster)."""

from __future__ import annotations

import pytest

from tests.conftest import cli, read_metrics


@pytest.mark.parametrize("backend", ["local", "serial"])
def test_a_flag_and_a_config_value_reach_every_process_and_come_back(installed, tmp_path, backend):
    run_dir = tmp_path / "run"
    done = cli(
        "run", "--plugin", "probe", "--backend", backend, "--workers", "2", "--quiet",
        "--total-steps", "300", "--probe-tag", "from-the-cli", "--set", "step_sleep=0.0015",
        "--run-dir", str(run_dir), timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tagged = {r["source"]: r for r in read_metrics(run_dir) if "tag" in r}
    assert set(tagged) == {"worker:0", "worker:1", "trainer"}
    assert {r["tag"] for r in tagged.values()} == {"from-the-cli"}
    assert tagged["worker:0"]["step_sleep"] == tagged["worker:1"]["step_sleep"] == 0.0015
    config = (run_dir / "config.json").read_text()
    assert '"probe_tag": "from-the-cli"' in config  # kept for a resume


def test_children_forked_from_the_forkserver_start_as_spawned_ones_do(installed, tmp_path):
    """--start-method forkserver (the default) and spawn: each worker's first random draws
    (random, numpy, torch) are its seed's, the same under both, another worker's differ (a
    forked child does not carry the server's random state), and the thread count is the run's."""
    firsts = {}
    for method in ("forkserver", "spawn"):
        run_dir = tmp_path / method
        done = cli(
            "run", "--plugin", "probe", "--workers", "2", "--seed", "7", "--torch-threads", "1",
            "--total-steps", "200", "--start-method", method, "--run-dir", str(run_dir),
            "--quiet", timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        started = {r["source"]: r for r in read_metrics(run_dir) if "draws" in r}
        assert set(started) == {"worker:0", "worker:1"}
        assert all(r["threads"] == 1 for r in started.values())
        firsts[method] = {source: r["draws"] for source, r in started.items()}
    assert firsts["forkserver"] == firsts["spawn"]
    draws = firsts["spawn"]
    assert all(a != b for a, b in zip(draws["worker:0"], draws["worker:1"], strict=True))
