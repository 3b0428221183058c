"""Run options: :class:`mprl.RunConfig`'s own fields and those plugins register through
``mprl_register_options`` (a backend's, a reporter's). One place reads and checks them all, for
the command line, a config file's ``[run]`` table, :func:`mprl.run` and a resumed checkpoint."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from mprl.errors import ConfigError, PluginError
from mprl.host.config import build, describe_fields, fields_of
from mprl.run_types import RunConfig


class RunOptions:
    """Every run option a plugin manager knows, and who owns it.

    :param registered: ``(plugin name, attrs class)`` for each registered options class.
    """

    def __init__(self, registered: list[tuple[str, type]]) -> None:
        self.owners: dict[str, str] = dict.fromkeys(_core(), "mprl")
        self.classes: list[tuple[str, type]] = []
        for plugin, cls in registered:
            if not attrs.has(cls):
                raise PluginError(
                    f"plugin {plugin!r}: mprl_register_options called register({cls!r}); "
                    "expected an attrs class"
                )
            for name in fields_of(cls):
                if name in self.owners:
                    raise PluginError(
                        f"plugin {plugin!r} registers run option {name!r}, which "
                        f"{self.owners[name]!r} owns already; rename the field"
                    )
                self.owners[name] = plugin
            self.classes.append((plugin, cls))

    @property
    def names(self) -> list[str]:
        return list(self.owners)

    def groups(self) -> Iterator[tuple[str, list[tuple[str, str, str, str]]]]:
        """``(owner, rows of describe_fields)``: the core's options first, then each plugin's."""
        yield "mprl", [row for row in describe_fields(RunConfig) if row[0] in _core()]
        for plugin, cls in self.classes:
            yield plugin, describe_fields(cls)

    def field(self, name: str) -> attrs.Attribute:
        if self.owners[name] == "mprl":
            return _core()[name]
        return next(fields_of(c)[name] for _, c in self.classes if name in fields_of(c))

    def unknown(self, values: Mapping[str, Any], source: str) -> None:
        """Raise naming the first key of ``values`` that is no run option, with the known ones."""
        for key in values:
            if key.replace("-", "_") not in self.owners:
                raise ConfigError(
                    f"{source}: unknown field {key!r}; known fields: {', '.join(self.names)}"
                )

    def build(self, values: Mapping[str, Any], source: str = "run option") -> RunConfig:
        """The :class:`RunConfig` of ``values``: each checked by its owner's class (errors name
        ``source`` and the field); the registered ones, defaults included, in ``extra``."""
        values = {k.replace("-", "_"): v for k, v in values.items()}
        self.unknown(values, source)
        extra: dict[str, Any] = {}
        for _, cls in self.classes:
            mine = {k: v for k, v in values.items() if k in fields_of(cls)}
            extra.update(attrs.asdict(build(cls, mine, source=source)))
        core = {k: v for k, v in values.items() if self.owners[k] == "mprl"}
        return attrs.evolve(build(RunConfig, core, source=source), extra=extra)

    def check(self, values: Mapping[str, Any], source: str) -> dict[str, Any]:
        """``values`` as :meth:`build` reads them (types converted), or an error naming
        ``source``: for the CLI, which checks each source (a flag, a file) on its own."""
        run = self.build(values, source)
        flat = run.to_dict()
        return {k.replace("-", "_"): flat[k.replace("-", "_")] for k in values}

    def known(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """The options of ``saved`` (a checkpoint's) that are known here: one a plugin that is
        not installed now registered is left out, at its default."""
        return {k: v for k, v in saved.items() if k in self.owners}


def _core() -> dict[str, attrs.Attribute]:
    """RunConfig's own options (``extra`` holds the registered ones)."""
    return {k: f for k, f in fields_of(RunConfig).items() if k != "extra"}
