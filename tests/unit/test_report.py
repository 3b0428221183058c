"""``python -m mprl plot`` and ``python -m mprl runs`` on real run directories."""

from __future__ import annotations

import json
import re

import pytest

from mprl.errors import UsageError
from mprl.tools.cli import main
from mprl.tools.report import list_runs, read_run
from tests.conftest import cli_here


def test_episodes_are_in_the_order_they_finished_not_the_order_they_were_written(tmp_path):
    # Children send their records in batches, so worker 1's earlier episodes can reach the
    # file after worker 0's later ones; a curve drawn in file order zigzags back in time.
    lines = [
        {"source": "worker:0", "step": 300, "wall": 3.0, "episode_return": 30.0},
        {"source": "worker:0", "step": 400, "wall": 4.0, "episode_return": 40.0},
        {"source": "worker:1", "step": 100, "wall": 1.0, "episode_return": 10.0},
        {"source": "worker:1", "step": 350, "wall": 3.5, "episode_return": 35.0},
        {"source": "worker:1", "step": 400, "wall": 4.0, "episode_return": 41.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    run = read_run(tmp_path)
    assert [r for _, _, r in run.episodes] == [10.0, 30.0, 35.0, 40.0, 41.0]
    assert [w for _, w, _ in run.episodes] == sorted(w for _, w, _ in run.episodes)


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda d: None, [], r"'{d}' is not a run directory \(no metrics.jsonl\); give a directory made by `python -m mprl run`"),
        (lambda d: (d / "notes.txt").write_text("x"), [], r"'{d}' is not a run directory \(no metrics.jsonl\)"),
        (lambda d: (d / "metrics.jsonl").write_text('{"source": "main", "step": 0, "wall": 0.1}\n'), [], r"run '{d}' has no episodes in metrics.jsonl yet"),
    ],
)  # fmt: skip
def test_plot_of_a_non_run_directory_exits_2_naming_it(tmp_path, capsys, make, args, message):
    d = tmp_path / "not-a-run"
    d.mkdir()
    make(d)
    code, stderr = cli_here(capsys, "plot", str(d), "-o", str(tmp_path / "x.png"), *args)
    assert code == 2, stderr
    expected = message.format(d=str(d))
    assert stderr.startswith("mprl: error: ") and len(stderr.strip().splitlines()) == 1, stderr
    assert re.search(expected, stderr), stderr
    assert not (tmp_path / "x.png").exists()


def test_runs_of_a_missing_or_empty_directory(tmp_path, capsys, monkeypatch):
    code, stderr = cli_here(capsys, "runs", str(tmp_path / "nope"))
    assert code == 2, stderr
    expected = f"mprl: error: '{tmp_path / 'nope'}' does not exist; give the directory your runs are in (default: runs)"
    assert stderr.strip() == expected
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is not a directory"):
        list_runs(tmp_path / "file")

    (tmp_path / "empty" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert main(["runs", "empty"]) == 0
    assert capsys.readouterr().out.strip() == "no runs under empty"
    assert main(["runs"]) == 2  # the default, ./runs, does not exist here
    assert "'runs' does not exist" in capsys.readouterr().err
