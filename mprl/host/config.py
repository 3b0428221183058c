"""Configuration from the command line and TOML files, validated against attrs config classes.

Every error names the field and what it accepts, so ``--set lr=-1`` or a typo in a TOML file
stops the run before any process starts.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from mprl import deprecated
from mprl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def fields_of(cls: type) -> dict[str, attrs.Attribute]:
    """The public (init) fields of an attrs class, with their types resolved."""
    attrs.resolve_types(cls)
    return {f.alias or f.name: f for f in attrs.fields(cls) if f.init}


def type_name(tp: Any) -> str:
    if tp is None or tp is type(None):
        return "none"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {type_name(args[0])}" if args else "list"
    return getattr(tp, "__name__", str(tp))


class NotFinite(TypeError):
    """A float field was given inf or nan."""


def coerce(value: Any, tp: Any) -> Any:
    """Return ``value`` as type ``tp`` or raise ``TypeError``; only safe conversions are made."""
    if tp is None or tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return coerce(value, arg)
            except NotFinite:
                raise
            except TypeError:
                continue
        raise TypeError
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise TypeError
    if tp is type(None):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        raise TypeError
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [parse_value(v.strip()) for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise TypeError
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        items = [coerce(v, args[0]) if args else v for v in value]
        return origin(items)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
            return int(value)  # 1e6 on the command line means 1000000; 1e30 is no count
        raise TypeError
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise NotFinite
            return float(value)
        raise TypeError
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeError
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise TypeError


def parse_value(text: str) -> Any:
    """Read a ``--set`` value as TOML would (``3``, ``1e-3``, ``[64, 64]``), else as text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        low = text.lower()
        if low in ("yes", "on"):
            return True
        if low in ("no", "off"):
            return False
        return text


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``["lr=1e-3", "hidden=[64,64]"]`` -> ``{"lr": 0.001, "hidden": [64, 64]}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set lr=0.001")
        out[key] = parse_value(text.strip())
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file; a missing or malformed file is a ConfigError naming it."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {str(p)!r} is a directory; give a .toml file") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}); TOML files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None


def build(cls: type, values: Mapping[str, Any], source: str = "config") -> Any:
    """Create ``cls(**values)``: unknown keys, wrong types and failed validators name the field."""
    fields = fields_of(cls)
    clean: dict[str, Any] = {}
    for key, value in values.items():
        # an old name becomes the new one; given both, the later wins, as for any repeated key
        key = deprecated.renamed_field(cls, key.replace("-", "_"), source)
        if key not in fields:
            # a recurrent core is the built-in ppo's, impala's, mappo's and ippo's only
            recurrent = key in ("core", "core_size")
            where = "; recurrent policies (core=lstm|gru): --plugin ppo or impala (mappo, ippo)"
            where = where if recurrent else ""
            raise ConfigError(
                f"{source}: unknown field {key!r}; known fields: {', '.join(sorted(fields))}"
                + where
            )
        tp = fields[key].type
        try:
            clean[key] = coerce(value, tp)
        except NotFinite:
            raise ConfigError(
                f"{source}: field {key!r} must be a finite number, got {value!r}"
            ) from None
        except TypeError:
            raise ConfigError(
                f"{source}: field {key!r} expects {type_name(tp)}, got {value!r}"
            ) from None
    try:
        return cls(**clean)
    except (ValueError, TypeError) as exc:
        # Find the field to blame: the first one that fails on its own.
        for key, value in clean.items():
            try:
                cls(**{key: value})
            except (ValueError, TypeError) as one:
                raise ConfigError(f"{source}: field {key!r}: {_describe(one)}") from None
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    # attrs validators raise with (message, attribute, ...) args; the message is what users need.
    return str(exc.args[0]) if exc.args else str(exc)


def describe_fields(cls: type) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, help)`` for each field, for ``--help`` and docs; a field's
    ``metadata["type"]`` names its type there when the annotation does not say it well (a
    duration: ``float | str | None``)."""
    rows = []
    for name, f in fields_of(cls).items():
        default = f.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        shown = f.metadata.get("type") or type_name(f.type)
        rows.append((name, shown, repr(default), f.metadata.get("help", "")))
    return rows


def as_dict(instance: Any) -> dict[str, Any]:
    """A JSON-friendly dict of an attrs instance (tuples become lists)."""
    return attrs.asdict(instance, recurse=True)
