"""The plugin manager and hooks, in isolation: fresh managers, plugins registered inline."""

from __future__ import annotations

import json

import torch

import mprl
from mprl.host.plugins import get_plugin_manager
from tests.conftest import cli, read_metrics


def test_run_start_and_end_hooks_see_the_run(pm, installed, tmp_path):
    seen = {}

    class Watcher:
        @mprl.hookimpl
        def mprl_run_start(self, run):
            seen["start"] = (run.algorithm, run.run.env, run.run_dir)

        @mprl.hookimpl
        def mprl_report_metrics(self, records):
            seen.setdefault("records", []).extend(records)

        @mprl.hookimpl
        def mprl_run_end(self, summary):
            seen["end"] = summary

    full = get_plugin_manager()
    full.register(Watcher(), name="watcher")
    summary = mprl.run(
        "probe", workers=1, total_steps=200, run_dir=tmp_path / "r", progress="none", plugins=full
    )
    assert seen["start"] == ("probe", "Corridor-v0", tmp_path / "r")
    episodes = [r for r in seen["records"] if "episode_return" in r]
    assert len(episodes) == summary.episodes >= 1
    assert all(r["episode_return"] == 10.0 for r in episodes)  # the corridor is 10 steps long
    assert seen["end"]["env_steps"] == summary.env_steps >= 200


def test_a_third_party_plugin_named_like_a_built_in_is_chosen_on_the_command_line(
    third_party_dqn, tmp_path
):
    """``mprl-dqn`` (plugin ``dqn``, module ``mprl_dqn``) installed beside mprl: ``plugins``
    shows the conflict, ``run`` refuses it starting nothing, and ``-p no:mprl:dqn`` runs the
    third party's code, in spawned workers too, recorded as ``mprl-dqn``'s."""
    listing = cli("plugins")
    assert listing.returncode == 0, listing.stderr
    (conflict,) = [line for line in listing.stdout.splitlines() if line.startswith("CONFLICT")]
    assert conflict.startswith("CONFLICT plugin 'dqn' is installed by more than one distribution")
    assert f"mprl {mprl.__version__} (mprl_builtin.dqn) and mprl-dqn 0.1.0 (mprl_dqn)" in conflict
    assert "-p no:mprl:dqn or -p no:mprl-dqn:dqn" in conflict and "uninstall" in conflict

    refused = cli("run", "--plugin", "dqn", "--run-dir", str(tmp_path / "refused"))
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines() == [f"mprl: error: {conflict.removeprefix('CONFLICT ')}"]
    assert not (tmp_path / "refused").exists()

    run_dir = tmp_path / "run"
    ran = cli(
        "run", "--plugin", "dqn", "-p", "no:mprl:dqn", "--workers", "1", "--total-steps", "300",
        "--env", "CartPole-v1", "--quiet", "--run-dir", str(run_dir),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["plugin_distribution"], config["plugin_version"]) == ("mprl-dqn", "0.1.0")
    assert config["config"] == {"anneal_steps": 100}
    sources = {r.get("source") for r in read_metrics(run_dir) if "third_party_steps" in r}
    assert sources == {"worker:0"}  # the third party's worker ran, in a spawned child
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (saved["plugin_distribution"], saved["plugin_version"]) == ("mprl-dqn", "0.1.0")
