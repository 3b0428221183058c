"""Which command lines start something ahead before anything is imported (``python -m mprl
run``'s first act, :mod:`mprl.startup`): the command line read once, its defaults from the
option classes; the local backend's forkserver for its runs that fork their children, a Ray on
this machine (with the CPUs the run reserves) for a Ray run with no address, and nothing
else."""

from __future__ import annotations

import importlib.metadata as md
import signal

import pytest

from mprl import startup
from mprl.backends.local import forkserver
from mprl.run_types import RunConfig
from mprl_builtin.ray import start as ray_start


def wants_forkserver(argv: list[str]) -> bool:
    command = startup.preparse(argv)
    return command is not None and forkserver.wants_forkserver(command)


def wants_embedded(argv: list[str]) -> float | None:
    command = startup.preparse(argv)
    return None if command is None else ray_start.wants_embedded(command)


def test_the_command_line_is_read_once_with_the_option_classes_defaults(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    command = startup.preparse(["run", "--workers=3", "--worker-cpus", "0.5", "--serial"])
    assert command is not None
    assert command.options == {"workers": "3", "worker_cpus": "0.5", "serial": ""}
    assert command.value(RunConfig, "workers") == 3
    assert command.value(RunConfig, "backend") == RunConfig().backend  # not given: the default
    assert startup.preparse(["run", "--workers", "x"]).value(RunConfig, "workers") == 6
    assert startup.preparse(["plugins"]) is None and startup.preparse(["run", "-h"]) is None


def test_the_early_starts_are_entry_points_of_their_backends():
    starts = {e.name: e.value for e in md.entry_points(group=startup.GROUP)}
    assert starts["local"] == "mprl.backends.local.forkserver:start"
    assert starts["ray"] == "mprl_builtin.ray.start:start"


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
    # a value the parser refuses later: as if not given (the parser says what is wrong)
    assert wants_embedded(["run", "--backend", "ray", "--workers", "many"]) == 7
    # Ray options the parser refuses: no Ray started ahead for a run that will not run
    assert wants_embedded(["run", "--backend", "ray", "--worker-cpus", "0.00001"]) is None
    assert wants_embedded(["run", "--backend", "ray", "--learner-resources", '{"": 1}']) is None


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


# a Ctrl-C while `python -m mprl` starts: its handler (mprl.startup.guard_interrupts), called
# here as the signal would call it


def test_a_ctrl_c_before_main_ends_the_command_as_interrupted_and_one_after_is_main_s(
    monkeypatch, capsys
):
    forced = []
    monkeypatch.setattr(startup.os, "_exit", forced.append)
    monkeypatch.setattr(startup, "_exit_interrupts", 0)
    monkeypatch.setattr(startup, "_phase", startup.STARTING)
    with pytest.raises(SystemExit) as ended:  # no traceback: the command exits, atexit runs
        startup._on_sigint(signal.SIGINT, None)
    assert ended.value.code == 130 and capsys.readouterr().err == "mprl: interrupted\n"
    startup._on_sigint(signal.SIGINT, None)  # one more while it exits: the exit goes on
    assert forced == [] and capsys.readouterr().err == ""
    with pytest.raises(SystemExit):  # an exit that an import swallowed: main() ends it
        startup.entering_main()
    startup._on_sigint(signal.SIGINT, None)  # and one more forces it
    assert forced == [130] and capsys.readouterr().err == f"{startup.FORCED}\n"

    monkeypatch.setattr(startup, "_exit_interrupts", 0)
    monkeypatch.setattr(startup, "_phase", startup.STARTING)
    startup.entering_main()
    with pytest.raises(KeyboardInterrupt):  # main()'s to say, once: its exit begins
        startup._on_sigint(signal.SIGINT, None)
    startup._on_sigint(signal.SIGINT, None)  # while main() stops what it started: goes on
    startup.leaving_main()
    assert forced == [130] and capsys.readouterr().err == ""

    monkeypatch.setattr(startup, "_exit_interrupts", 0)
    monkeypatch.setattr(startup, "_phase", startup.MAIN)
    startup.leaving_main()
    startup._on_sigint(signal.SIGINT, None)  # main() has returned: the exit goes on
    assert forced == [130] and capsys.readouterr().err == ""


def test_a_ctrl_c_during_an_early_start_comes_once_what_it_started_is_to_be_stopped(
    monkeypatch, capsys
):
    """The Ctrl-C comes while the early start runs (after its thread started Ray): it is acted
    on once the handle is registered, so the exit it asks for stops what was started."""
    started = []

    class Handle:
        def stop(self) -> None:
            started.remove(self)

    def start(command):
        started.append(Handle())
        startup._on_sigint(signal.SIGINT, None)  # (the signal, as it comes)
        return started[-1]

    class Entry:
        name = "fake"

        def load(self):
            return start

    monkeypatch.setattr(startup.md, "entry_points", lambda group: [Entry()])
    monkeypatch.setattr(startup, "_phase", startup.STARTING)
    monkeypatch.setattr(startup, "_started", {})
    monkeypatch.setattr(startup.atexit, "register", lambda f: None)
    old = signal.signal(signal.SIGINT, startup._on_sigint)
    try:
        with pytest.raises(SystemExit) as ended:
            startup.start_early(["run", "--plugin", "a3c"])
    finally:
        signal.signal(signal.SIGINT, old)
    assert ended.value.code == 130 and capsys.readouterr().err == "mprl: interrupted\n"
    assert list(startup._started) == ["fake"]  # registered: stopped at exit
    startup.stop_unclaimed()
    assert started == []
