"""``--total-steps``, ``--max-time`` and ``--eval-every`` / ``--eval-episodes`` through the CLI, with real runs:
a run ended by its time budget, resumed with the budget counting the whole run, and a3c on
CartPole judged on evaluation episodes that ``mprl eval --deterministic`` plays again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import cli, cli_here, read_metrics

THRESHOLD = 475.0  # CartPole-v1's reward threshold


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("backend", ["local", "serial"])
def test_max_time_ends_the_run_finished_with_a_checkpoint(tmp_path, backend):
    run_dir = tmp_path / "run"
    result = cli(
        "run", "--plugin", "a3c", "--workers", "2", "--max-time", "5s", "--backend", backend,
        "--run-dir", str(run_dir), "--quiet", timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("mprl: finished (time budget) after "), last
    s = _summary(run_dir)
    assert (s["status"], s["stop_reason"], s["exit_code"]) == ("finished", "time budget", 0)
    # stopped once 5 s had passed: then the stop of the children and the final checkpoint
    assert 5.0 <= s["wall_s"] - (s["shutdown_s"] or 0.0) < 8.0, s
    assert s["checkpoint"]["path"] == str(run_dir / "checkpoints" / "last.pt")
    saved = torch.load(s["checkpoint"]["path"], weights_only=False)
    assert saved["env_steps"] == s["env_steps"] == s["checkpoint"]["env_steps"]
    assert json.loads((run_dir / "config.json").read_text())["run"]["max_time"] == 5.0


@pytest.mark.parametrize("backend", ["local", "serial"])
def test_the_step_budget_stops_the_workers_within_a_rollout_each(tmp_path, installed, backend):
    # rollouts of 500 steps counted whole, 100,000+ steps/s: a budget looked at only by the main
    # process, every tick, would be passed by tens of thousands of steps
    run_dir, total, burst, workers = tmp_path / "run", 30_000, 500, 3
    result = cli(
        "run", "--plugin", "bursts", "--workers", str(workers), "--total-steps", str(total),
        "--set", f"burst={burst}", "--backend", backend, "--run-dir", str(run_dir), "--quiet",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    s = _summary(run_dir)
    assert s["stop_reason"] == "total steps reached", s
    # each worker was at most one rollout into the next when the count reached the budget
    assert total <= s["env_steps"] < total + workers * burst, s
    assert all(n % burst == 0 for n in s["per_worker_steps"][:workers])


def test_resumed_the_budget_counts_the_whole_run(tmp_path):
    run_dir = tmp_path / "run"
    common = ["--quiet", "--serial"]
    first = cli(
        "run", "--plugin", "a3c", "--workers", "1", "--max-time", "2", "--run-dir",
        str(run_dir), *common, timeout=180,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = _summary(run_dir)
    second = cli("run", "--resume", str(run_dir), "--max-time", "4s", *common, timeout=180)
    assert second.returncode == 0, second.stderr
    after = _summary(run_dir)
    assert after["stop_reason"] == "time budget" and after["session"] == 1
    assert 4.0 <= after["wall_s"] < 7.0  # 2 s more, not 4
    assert after["env_steps"] > before["env_steps"]
    # resumed with its budget spent: it stops at once, finished, its checkpoint kept
    third = cli("run", "--resume", str(run_dir), *common, timeout=180)
    assert third.returncode == 0, third.stderr
    assert "mprl: finished (time budget) after " in third.stdout
    spent = _summary(run_dir)
    assert spent["stop_reason"] == "time budget" and spent["session"] == 2
    assert spent["wall_s"] < after["wall_s"] + 2.0
    assert spent["checkpoint"] is not None


def test_a_bad_max_time_exits_2_naming_the_field(tmp_path, capsys):
    code, err = cli_here(
        capsys,
        "run",
        "--plugin",
        "a3c",
        "--max-time",
        "10 minutes",
        "--run-dir",
        str(tmp_path / "r"),
    )
    assert code == 2
    assert err.strip() == (
        "mprl: error: run option: field 'max_time': a wall-clock time above 0: seconds or a "
        "number with a unit, e.g. 90s, 10m, 1.5h, 1h30m (none: no limit); got '10 minutes'"
    )
    assert not (tmp_path / "r").exists()


def test_a3c_judged_on_evaluation_episodes_that_mprl_eval_plays_again(tmp_path):
    root = tmp_path / "runs"
    run_dir = root / "a3c-eval"
    result = cli(
        "run", "--plugin", "a3c", "--workers", "2", "--eval-every", "2000",
        "--eval-episodes", "3", "--total-steps", "500000", "--max-time", "150s",
        "--run-dir", str(run_dir), timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    s = _summary(run_dir)
    assert s["solved"] and s["stop_reason"] == "solved" and s["solved_on"] == "eval", s
    records = read_metrics(run_dir)
    evals = [r for r in records if r.get("source") == "eval"]
    steps = [r["step"] for r in evals]
    # one evaluation at a time, each at or past the next multiple of 2,000
    assert steps == sorted(steps) and steps[0] >= 2000
    assert len({step // 2000 for step in steps}) == len(steps)
    for r in evals:
        assert r["eval_episodes"] == 3 and len(r["eval_returns"]) == 3
        assert r["eval_return_mean"] == pytest.approx(sum(r["eval_returns"]) / 3)
        assert r["eval_length_mean"] == pytest.approx(sum(r["eval_lengths"]) / 3)
    # solved on the first evaluation that reached the threshold, not on training returns
    passed = next(r for r in evals if r["eval_return_mean"] >= THRESHOLD)
    assert s["solved_at"]["env_steps"] == passed["step"]
    # (the summary's mean to 2 decimals)
    assert s["solved_at"]["eval_return_mean"] == pytest.approx(passed["eval_return_mean"], abs=5e-3)
    assert not [r for r in records if r.get("event") == "policy-check"]
    assert [r["on"] for r in records if r.get("event") == "solved"] == ["eval"]
    assert s["last_eval"]["step"] == evals[-1]["step"]
    # what the user saw: the last evaluation in the progress line, the verdict
    assert f"eval {s['last_eval']['eval_return_mean']:.1f} ± " in result.stderr
    assert f"{passed['step']:,} env steps: eval return " in result.stdout

    # the final checkpoint holds the weights that evaluation played: `mprl eval
    # --deterministic` with the run's seed (0) plays the same three episodes
    played = cli(
        "eval", str(run_dir), "--deterministic", "--episodes", "3", "--seed", "0",
        "--out", str(tmp_path / "eval.json"),
    )  # fmt: skip
    assert played.returncode == 0, played.stderr
    again = json.loads((tmp_path / "eval.json").read_text())
    assert again["returns"] == passed["eval_returns"]
    assert again["lengths"] == passed["eval_lengths"]

    listed = cli("runs", str(root))
    assert listed.returncode == 0, listed.stderr
    head, line = listed.stdout.splitlines()[:2]
    assert "LAST EVAL" in head
    assert f"{s['last_eval']['eval_return_mean']:.1f}" in line.split()
    plotted = cli("plot", str(run_dir), "-o", str(tmp_path / "curves.png"))
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_eval_every_with_a_model_without_act_exits_2(tmp_path, installed, capsys):
    code, err = cli_here(
        capsys, "run", "--plugin", "probe", "--eval-every", "100", "--run-dir", str(tmp_path / "r")
    )
    assert code == 2
    line = err.strip()
    assert line.startswith("mprl: error: --eval-every 100: algorithm 'probe' of plugin ")
    assert "(ProbeModel) without an act(obs_batch, deterministic) method" in line
    assert "add one to the model" in line and len(line.splitlines()) == 1
    assert not (tmp_path / "r").exists()
