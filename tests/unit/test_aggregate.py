"""Statistics across seeds (rliable's): the IQM of runs' final scores with a 95% stratified-
bootstrap interval in the sweep's report, performance profiles, and `mprl plot` drawing the
seeds of one configuration as their IQM with a band. Run directories are written as a run
writes them (config.json, metrics.jsonl, summary.json), with returns chosen here."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from mprl.tools import aggregate
from mprl.tools.cli import main
from mprl.tools.report import read_run
from mprl_builtin.sweep import results, spec


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenth of the bootstrap's resamples: what the tests check (an interval holds the IQM,
    narrows with seeds, a band holds its curve) does not need the report's precision."""
    monkeypatch.setattr(aggregate, "REPS", aggregate.REPS // 10)
    monkeypatch.setattr(aggregate, "CURVE_REPS", aggregate.CURVE_REPS // 10)


# (found, not imported: rliable's import takes 4 s, which every pytest-xdist worker would pay
# collecting this module, whatever tests it then runs)
needs_rliable = pytest.mark.skipif(
    importlib.util.find_spec("rliable") is None, reason="rliable not installed"
)


def write_run(path, *, final, seed=0, config=None, evals=(), episodes=150, plugin="ppo"):
    """A finished run's directory: ``episodes`` training returns rising to ``final`` (the last
    100 all ``final``), evaluations ``(step, mean)``, and its summary."""
    path.mkdir(parents=True)
    returns = [final * i / (episodes - 100) for i in range(episodes - 100)] + [final] * 100
    records = [
        {"source": "worker:0", "step": 100 * (i + 1), "wall": 0.5 * (i + 1),
         "episode_return": float(r), "episode_length": 10}
        for i, r in enumerate(returns)
    ]  # fmt: skip
    records += [
        {"source": "eval", "step": step, "wall": step / 200, "eval_return_mean": float(mean),
         "eval_return_std": 0.0, "eval_episodes": 10}
        for step, mean in evals
    ]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "config.json").write_text(json.dumps({
        "plugin": plugin, "config": config or {"lr": 0.001},
        "run": {"env": "CartPole-v1", "seed": seed}, "reward_threshold": 475.0,
    }))  # fmt: skip
    (path / "summary.json").write_text(json.dumps({
        "status": "finished", "plugin": plugin, "env": "CartPole-v1", "solved": final >= 475,
        "env_steps": 100 * episodes, "episodes": episodes, "wall_s": 0.5 * episodes,
        "best_return": float(final), "mean_return_100": float(final),
    }))  # fmt: skip
    return path


def test_the_iqm_is_the_mean_of_the_middle_half():
    assert aggregate.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # 1, 2 and 7, 8 cut
    assert aggregate.iqm([8, 1, 100, 3]) == 5.5  # floor(4 / 4) = 1 cut from each end
    assert aggregate.iqm([1.0, 2.0, 3.0]) == 2.0  # floor(3 / 4) = 0: the mean
    rng = np.random.default_rng(5)
    x = rng.normal(size=(9, 4))
    middle = np.sort(x, axis=0)[2:7].mean(axis=0)  # 9 // 4 = 2 cut from each end
    assert np.allclose(aggregate.iqm(x, axis=0), middle)


@needs_rliable
def test_the_interval_holds_the_iqm_narrows_with_seeds_and_needs_two():
    rng = np.random.default_rng(7)
    few, many = rng.normal(300, 60, 4), rng.normal(300, 60, 40)
    for scores in (few, many):
        point, (low, high) = aggregate.interval(scores)
        assert point == pytest.approx(aggregate.iqm(scores)) and low <= point <= high
    width = [np.subtract(*aggregate.interval(s)[1][::-1]) for s in (few, many)]
    assert width[1] < width[0] / 2
    assert aggregate.interval([123.0]) == (123.0, None)  # one seed: no fake interval
    assert aggregate.interval([5.0, 5.0, 5.0]) == (5.0, (5.0, 5.0))


@needs_rliable
def test_the_intervals_and_bands_are_rliables_own_computed_with_numpy():
    """The statistics given to rliable's bootstrap are numpy's (``iqm``, one comparison for
    every threshold) and rliable's own (``aggregate_iqm``, ``score_distributions``) gives the
    same point and interval, ties on a threshold included (a score equal to tau is not above)."""
    library, metrics = aggregate.rliable()
    rng = np.random.default_rng(11)
    scores = {"a": np.round(rng.normal(200, 80, 7)), "b": np.round(rng.normal(150, 40, 5))}
    taus = np.concatenate([np.linspace(0, 400, 41), scores["a"][:3]])  # thresholds on scores
    profiles = aggregate.performance_profiles(scores, taus, reps=300)
    matrices = {k: v.reshape(-1, 1) for k, v in scores.items()}
    points, cis = aggregate._bootstrap(
        library, matrices, lambda m: library.score_distributions(m, taus), 300
    )
    for key in scores:
        assert np.array_equal(profiles[key][0], points[key])
        assert np.array_equal(profiles[key][1], cis[key])
    point, ci = aggregate.interval(scores["a"], reps=500)
    _, theirs = aggregate._bootstrap(
        library, {"x": matrices["a"]}, lambda m: np.array([metrics.aggregate_iqm(m)]), 500
    )
    assert point == pytest.approx(metrics.aggregate_iqm(matrices["a"]), abs=1e-12)
    assert ci == pytest.approx(tuple(theirs["x"][:, 0]), abs=1e-9)


def test_final_score_is_the_last_evaluation_else_the_last_100_episodes(tmp_path):
    trained = read_run(write_run(tmp_path / "a", final=200))
    assert aggregate.final_score(trained) == (200.0, "training")
    evaluated = read_run(write_run(tmp_path / "b", final=200, evals=[(1000, 80), (2000, 450)]))
    assert aggregate.final_score(evaluated) == (450.0, "eval")


def _sweep(root, scores):
    """A sweep directory whose configs ``lr=...`` have runs with these final scores."""
    root.mkdir()
    grid = {"lr": list(scores)}
    s = spec.Spec("ppo", list(range(max(len(v) for v in scores.values()))), grid=grid)
    (root / spec.SPEC_FILE).write_text(json.dumps(s.to_dict()))
    for lr, finals in scores.items():
        for seed, final in enumerate(finals):
            write_run(root / "trials" / f"lr={lr}-seed{seed}", final=final, seed=seed,
                      config={"lr": float(lr)})  # fmt: skip
    return root


@needs_rliable
def test_the_sweep_report_gives_the_iqm_its_interval_and_performance_profiles(tmp_path):
    finals = {"1e-3": [500, 480, 100, 490, 470, 20, 500, 495], "3e-4": [300]}
    root = _sweep(tmp_path / "sw", finals)
    _, rows = results.sweep_results(root)
    by_key = {r["key"]: r for r in rows}
    eight = by_key["lr=1e-3"]
    assert sorted(eight["scores"]) == sorted(map(float, finals["1e-3"]))
    assert eight["score_kind"] == "training"
    middle = np.sort(finals["1e-3"])[2:6].mean()  # 100, 470, 480, 490 ... cut 2 each end
    assert eight["iqm"] == pytest.approx(middle)
    low, high = eight["iqm_ci"]
    assert low <= middle <= high and low >= 20 and high <= 500
    one = by_key["lr=3e-4"]
    assert one["iqm"] == 300.0 and one["iqm_ci"] is None

    text = results.write_results(root)
    row = next(line for line in text.splitlines() if line.startswith("lr=0.001"))
    assert f"{middle:.1f} [{low:.1f}, {high:.1f}]" in row
    assert "300.0 [-]" in next(ln for ln in text.splitlines() if ln.startswith("lr=0.0003"))
    assert "an interval needs at least 2 seeds" in text and "1 to 8 seeds" in text
    saved = json.loads((root / "results.json").read_text())["rows"]
    assert {r["key"]: r["iqm_ci"] for r in saved}["lr=1e-3"] == [low, high]
    assert (root / "profiles.png").stat().st_size > 0 and "profiles.png" in text

    taus = np.array([0.0, 250.0, 499.0])
    profiles = aggregate.performance_profiles({"a": finals["1e-3"]}, taus)
    point, band = profiles["a"]
    assert list(point) == [1.0, 6 / 8, 2 / 8]  # the fraction of runs above each tau
    assert band.shape == (2, 3) and np.all(band[0] <= point) and np.all(point <= band[1])


def test_without_rliable_the_report_says_so_and_shows_no_interval(tmp_path, monkeypatch):
    root = _sweep(tmp_path / "sw", {"1e-3": [500, 400, 300]})
    monkeypatch.setattr(aggregate, "rliable", lambda: None)
    text = results.write_results(root)
    assert aggregate.RLIABLE_MISSING in text and "400.0 [-]" in text
    assert not (root / "profiles.png").exists()


@needs_rliable
def test_plot_draws_each_configuration_as_its_iqm_with_a_band(tmp_path, capsys):
    a = [write_run(tmp_path / f"a{s}", final=f, seed=s) for s, f in enumerate([500, 450, 300])]
    b = [write_run(tmp_path / f"b{s}", final=100, seed=s, config={"lr": 0.01}) for s in (0, 1)]
    fig = aggregate.build_iqm_figure([read_run(p) for p in a + b])
    by_steps, by_wall = fig.axes
    for ax in (by_steps, by_wall):
        assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 2  # 2 bands
    labels = by_steps.get_legend_handles_labels()[1]
    assert "ppo CartPole-v1 lr=0.001: IQM of 3 seeds, 95% CI" in labels
    assert "ppo CartPole-v1 lr=0.01: IQM of 2 seeds, 95% CI" in labels
    line = next(
        ln for ln in by_steps.lines if ln.get_label().startswith("ppo CartPole-v1 lr=0.001")
    )
    assert line.get_ydata()[-1] == pytest.approx(aggregate.iqm([500, 450, 300]))  # = 450

    out = tmp_path / "curves.png"
    assert main(["plot", *map(str, a + b), "-o", str(out)]) == 0
    assert out.stat().st_size > 0
    assert main(["plot", *map(str, a), "--per-run", "-o", str(tmp_path / "lines.png")]) == 0
    capsys.readouterr()


def test_plot_without_rliable_draws_lines_and_says_why(tmp_path, monkeypatch, capsys):
    runs = [write_run(tmp_path / f"a{s}", final=400, seed=s) for s in range(2)]
    monkeypatch.setattr(aggregate, "rliable", lambda: None)
    assert main(["plot", *map(str, runs), "-o", str(tmp_path / "c.png")]) == 0
    said = capsys.readouterr().err
    assert f"mprl: one line per run, no IQM bands: {aggregate.RLIABLE_MISSING}" in said
    notes: list[str] = []
    fig = aggregate.seeds_figure([read_run(p) for p in runs], 100, notes)
    assert fig is None and len(notes) == 1
