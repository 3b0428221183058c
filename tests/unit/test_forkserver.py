"""Which command lines start the local backend's forkserver before anything is imported
(``python -m mprl run``'s first act): the local backend's runs that fork their children, and
nothing else."""

from __future__ import annotations

import pytest

from mprl.backends.forkserver import wants_forkserver


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--plugin", "a3c", "--workers", "4"],
        ["run", "--backend", "local", "--plugin", "ppo"],
        ["run", "--backend=local", "--start-method=forkserver"],
        ["run", "--config", "exp.toml"],  # a [run] backend there: stopped once prepared
        ["run", "--resume", "runs/exp1"],
    ],
)
def test_a_local_run_that_forks_its_children_starts_the_server_early(argv):
    assert wants_forkserver(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["plugins"],
        ["eval", "runs/exp1"],
        ["run", "--help"],
        ["run", "--plugin", "a3c", "-h"],
        ["run", "--backend", "ray"],
        ["run", "--backend=serial"],
        ["run", "--start-method", "spawn"],
        ["run", "--start-method=spawn", "--plugin", "a3c"],
    ],
)
def test_any_other_command_line_starts_none(argv):
    assert not wants_forkserver(argv)
