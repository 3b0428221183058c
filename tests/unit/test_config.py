"""Config parsing and validation against attrs classes: every error names the field."""

from __future__ import annotations

from typing import Literal

import attrs
import pytest
from attrs import validators as v

from mprl.errors import ConfigError
from mprl.host.config import build, describe_fields, load_toml, parse_assignments, parse_value
from mprl.run_types import RunConfig


@attrs.frozen
class Cfg:
    lr: float = attrs.field(default=1e-3, validator=v.gt(0), metadata={"help": "learning rate"})
    steps: int = attrs.field(default=5, validator=v.ge(1))
    flag: bool = False
    name: str = "x"
    hidden: tuple[int, ...] = attrs.field(default=(64, 64), converter=tuple)
    mode: Literal["fast", "slow"] = "fast"
    limit: int | None = None


@pytest.mark.parametrize(
    ("text", "value"),
    [("3", 3), ("1e-3", 0.001), ("true", True), ("no", False), ("[64, 32]", [64, 32]),
     ("hello", "hello"), ('"quoted"', "quoted")],
)  # fmt: skip
def test_parse_value_reads_toml_scalars(text, value):
    assert parse_value(text) == value


def test_assignments_and_build_convert_safely():
    values = parse_assignments(
        ["lr=5e-4", "steps=1e3", "flag=true", "hidden=[8,8]", "limit=none", "mode=slow"]
    )
    cfg = build(Cfg, values)
    assert cfg == Cfg(lr=5e-4, steps=1000, flag=True, hidden=(8, 8), limit=None, mode="slow")
    assert build(Cfg, {"hidden": "16,16", "lr": 1}).hidden == (16, 16)  # comma list, int -> float


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"lrr": 1.0},
            r"unknown field 'lrr'; known fields: flag, hidden, limit, lr, mode, name, steps",
        ),
        ({"lr": "fast"}, r"field 'lr' expects float, got 'fast'"),
        ({"steps": 2.5}, r"field 'steps' expects int, got 2.5"),
        ({"flag": 1}, r"field 'flag' expects bool, got 1"),
        ({"mode": "medium"}, r"field 'mode' expects 'fast' \| 'slow', got 'medium'"),
        ({"hidden": ["a"]}, r"field 'hidden' expects list of int"),
        ({"lr": -1.0}, r"field 'lr': 'lr' must be > 0: -1.0"),
        ({"steps": 3, "lr": 0.0}, r"field 'lr': 'lr' must be > 0: 0.0"),
    ],
)
def test_bad_values_name_the_field_and_what_is_allowed(values, message):
    with pytest.raises(ConfigError, match=message):
        build(Cfg, values, source="cfg")


def test_assignment_without_equals_is_an_error():
    with pytest.raises(ConfigError, match=r"--set 'lr': expected KEY=VALUE"):
        parse_assignments(["lr"])


def test_toml_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = = 3\n")
    with pytest.raises(ConfigError, match=r"config file '.*bad.toml' is not valid TOML"):
        load_toml(bad)
    with pytest.raises(ConfigError, match=r"'.*missing.toml' does not exist"):
        load_toml(tmp_path / "missing.toml")
    good = tmp_path / "good.toml"
    good.write_text("lr = 0.01\n[run]\nworkers = 3\n")
    assert load_toml(good) == {"lr": 0.01, "run": {"workers": 3}}


def test_run_config_validates_its_fields():
    with pytest.raises(ConfigError, match=r"field 'workers': 'workers' must be >= 1: 0"):
        build(RunConfig, {"workers": 0})
    with pytest.raises(ConfigError, match=r"'total_steps' must be >= 1 or unset"):
        build(RunConfig, {"total_steps": 0})
    assert build(RunConfig, {}).workers >= 1


def test_describe_fields_lists_defaults_and_help():
    rows = {name: (tp, default, text) for name, tp, default, text in describe_fields(Cfg)}
    assert rows["lr"] == ("float", "0.001", "learning rate")
    assert rows["limit"][0] == "int | none"
