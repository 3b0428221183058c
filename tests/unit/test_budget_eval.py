"""The wall-clock budget (``--max-time``) and evaluation episodes (``--eval-every``,
``--eval-episodes``): parsing, the solved rule on evaluation returns, the player and what
``plot`` and ``runs`` read back. Runs here are serial, in this process; the CLI runs of both
are in tests/integration/test_budget_eval.py."""

from __future__ import annotations

import json
import math
import sys

import attrs
import gymnasium as gym
import pytest
import torch

import mprl
from mprl.errors import ConfigError, UsageError
from mprl.host import policy_check
from mprl.host.envs import play_episodes
from mprl.host.plugins import get_plugin_manager
from mprl.host.policy_check import Evaluation
from mprl.host.progress import summary_line
from mprl.host.stats import RunStats
from mprl.lib.nets import ActorCritic
from mprl.run_types import RunConfig, duration
from mprl.testing import plugin_manager, run_serial
from mprl.tools.evaluate import evaluate
from mprl.tools.report import build_figure, format_runs, list_runs, read_run
from tests.conftest import cli_here
from tests.plugins import mprl_testplugin

# -- --max-time: parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0), ("600", 600.0), (600, 600.0),
        (2.5, 2.5), ("1h30m", 5400.0), ("1h 30m 10s", 5410.0), (" 5 min ", 300.0),
        ("2d", 172800.0), ("1e3", 1000.0), (None, None), ("none", None),
    ],
)  # fmt: skip
def test_a_duration_is_seconds_or_a_number_with_a_unit(given, seconds):
    assert duration(given) == seconds
    assert RunConfig(max_time=given).max_time == seconds


@pytest.mark.parametrize("given", ["0", 0, -5, "10x", "1h30", "abc", "", "h", True, math.inf])
def test_a_bad_duration_says_what_is_accepted(given):
    with pytest.raises(ValueError, match=r"a wall-clock time above 0: .* e\.g\. 90s, 10m, 1\.5h"):
        duration(given)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-time", "10x"], "run option: field 'max_time': a wall-clock time above 0"),
        (["--max-time=-5"], "run option: field 'max_time': a wall-clock time above 0"),
        (["--eval-every", "-1"], "run option: field 'eval_every': 'eval_every' must be >= 0"),
        (["--eval-episodes", "0"], "run option: field 'eval_episodes': 'eval_episodes' must be >= 1"),
    ],
)  # fmt: skip
def test_bad_values_exit_2_naming_the_field(capsys, tmp_path, args, message):
    code, stderr = cli_here(
        capsys, "run", "--plugin", "a3c", "--run-dir", str(tmp_path / "r"), *args
    )
    assert code == 2
    assert stderr.startswith(f"mprl: error: {message}") and len(stderr.splitlines()) == 1, stderr
    assert not (tmp_path / "r").exists()


def test_max_time_in_the_run_table_and_from_python(capsys, tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[run]\nmax_time = "ten minutes"\n')
    code, stderr = cli_here(capsys, "run", "--plugin", "a3c", "--config", str(toml))
    assert code == 2
    assert f"config file '{toml}' [run]: field 'max_time': a wall-clock time above 0" in stderr
    with pytest.raises(ConfigError, match="field 'max_time'"):
        mprl.run("a3c", max_time="soon", run_dir=tmp_path / "r")
    options = get_plugin_manager(autoload=False).run_options()
    assert options.build({"max_time": "10m"}).max_time == 600.0
    assert options.build({"max_time": 90}).to_dict()["max_time"] == 90.0  # config.json: seconds


def test_help_shows_a_duration(capsys):
    from mprl.tools.cli import main

    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--max-time DURATION" in out and "--eval-every INT" in out


# -- --max-time: a run ------------------------------------------------------------------------


@attrs.define
class LedgeConfig:
    train_action: int = 0  # what the worker plays (Ledge-v0: 0 walks on, 1 steps off)
    play_action: int = 0  # what the model's act() plays (-1: the model has no act)
    act_raises: bool = False


class Walker(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))


class PlayingWalker(Walker):
    def __init__(self, action: int, raises: bool) -> None:
        super().__init__()
        self.action, self.raises = action, raises

    def act(self, obs: torch.Tensor, deterministic: bool) -> list[int]:
        if self.raises:
            raise ValueError("act() is broken")
        return [self.action] * len(obs)


def make_walker(obs_space, act_space, config):
    if config.play_action < 0:
        return Walker()
    return PlayingWalker(config.play_action, config.act_raises)


def walk(ctx: mprl.Context) -> None:
    env = ctx.make_env(0)
    env.reset(seed=ctx.seed)
    ret, length = 0.0, 0
    while not ctx.should_stop():
        _, reward, terminated, truncated, _ = env.step(ctx.config.train_action)
        ret, length = ret + float(reward), length + 1
        ctx.add_steps(1)
        if terminated or truncated:
            ctx.log_episode(ret, length)
            env.reset()
            ret, length = 0.0, 0
    env.close()


@mprl.hookimpl
def mprl_register_algorithms(register):
    register(
        mprl.Algorithm(
            name="walker", config_cls=LedgeConfig, make_model=make_walker, worker=walk,
            default_env="Ledge-v0",
        )
    )  # fmt: skip


def _walk(tmp_path, name, **options):
    """A serial run of the walker on Ledge-v0 (reward threshold 10: walking on to the end)."""
    options.setdefault("total_steps", 10**9)
    return run_serial(
        "walker", plugins=plugin_manager(mprl_testplugin, sys.modules[__name__]),
        run_dir=tmp_path / name, **options,
    )  # fmt: skip


def test_a_time_budget_ends_the_run_finished_with_a_checkpoint(tmp_path):
    result = _walk(tmp_path, "budget", max_time=1.0, config={"train_action": 1})
    s = result.summary
    assert (s.status, s.stop_reason, s.exit_code) == ("finished", "time budget", 0)
    assert 1.0 <= s.wall_s < 4.0
    assert s.checkpoint is not None and s.checkpoint["env_steps"] == s.env_steps > 0
    saved = torch.load(s.checkpoint["path"], weights_only=False)
    assert saved["run"]["max_time"] == 1.0
    # resumed, the budget counts the whole run: 1 s more, not 2
    again = _walk(tmp_path, "resumed", max_time="2s", resume=result.run_dir, total_steps=None)
    assert again.summary.stop_reason == "time budget" and again.summary.session == 1
    assert 2.0 <= again.summary.wall_s < 5.0
    assert again.summary.env_steps > s.env_steps


# -- --eval-every: the player -------------------------------------------------------------------


def test_an_evaluation_plays_what_mprl_eval_plays_in_slices(monkeypatch):
    """Sliced into one batched step per call, three envs side by side give the returns of the
    episodes ``mprl eval --deterministic`` plays one after another in one env."""
    env = gym.make("CartPole-v1")
    torch.manual_seed(3)
    model = ActorCritic(env.observation_space, env.action_space, hidden=(16,))
    monkeypatch.setattr(policy_check, "SLICE_S", 0.0)

    def make_envs():
        return [gym.make("CartPole-v1") for _ in range(3)]

    evaluation = Evaluation(model, make_envs, "x", every=100, episodes=5, seed=7, env_steps=250)
    assert evaluation.next_at == 300
    assert evaluation.advance(299, 1.0) is None and not evaluation.playing
    calls, record = 0, None
    while record is None:
        record = evaluation.advance(310 + calls, 2.0)
        calls += 1
    assert calls > 5 and evaluation.next_at == 400  # every call played one step
    assert (record["source"], record["step"], record["wall"]) == ("eval", 310, 2.0)
    with torch.random.fork_rng():
        torch.manual_seed(7)
        returns, lengths = play_episodes([env], model.act, 5, True, 7)
    assert record["eval_returns"] == returns and record["eval_lengths"] == lengths
    assert len(set(returns)) > 1  # the start states differ: not a trivial match
    assert record["eval_return_mean"] == pytest.approx(sum(returns) / 5)
    assert record["eval_return_std"] == pytest.approx(torch.tensor(returns).std(correction=0))
    assert record["eval_length_mean"] == pytest.approx(sum(lengths) / 5)
    evaluation.close()


# -- --eval-every: the solved rule on evaluation returns ----------------------------------------


def test_solved_on_evaluation_returns_not_on_training_returns(tmp_path):
    """Ledge-v0: walking on (action 0) scores the threshold, 10; action 1 steps off, 0."""
    # training walks off the ledge (returns 0), the deterministic policy walks on: solved on
    # the evaluation returns, the weights it played kept, "solved_on" saying so
    solved = _walk(
        tmp_path, "eval-solves", env="Ledge-v0", eval_every=200, eval_episodes=3,
        config={"train_action": 1, "play_action": 0},
    )  # fmt: skip
    s = solved.summary
    assert s.solved and s.stop_reason == "solved" and s.solved_on == "eval"
    evals = [r for r in solved.records if r.get("source") == "eval"]
    assert evals and all(r["eval_returns"] == [10.0] * 3 for r in evals)
    assert s.solved_at["env_steps"] == evals[0]["step"] >= 200
    assert s.solved_at["eval_return_mean"] == 10.0 and s.solved_at["mean_return_100"] == 0.0
    assert s.last_eval == {
        "step": evals[-1]["step"], "wall": evals[-1]["wall"], "eval_return_mean": 10.0,
        "eval_return_std": 0.0, "eval_length_mean": 10.0, "episodes": 3,
    }  # fmt: skip
    assert not [r for r in solved.records if r.get("event") == "policy-check"]
    assert [r["on"] for r in solved.records if r.get("event") == "solved"] == ["eval"]
    summary = json.loads((solved.run_dir / "summary.json").read_text())
    assert summary["solved_on"] == "eval" and summary["last_eval"]["eval_return_mean"] == 10.0
    # `mprl eval --deterministic` of its checkpoint plays what the evaluation played
    pm = plugin_manager(mprl_testplugin, sys.modules[__name__])
    played = evaluate(
        solved.run_dir, episodes=3, deterministic=True, plugins=pm,
        out=tmp_path / "eval.json",
    )  # fmt: skip
    assert played["returns"] == evals[0]["eval_returns"]
    assert played["lengths"] == evals[0]["eval_lengths"]

    # training returns reach the threshold, the deterministic policy steps off: with
    # evaluation episodes it is not solved, whatever the training returns say
    unsolved = _walk(
        tmp_path, "train-only", env="Ledge-v0", eval_every=200, eval_episodes=2,
        total_steps=2500, config={"train_action": 0, "play_action": 1},
    )  # fmt: skip
    s = unsolved.summary
    assert not s.solved and s.stop_reason == "total steps reached" and s.solved_on == "eval"
    assert s.mean_return_100 == 10.0 and s.last_eval["eval_return_mean"] == 0.0
    evals = [r for r in unsolved.records if r.get("source") == "eval"]
    assert len(evals) >= 2 and [r["step"] // 200 for r in evals] == sorted(
        {r["step"] // 200 for r in evals}
    )  # one evaluation per multiple of 200 at most, in order

    # without them, the training returns (and the policy check) decide, as before
    before = _walk(
        tmp_path, "no-eval", env="Ledge-v0", total_steps=5000,
        config={"train_action": 0, "play_action": 0},
    )  # fmt: skip
    assert before.summary.solved and before.summary.solved_on == "training"
    assert before.summary.last_eval is None
    assert [r.get("on") for r in before.records if r.get("event") == "solved"] == ["training"]


def test_a_model_without_act_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(UsageError) as caught:
        _walk(tmp_path, "no-act", eval_every=100, config={"play_action": -1})
    message = str(caught.value)
    assert "--eval-every 100: algorithm 'walker' of plugin" in message
    assert "(Walker) without an act" in message and "add one to the model" in message
    assert "act(obs_batch, deterministic)" in message
    assert not (tmp_path / "no-act").exists()


def test_an_act_that_breaks_stops_the_evaluations_and_training_returns_decide(tmp_path):
    result = _walk(
        tmp_path, "broken", env="Ledge-v0", eval_every=100, total_steps=3000,
        config={"act_raises": True},
    )  # fmt: skip
    failed = [r for r in result.records if r.get("event") == "eval-failed"]
    assert len(failed) == 1 and "act() is broken" in failed[0]["message"]
    assert "the training returns decide whether it is solved" in failed[0]["message"]
    assert result.summary.solved_on == "training" and result.summary.last_eval is None


# -- what the progress display, plot and runs show ------------------------------------------------


def test_the_progress_line_shows_the_last_evaluation_and_the_time_left():
    stats = RunStats(threshold=None, total_steps=None, max_time=600.0)
    line = summary_line(stats.snapshot())
    assert "eval" not in line and "ETA 600s" in line
    stats.add_eval(
        {"step": 24_000, "wall": 3.0, "eval_return_mean": 487.25, "eval_return_std": 12.1,
         "eval_length_mean": 487.25, "eval_episodes": 10}
    )  # fmt: skip
    assert "eval 487.2 ± 12.1 @ 24,000" in summary_line(stats.snapshot())
    again = RunStats(threshold=None, total_steps=None)
    again.restore(stats.state())  # a resumed run shows it too
    assert again.last_eval == stats.last_eval


def _run_dir(tmp_path, evals=True):
    lines = [
        {"source": "worker:0", "step": 100 * i, "wall": 0.1 * i, "episode_return": float(i)}
        for i in range(1, 30)
    ]
    if evals:
        lines += [
            {"source": "eval", "step": 1000, "wall": 1.0, "eval_return_mean": 5.0,
             "eval_return_std": 1.5, "eval_length_mean": 5.0, "eval_episodes": 3},
            {"source": "eval", "step": 2000, "wall": 2.0, "eval_return_mean": 9.5,
             "eval_return_std": 0.5, "eval_length_mean": 9.5, "eval_episodes": 3},
            {"source": "eval", "step": 3000, "wall": 3.0, "error": "TypeError: x"},  # not one
        ]  # fmt: skip
    tmp_path.mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "config.json").write_text(
        json.dumps({"plugin": "a3c", "run": {"env": "CartPole-v1"}, "reward_threshold": 10.0})
    )
    return tmp_path


def test_plot_draws_the_evaluations_beside_the_training_curve(tmp_path):
    run = read_run(_run_dir(tmp_path / "a"))
    assert run.evals == [(1000, 1.0, 5.0, 1.5), (2000, 2.0, 9.5, 0.5)]
    plain = read_run(_run_dir(tmp_path / "b", evals=False))
    fig = build_figure([run, plain], labels=["with", "without"], window=5)
    by_steps, by_wall = fig.axes
    labels = by_steps.get_legend_handles_labels()[1]
    assert {"with", "with (eval)", "without"} <= set(labels)
    for ax, xs in ((by_steps, [1000, 2000]), (by_wall, [1.0, 2.0])):
        (bars,) = ax.containers  # one errorbar container: the run with evaluations
        data_line, _, (barcol,) = bars.lines
        assert list(data_line.get_xdata()) == xs and list(data_line.get_ydata()) == [5.0, 9.5]
        segments = barcol.get_segments()  # error bars: mean ± std
        assert [(s[0][1], s[1][1]) for s in segments] == [(3.5, 6.5), (9.0, 10.0)]
    assert by_steps.lines[0].get_color() == bars.lines[0].get_color()  # the run's colour
    assert "eval" in by_steps.get_ylabel()
    only_evals = _run_dir(tmp_path / "c")
    (only_evals / "metrics.jsonl").write_text(
        json.dumps({"source": "eval", "step": 10, "wall": 1.0, "eval_return_mean": 2.0}) + "\n"
    )
    build_figure([read_run(only_evals)])  # evaluations alone are something to plot


def test_runs_shows_the_last_evaluation(tmp_path):
    _run_dir(tmp_path / "runs" / "a")
    _run_dir(tmp_path / "runs" / "b", evals=False)
    rows = {r["run_dir"].rsplit("/", 1)[1]: r for r in list_runs(tmp_path / "runs")}
    assert rows["a"]["last_eval"] == 9.5 and rows["b"]["last_eval"] is None
    table = format_runs(list(rows.values())).splitlines()
    assert "BEST RETURN  LAST EVAL  SOLVED" in table[0]
    assert "9.5" in next(x for x in table if "/a " in x)
    assert "LAST EVAL" not in format_runs([rows["b"]])  # no run with evaluations: no column


def test_solved_on_says_what_solved_the_run_across_sessions():
    from mprl.host.runner import _solved_on

    assert _solved_on(None, "eval") == "eval"  # not solved: the rule of this session
    assert _solved_on({"env_steps": 5, "mean_return_100": 480.0}, "eval") == "training"
    assert _solved_on({"env_steps": 5, "eval_return_mean": 500.0}, "training") == "eval"


def test_a_worker_at_its_grant_waits_for_the_next_one_or_the_stop():
    # a child that reports through calls (a Ray actor) takes the steps its driver granted and
    # then waits for the next grant instead of going on past the run's budget
    import threading

    from mprl.backends.child import ChildChannel

    channel = ChildChannel()
    channel.limit = 0  # budgeted, nothing granted yet
    channel.counted(0, limit=500)
    channel.add_steps(0, 400)  # below its grant: goes on
    assert channel.env_steps() == 400
    entered, left = threading.Event(), threading.Event()

    def rollout(n: int) -> None:
        entered.set()
        channel.add_steps(0, n)
        left.set()

    thread = threading.Thread(target=rollout, args=(200,))  # 600: past its grant of 500
    thread.start()
    entered.wait(10)
    assert not left.wait(0.3)
    channel.counted(300)  # a count without a grant (the driver's others) does not free it
    assert not left.wait(0.2)
    channel.counted(300, limit=700)
    assert left.wait(10)
    thread.join()
    assert channel.env_steps() == 900
    # at its grant again: the stop ends the wait as well
    entered.clear(), left.clear()
    thread = threading.Thread(target=rollout, args=(100,))
    thread.start()
    entered.wait(10)
    assert not left.wait(0.2)
    channel.stopping = True
    assert left.wait(10)
    thread.join()
    # no budget (limit None): never waits
    free = ChildChannel()
    free.add_steps(0, 10**9)
    assert free.steps == 10**9


def test_the_ray_drivers_grants_keep_the_workers_within_a_rollout_each_of_the_budget(
    monkeypatch,
):
    # the driver's grants, polled a tick at a time, with workers of unlike speeds that count
    # whole rollouts: the run ends at its budget plus at most a rollout per worker, and a fast
    # worker is not held back far from the budget
    import types

    from mprl.backends.base import Role
    from mprl_builtin.ray import backend
    from mprl_builtin.ray.backend import _Actor, _RaySupervisor

    clock = [0.0]
    monkeypatch.setattr(backend, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def run(total: int, speeds: list[int], burst: int) -> tuple[int, int]:
        """The run's steps at its end, and the ticks it took."""
        actors = {}
        for slot, _ in enumerate(speeds):
            a = _Actor.__new__(_Actor)
            a.role, a.actor, a._ended = Role(kind="worker", rank=slot, slot=slot), object(), None
            a.steps, a.limit, a.committed, a.first, a.answered_at = 0, None, 0, 0.0, 0.0
            actors[slot] = a
        trainer = _Actor.__new__(_Actor)
        trainer.role, trainer.actor, trainer._ended = Role(kind="trainer", rank=-1, slot=9), 1, None
        trainer.steps, trainer.limit, trainer.committed, trainer.first = 0, None, 0, 0.0
        trainer.answered_at = 0.0
        actors[9] = trainer
        sup = types.SimpleNamespace(
            job=types.SimpleNamespace(run=types.SimpleNamespace(total_steps=total)),
            base=[0] * 10, actors=actors,
            steps=lambda: [a.steps for a in actors.values()],
        )  # fmt: skip
        true = [0] * len(speeds)
        limits = [0] * len(speeds)
        for tick in range(1, 10_000):
            clock[0] += 0.25
            if sum(true) >= total:
                return sum(true), tick
            for slot, speed in enumerate(speeds):  # a tick of work: whole rollouts
                for _ in range(speed):
                    if true[slot] >= limits[slot]:
                        break
                    true[slot] += burst
            for slot, a in actors.items():  # the polls: grant, then the answer
                if slot == 9:
                    continue
                limits[slot] = _RaySupervisor.grant(sup, a)
                a.steps, a.answered_at = true[slot], clock[0]
                a.committed = max(a.limit, a.steps)
                if not a.steps:
                    a.first = clock[0]
        raise AssertionError("the run never reached its budget")

    for total, speeds, burst in [(30_000, [25, 25], 500), (30_000, [40, 3, 1], 500),
                                 (1_000_000, [100, 7], 200), (5_000, [1, 1, 1, 1], 1_000)]:  # fmt: skip
        steps, ticks = run(total, speeds, burst)
        assert total <= steps <= total + burst * len(speeds), (total, speeds, steps)
        # the waits for grants cost about a second (ticks of 0.25 s: the first grant, the rates
        # not known yet, the last steps split), whatever the length of the run
        ideal = total / burst / sum(speeds)
        assert ticks <= ideal + 6, (total, speeds, ticks, ideal)


def test_should_stop_is_true_once_the_runs_count_reaches_the_budget():
    from mprl.backends.child import ChildChannel
    from mprl.context import Context

    channel = ChildChannel()
    ctx = Context(
        role="worker", rank=0, n_workers=2, seed=0, config=None, state=None, model=None,
        optimizer=None, make_env=None, run=RunConfig(total_steps=1000), channel=channel,
    )  # fmt: skip
    channel.counted(900)
    assert not ctx.should_stop()
    ctx.add_steps(99)
    assert not ctx.should_stop()
    ctx.add_steps(1)
    assert ctx.should_stop()
