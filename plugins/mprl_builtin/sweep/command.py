"""The ``sweep`` command: its arguments, and what it runs (a new sweep, ``--resume``,
``--report``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mprl.errors import UsageError
from mprl.host.plugins import PluginManager
from mprl.tools.cli import add_run_arguments, run_inputs

HELP = "run several seeds, a grid or an Optuna search"
DESCRIPTION = (
    "Run one config over several seeds, a grid (every combination x every seed) or an Optuna "
    "search over config fields and run options; each run is a normal `run` with its own run "
    "directory under SWEEP_DIR/trials/. Ctrl-C stops it cleanly; --resume SWEEP_DIR (or the same "
    'command again) continues it. Needs Optuna (pip install "mprl[sweep]"). Ends with a table '
    "(also SWEEP_DIR/results.csv, results.json) and a plot (SWEEP_DIR/sweep.png)."
)


def add_arguments(parser: argparse.ArgumentParser, plugins: PluginManager) -> None:
    """``sweep``'s arguments, and every run's (``--set``, ``--config``, the run options)."""
    parser.description = DESCRIPTION
    parser.add_argument("--plugin", help="the algorithm to run (as for run)")
    _add_axes(parser)
    parser.add_argument(
        "--parallel", type=int, default=None, metavar="K",
        help="runs at a time [default: the cores (a Ray cluster's CPUs with --backend ray "
        "--ray-address) over the processes of one run, at least 1]",
    )  # fmt: skip
    parser.add_argument(
        "--sweep-dir", metavar="DIR",
        help="where the sweep writes (default: sweeps/PLUGIN-ENV-TIME); an existing one holding "
        "the same sweep is continued",
    )  # fmt: skip
    parser.add_argument(
        "--resume", metavar="SWEEP_DIR", help="continue the sweep in SWEEP_DIR as it was given"
    )
    parser.add_argument(
        "--report", metavar="SWEEP_DIR",
        help="print the results table of SWEEP_DIR (and write its results files and plot); runs "
        "nothing",
    )  # fmt: skip
    add_run_arguments(parser, plugins)


def _add_axes(parser: argparse.ArgumentParser) -> None:
    """The seeds, grid, search and objective."""
    parser.add_argument(
        "--seeds", default="1", metavar="SPEC",
        help="the seeds of every config: a range 0-9 (both ends in), a list 0,3,7 or a count "
        "5 (= 0-4) [default 1: seed 0]",
    )  # fmt: skip
    parser.add_argument(
        "--grid", action="append", default=[], metavar="NAME=V1,V2",
        help="a grid axis over a config field or run option (repeatable: every combination), "
        "e.g. --grid lr=1e-3,3e-4 --grid hidden=[64,64],[128,128]",
    )  # fmt: skip
    parser.add_argument(
        "--search", action="append", default=[], metavar="NAME=DIST",
        help="an Optuna search axis (repeatable): log(LOW,HIGH), uniform(LOW,HIGH), "
        'int(LOW,HIGH), intlog(LOW,HIGH) or choice(A,B,...), e.g. --search "lr=log(1e-4,1e-2)"',
    )  # fmt: skip
    parser.add_argument(
        "--trials", type=int, default=None, metavar="N",
        help="with --search: how many configs to try [default 20]",
    )  # fmt: skip
    parser.add_argument(
        "--objective", default="return", choices=["return", "time", "steps"],
        help="what the search optimises and the table sorts by: return (maximise the mean over "
        "seeds of the final mean return(100)), time / steps (minimise the median over seeds of "
        "the wall seconds / env steps to solve; unsolved counts as --max-time / --total-steps, "
        "inf without) [default return]",
    )  # fmt: skip
    parser.add_argument(
        "--sampler", default="tpe", choices=["tpe", "random"],
        help="Optuna's sampler for --search [default tpe]",
    )  # fmt: skip


def run(args: argparse.Namespace, plugins: PluginManager) -> int:
    """``python -m mprl sweep ...``: the exit code (0 done, 128 + a signal's number stopped)."""
    from mprl_builtin.sweep.results import write_results
    from mprl_builtin.sweep.runner import run_sweep
    from mprl_builtin.sweep.spec import make_spec
    from mprl_builtin.sweep.sweepdir import check

    if args.report:
        check(Path(args.report))  # what it writes there: never through a link
        print(write_results(args.report))
        return 0
    if args.resume:
        return run_sweep(plugins, None, args.resume, parallel=args.parallel, trials=args.trials)
    if not args.plugin:
        installed = ", ".join(sorted(plugins.algorithms())) or "none"
        raise UsageError(
            f"sweep needs --plugin NAME (or --resume SWEEP_DIR); installed: {installed}"
        )
    config, options = run_inputs(args, plugins)
    spec = make_spec(
        plugins, args.plugin, config=config, run=options, seeds=args.seeds, grid=args.grid,
        search=args.search, trials=args.trials, objective=args.objective, sampler=args.sampler,
        blocked=[value.removeprefix("no:") for value in args.plugin_options],
    )  # fmt: skip
    return run_sweep(plugins, spec, args.sweep_dir, parallel=args.parallel)
