"""`mprl runs`, `mprl plot` and `mprl eval` on run directories whose files someone else wrote:
escape sequences and newlines planted in ``config.json`` / ``summary.json`` are shown, never
sent to the terminal; a damaged or hostile ``config.json``, ``summary.json`` or
``metrics.jsonl`` beside a good run is skipped with one line naming it, and the rest is shown.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mprl.tools.cli import main
from tests.conftest import cli

DEEP = 100_000  # levels of nesting: far past what json (Python's recursion limit) can read


@pytest.fixture(scope="module")
def good(plugin_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short real run of the test plugin, made once: RUN/good."""
    run_dir = tmp_path_factory.mktemp("made") / "good"
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_site), os.environ.get("PYTHONPATH", "")])}
    made = cli(
        "run", "--plugin", "probe", "--workers", "1", "--total-steps", "600", "--quiet",
        "--set", "play_action=0", "--run-dir", str(run_dir), env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return run_dir


def _edit_json(path: Path, change: Callable[[dict], object]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _mprl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``python -m mprl ARGS`` in this process: exit code, stdout, stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# escape sequences and newlines in what a run directory holds are shown, never sent raw
def test_what_runs_plot_and_eval_print_from_files_is_escaped(good, tmp_path, installed):
    root = tmp_path / "runs"
    shutil.copytree(good, root / "good")
    evil = root / "evil\x1b[2J"  # a directory name is read from the file system too
    shutil.copytree(good, evil)
    title = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"  # set the window title, clear the screen, red
    _edit_json(evil / "config.json", lambda c: c.update(plugin=f"probe{title}\ud800"))
    _edit_json(evil / "config.json", lambda c: c["run"].update(env="Corridor\nFAKE-ROW\r"))
    _edit_json(evil / "summary.json", lambda s: s.update(status="finished\x1b[8m\u202e"))
    shown = cli("runs", str(root))  # a real stdout, as a terminal would get it
    assert shown.returncode == 0, shown.stderr
    everything = shown.stdout + shown.stderr
    assert "\x1b" not in everything and "\x07" not in everything and "\r" not in everything
    assert "\u202e" not in everything, everything
    lines = shown.stdout.splitlines()
    assert len(lines) == 3, lines  # the header and one line per run: no planted line
    row = next(line for line in lines if "evil" in line)
    assert row.split()[0] == str(root / "evil\\x1b[2J")
    assert "probe\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31m\\ud800" in row, row
    assert "Corridor\\nFAKE-ROW\\r" in row and "finished\\x1b[8m\\u202e" in row, row

    curves = cli("plot", str(root / "good"), str(evil), "-o", str(tmp_path / "c.png"))
    assert curves.returncode == 0, curves.stderr
    assert "\x1b" not in curves.stdout + curves.stderr
    assert (tmp_path / "c.png").stat().st_size > 10_000

    # eval names the env its checkpoint holds
    saved = torch.load(evil / "checkpoints" / "last.pt", weights_only=True)
    saved["run"]["env"] = f"Corridor-v0{title}"
    torch.save(saved, evil / "checkpoints" / "last.pt")
    played = cli("eval", str(evil), "--episodes", "1", "--out", str(tmp_path / "e.json"))
    assert played.returncode == 2, played.stderr
    assert "\x1b" not in played.stdout + played.stderr, played.stderr
    assert len(played.stderr.strip().splitlines()) == 1, played.stderr


#: damaged or hostile files, each beside a good run: (file, what it holds, why it is skipped)
DAMAGED = {
    "config-nested": ("config.json", '{"run": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
    "config-run-a-string": ("config.json", '{"plugin": "probe", "run": "x"}', "run is string, not object"),
    "config-env-nan": ("config.json", '{"plugin": "probe", "run": {"env": NaN}, "reward_threshold": 10}', "run.env is NaN, not string"),
    "config-not-json": ("config.json", "{not json", "not JSON: "),
    "summary-nested": ("summary.json", '{"status": ' + "[" * DEEP + "]" * DEEP + "}", "nested too deeply"),
    "summary-wrong-kinds": ("summary.json", '{"status": ["finished"], "env_steps": "many"}', "status is array, not string"),
    "summary-a-list": ("summary.json", "[1, 2]", "a JSON array, not an object"),
}  # fmt: skip

#: lines appended to a good run's metrics.jsonl that no run writes
HOSTILE_LINES = {
    "metrics-nested": "[" * DEEP + "]" * DEEP,
    "metrics-infinite-step": '{"source": "worker:0", "step": Infinity, "wall": 1.0, "episode_return": 1.0}',
    "metrics-nan-wall": '{"source": "worker:0", "step": 5, "wall": NaN, "episode_return": 1.0}',
    "metrics-episode-count": '{"source": "worker:0", "step": 3, "wall": 1.0, "episode_return": 1.0, "episode_count": 1000000000000}',
}  # fmt: skip


def _damaged(good: Path, root: Path, case: str) -> tuple[Path, str]:
    """RUN/good and RUN/bad (a copy of it, damaged as ``case`` says); the line expected."""
    shutil.copytree(good, root / "good")
    bad = root / "bad"
    shutil.copytree(good, bad)
    if case in DAMAGED:
        name, text, why = DAMAGED[case]
        (bad / name).write_text(text)
        return bad, f"mprl: skipped {str(bad / name)!r} ({why}"
    with (bad / "metrics.jsonl").open("a") as f:
        f.write(HOSTILE_LINES[case] + "\n")
    return bad, f"mprl: skipped 1 line of {str(bad / 'metrics.jsonl')!r} (nested too deeply, or a"


@pytest.mark.parametrize("case", [*DAMAGED, *HOSTILE_LINES])
def test_runs_skips_a_damaged_file_naming_it_and_shows_the_rest(good, tmp_path, capsys, case):
    root = tmp_path / "runs"
    bad, expected = _damaged(good, root, case)
    code, out, err = _mprl(capsys, "runs", str(root))
    assert code == 0, err
    (line,) = err.strip().splitlines()
    assert line.startswith(expected), line
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert set(rows) == {str(root / "good"), str(bad)}, out
    summary = json.loads((good / "summary.json").read_text())
    assert rows[str(root / "good")][1:3] == ["testplugin", "Corridor-v0"]
    assert rows[str(root / "good")][-1] == "finished"
    if not case.startswith("summary"):  # what summary.json says is still shown
        assert rows[str(bad)][-1] == "finished" and f"{summary['env_steps']:,}" in rows[str(bad)]
    if not case.startswith("config"):
        assert rows[str(bad)][1] == "testplugin"  # config.json's


@pytest.mark.parametrize("case", [*DAMAGED, *HOSTILE_LINES])
def test_plot_skips_a_damaged_file_naming_it_and_draws_the_rest(good, tmp_path, capsys, case):
    root = tmp_path / "runs"
    bad, expected = _damaged(good, root, case)
    out_png = tmp_path / "curves.png"
    code, out, err = _mprl(capsys, "plot", str(root / "good"), str(bad), "-o", str(out_png))
    assert code == 0, err
    (line,) = err.strip().splitlines()
    assert line.startswith(expected), line
    assert out.strip() == f"mprl: wrote {out_png}" and out_png.stat().st_size > 10_000


# a run with nothing left to draw once its hostile lines are skipped is left out, named
def test_plot_leaves_out_a_run_with_nothing_readable_beside_a_good_one(good, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text("[" * DEEP + "]" * DEEP + "\n")
    out_png = tmp_path / "curves.png"
    code, out, err = _mprl(capsys, "plot", str(good), str(bad), "-o", str(out_png))
    assert code == 0 and out.strip() == f"mprl: wrote {out_png}", err
    assert err.strip().splitlines() == [
        f"mprl: skipped 1 line of {str(bad / 'metrics.jsonl')!r} (nested too deeply, or a step, "
        "wall or episode count that no run writes)",
        f"mprl: skipped {str(bad)!r} (nothing in it could be drawn)",
    ], err
    assert out_png.stat().st_size > 10_000
    # alone, it is an error naming it, as a run without episodes is
    code, _, err = _mprl(capsys, "plot", str(bad), "-o", str(tmp_path / "alone.png"))
    assert code == 2 and f"run {str(bad)!r} has no episodes in metrics.jsonl yet" in err, err
