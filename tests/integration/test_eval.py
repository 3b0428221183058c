"""``python -m mprl eval``: a trained policy played from its checkpoint, through the CLI."""

from __future__ import annotations

import json
import os

from tests.conftest import cli, cli_here


def _train(run_dir, *args: str) -> None:
    proc = cli("run", "--run-dir", str(run_dir), "--quiet", *args, timeout=280)
    assert proc.returncode == 0, proc.stderr


def test_eval_is_repeatable_for_a_seed_and_plays_box_actions(tmp_path):
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "ppo", "--env", "Pendulum-v1", "--total-steps", "4000")
    out = [tmp_path / f"eval{i}.json" for i in range(3)]
    for file, seed in zip(out, ("3", "3", "4"), strict=True):
        proc = cli("eval", str(run_dir / "checkpoints" / "last.pt"), "--episodes", "3",
                   "--seed", seed, "--out", str(file))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    first, again, other = (json.loads(f.read_text()) for f in out)
    assert first["lengths"] == [200, 200, 200]  # Pendulum's time limit: played to the end
    assert first["returns"] == again["returns"]  # same seed: same episodes, same sampled actions
    assert first["returns"] != other["returns"]
    assert first["env"] == "Pendulum-v1" and first["algorithm"] == "ppo"
    assert first["deterministic"] is False and first["env_steps_trained"] >= 4000


def test_eval_refuses_bad_input_naming_it(tmp_path, capsys):
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    code, err = cli_here(capsys, "eval", str(not_a_run))  # refused before anything starts
    assert code == 2 and f"no checkpoint at '{not_a_run}/checkpoints/last.pt'" in err, err
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "a3c", "--workers", "1", "--total-steps", "500")
    code, err = cli_here(capsys, "eval", str(run_dir), "--episodes", "0")
    assert code == 2 and "--episodes must be at least 1" in err, err
    hidden = tmp_path / "hidden"  # moviepy made unimportable, as on a machine without it
    (hidden / "moviepy").mkdir(parents=True)
    (hidden / "moviepy" / "__init__.py").write_text("raise ImportError('not installed')\n")
    proc = cli("eval", str(run_dir), "--video", str(tmp_path / "video"),
               env={"PYTHONPATH": os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])})  # fmt: skip
    assert proc.returncode == 2 and 'pip install "mprl[video]"' in proc.stderr
    assert not (run_dir / "eval.json").exists()  # nothing half-done


def test_video_records_every_episode(tmp_path):
    run_dir = tmp_path / "run"
    _train(run_dir, "--plugin", "a3c", "--workers", "1", "--total-steps", "500")
    video = tmp_path / "video"
    proc = cli("eval", str(run_dir), "--episodes", "2", "--video", str(video))
    assert proc.returncode == 0, proc.stderr
    files = sorted(video.glob("*.mp4"))
    assert [f.name for f in files] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    assert all(f.stat().st_size > 1000 for f in files)
    assert json.loads((run_dir / "eval.json").read_text())["video_dir"] == str(video)
