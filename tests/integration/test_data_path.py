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
