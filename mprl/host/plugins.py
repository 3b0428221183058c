"""Finding plugins: the core's own (:data:`DEFAULT_PLUGINS`), entry points in the ``mprl``
group, block list and tracing; and what they register (algorithms, backends, commands).

:func:`get_plugin_manager` is a factory, not a global: each call gives a fresh manager, so tests
build one with ``autoload=False`` and register plugin objects inline.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from mprl import deprecated, hookspecs
from mprl.algorithm import Algorithm
from mprl.backends.base import Backend
from mprl.errors import PluginError, UsageError
from mprl.hookspecs import NAME
from mprl.host.options import RunOptions
from mprl.version import __version__

#: Comma-separated plugin names not to load (like ``-p no:NAME``); ``DIST:NAME`` names the plugin
#: NAME of distribution DIST only (to choose between two plugins of one name).
BLOCK_ENV = "MPRL_BLOCK_PLUGINS"
#: Set to 1 to load no entry-point plugins at all.
NO_AUTOLOAD_ENV = "MPRL_DISABLE_PLUGIN_AUTOLOAD"
#: Set to 1 to print every hook call and its result.
TRACE_ENV = "MPRL_TRACE"

#: the core's own plugins, registered by module name before the entry points: the env room
#: (gymnasium's environments, Atari, MuJoCo, PettingZoo, EnvPool) and the core's two backends
DEFAULT_PLUGINS = (
    "mprl.environments",
    "mprl.backends.local",
    "mprl.backends.serial",
)


@attrs.frozen
class FailedPlugin:
    """A plugin that failed to import, to register or to register what it provides; the other
    plugins stay usable, and only selecting what it provides is an error."""

    name: str
    value: str
    distribution: str
    version: str
    error: str
    stage: str = "import"  # what failed: "import", "register", "register its algorithms" ...

    def message(self) -> str:
        where = (
            f"entry point {self.name} = {self.value} in distribution "
            f"{self.distribution} {self.version}"
            if self.value
            else "registered in code"
        )
        return (
            f"plugin {self.name!r} ({where}) failed to {self.stage}: {self.error}; block it "
            f"with -p no:{self.name} or {BLOCK_ENV}={self.name}"
        )


@attrs.frozen
class PluginConflict:
    """A plugin name that more than one installed distribution gives an entry point: none of
    them is loaded until the user blocks all but one (``-p no:DIST:NAME``) or uninstalls them."""

    name: str
    #: ``(distribution, version, entry point value)`` of each
    owners: tuple[tuple[str, str, str], ...]

    def message(self) -> str:
        owners = " and ".join(f"{dist} {version} ({value})" for dist, version, value in self.owners)
        blocks = " or ".join(f"-p no:{dist}:{self.name}" for dist, _, _ in self.owners)
        return (
            f"plugin {self.name!r} is installed by more than one distribution: {owners}, so "
            f"none of them is loaded; to choose one, block the other with {blocks} "
            f"({BLOCK_ENV}=DIST:{self.name}), or uninstall it"
        )


@attrs.frozen
class PluginInfo:
    """What ``python -m mprl plugins`` shows for one plugin."""

    name: str
    distribution: str
    version: str
    algorithms: tuple[str, ...]
    hooks: tuple[str, ...]
    backends: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()


@attrs.frozen
class BackendInfo:
    """A backend some plugin registered: ``factory()`` makes one for a run."""

    name: str
    plugin: str
    factory: Callable[[], Backend]
    description: str = ""


@attrs.frozen
class CommandInfo:
    """A command some plugin registered: ``python -m mprl NAME``."""

    name: str
    plugin: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser, PluginManager], None]
    run: Callable[[argparse.Namespace, PluginManager], int]


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus what mprl needs to know: failed imports, distributions, algorithms."""

    def __init__(self) -> None:
        super().__init__(NAME)
        self.add_hookspecs(hookspecs)
        self.add_hookspecs(deprecated)  # mprl_make_backend: warns when a plugin implements it
        self.failed: list[FailedPlugin] = []
        self.distributions: dict[str, tuple[str, str]] = {}
        self.entry_points: dict[str, str] = {}  # plugin name -> the entry point's value
        self._algorithms: dict[str, tuple[str, Algorithm]] | None = None
        self._backends: dict[str, BackendInfo] | None = None
        self._options: RunOptions | None = None
        self._commands: list[CommandInfo] | None = None
        #: algorithm names registered by more than one plugin: name -> the plugins
        self.conflicts: dict[str, list[str]] = {}
        #: command names registered twice (the core's own as plugin ``mprl``): name -> owners
        self.command_conflicts: dict[str, list[str]] = {}
        #: plugin names more than one distribution installs: none of them is loaded
        self.plugin_conflicts: dict[str, PluginConflict] = {}
        self._blocked: list[str] = []
        self._blocked_in: set[tuple[str, str]] = set()  # (distribution, plugin) of DIST:NAME

    # -- loading ---------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Register every ``mprl`` entry point; an import failure is recorded, not raised. A
        plugin name that several distributions use is recorded in :attr:`plugin_conflicts`, and
        none of them is imported: which one runs is the user's choice, never an accident of
        the order the distributions are found in."""
        found: dict[str, list[md.EntryPoint]] = {}
        for ep in md.entry_points(group=NAME):
            blocked_in = (_canonical(_owner(ep)[0]), ep.name) in self._blocked_in
            if not (blocked_in or self.is_blocked(ep.name) or self.has_plugin(ep.name)):
                found.setdefault(ep.name, []).append(ep)
        for name, eps in found.items():
            if len(eps) > 1:
                self.plugin_conflicts[name] = PluginConflict(name, tuple(sorted(map(_owner, eps))))
                continue
            dist, version, self.entry_points[name] = _owner(eps[0])
            self.distributions[name] = (dist, version)
            stage = "import"
            try:
                plugin = eps[0].load()
                stage = "register"
                self.register(plugin, name=name)
            except Exception as exc:
                self._fail(name, stage, exc)
        self._algorithms = self._backends = self._commands = None

    def _fail(self, name: str, stage: str, exc: BaseException) -> None:
        """Record that plugin ``name`` failed at ``stage``; it is left out from here on."""
        text = str(exc)
        if isinstance(exc, PluginError):  # mprl's own words: no type name before them
            error = text.removeprefix(f"plugin {name!r}: ")
        else:
            error = f"{type(exc).__name__}: {text}"
        dist, version = self.distributions.get(name, ("", ""))
        value = self.entry_points.get(name, "")
        self.failed.append(FailedPlugin(name, value, dist, version, error, stage))

    def set_blocked(self, name: str) -> None:
        """Never load plugin ``name``; ``DIST:NAME`` blocks only the plugin ``NAME`` of
        distribution ``DIST``, the way to choose between two plugins of one name."""
        if name in deprecated.RENAMED_PLUGINS:  # a 0.1.0 plugin name: block what it became
            message = deprecated.renamed_plugin_message(name)
            warnings.warn(message, deprecated.MprlDeprecationWarning, stacklevel=2)
            for renamed in deprecated.RENAMED_PLUGINS[name]:
                self.set_blocked(renamed)
            return
        dist, colon, plugin = name.partition(":")
        if colon:
            self._blocked_in.add((_canonical(dist), plugin))
        else:
            super().set_blocked(name)
        self._blocked.append(name)

    def blocked_names(self) -> list[str]:
        """Names blocked in this manager; spawned children block the same ones."""
        return list(self._blocked)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        self._algorithms = self._backends = self._commands = None
        try:
            return super().register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name or plugin!r}: {exc}") from None

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        self._algorithms = self._backends = self._commands = None
        return super().unregister(plugin=plugin, name=name)

    def check(self) -> None:
        """Fail loudly on a hook implementation that matches no spec (a misspelt hook). An
        installed plugin (an entry point) with one is recorded as failed and left out, so it
        disables nothing but itself; one registered in code raises."""
        while True:
            try:
                self.check_pending()
                return
            except pluggy.PluginValidationError as exc:
                name = self.get_name(exc.plugin) or repr(exc.plugin)
                hooks = ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("mprl_")))
                error = PluginError(f"plugin {name!r}: {exc}; hooks are named {hooks}")
                if name not in self.entry_points:
                    raise error from None
                self.unregister(exc.plugin)
                self._fail(name, "register", error)

    # -- algorithms ------------------------------------------------------------------------

    def call_one(self, hook: str, plugin: object, **kwargs: Any) -> Any:
        """Call ``hook`` on ``plugin`` alone (through pluggy, so tracing still sees it)."""
        others = [
            i.plugin for i in getattr(self.hook, hook).get_hookimpls() if i.plugin is not plugin
        ]
        return self.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

    def _registrations(
        self, hook: str, check: Callable[..., None]
    ) -> list[tuple[str, tuple[tuple, dict]]]:
        """Call registration ``hook`` on each plugin, in pluggy's order; ``(plugin name,
        register's arguments)`` for each call of ``register``, each checked by
        ``check(plugin, *args)``. A plugin whose hook or checks fail is recorded in
        :attr:`failed` with what it registered dropped: the others are unaffected."""
        out: list[tuple[str, tuple[tuple, dict]]] = []
        failed = {f.name for f in self.failed}
        for impl in reversed(getattr(self.hook, hook).get_hookimpls()):
            name = impl.plugin_name
            mine: list[tuple[tuple, dict]] = []

            def register(*args: Any, _mine: list = mine, **kwargs: Any) -> None:
                _mine.append((args, kwargs))

            try:
                self.call_one(hook, impl.plugin, register=register)
                for args, kwargs in mine:
                    check(name, *args, **kwargs)
            except Exception as exc:
                if name not in failed:
                    self._fail(name, "register what it provides", exc)
                continue
            out += [(name, args) for args in mine]
        return out

    def algorithms(self) -> dict[str, tuple[str, Algorithm]]:
        """``{algorithm name: (plugin name, Algorithm)}`` from every plugin's registration hook.
        A name two plugins register is left out (:attr:`conflicts`), as are the algorithms of
        a plugin whose registration failed (:attr:`failed`)."""
        if self._algorithms is not None:
            return self._algorithms

        def check(plugin: str, algo: Any = None, *extra: Any, **kwargs: Any) -> None:
            if extra or kwargs or not isinstance(algo, Algorithm):
                raise PluginError(
                    f"plugin {plugin!r}: mprl_register_algorithms called register() with "
                    f"{type(algo).__name__} {algo!r}; expected an mprl.Algorithm"
                )

        owners: dict[str, list[str]] = {}
        first: dict[str, tuple[str, Algorithm]] = {}
        for plugin, ((algo,), _) in self._registrations("mprl_register_algorithms", check):
            owners.setdefault(algo.name, []).append(plugin)
            first.setdefault(algo.name, (plugin, algo))
        found = {name: first[name] for name, plugins in owners.items() if len(plugins) == 1}
        self.conflicts = {name: plugins for name, plugins in owners.items() if len(plugins) > 1}
        self._algorithms = found
        return found

    def algorithm(self, name: str) -> tuple[str, Algorithm]:
        """``(plugin name, Algorithm)`` for ``name``: an algorithm's name, or the name of a
        plugin that registers exactly one algorithm. Anything else is a PluginError that says
        what is installed, or what went wrong with ``name``."""
        algos = self.algorithms()
        if name in algos:
            return algos[name]
        of_plugin = sorted(a for a, (plugin, _) in algos.items() if plugin == name)
        if len(of_plugin) == 1:
            return algos[of_plugin[0]]
        installed = ", ".join(sorted(algos)) or "none"
        if of_plugin:
            raise PluginError(
                f"plugin {name!r} registers several algorithms: {', '.join(of_plugin)}; "
                "give one of them to --plugin"
            )
        if name in self.plugin_conflicts:
            raise PluginError(self.plugin_conflicts[name].message())
        if name in self.conflicts:
            raise PluginError(self._algorithm_conflict(name))
        for failed in self.failed:
            if failed.name == name:
                raise PluginError(failed.message())
        if self.is_blocked(name):
            raise PluginError(
                f"plugin {name!r} is blocked (-p no:{name} or {BLOCK_ENV}); installed: {installed}"
            )
        problems = [f.message() for f in self.failed]
        problems += [c.message() for c in self.plugin_conflicts.values()]
        raise PluginError(
            "; ".join([f"unknown plugin/algorithm {name!r}; installed: {installed}", *problems])
        )

    def _algorithm_conflict(self, name: str) -> str:
        def owner(plugin: str) -> str:
            dist, version = self.distribution_of(plugin)
            return f"{plugin!r} ({'registered in code' if version == '-' else f'{dist} {version}'})"

        plugins = sorted(set(self.conflicts[name]))
        if len(plugins) == 1:  # a plugin that registers it twice
            return (
                f"plugin {owner(plugins[0])} registers algorithm {name!r} more than once, so it "
                f"is not usable: fix the plugin, or block it with -p no:{plugins[0]}"
            )
        blocks = " or ".join(f"-p no:{plugin}" for plugin in plugins)
        return (
            f"algorithm {name!r} is registered by more than one plugin: "
            f"{' and '.join(map(owner, plugins))}, so none of them is usable; to choose one, "
            f"block the other with {blocks} ({BLOCK_ENV}=NAME), or uninstall it"
        )

    def conflict_messages(self) -> list[str]:
        """One line for each name more than one installed thing claims (a plugin name several
        distributions install, an algorithm name several plugins register), naming each owner
        with its distribution and version and how to choose one. ``python -m mprl plugins``
        shows them as ``CONFLICT`` lines."""
        self.algorithms()
        return [c.message() for _, c in sorted(self.plugin_conflicts.items())] + [
            self._algorithm_conflict(name) for name in sorted(self.conflicts)
        ]

    # -- backends --------------------------------------------------------------------------

    def backends(self) -> dict[str, BackendInfo]:
        """Every registered backend by name; the first registration of a name wins."""
        if self._backends is not None:
            return self._backends

        def check(
            plugin: str, name: Any = None, factory: Any = None, description: Any = ""
        ) -> None:
            if not (isinstance(name, str) and name) or not callable(factory):
                raise PluginError(
                    f"plugin {plugin!r}: mprl_register_backends called register({name!r}, "
                    f"{factory!r}); expected a name, a backend factory and a description"
                )

        found: dict[str, BackendInfo] = {}
        for plugin, (args, kwargs) in self._registrations("mprl_register_backends", check):
            info = BackendInfo(args[0], plugin, *args[1:], **kwargs)
            found.setdefault(info.name, info)
        self._backends = found
        return found

    def run_options(self) -> RunOptions:
        """Every run option: :class:`mprl.RunConfig`'s and those plugins register."""
        if self._options is None:

            def check(plugin: str, cls: Any = None, *extra: Any, **kwargs: Any) -> None:
                if extra or kwargs or not attrs.has(cls):
                    raise PluginError(
                        f"plugin {plugin!r}: mprl_register_options called register() with "
                        f"{cls!r}; expected an attrs class"
                    )

            found = self._registrations("mprl_register_options", check)
            self._options = RunOptions([(plugin, args[0]) for plugin, (args, _) in found])
        return self._options

    def backend(self, name: str) -> Backend:
        """A new backend ``name`` for one run; unknown names list the available ones. A name
        no plugin registered is asked of the deprecated ``mprl_make_backend`` hook."""
        info = self.backends().get(name)
        if info is not None:
            plugin, backend = info.plugin, info.factory()
        else:  # firstresult, in pluggy's order, knowing who answered
            plugin, backend = "", None
            for impl in reversed(self.hook.mprl_make_backend.get_hookimpls()):
                backend = self.call_one("mprl_make_backend", impl.plugin, name=name)
                if backend is not None:
                    plugin = impl.plugin_name
                    break
            else:
                known = ", ".join(sorted(self.backends())) or "none"
                raise UsageError(f"no plugin provides backend {name!r}; available: {known}")
        if not isinstance(backend, Backend):
            raise PluginError(
                f"plugin {plugin!r}: backend {name!r} is a {type(backend).__name__}, not "
                "an mprl.backends.base.Backend"
            )
        return backend

    # -- commands --------------------------------------------------------------------------

    def commands(self, reserved: Iterable[str] = ()) -> dict[str, CommandInfo]:
        """Every command plugins registered, by name. A name two plugins register, or one of
        ``reserved`` (the core's own commands, owned by ``mprl``), is left out and kept in
        :attr:`command_conflicts`, naming both owners."""
        by_name: dict[str, list[CommandInfo]] = {}
        for info in self._registered_commands():
            by_name.setdefault(info.name, []).append(info)
        reserved = set(reserved)
        self.command_conflicts = {
            name: ["mprl"] * (name in reserved) + sorted(i.plugin for i in infos)
            for name, infos in by_name.items()
            if len(infos) > 1 or name in reserved
        }
        return {n: i[0] for n, i in by_name.items() if n not in self.command_conflicts}

    def _registered_commands(self) -> list[CommandInfo]:
        if self._commands is None:
            found = self._registrations("mprl_register_commands", _command)
            self._commands = [_command(plugin, *a, **kw) for plugin, (a, kw) in found]
        return self._commands

    def distribution_of(self, plugin_name: str) -> tuple[str, str]:
        if plugin_name in self.distributions:
            return self.distributions[plugin_name]
        if plugin_name in DEFAULT_PLUGINS:
            return ("mprl", __version__)
        return ("(registered in code)", "-")

    def info(self) -> list[PluginInfo]:
        by_plugin: dict[str, list[str]] = {}
        for algo_name, (plugin_name, _) in self.algorithms().items():
            by_plugin.setdefault(plugin_name, []).append(algo_name)
        backends: dict[str, list[str]] = {}
        for backend in self.backends().values():
            backends.setdefault(backend.plugin, []).append(backend.name)
        commands: dict[str, list[str]] = {}
        for command in self._registered_commands():
            commands.setdefault(command.plugin, []).append(command.name)
        rows = []
        for name, plugin in sorted(self.list_name_plugin()):
            hooks = tuple(sorted(c.name for c in self.get_hookcallers(plugin) or ()))
            dist, version = self.distribution_of(name)
            algos = tuple(sorted(by_plugin.get(name, ())))
            mine = tuple(backends.get(name, ())), tuple(sorted(commands.get(name, ())))
            rows.append(PluginInfo(name, dist, version, algos, hooks, *mine))
        return rows


def _owner(ep: md.EntryPoint) -> tuple[str, str, str]:
    """The distribution, version and value of an entry point."""
    return (ep.dist.name, ep.dist.version, ep.value) if ep.dist else ("?", "?", ep.value)


def _canonical(distribution: str) -> str:
    """A distribution name as pip compares them: ``MPRL_dqn`` is ``mprl-dqn``."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _command(
    plugin: str,
    name: Any = None,
    help: Any = None,
    add_arguments: Any = None,
    run: Any = None,
    *extra: Any,
    **kwargs: Any,
) -> CommandInfo:
    """The command ``register(name, help, add_arguments, run)`` of ``plugin`` registered."""
    named = isinstance(name, str) and re.fullmatch(r"[a-z][a-z0-9-]*", name) is not None
    fits = named and isinstance(help, str) and callable(add_arguments) and callable(run)
    if extra or kwargs or not fits:
        raise PluginError(
            f"plugin {plugin!r}: mprl_register_commands called register({name!r}, {help!r}, "
            f"{add_arguments!r}, {run!r}); expected a command name (lower case), a help line, "
            "add_arguments(parser, plugins) and run(args, plugins)"
        )
    return CommandInfo(name, plugin, help, add_arguments, run)


def blocked_from_env() -> tuple[str, ...]:
    return tuple(n.strip() for n in os.environ.get(BLOCK_ENV, "").split(",") if n.strip())


def get_plugin_manager(
    *, autoload: bool | None = None, blocked: Iterable[str] = (), builtins: bool = True
) -> PluginManager:
    """A fresh plugin manager: hook specs, built-ins, then the ``mprl`` entry points.

    :param autoload: load entry-point plugins; default: yes unless ``MPRL_DISABLE_PLUGIN_AUTOLOAD``
        is set.
    :param blocked: plugin names never to register (added to ``MPRL_BLOCK_PLUGINS``).
    :param builtins: register :data:`DEFAULT_PLUGINS` (gymnasium's envs, the backends).
    """
    pm = PluginManager()
    for name in (*blocked, *blocked_from_env()):
        pm.set_blocked(name)
    for name in DEFAULT_PLUGINS if builtins else ():
        if not pm.is_blocked(name):
            pm.register(importlib.import_module(name), name=name)
    if autoload is None:
        autoload = os.environ.get(NO_AUTOLOAD_ENV, "") in ("", "0")
    if autoload:
        pm.load_entry_points()
    pm.check()
    if os.environ.get(TRACE_ENV, "") not in ("", "0"):
        pm.trace.root.setwriter(lambda s: sys.stderr.write(f"[mprl trace] {s}"))
        pm.enable_tracing()
    return pm
