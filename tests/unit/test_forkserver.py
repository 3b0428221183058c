"""Which command lines start something ahead before anything is imported (``python -m mprl
run``'s first act): the local backend's forkserver for its runs that fork their children, a Ray
on this machine (with the CPUs the run reserves) for a Ray run with no address, and nothing
else."""

from __future__ import annotations

import pytest

from mprl.backends.forkserver import wants_forkserver
from mprl.backends.ray_start import wants_embedded


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


def test_a_ray_run_with_no_address_starts_its_ray_ahead_with_the_cpus_it_reserves(monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    # workers (default: one per core) times --worker-cpus, and the train process's CPU
    assert wants_embedded(["run", "--backend", "ray"]) == 7
    assert wants_embedded(["run", "--backend=ray", "--workers", "3", "--plugin", "ppo"]) == 4
    learner = ["--learner-resources", '{"CPU": 2, "GPU": 1}']
    assert wants_embedded(["run", "--backend", "ray", "--workers=4", "--worker-cpus", "0.5",
                           *learner]) == 4  # fmt: skip
    # a value the parser refuses later: Ray starts with the machine's cores (its floor)
    assert wants_embedded(["run", "--backend", "ray", "--workers", "many"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--backend", "local"],
        ["run", "--config", "ray.toml"],  # a backend named there: started when it is known
        ["run", "--backend", "ray", "--ray-address", "10.0.0.5:6379"],
        ["run", "--backend", "ray", "--ray-address=auto"],
        ["run", "--backend", "ray", "--help"],
        ["sweep", "--backend", "ray"],
        ["eval", "runs/exp1"],
    ],
)
def test_a_run_that_joins_a_cluster_or_runs_elsewhere_starts_no_ray_ahead(argv, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert wants_embedded(argv) is None


def test_rays_address_in_the_environment_starts_no_ray_ahead(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert wants_embedded(["run", "--backend", "ray"]) is None
