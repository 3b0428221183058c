"""RunStats: the main process's view of a run."""

from __future__ import annotations

from mprl.stats import RunStats


def test_solved_latches_once_the_window_mean_reaches_the_threshold():
    stats = RunStats(threshold=10.0, total_steps=None)
    for _ in range(99):
        stats.add({"episode_return": 20.0})
    assert not stats.solved()  # fewer than 100 episodes
    stats.add({"episode_return": 20.0})
    assert stats.solved()
    for _ in range(100):  # episodes that arrive while the run stops do not undo it
        stats.add({"episode_return": 0.0})
    assert stats.mean_return_100 == 0.0 and stats.solved()


def test_state_round_trips_counters_and_window():
    stats = RunStats(threshold=None, total_steps=None)
    for r in range(150):
        stats.add({"episode_return": float(r)})
    state = stats.state()
    again = RunStats(threshold=None, total_steps=None)
    again.restore(state)
    assert again.episodes == 150 and list(again.returns) == list(stats.returns)
    assert again.best_return == 149.0 and again.wall_s >= state["wall_s"]
