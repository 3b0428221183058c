"""RunStats: the main process's view of a run."""

from __future__ import annotations

from mprl.host.stats import RunStats


def test_reached_follows_the_window_mean_and_solved_latches_once_marked():
    stats = RunStats(threshold=10.0, total_steps=None)
    for _ in range(99):
        stats.add({"episode_return": 20.0})
    assert not stats.reached()  # fewer than 100 episodes
    stats.add({"episode_return": 20.0})
    assert stats.reached() and not stats.solved()  # solved: once the runner checked the policy
    stats.mark_solved()
    for _ in range(100):  # episodes that arrive while the run stops do not undo it
        stats.add({"episode_return": 0.0})
    assert stats.mean_return_100 == 0.0 and not stats.reached() and stats.solved()
    assert stats.solved_at["episodes"] == 100 and stats.solved_at["mean_return_100"] == 20.0
    again = RunStats(threshold=10.0, total_steps=None)
    again.restore(stats.state())
    assert again.solved() and again.solved_at == stats.solved_at
    older = stats.state()
    del older["solved"], older["solved_at"]  # before the check: solved when it had reached
    again = RunStats(threshold=10.0, total_steps=None)
    again.restore(older)
    assert not again.solved()
    older["solved"] = True  # solved before the moment was kept
    again = RunStats(threshold=10.0, total_steps=None)
    again.restore(older)
    assert again.solved() and again.solved_at == {}


def test_a_run_resumed_with_a_higher_target_is_solved_only_once_it_reaches_that():
    stats = RunStats(threshold=10.0, total_steps=None)
    for _ in range(100):
        stats.add({"episode_return": 20.0})
    stats.mark_solved()
    for threshold, solved in ((20.0, True), (5.0, True), (20.5, False)):
        again = RunStats(threshold=threshold, total_steps=None)
        again.restore(stats.state())
        assert again.solved() is solved, threshold
    by_eval = RunStats(threshold=10.0, total_steps=None)
    by_eval.restore(stats.state())
    by_eval.solved_at = {**stats.solved_at, "eval_return_mean": 30.0, "mean_return_100": 1.0}
    again = RunStats(threshold=25.0, total_steps=None)
    again.restore(by_eval.state())
    assert again.solved()  # solved by evaluation episodes: theirs is the number that counts


def test_state_round_trips_counters_and_window():
    stats = RunStats(threshold=None, total_steps=None)
    for r in range(150):
        stats.add({"episode_return": float(r)})
    state = stats.state()
    again = RunStats(threshold=None, total_steps=None)
    again.restore(state)
    assert again.episodes == 150 and list(again.returns) == list(stats.returns)
    assert again.best_return == 149.0 and again.wall_s >= state["wall_s"]


def test_worker_rates_idle_times_and_eta_reach_the_live_panel(monkeypatch):
    import io

    from rich.console import Console

    from mprl.host import stats as stats_module
    from mprl.host.progress import Progress

    clock = [100.0]
    monkeypatch.setattr(stats_module.time, "monotonic", lambda: clock[0])
    stats = RunStats(threshold=None, total_steps=10_000)
    stats.workers = 2
    stats.set_steps([0, 0, 0, 0])  # two workers, the trainer's slot, carried-over steps
    for _ in range(8):  # worker 0 steps 500/s, worker 1 is stuck from the start
        clock[0] += 1.0
        stats.set_steps([stats.per_worker[0] + 500, 0, 0, 0])
    snap = stats.snapshot()
    assert snap.worker_rates == (500.0, 0.0) and snap.steps_per_s == 500.0
    assert snap.worker_idle_s == (0.0, 8.0)
    assert snap.eta_s == (10_000 - 4_000) / 500.0
    out = io.StringIO()
    Console(file=out, width=120).print(Progress("none")._render(snap))
    text = out.getvalue()
    assert "worker 0" in text and "stepping" in text and "4,000" in text
    assert "worker 1" in text and "idle 8s" in text
    assert "12s" in text  # the ETA column


def test_the_rate_of_counters_that_move_in_bursts_never_reads_zero_between_them(monkeypatch):
    from mprl.host import stats as stats_module

    clock = [50.0]
    monkeypatch.setattr(stats_module.time, "monotonic", lambda: clock[0])
    stats = RunStats(threshold=None, total_steps=None)
    stats.workers = 1
    stats.set_steps([0, 0])
    shown = []
    for tick in range(1, 16):  # 3,000 steps every third second: 1,000 steps/s
        clock[0] += 1.0
        stats.set_steps([stats.per_worker[0] + (3000 if tick % 3 == 0 else 0), 0])
        shown.append(stats.snapshot().steps_per_s)
    # from the first burst on, the rate is the window's (5 s): never 0 between bursts
    assert all(600 <= rate <= 1500 for rate in shown[3:]), shown
    assert abs(shown[-1] - 1000) <= 400, shown
    # a stall reads 0 once the window holds no step
    for _ in range(7):
        clock[0] += 1.0
        stats.set_steps(list(stats.per_worker))
    assert stats.snapshot().steps_per_s == 0.0
