"""``python -m mprl sweep``: several seeds, a grid or an Optuna search over config fields; a
built-in plugin that adds its command through the ``mprl_register_commands`` hook, as a
third-party one would, and uses only mprl's public names.

Each run of a sweep is a plain ``python -m mprl run`` subprocess with its own run directory,
``SWEEP_DIR/trials/<config key>-seed<N>/``. Optuna (``pip install "mprl[sweep]"``) keeps what
was asked and what finished in ``SWEEP_DIR/optuna.db`` (SQLite): an Optuna trial is one config,
run once per seed, and its value is the sweep's objective over those runs. That storage is what
makes a stopped sweep resume; the results table is read back from the run directories alone,
so ``--report`` needs neither Optuna nor a finished sweep.

Layout of a sweep directory: ``sweep.json`` (what the sweep is: plugin, config, run options,
seeds, grid, search, objective), ``optuna.db``, ``configs/KEY.toml`` (each config as
``run --config`` takes it), ``trials/KEY-seedN/`` (the run directories), ``logs/KEY-seedN.log``
(each run's output), and at the end ``results.csv``, ``results.json`` and ``sweep.png``.

The modules: :mod:`.command` (the arguments), :mod:`.spec` (what a sweep is, checked),
:mod:`.runner` (running it), :mod:`.results` (the table and plot), :mod:`.sweepdir` (the sweep
directory's files, never written, read or removed through a link).
"""

from __future__ import annotations

from collections.abc import Callable

import mprl
from mprl_builtin.sweep import command


@mprl.hookimpl
def mprl_register_commands(register: Callable[..., None]) -> None:
    register("sweep", command.HELP, command.add_arguments, command.run)
