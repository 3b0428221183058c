"""Run options belong to whoever registers them: the core's RunConfig fields, a backend's
(Ray's), a reporter's (--tensorboard); one registry reads and checks them all."""

from __future__ import annotations

import warnings

import attrs
import pytest

import mprl
from mprl.errors import PluginError
from mprl.host.options import RunOptions
from mprl.host.plugins import get_plugin_manager
from mprl.tools.cli import main
from mprl_builtin.ray import RayOptions
from mprl_builtin.tensorboard import TensorBoardOptions


@attrs.frozen
class Budget:
    max_hours: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))


def test_the_builtin_owners_register_their_options():
    core = get_plugin_manager(autoload=False).run_options()
    assert core.owners["workers"] == "mprl" and "ray_address" not in core.owners
    options = get_plugin_manager().run_options()  # the built-in plugins: Ray's, TensorBoard's
    assert {options.owners[k] for k in ("ray_address", "worker_cpus", "learner_resources")} == {
        "ray"
    }
    assert options.owners["tensorboard"] == "tensorboard"


def test_registered_options_are_checked_and_read_through_their_class():
    options = RunOptions([("budget", Budget), ("ray", RayOptions)])
    run = options.build({"max_hours": 2, "workers": 3, "worker_cpus": 0.5})
    assert run.workers == 3 and run.of(Budget) == Budget(2.0)
    assert run.of(RayOptions) == RayOptions(worker_cpus=0.5)  # defaults for the rest
    assert run.to_dict()["max_hours"] == 2.0 and "extra" not in run.to_dict()
    with pytest.raises(mprl.ConfigError, match=r"config file 'x.toml' \[run\]: field 'max_hours'"):
        options.build({"max_hours": -1}, "config file 'x.toml' [run]")
    with pytest.raises(mprl.ConfigError, match="unknown field 'max_hour'; known fields: env,"):
        options.build({"max_hour": 1})
    with pytest.raises(mprl.ConfigError, match=r"learner_resources.*finite amounts"):
        options.build({"learner_resources": '{"CPU": Infinity}'})


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"worker_cpus": 0.00001}, r"field 'worker_cpus': --worker-cpus 1e-05: .* 0.0001 or more"),
        ({"worker_cpus": float("nan")}, r"field 'worker_cpus'.*nan"),
        ({"learner_resources": '{"CPU": 0.00001}'}, r"CPU 1e-05 is less than Ray reserves"),
        ({"learner_resources": '{"GPU": 0.00009}'}, r"GPU 9e-05 is less than Ray reserves"),
        ({"learner_resources": '{"": 1}'}, r"a resource name is blank \(''\)"),
        ({"learner_resources": '{" ": 1}'}, r"a resource name is blank \(' '\)"),
        ({"learner_resources": '{"object_store_memory": 1}'}, r"'object_store_memory' is not"),
    ],
)
def test_ray_amounts_ray_would_refuse_are_refused_naming_the_field(given, says):
    # Ray raises a ValueError of its own for an amount below 1/10,000 once the actor is made:
    # here they are refused with the field before anything starts
    options = RunOptions([("ray", RayOptions)])
    with pytest.raises(mprl.ConfigError, match=says):
        options.build(given)


def test_ray_amounts_at_its_smallest_unit_or_zero_are_taken():
    options = RunOptions([("ray", RayOptions)])
    run = options.build({"worker_cpus": 0.0001, "learner_resources": '{"CPU": 0, "GPU": 0.0001}'})
    assert run.of(RayOptions).worker_cpus == 0.0001


def test_an_option_name_taken_already_names_both_owners():
    @attrs.frozen
    class Clash:
        workers: int = 1

    with pytest.raises(PluginError, match=r"plugin 'mine' registers run option 'workers'.*'mprl'"):
        RunOptions([("mine", Clash)])
    with pytest.raises(PluginError, match=r"'other' registers run option 'max_hours'.*'budget'"):
        RunOptions([("budget", Budget), ("other", Budget)])


def test_a_saved_option_of_a_plugin_not_installed_is_left_out():
    options = RunOptions([])
    assert options.known({"workers": 2, "tensorboard": True}) == {"workers": 2}


def test_a_registered_option_read_as_an_attribute_warns_and_works():
    run = RunOptions([("tensorboard", TensorBoardOptions)]).build({"tensorboard": True})
    with pytest.warns(DeprecationWarning, match=r"run.of\(ITS_OPTIONS_CLASS\).tensorboard"):
        assert run.tensorboard is True
    with warnings.catch_warnings(), pytest.raises(AttributeError):
        warnings.simplefilter("error")
        run.no_such_option  # noqa: B018


def test_the_cli_lists_an_option_under_its_plugin_and_drops_it_when_blocked(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "run options of plugin ray" in out and "--learner-resources" in out
    assert "run options of plugin tensorboard" in out
    assert main(["run", "-p", "no:tensorboard", "--plugin", "a3c", "--tensorboard"]) == 2
    assert "unrecognized arguments: --tensorboard" in capsys.readouterr().err
    assert main(["run", "--plugin", "a3c", "--worker-cpus", "0"]) == 2
    assert "run option: field 'worker_cpus'" in capsys.readouterr().err
