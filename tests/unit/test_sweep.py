"""``mprl sweep``'s parts that start no process: reading --seeds, --grid and --search, the
checks against the plugin's config, config keys and files, and the results table, read back
from run directories made by real (serial, in-process) runs."""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest

import mprl
from mprl.errors import UsageError
from mprl.host.config import build, load_toml
from mprl.host.plugins import get_plugin_manager
from mprl_builtin.sweep import results, runner, spec
from tests.conftest import cli_here


@pytest.fixture(scope="module")
def plugins():
    return get_plugin_manager()


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("0-9", list(range(10))), ("3-3", [3]), ("0,3,7", [0, 3, 7]), ("5", [0, 1, 2, 3, 4]),
     (" 2 ", [0, 1])],
)  # fmt: skip
def test_seeds_take_a_range_a_list_or_a_count(text, seeds):
    assert spec.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "0", "9-3", "a-b", "1,1", "-1", "1,-2", "0-", "1.5"])
def test_a_bad_seeds_spec_names_the_forms(text):
    with pytest.raises(
        UsageError, match=r"--seeds .*: give a range 0-9, a list 0,3,7 or a count 5"
    ):
        spec.parse_seeds(text)


def test_grid_values_split_on_top_level_commas():
    grid = spec.parse_grid(["lr=1e-3,3e-4", "hidden=[64,64],[128]", "n-steps=5"])
    assert grid == {"lr": ["1e-3", "3e-4"], "hidden": ["[64,64]", "[128]"], "n_steps": ["5"]}
    assert list(spec.Spec("a3c", [0], grid=grid).grid_points())[1] == {
        "lr": "1e-3", "hidden": "[128]", "n_steps": "5"
    }  # fmt: skip
    assert len(spec.Spec("a3c", [0], grid=grid).grid_points()) == 4
    assert spec.Spec("a3c", [0]).grid_points() == [{}]  # seeds alone: one config


@pytest.mark.parametrize(
    ("items", "message"),
    [(["lr"], "expected NAME=V1,V2"), (["lr="], "expected NAME=V1,V2"), (["lr=1,,2"], "expected"),
     (["lr=1", "lr=2"], "given twice"), (["lr=1,1"], "a value is given twice")],
)  # fmt: skip
def test_bad_grid_items(items, message):
    with pytest.raises(UsageError, match=message):
        spec.parse_grid(items)


def test_search_distributions():
    search = spec.parse_search(
        ["lr=log(1e-4, 1e-2)", "gamma=uniform(0.9,0.999)", "n_steps=int(5,20)",
         "hidden=choice([64],[64,64])", "envs_per_worker=intlog(1,8)"]
    )  # fmt: skip
    assert search["lr"] == spec.Distribution("log", 1e-4, 1e-2)
    assert search["hidden"].choices == ("[64]", "[64,64]")
    dists = {name: d.to_optuna() for name, d in search.items()}
    assert dists["lr"].log and dists["lr"].low == 1e-4
    assert dists["n_steps"].low == 5 and not dists["n_steps"].log and dists["envs_per_worker"].log


@pytest.mark.parametrize(
    ("text", "message"),
    [("log(0,1)", "needs LOW > 0"), ("uniform(2,1)", "LOW < HIGH"), ("int(1.5,3)", "two integers"),
     ("normal(0,1)", "expected log"), ("log(1e-4)", "two numbers"), ("choice(a)", "two or more"),
     ("uniform(a,b)", "two numbers"), ("uniform(0,inf)", "finite")],
)  # fmt: skip
def test_a_bad_distribution_names_the_field(text, message):
    with pytest.raises(
        UsageError, match=rf"--search lr={text.replace('(', '.').replace(')', '.')}: .*{message}"
    ):
        spec.parse_distribution("lr", text)


def a3c_spec(plugins, **kw):
    args = {"config": {}, "run": {}, "seeds": "2"} | kw
    return spec.make_spec(plugins, "a3c", **args)


def test_a_spec_is_checked_against_the_plugin_config_and_run_options(plugins):
    s = a3c_spec(plugins, grid=["lr=1e-3,3e-4", "workers=1,2"],
                 search=["gamma=uniform(0.9,0.99)"], trials=5, run={"total_steps": 1000})  # fmt: skip
    assert (s.plugin, s.seeds, s.trials, s.axes) == ("a3c", [0, 1], 5, ["lr", "workers", "gamma"])
    assert s.search == {"gamma": "uniform(0.9,0.99)"} and s.direction == "maximize"
    assert a3c_spec(plugins, objective="time").direction == "minimize"
    assert a3c_spec(plugins, search=["lr=log(1e-4,1e-2)"]).trials == 20  # the default
    config, run = spec.trial_inputs(
        s, {"lr": "3e-4", "workers": "2"}, s_config(plugins), plugins.run_options()
    )
    assert config == {"lr": 3e-4} and run == {"total_steps": 1000, "workers": 2}


def s_config(plugins):
    return plugins.algorithm("a3c")[1].config_cls


@pytest.mark.parametrize(
    ("kw", "message"),
    [({"grid": ["foo=1,2"]}, "--grid foo: unknown field 'foo'; a3c's config fields: .*lr.*; run options: env"),
     ({"search": ["bar=log(1,2)"]}, "--search bar: unknown field 'bar'"),
     ({"grid": ["lr=abc"]}, "--grid lr=abc: field 'lr' expects float, got 'abc'"),
     ({"grid": ["lr=-1"]}, "--grid lr=-1: field 'lr'"),
     ({"grid": ["workers=0"]}, "--grid workers=0: field 'workers'"),
     ({"grid": ["seed=1,2"]}, "--grid seed: give the seeds with --seeds"),
     ({"search": ["n_steps=uniform(1,5)"]}, "field 'n_steps' takes whole numbers; use int"),
     ({"search": ["lr=uniform(-1,1)"]}, "--search lr=uniform.-1,1.: field 'lr'"),
     ({"grid": ["lr=1e-3"], "search": ["lr=log(1e-4,1e-2)"]}, "'lr' is in both --grid and --search"),
     ({"trials": 3}, "--trials is the number of configs a --search tries"),
     ({"run": {"seed": 3}}, "sweep takes --seeds"),
     ({"seeds": "x"}, "--seeds 'x'"),
     ({"objective": "speed"}, "--objective 'speed'")],
)  # fmt: skip
def test_what_a_spec_refuses(plugins, kw, message):
    with pytest.raises(UsageError, match=message):
        a3c_spec(plugins, **kw)


def test_config_keys_are_short_and_safe():
    assert spec.config_key({}) == "base"
    assert spec.config_key({"lr": "1e-3", "n_steps": 5}) == "lr=1e-3,n_steps=5"
    assert spec.config_key({"lr": 0.00012345}) == "lr=0.00012345"
    odd = spec.config_key({"hidden": "[64, 64]"})
    assert odd.startswith("cfg-") and odd != spec.config_key({"hidden": "[64,64]"})
    assert spec.config_key({"x": "1" * 80}).startswith("cfg-")


def test_a_config_file_is_what_run_reads(plugins, tmp_path):
    text = spec.toml_text({"lr": 0.001, "hidden": [64, 64], "activation": "relu"},
                           {"env": "CartPole-v1", "total_steps": 2000, "max_time": None})  # fmt: skip
    (tmp_path / "c.toml").write_text(text)
    data = load_toml(tmp_path / "c.toml")
    run = data.pop("run")
    assert run == {"env": "CartPole-v1", "total_steps": 2000}
    assert build(s_config(plugins), data).hidden in ([64, 64], (64, 64))


def test_the_objectives():
    solved = {
        "solved": True,
        "solved_at": {"wall_s": 10.0, "env_steps": 5000},
        "mean_return_100": 480.0,
    }
    unsolved = {"solved": False, "wall_s": 30.0, "env_steps": 9000, "mean_return_100": 100.0}
    runs = [(solved, {"max_time": 60.0, "total_steps": 10_000}), (unsolved, {"max_time": 60.0})]
    assert results.objective_value("return", runs) == 290.0
    assert results.objective_value("time", runs) == 35.0  # median of 10 and the cap 60
    assert results.objective_value("steps", runs) == math.inf  # unsolved without --total-steps
    assert results.objective_value("steps", [runs[0]]) == 5000
    assert results.objective_value("return", [({}, {})]) == -math.inf


def test_the_results_table_from_real_runs(tmp_path):
    """Four serial runs in this process, laid out as a sweep's trials: the table's numbers are
    those of their summary.json files."""
    root = tmp_path / "sw"
    s = spec.Spec("a3c", [0, 1], run={"total_steps": 600, "workers": 1},
                   grid={"lr": ["1e-3", "3e-4"]})  # fmt: skip
    root.mkdir()
    (root / spec.SPEC_FILE).write_text(json.dumps(s.to_dict()))
    summaries = {}
    for lr in ("1e-3", "3e-4"):
        for seed in (0, 1):
            out = mprl.run("a3c", backend="serial", workers=1, seed=seed, total_steps=600,
                           config={"lr": float(lr)}, progress="none",
                           run_dir=root / "trials" / f"lr={lr}-seed{seed}")  # fmt: skip
            summaries.setdefault(lr, []).append(out.to_dict())
    (root / "trials" / "lr=1e-3-seed9").mkdir()  # a run that never wrote anything: left out
    spec_back, rows = results.sweep_results(root)
    assert spec_back == s
    best_first = sorted(summaries, key=lambda lr: -sum(x["mean_return_100"] for x in summaries[lr]))
    assert [r["key"] for r in rows] == [f"lr={lr}" for lr in best_first]  # by objective
    for row in rows:
        mine = summaries[row["key"].removeprefix("lr=")]
        assert row["runs"] == 2 and row["failed"] == 0
        assert row["solved"] == sum(x["solved"] for x in mine)
        assert row["best_return"] == max(x["best_return"] for x in mine)
        assert row["mean_return_100"] == pytest.approx(sum(x["mean_return_100"] for x in mine) / 2)
        assert row["objective"] == pytest.approx(row["mean_return_100"])
        assert row["params"] == {"lr": float(row["key"].removeprefix("lr="))}
    text = results.write_results(root, plot=False)
    assert text.splitlines()[0].split()[:3] == ["CONFIG", "RUNS", "SOLVED"]
    assert "lr=0.001" in text and "lr=0.0003" in text
    saved = json.loads((root / "results.json").read_text())
    assert saved["objective"] == "return" and len(saved["rows"]) == 2
    with (root / "results.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["key"] for r in table] == [r["key"] for r in rows] and table[0]["lr"]


def test_optuna_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(UsageError, match=r'needs Optuna.*pip install "mprl\[sweep\]"'):
        runner._optuna()


def test_cli_errors_are_one_line_and_exit_2(capsys, tmp_path):
    code, err = cli_here(capsys, "sweep", "--plugin", "a3c", "--grid", "foo=1,2")
    assert code == 2 and err.count("\n") == 1 and "--grid foo: unknown field 'foo'" in err
    code, err = cli_here(capsys, "sweep", "--plugin", "a3c", "--seeds", "9-1")
    assert code == 2 and "--seeds '9-1'" in err
    code, err = cli_here(capsys, "sweep")
    assert code == 2 and "sweep needs --plugin NAME" in err
    code, err = cli_here(capsys, "sweep", "--report", str(tmp_path))
    assert code == 2 and "is not a sweep directory" in err


def test_a_sweep_dir_holding_another_sweep_is_refused(capsys, tmp_path):
    root = tmp_path / "sw"
    root.mkdir()
    other = spec.Spec("ppo", [0], grid={"lr": ["1e-3"]})
    (root / spec.SPEC_FILE).write_text(json.dumps(other.to_dict()))
    code, err = cli_here(
        capsys, "sweep", "--plugin", "a3c", "--grid", "lr=1e-3", "--sweep-dir", str(root)
    )
    assert code == 2
    assert f"--sweep-dir '{root}' holds another sweep (its plugin differ" in err
    assert f"--resume {root} to continue that one" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    code, err = cli_here(capsys, "sweep", "--plugin", "a3c", "--sweep-dir", str(tmp_path / "full"))
    assert code == 2 and "exists and is not a sweep directory" in err


def test_help_says_what_seeds_take(capsys):
    with pytest.raises(SystemExit):
        from mprl.tools.cli import main

        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert "a range 0-9" in out and "a list 0,3,7" in out and "--total-steps" in out


def test_the_old_module_gives_each_name_with_a_warning_naming_its_new_place():
    import re

    from mprl import deprecated
    from mprl.deprecated import MprlDeprecationWarning

    moved = deprecated.MOVED_SINCE_0_1_0["mprl.tools.sweep"]
    assert {"Spec", "make_spec", "run_sweep", "write_results", "Sweep"} <= set(moved)
    for name, place in moved.items():
        new = re.escape(place.replace(":", "."))
        with pytest.warns(MprlDeprecationWarning, match=rf"^mprl\.tools\.sweep\.{name} is "
                          rf"deprecated: use {new} instead; .* goes away in mprl 0\.3\.0$"):  # fmt: skip
            exec(f"from mprl.tools.sweep import {name} as found", namespace := {})
        assert namespace["found"] is deprecated.resolve(place)
    with pytest.raises(ImportError, match="cannot import name 'nothing'"):
        exec("from mprl.tools.sweep import nothing")


# -- the sweep directory's files: never written, read or removed through a link -----------------


def _sweep_dir(root):
    root.mkdir()
    (root / spec.SPEC_FILE).write_text(json.dumps(spec.Spec("a3c", [0]).to_dict()))
    return root


def test_what_a_sweep_writes_whole_replaces_a_link_there_never_writes_through_it(tmp_path):
    """Planted after the sweep's check at its start, a link where it writes a file whole (the
    results, a config, sweep.json) or a run's log is replaced by the sweep's own file."""
    from mprl_builtin.sweep import sweepdir

    root = _sweep_dir(tmp_path / "sw")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("results.json", "results.csv", "run.log"):
        (root / name).symlink_to(victim)
    results.write_results(root, plot=False)
    with sweepdir.open_log(root / "run.log") as log:
        log.write(b"output\n")
    assert victim.read_text() == "precious\n"
    for name in ("results.json", "results.csv", "run.log"):
        assert not (root / name).is_symlink() and (root / name).stat().st_size > 0
    assert json.loads((root / "results.json").read_text())["rows"] == []
    assert sorted(p.name for p in root.iterdir()) == [  # no temp file left
        "results.csv", "results.json", "run.log", spec.SPEC_FILE
    ]  # fmt: skip


def test_report_refuses_a_link_where_it_writes(capsys, tmp_path):
    root = _sweep_dir(tmp_path / "sw")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (root / "results.json").symlink_to(victim)
    code, err = cli_here(capsys, "sweep", "--report", str(root))
    assert code == 2 and err.count("\n") == 1, err
    assert f"'{root / 'results.json'}' is a symbolic link (to '{victim}')" in err
    assert victim.read_text() == "precious\n"


def test_held_by_names_the_pid_holding_a_run_directory(tmp_path):
    import fcntl
    import os

    from mprl.files import held_by

    run = tmp_path / "run"
    run.mkdir()
    assert held_by(run) is None  # no lock: no run was ever there
    (run / ".lock").write_text("4242\n")
    assert held_by(run) is None  # a run that ended (or was killed): the kernel let it go
    fd = os.open(run / ".lock", os.O_RDWR)  # held as a run holds it
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert held_by(run) == "4242"
    finally:
        os.close(fd)
    assert held_by(run) is None
    (run / ".lock").unlink()
    (run / ".lock").symlink_to(tmp_path / "nowhere")  # no run could hold that
    assert held_by(run) is None and not (tmp_path / "nowhere").exists()


def test_a_run_directory_is_removed_never_through_a_link(tmp_path):
    from mprl_builtin.sweep.sweepdir import remove_run_dir

    root = tmp_path / "sw"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "base-seed0").mkdir(parents=True)
    (elsewhere / "base-seed0" / "keep.txt").write_text("mine\n")
    (root / "trials").mkdir(parents=True)
    (root / "trials" / "base-seed0").symlink_to(elsewhere / "base-seed0")
    with pytest.raises(UsageError, match=r"trials/base-seed0' is a symbolic link .* remove it"):
        remove_run_dir(root, root / "trials" / "base-seed0")
    (root / "trials" / "base-seed0").unlink()
    run = root / "trials" / "base-seed0"
    run.mkdir()
    (run / "inside").symlink_to(elsewhere)  # a link inside goes, not what it names
    remove_run_dir(root, run)
    assert not run.exists() and (elsewhere / "base-seed0" / "keep.txt").read_text() == "mine\n"
    (root / "trials").rmdir()
    (root / "trials").symlink_to(elsewhere)
    with pytest.raises(UsageError, match=r"sw/trials' is a symbolic link .*not a directory"):
        remove_run_dir(root, root / "trials" / "base-seed0")
    assert (elsewhere / "base-seed0" / "keep.txt").read_text() == "mine\n"


def test_a_summary_that_is_a_link_is_no_result(tmp_path):
    run = tmp_path / "trials" / "base-seed0"
    run.mkdir(parents=True)
    (tmp_path / "done.json").write_text(json.dumps({"status": "finished"}))
    (run / "summary.json").symlink_to(tmp_path / "done.json")
    assert not results.is_done(run)
    (run / "summary.json").unlink()
    (run / "summary.json").write_text(json.dumps({"status": "finished"}))
    assert results.is_done(run)
