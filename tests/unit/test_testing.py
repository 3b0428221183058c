"""mprl.testing: what plugin authors test their hooks with (fixtures enabled in pyproject)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import mprl
from mprl import testing
from mprl.errors import PluginError
from tests.plugins import mprl_testplugin


class LongCartPole:
    @mprl.hookimpl
    def mprl_make_env(self, env_id, render_mode):
        if env_id == "CartPole-1000-v0":
            return gym.make("CartPole-v1", max_episode_steps=1000, render_mode=render_mode)
        return None


def test_call_hook_on_one_plugin_sees_only_its_answer(mprl_pm):
    plugin = LongCartPole()
    mprl_pm.register(plugin)
    kwargs = {"env_id": "CartPole-v1", "seed": 0, "rank": 0, "index": 0, "render_mode": None}
    assert testing.call_hook(mprl_pm, "mprl_make_env", plugin=plugin, **kwargs) is None
    env = testing.call_hook(mprl_pm, "mprl_make_env", **kwargs)  # the built-in answers
    assert env.spec.id == "CartPole-v1"
    env.close()
    kwargs["env_id"] = "CartPole-1000-v0"
    env = testing.call_hook(mprl_pm, "mprl_make_env", plugin=plugin, **kwargs)
    assert env.spec.max_episode_steps == 1000
    env.close()
    with pytest.raises(ValueError, match="'make_env' is not an mprl hook"):
        testing.call_hook(mprl_pm, "make_env")


def test_registered_checks_what_a_plugin_registers():
    algos = testing.registered(mprl_testplugin)
    assert list(algos) == ["probe", "bursts"]
    assert algos["probe"].train is mprl_testplugin.probe_train

    class Twice:
        @mprl.hookimpl
        def mprl_register_algorithms(self, register):
            register(algos["probe"])
            register(algos["probe"])

    with pytest.raises(
        PluginError, match=r"\(registered in code\) registers algorithm 'probe' more"
    ):
        testing.registered(Twice())


def test_recorder_sees_every_hook_of_a_serial_run(mprl_pm, mprl_recorder, mprl_serial):
    mprl_pm.register(LongCartPole(), name="long-cartpole")
    mprl_pm.register(mprl_testplugin, name="probe-plugin")
    result = mprl_serial("probe", env="CartPole-1000-v0", workers=2, total_steps=40)
    names = mprl_recorder.names()
    assert names.index("mprl_run_start") < names.index("mprl_run_end") == len(names) - 1
    # plugins are asked one by one, the last registered first, until one makes the env: once
    # in the main process to check the id, then once per worker, in that worker
    envs = mprl_recorder.of("mprl_make_env")
    assert [(c.plugins, c.kwargs["rank"], c.result is None) for c in envs] == [
        (("probe-plugin",), rank, True) if asked == "probe" else (("long-cartpole",), rank, False)
        for rank in (-1, 0, 1)
        for asked in ("probe", "long")
    ]
    made = [c.result for c in envs if c.result is not None]
    assert all(env.spec.max_episode_steps == 1000 for env in made)
    reported = [r for c in mprl_recorder.of("mprl_report_metrics") for r in c.kwargs["records"]]
    assert sum("episode_return" in r for r in reported) == result.summary.episodes
    end = mprl_recorder.of("mprl_run_end")[0]
    assert end.kwargs["summary"]["env_steps"] == result.summary.env_steps >= 40
    assert end.result == [] and end.error is None


def test_run_serial_resumes_a_run_in_place_with_its_own_workers_and_seed(tmp_path):
    pm = testing.plugin_manager(mprl_testplugin)
    first = testing.run_serial(
        "probe", plugins=pm, run_dir=tmp_path / "a", workers=2, seed=3, total_steps=120,
        env="Corridor-v0",
    )  # fmt: skip
    more = testing.run_serial("probe", plugins=pm, resume=first.run_dir, total_steps=240)
    assert more.run_dir == first.run_dir  # in place, as --resume without --run-dir
    assert more.summary.session == 1 and more.summary.env_steps >= 240
    assert len(more.summary.per_worker_steps) == 2  # the checkpoint's workers, not 1
    assert more.records[: len(first.records)] == first.records  # the metrics appended to
    assert any(r.get("event") == "resume" for r in more.records[len(first.records) :])
    # the checkpoint's run seed, and ctx.seed of a new session: not the first session's again
    seeds = {c.rank: c.seed for c in more.contexts}
    assert seeds == {r: mprl.context.derive_seed(3, r + 1, 1, 0) for r in (-1, 0, 1)}
    assert seeds != {c.rank: c.seed for c in first.contexts}
    other = testing.run_serial(
        "probe", plugins=pm, resume=more.run_dir, run_dir=tmp_path / "b", workers=1,
        total_steps=300, resume_drop="seen",
    )  # fmt: skip
    assert other.run_dir == tmp_path / "b" and len(other.summary.per_worker_steps) == 1
