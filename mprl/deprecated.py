"""Everything deprecated, in one place (the shape of pytest's ``_pytest/deprecated.py``): what
moved or went away since mprl 0.1.0, what replaces it, and the release that drops it.

- A name in :data:`MOVED` keeps working until :data:`REMOVED_IN`, with a
  :class:`MprlDeprecationWarning` that names its new place: ``from mprl.plugins import
  PluginManager`` gets ``mprl.host.plugins.PluginManager``. The 0.1.0 modules that are gone
  (:data:`OLD_MODULES`) are made on import by the finder :func:`install` puts last on
  ``sys.meta_path``; a module that still exists forwards its moved names with
  ``__getattr__ = deprecated.forward(__name__)``.
- A name in :data:`REMOVED` raises an ``AttributeError`` (an ``ImportError`` for ``from ...
  import``) that says what to do instead.
- The ``mprl_make_backend`` hook (:func:`mprl_make_backend`, here and not in
  :mod:`mprl.hookspecs`) warns when a plugin implements it, and is asked only for a backend
  name no plugin registered through ``mprl_register_backends``.
- ``MPRL_BLOCK_PLUGINS=mprl.builtin`` (:data:`RENAMED_PLUGINS`) blocks what that plugin became.
- The built-in plugins' top-level modules (``mprl_dqn`` ...) moved under ``mprl_builtin``
  (:data:`MOVED_PLUGIN_MODULES`): the same finder makes the old name the new module, but only
  where no installed module has that name, so a third party's ``mprl_dqn`` always wins.
- A config field in :data:`RENAMED_FIELDS` is still accepted under its old name (``--set``, a
  TOML file, the config of a run made before), with a warning: :func:`renamed_field`.

Removing all of it in 0.3.0: delete this module, the ``install()`` call and ``OLD_MODULES`` look-up
in ``mprl/__init__.py``, the ``forward`` lines, and the ``deprecated`` uses in
``mprl/host/plugins.py`` and ``mprl/host/config.py``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import pkgutil
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pluggy

#: the release that removes everything deprecated here
REMOVED_IN = "0.3.0"


class MprlDeprecationWarning(DeprecationWarning):
    """mprl API that still works but goes away in :data:`REMOVED_IN`; the message names what
    replaces it. pytest shows these; ``-W error::DeprecationWarning`` makes them errors."""


def _same(new_module: str, names: str) -> dict[str, str]:
    return {name: f"{new_module}:{name}" for name in names.split()}


#: ``{old module: {name: "new.module:attribute"}}``: every 0.1.0 name that moved, where it is
#: now (a different attribute where it was renamed, ``Class.attribute`` where it became one)
MOVED: dict[str, dict[str, str]] = {
    "mprl.backend": {
        **_same("mprl.backends.base", "Backend Job Monitor Outcome"),
        **_same("mprl.run_types", "ChildFailure"),
    },
    "mprl.builtin": _same("mprl.environments", "mprl_make_env"),
    "mprl.checkpoint": {
        **_same(
            "mprl.host.checkpoint", "FORMAT VERSION checkpoint_path load rng_states set_rng_states"
        ),
        "REQUIRED": "mprl.host.checkpoint:FIELDS",
    },
    "mprl.cli": _same("mprl.tools.cli", "EXIT_FAILED EXIT_USAGE main"),
    "mprl.config": _same(
        "mprl.host.config",
        "as_dict build coerce describe_fields fields_of load_toml parse_assignments parse_value "
        "type_name",
    ),
    "mprl.envs": _same("mprl.host.envs", "make_env play_episodes"),
    "mprl.evaluate": _same("mprl.tools.evaluate", "evaluate"),
    "mprl.hookspecs": _same("mprl.deprecated", "mprl_make_backend"),
    "mprl.local": {
        **_same("mprl.backends.local", "LocalBackend"),
        **_same("mprl.backends.local.backend", "threads_per_child"),
        "STOP_GRACE_S": "mprl.backends.supervisor:Supervisor.stop_grace_s",
        **_same("mprl.backends.local.channel", "LocalChannel"),
        **_same("mprl.backends.base", "TICK_S"),
        **_same("mprl.backends.processes", "PARENT_DIED_EXIT"),
        "MAX_RESTART_DELAY_S": "mprl.backends.restart:MAX_DELAY_S",
        "STARTUP_TIMEOUT_S": "mprl.backends.supervisor:Supervisor.startup_timeout_s",
    },
    "mprl.nets": {
        **_same(
            "mprl.lib.nets",
            "ActorCritic ActorCriticConfig Adam field_help make_model make_optimizer mlp",
        ),
        **_same("mprl.lib.envbatch", "EnvBatch rollout_spec"),
    },
    "mprl.plugins": {
        **_same(
            "mprl.host.plugins",
            "BLOCK_ENV NO_AUTOLOAD_ENV TRACE_ENV FailedPlugin PluginInfo PluginManager "
            "blocked_from_env get_plugin_manager",
        ),
        "BUILTIN_PLUGINS": "mprl.host.plugins:DEFAULT_PLUGINS",
    },
    "mprl.preflight": _same(
        "mprl.backends.local.preflight",
        "FDS_PER_CHILD FDS_SPARE MIB SHM check check_shm shared_bytes",
    ),
    "mprl.progress": _same(
        "mprl.host.progress", "IDLE_S PLAIN_EVERY_S Progress summary_line worker_rows"
    ),
    "mprl.report": _same(
        "mprl.tools.report",
        "MAX_DEPTH MISSING RUNNING_WITHIN_S Run build_figure format_runs format_wall is_run_dir "
        "list_runs plot_runs read_run rolling_mean",
    ),
    "mprl.rundir": _same("mprl.host.rundir", "CSV_COLUMNS RunDir atomic_write"),
    "mprl.runner": {
        **_same("mprl", "RunConfig Summary run"),
        **_same("mprl.run_types", "RunInfo"),
        **_same("mprl.host.policy_check", "CHECK_EPISODES"),
        **_same("mprl.host.monitor", "METRICS_EVERY_S"),
        **_same("mprl.host.job", "materialize_optimizer_state"),
    },
    "mprl.serial": {
        **_same("mprl.backends.serial", "InProcessManager SerialBackend"),
        **_same("mprl.backends.serial.backend", "DEADLOCK_S"),
        **_same("mprl.backends.inprocess", "Pause"),
        **_same("mprl.backends.base", "TICK_S"),
    },
    "mprl.stats": _same("mprl.host.stats", "WINDOW RunStats Snapshot"),
    "mprl.transport": _same("mprl.transport.memory", "FREE FULL MAX_PAUSE_S TAKEN"),
}

#: names that moved after 0.1.0, while 0.2.0 was made, forwarded as :data:`MOVED`'s are: the
#: sweep left the core for the built-in plugin ``mprl_builtin.sweep`` (its command unchanged)
MOVED_SINCE_0_1_0: dict[str, dict[str, str]] = {
    "mprl.tools.sweep": {
        **_same(
            "mprl_builtin.sweep.spec",
            "SPEC_FILE OBJECTIVES parse_seeds split_values parse_grid Distribution "
            "parse_distribution parse_search Spec make_spec search_texts trial_inputs param_text "
            "config_key toml_text read_spec",
        ),
        **_same(
            "mprl_builtin.sweep.results",
            "DONE is_done objective_value sweep_results format_results write_results plot_sweep",
        ),
        **_same(
            "mprl_builtin.sweep.runner",
            "INSTALL STUDY POLL_S default_parallel cluster_cpus Sweep run_sweep",
        ),
    },
}


MOVED_SINCE_0_1_0["mprl.schema"] = {"Builder": "mprl.kinds:Builder"}

#: what a field declaration or a schema did at run time in 0.2.0's drafts, and where it is now
#: (mprl.kinds, the backends' and the host's side): ``Owner.method`` -> how to call it now
MOVED_METHODS: dict[str, str] = {
    "Field.build": "mprl.kinds.of(field).build(field, builder, dims)",
    "Field.snapshot": "mprl.kinds.of(field).snapshot(field, built)",
    "Field.restore": "mprl.kinds.of(field).restore(field, built, data)",
    "Field.fit": "mprl.kinds.of(field).fit(field, data, dims)",
    "Field.memory": "mprl.kinds.of(field).memory(field, dims)",
    "Field.check_dims": "mprl.kinds.of(field).check_dims(field, dims)",
    "Field.check": "nothing: Schema(...) checks its fields as it is made",
    "Field.needs_manager": "mprl.kinds.of(field).manager",
    "ReplayBuffer.pace": "mprl.kinds.pace(field, dims)",
    "Schema.build": "mprl.kinds.build(schema, builder, dims)",
    "Schema.snapshot": "mprl.kinds.snapshot(schema, state)",
    "Schema.restore": "mprl.kinds.restore(schema, state, saved)",
    "Schema.fit": "mprl.kinds.fit(schema, saved, dims)",
    "Schema.memory": "mprl.kinds.memory(schema, dims)",
    "Schema.check_dims": "mprl.kinds.check_dims(schema, dims)",
    "Schema.needs_manager": "mprl.kinds.needs_manager(schema)",
}


def moved_method(obj: Any, owner: str, name: str) -> Any:
    """``obj.name`` of :data:`MOVED_METHODS` (``owner``: ``"Field"`` or ``"Schema"``), with a
    warning; ``AttributeError`` for any other name."""
    key = f"{owner}.{name}"
    if key not in MOVED_METHODS and owner == "Field":
        key = f"{type(obj).__name__}.{name}"
    if key not in MOVED_METHODS or name.startswith("__"):
        raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
    message = (
        f"mprl.schema.{key} is deprecated: use {MOVED_METHODS[key]} instead; "
        f"it goes away in mprl {REMOVED_IN}"
    )
    warnings.warn(message, MprlDeprecationWarning, stacklevel=3)
    kinds = importlib.import_module("mprl.kinds")  # by name, as every new place here (resolve)
    if owner == "Schema":
        return functools.partial(getattr(kinds, name), obj)
    if name == "check":
        return obj._check
    if name == "pace":
        return functools.partial(kinds.pace, obj)
    handler = kinds.of(obj)
    return (
        handler.manager
        if name == "needs_manager"
        else functools.partial(getattr(handler, name), obj)
    )


def _moved(module: str) -> dict[str, str]:
    return {**MOVED.get(module, {}), **MOVED_SINCE_0_1_0.get(module, {})}


#: a word after the warning, where the new place alone does not say enough
NOTES: dict[str, str] = {
    "mprl.hookspecs.mprl_make_backend": "the hook itself is deprecated: implement "
    "mprl_register_backends(register) instead",
    "mprl.checkpoint.REQUIRED": "its keys are the required fields, its values their types",
    "mprl.local.STARTUP_TIMEOUT_S": "a class attribute of the supervisor every backend shares",
}

_SCHEMA_KINDS = "mprl.schema.Rollouts, Weights, ReplayBuffer, Counter or Module"

#: ``{old name: what to do instead}``: 0.1.0 names with no counterpart
REMOVED: dict[str, str] = {
    "mprl.local.KILL_GRACE_S": "a child that does not stop within the grace after the stop "
    "flag (mprl.backends.supervisor.Supervisor.stop_grace_s) is killed then, with no SIGTERM "
    "step before",
    "mprl.algorithm.SharedFactory": "Algorithm(make_shared=...) is gone: declare the shared "
    f"objects as fields of the algorithm's schema ({_SCHEMA_KINDS}); the backend builds them",
    "mprl.builtin.mprl_make_backend": "the built-in backends register themselves (modules "
    "mprl.backends.local and mprl.backends.serial, hook mprl_register_backends)",
    "mprl.runner.prepare": "it was the first half of mprl.run; call mprl.run (or "
    "mprl.testing.run_serial), which checks everything before anything starts",
    "mprl.runner.share_optimizer_state": "the optimizers an algorithm declares (make_optimizer, "
    "optimizers) are shared, checkpointed and restored by the backend",
    "mprl.transport.FieldSpec": "a rollout spec is {name: (shape, dtype)} "
    "(mprl.schema.RowSpec), given to mprl.schema.Rollouts",
    "mprl.transport.Rollouts": "declare mprl.schema.Rollouts(spec, slots_per_worker) in the "
    "schema; ctx.state.NAME is then a mprl.transport.RolloutSlots",
    "mprl.transport.Weights": "declare mprl.schema.Weights() in the schema; ctx.state.NAME is "
    "then a mprl.transport.WeightBroadcast",
}

#: the 0.1.0 modules that are gone (no file of that name), and what took their place
OLD_MODULES: dict[str, str] = {
    "mprl.backend": "mprl.backends.base",
    "mprl.builtin": "mprl.environments, mprl.backends.local, mprl.backends.serial",
    "mprl.checkpoint": "mprl.host.checkpoint",
    "mprl.cli": "mprl.tools.cli",
    "mprl.config": "mprl.host.config",
    "mprl.envs": "mprl.host.envs",
    "mprl.evaluate": "mprl.tools.evaluate",
    "mprl.local": "mprl.backends.local",
    "mprl.nets": "mprl.lib.nets, mprl.lib.envbatch",
    "mprl.plugins": "mprl.host.plugins",
    "mprl.preflight": "mprl.backends.local.preflight",
    "mprl.progress": "mprl.host.progress",
    "mprl.report": "mprl.tools.report",
    "mprl.rundir": "mprl.host.rundir",
    "mprl.runner": "mprl.run, mprl.run_types, mprl.host",
    "mprl.serial": "mprl.backends.serial",
    "mprl.stats": "mprl.host.stats",
}

#: ``{0.1.0 plugin name: what it became}``, for ``-p no:NAME`` and ``MPRL_BLOCK_PLUGINS``
RENAMED_PLUGINS: dict[str, tuple[str, ...]] = {
    "mprl.builtin": ("mprl.environments", "mprl.backends.local", "mprl.backends.serial"),
}


#: ``{old top-level module of a built-in plugin: the module it is now}``: the built-ins moved
#: under ``mprl_builtin`` (a name of mprl's own), leaving ``mprl_<name>`` to third parties
MOVED_PLUGIN_MODULES: dict[str, str] = {
    f"mprl_{name}": f"mprl_builtin.{name}"
    for name in ("a3c", "dqn", "impala", "mappo", "ppo", "sac", "tensorboard")
}


#: ``{"module:ConfigClass": {old field name: new name}}``: config fields renamed, one name for
#: one meaning across the built-ins (dqn's train_freq is what sac calls steps_per_update)
RENAMED_FIELDS: dict[str, dict[str, str]] = {
    "mprl_builtin.dqn.algorithm:DQNConfig": {"train_freq": "steps_per_update"},
}


def display(place: str) -> str:
    """A place as a user writes it: ``mprl.host.plugins.PluginManager``."""
    return place.replace(":", ".")


def resolve(place: str) -> Any:
    """The object at ``"module:attribute.path"``."""
    module, _, path = place.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def moved_message(old: str) -> str:
    """The warning for the moved name ``old`` (``"mprl.plugins.PluginManager"``)."""
    module, _, name = old.rpartition(".")
    new = display(_moved(module)[name])
    note = f" ({NOTES[old]})" if old in NOTES else ""
    return f"{old} is deprecated: use {new} instead{note}; {old} goes away in mprl {REMOVED_IN}"


def removed_message(old: str) -> str:
    return f"{old} was removed in mprl 0.2.0: {REMOVED[old]}"


def renamed_plugin_message(name: str) -> str:
    new = ", ".join(RENAMED_PLUGINS[name])
    return (
        f"plugin name {name!r} is deprecated: that plugin is now {new}; blocking those (block "
        f"them by these names: {name!r} stops working in mprl {REMOVED_IN})"
    )


def moved_plugin_module_message(old: str) -> str:
    new = MOVED_PLUGIN_MODULES[old]
    return (
        f"module {old} is deprecated: use {new} instead (the built-in plugins moved under "
        f"mprl_builtin); {old} goes away in mprl {REMOVED_IN}"
    )


def renamed_field(config_cls: type, name: str, source: str) -> str:
    """``name``, a field of ``config_cls`` as given (``source``: where, for the warning), as the
    class calls it now: an old name of :data:`RENAMED_FIELDS` warns and gives the new one."""
    new = RENAMED_FIELDS.get(f"{config_cls.__module__}:{config_cls.__qualname__}", {}).get(name)
    if new is None:
        return name
    message = (
        f"{source}: field {name!r} is deprecated: use {new!r} instead (the same setting); "
        f"{name!r} goes away in mprl {REMOVED_IN}"
    )
    warnings.warn(message, MprlDeprecationWarning, stacklevel=3)
    return new


def forward(module: str, stacklevel: int = 2) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: its moved names with a warning, its removed
    names with an error that says what instead. ``stacklevel``: as for ``warnings.warn``, seen
    from the returned function (2: the line that imported or used the old name; one more for
    each function between it and that line)."""
    moved = _moved(module)

    def __getattr__(name: str) -> Any:
        old = f"{module}.{name}"
        if name in moved:
            warnings.warn(moved_message(old), MprlDeprecationWarning, stacklevel=stacklevel)
            return resolve(moved[name])
        if old in REMOVED:
            raise AttributeError(removed_message(old))
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


class _OldModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes each module of :data:`OLD_MODULES` on import: a module whose names forward to their
    new places; and each of :data:`MOVED_PLUGIN_MODULES`: the new module itself. Last on
    ``sys.meta_path``, so a real module of that name always wins."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in OLD_MODULES and fullname not in MOVED_PLUGIN_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        if name in MOVED_PLUGIN_MODULES:
            _alias_plugin_module(name)
            return
        names = sorted(MOVED.get(name, {}))
        module.__doc__ = (
            f"Deprecated: {name} is now {OLD_MODULES[name]}; importing from {name} warns and "
            f"stops working in mprl {REMOVED_IN}."
        )
        module.__all__ = names  # type: ignore[attr-defined]
        module.__getattr__ = forward(name)  # type: ignore[method-assign]
        module.__dir__ = lambda: names  # type: ignore[method-assign]


def _alias_plugin_module(old: str) -> None:
    """Make ``old`` (and ``old.algorithm`` ...) the very modules of its new place: the import
    system returns what ``sys.modules`` holds once a loader is done. Every submodule is aliased
    now, so that none is ever loaded a second time under the old name."""
    warnings.warn(moved_plugin_module_message(old), MprlDeprecationWarning, stacklevel=3)
    new = MOVED_PLUGIN_MODULES[old]
    package = importlib.import_module(new)
    for sub in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{new}.{sub.name}")
    for name, module in list(sys.modules.items()):
        if name == new or name.startswith(f"{new}."):
            sys.modules[old + name[len(new) :]] = module


def install() -> None:
    """Make the gone 0.1.0 modules and the built-in plugins' old module names importable (once
    per process; ``import mprl`` calls it)."""
    if not any(getattr(f, "mprl_old_modules", False) for f in sys.meta_path):
        finder = _OldModules()
        finder.mprl_old_modules = True  # type: ignore[attr-defined]
        sys.meta_path.append(finder)


# --------------------------------------------------------------------------------------------
# The mprl_make_backend hook
# --------------------------------------------------------------------------------------------

MAKE_BACKEND_HOOK = MprlDeprecationWarning(
    "the mprl_make_backend hook is deprecated: implement mprl_register_backends(register) "
    "instead and call register(name, factory, description) for each backend (see "
    f"docs/hooks.md); mprl_make_backend is asked only for a backend name no plugin registered, "
    f"and goes away in mprl {REMOVED_IN}"
)

# the project's marker, made here so that this module imports nothing of mprl
_hookspec = pluggy.HookspecMarker("mprl")


@_hookspec(firstresult=True, warn_on_impl=MAKE_BACKEND_HOOK)
def mprl_make_backend(name: str) -> Any:
    """Deprecated since 0.2.0, removed in 0.3.0: implement ``mprl_register_backends``.

    Provide the backend that runs a job's processes, selected with ``--backend NAME``. mprl
    asks this hook only for a name that no plugin registered through ``mprl_register_backends``.

    :param name: the backend name asked for.
    :returns: an :class:`mprl.backends.base.Backend`, or ``None`` if this plugin does not
        provide ``name``. firstresult.

    Example::

        import mprl
        from mprl.backends.local import LocalBackend


        @mprl.hookimpl
        def mprl_make_backend(name):
            if name == "local-debug":  # the local backend under another name
                return LocalBackend()
            return None
    """
