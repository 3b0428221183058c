"""Several named optimizers over parts of one shared model (the classic program's policy and
auxiliary optimizers): shared, checkpointed, restored on resume, reachable by name."""

from __future__ import annotations

import json

import mprl
from mprl.host.checkpoint import load
from mprl.testing import plugin_manager
from tests.plugins import two_optimizers


def test_two_named_optimizers_are_shared_checkpointed_and_resumed(tmp_path):
    pm = plugin_manager(two_optimizers)
    run_dir = tmp_path / "run"
    common = {"plugins": pm, "backend": "serial", "progress": "none", "workers": 1}
    first = mprl.run("two-optimizers", run_dir=run_dir, total_steps=300, **common)
    _, saved = load(run_dir)
    assert set(saved["optimizers"]) == {"policy", "aux"} and saved["optimizer"] is None
    steps = int(saved["optimizers"]["policy"]["state"][0]["step"])
    assert steps > 10  # the learner stepped the shared Adam this often
    assert "momentum_buffer" in saved["optimizers"]["aux"]["state"][0]
    assert saved["optimizers"]["aux"]["param_groups"][0]["lr"] == 0.05  # its own settings
    again = mprl.run(resume=run_dir, total_steps=600, **common)
    assert again.session == 1 and again.env_steps >= 600 > first.env_steps
    _, after = load(run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [r["adam_step"] for r in records if "adam_step" in r]
    assert starts == [1, steps + 1]  # the resumed Adam counted on from its checkpoint
    assert int(after["optimizers"]["policy"]["state"][0]["step"]) > steps
