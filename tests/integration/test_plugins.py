"""The plugin manager and hooks, in isolation: fresh managers, plugins registered inline."""

from __future__ import annotations

import mprl
from mprl.host.plugins import get_plugin_manager


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
