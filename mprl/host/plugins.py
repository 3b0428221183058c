"""Finding plugins: the core's own (:data:`DEFAULT_PLUGINS`), entry points in the ``mprl``
group, block list and tracing; and what they register (algorithms, backends).

:func:`get_plugin_manager` is a factory, not a global: each call gives a fresh manager, so tests
build one with ``autoload=False`` and register plugin objects inline.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from mprl import hookspecs
from mprl.algorithm import Algorithm
from mprl.backends.base import Backend
from mprl.errors import PluginError, UsageError
from mprl.hookspecs import NAME
from mprl.version import __version__

#: Comma-separated plugin names not to load (like ``-p no:NAME``).
BLOCK_ENV = "MPRL_BLOCK_PLUGINS"
#: Set to 1 to load no entry-point plugins at all.
NO_AUTOLOAD_ENV = "MPRL_DISABLE_PLUGIN_AUTOLOAD"
#: Set to 1 to print every hook call and its result.
TRACE_ENV = "MPRL_TRACE"

#: the core's own plugins, registered by module name before the entry points: gymnasium's
#: environments and the built-in backends
DEFAULT_PLUGINS = ("mprl.host.envs", "mprl.backends.local", "mprl.backends.serial")


@attrs.frozen
class FailedPlugin:
    """An entry point whose import failed; the other plugins stay usable."""

    name: str
    value: str
    distribution: str
    version: str
    error: str

    def message(self) -> str:
        return (
            f"plugin {self.name!r} (entry point {self.name} = {self.value} in distribution "
            f"{self.distribution} {self.version}) failed to import: {self.error}"
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


@attrs.frozen
class BackendInfo:
    """A backend some plugin registered: ``factory()`` makes one for a run."""

    name: str
    plugin: str
    factory: Callable[[], Backend]
    description: str = ""


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus what mprl needs to know: failed imports, distributions, algorithms."""

    def __init__(self) -> None:
        super().__init__(NAME)
        self.add_hookspecs(hookspecs)
        self.failed: list[FailedPlugin] = []
        self.distributions: dict[str, tuple[str, str]] = {}
        self._algorithms: dict[str, tuple[str, Algorithm]] | None = None
        self._backends: dict[str, BackendInfo] | None = None
        self._blocked: list[str] = []

    # -- loading ---------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Register every ``mprl`` entry point; an import failure is recorded, not raised."""
        for ep in md.entry_points(group=NAME):
            if self.is_blocked(ep.name) or self.has_plugin(ep.name):
                continue
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else "?"
            try:
                plugin = ep.load()
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
                self.failed.append(FailedPlugin(ep.name, ep.value, dist, version, err))
                continue
            self.register(plugin, name=ep.name)
            self.distributions[ep.name] = (dist, version)
        self._algorithms = self._backends = None

    def set_blocked(self, name: str) -> None:
        super().set_blocked(name)
        self._blocked.append(name)

    def blocked_names(self) -> list[str]:
        """Names blocked in this manager; spawned children block the same ones."""
        return list(self._blocked)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        self._algorithms = self._backends = None
        try:
            return super().register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name or plugin!r}: {exc}") from None

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        self._algorithms = self._backends = None
        return super().unregister(plugin=plugin, name=name)

    def check(self) -> None:
        """Fail loudly on a hook implementation that matches no spec (a misspelt hook)."""
        try:
            self.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(
                f"plugin {self.get_name(exc.plugin)!r}: {exc}; hooks are named "
                f"{', '.join(sorted(n for n in dir(hookspecs) if n.startswith('mprl_')))}"
            ) from None

    # -- algorithms ------------------------------------------------------------------------

    def call_one(self, hook: str, plugin: object, **kwargs: Any) -> Any:
        """Call ``hook`` on ``plugin`` alone (through pluggy, so tracing still sees it)."""
        others = [
            i.plugin for i in getattr(self.hook, hook).get_hookimpls() if i.plugin is not plugin
        ]
        return self.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

    def _registrations(self, hook: str, add: Callable[..., None]) -> None:
        """Call registration ``hook`` on each plugin with ``register(*args)`` calling
        ``add(plugin_name, *args)``; whatever goes wrong is a PluginError naming the plugin."""
        for impl in reversed(getattr(self.hook, hook).get_hookimpls()):
            name = impl.plugin_name
            try:
                self.call_one(hook, impl.plugin, register=functools.partial(add, name))
            except PluginError as exc:
                if str(exc).startswith("plugin "):
                    raise
                raise PluginError(f"plugin {name!r}: {exc}") from None
            except Exception as exc:
                raise PluginError(
                    f"plugin {name!r}: {hook} raised {type(exc).__name__}: {exc}"
                ) from exc

    def algorithms(self) -> dict[str, tuple[str, Algorithm]]:
        """``{algorithm name: (plugin name, Algorithm)}`` from every plugin's registration hook."""
        if self._algorithms is not None:
            return self._algorithms
        found: dict[str, tuple[str, Algorithm]] = {}

        def register(plugin: str, algo: Any) -> None:
            if not isinstance(algo, Algorithm):
                raise PluginError(
                    f"plugin {plugin!r}: mprl_register_algorithms called register() with "
                    f"{type(algo).__name__} {algo!r}; expected an mprl.Algorithm"
                )
            if algo.name in found:
                raise PluginError(
                    f"algorithm {algo.name!r} is registered by two plugins: "
                    f"{found[algo.name][0]!r} and {plugin!r}; block one with "
                    f"-p no:NAME or {BLOCK_ENV}=NAME"
                )
            found[algo.name] = (plugin, algo)

        self._registrations("mprl_register_algorithms", register)
        self._algorithms = found
        return found

    def algorithm(self, name: str) -> tuple[str, Algorithm]:
        """``(plugin name, Algorithm)`` for ``name``; unknown names list what is installed."""
        algos = self.algorithms()
        if name in algos:
            return algos[name]
        installed = ", ".join(sorted(algos)) or "none"
        msg = f"unknown plugin/algorithm {name!r}; installed: {installed}"
        for failed in self.failed:
            if failed.name == name:
                msg = failed.message()
        if self.is_blocked(name):
            msg = (
                f"plugin {name!r} is blocked (-p no:{name} or {BLOCK_ENV}); installed: {installed}"
            )
        raise PluginError(msg)

    # -- backends --------------------------------------------------------------------------

    def backends(self) -> dict[str, BackendInfo]:
        """Every registered backend by name; the first registration of a name wins."""
        if self._backends is not None:
            return self._backends
        found: dict[str, BackendInfo] = {}

        def register(plugin: str, name: Any, factory: Any, description: str = "") -> None:
            if not (isinstance(name, str) and name) or not callable(factory):
                raise PluginError(
                    f"plugin {plugin!r}: mprl_register_backends called register({name!r}, "
                    f"{factory!r}); expected a name and a backend factory"
                )
            found.setdefault(name, BackendInfo(name, plugin, factory, description))

        self._registrations("mprl_register_backends", register)
        self._backends = found
        return found

    def backend(self, name: str) -> Backend:
        """A new backend ``name`` for one run; unknown names list the available ones."""
        info = self.backends().get(name)
        if info is None:
            known = ", ".join(sorted(self.backends())) or "none"
            raise UsageError(f"no plugin provides backend {name!r}; available: {known}")
        backend = info.factory()
        if not isinstance(backend, Backend):
            raise PluginError(
                f"plugin {info.plugin!r}: backend {name!r} is a {type(backend).__name__}, not "
                "an mprl.backends.base.Backend"
            )
        return backend

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
        rows = []
        for name, plugin in sorted(self.list_name_plugin()):
            hooks = tuple(sorted(c.name for c in self.get_hookcallers(plugin) or ()))
            dist, version = self.distribution_of(name)
            algos = tuple(sorted(by_plugin.get(name, ())))
            rows.append(
                PluginInfo(name, dist, version, algos, hooks, tuple(backends.get(name, ())))
            )
        return rows


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
