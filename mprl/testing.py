"""Testing helpers for plugin authors, and the pytest plugin that offers them as fixtures.

Enable the fixtures with one line in the ``conftest.py`` at the root of your tests::

    pytest_plugins = ["mprl.testing"]

(or ``-p mprl.testing`` on pytest's command line / in ``addopts``). Then:

- ``mprl_pm``: a fresh plugin manager with no entry points loaded (the core's built-ins only);
  ``mprl_pm.register(my_plugin)`` adds your plugin module for one test.
- ``mprl_recorder``: a :class:`HookRecorder` of every hook call made through ``mprl_pm``.
- ``mprl_serial``: :func:`run_serial` bound to ``mprl_pm`` and the test's ``tmp_path``: runs an
  algorithm's worker and train functions in the test's own process, taking turns (no spawn, no
  Manager server), repeatable for a seed; returns a :class:`SerialResult`.
- ``mprl_state``: :func:`build_state` that also shuts down any real Manager it started.

The functions work without pytest too: :func:`plugin_manager`, :func:`registered`,
:func:`call_hook`, :func:`build_state`, :func:`run_serial`.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from mprl.algorithm import Algorithm
from mprl.backends.serial import InProcessManager, SerialBackend
from mprl.backends.tensors import TensorStateBuilder
from mprl.errors import PluginError, UsageError
from mprl.hookspecs import hookimpl
from mprl.host.envs import make_env
from mprl.host.plugins import PluginManager, get_plugin_manager
from mprl.host.runner import run
from mprl.run_types import Summary
from mprl.schema import Dims, Schema, SharedState


def plugin_manager(*plugins: object, builtins: bool = True) -> PluginManager:
    """A fresh plugin manager without entry points, with ``plugins`` (modules or objects with
    ``@mprl.hookimpl`` functions) registered and checked (a misspelt hook is an error)."""
    pm = get_plugin_manager(autoload=False, builtins=builtins)
    for plugin in plugins:
        pm.register(plugin)
    pm.check()
    return pm


def registered(plugin: object) -> dict[str, Algorithm]:
    """The algorithms ``plugin``'s ``mprl_register_algorithms`` registers, by name, with the
    checks registration makes (importable functions, attrs config, schema kinds)."""
    pm = plugin_manager(plugin, builtins=False)
    algos = pm.algorithms()
    if pm.failed:  # a test of the registration wants the error itself
        raise PluginError(pm.failed[0].message())
    for name in pm.conflicts:
        pm.algorithm(name)  # raises, naming the plugins
    return {name: algo for name, (_, algo) in algos.items()}


def call_hook(pm: PluginManager, hook: str, *, plugin: object | None = None, **kwargs: Any) -> Any:
    """Call ``hook`` through ``pm`` with ``kwargs``; with ``plugin``, on that plugin alone (its
    own result, whatever the others would answer)."""
    if not hook.startswith("mprl_") or not hasattr(pm.hook, hook):
        raise ValueError(f"{hook!r} is not an mprl hook; see docs/hooks.md")
    if plugin is not None:
        return pm.call_one(hook, plugin, **kwargs)
    return getattr(pm.hook, hook)(**kwargs)


def build_state(
    schema: Schema | Algorithm,
    workers: int = 2,
    *,
    manager: Any = None,
    env: str | None = None,
    config: Any = None,
    plugins: PluginManager | None = None,
) -> SharedState:
    """The shared state ``schema`` (or an algorithm's) builds for ``workers`` workers, with
    tensors in shared memory, as the local backend builds it, and nothing started.

    Without ``manager``, Manager kinds are plain in-process objects
    (:class:`mprl.backends.serial.InProcessManager`: lists, dicts, locks...). Pass a started
    ``multiprocessing.managers.SyncManager`` for the real thing (the ``mprl_state`` fixture starts
    and shuts one down with ``manager=True``). Sizes that come from the spaces and the config
    use ``env`` (default: the algorithm's default env), made through ``plugins`` (default: the
    built-ins; pass your plugin's manager for an env only it makes), and ``config`` (default:
    the algorithm's defaults). ``Weights`` and ``Module`` fields need an algorithm (its model).
    The state is unbound: a test acts as process ``slot`` through ``state.bound(slot, stop)``.
    """
    algorithm = schema if isinstance(schema, Algorithm) else None
    if algorithm is not None:
        schema = algorithm.schema
        config = algorithm.config_cls() if config is None else config
    spaces: tuple[Any, Any] = (None, None)
    wanted = env or (algorithm.default_env if algorithm is not None else None)
    if wanted is not None:
        try:
            probe = make_env(plugins or plugin_manager(), wanted)
        except UsageError:
            if env is not None:
                raise
        else:  # no env to read spaces from: only sizes that need none can be built
            spaces = (probe.observation_space, probe.action_space)
            probe.close()
    dims = Dims(workers, *spaces, config)
    model = make = None
    if algorithm is not None and spaces[0] is not None:
        make = algorithm.make_model
        model = make(dims.observation_space, dims.action_space, dims.config)
    builder = TensorStateBuilder(manager or InProcessManager(), model, make, share=True, sleep=True)  # type: ignore[arg-type]
    assert isinstance(schema, Schema)
    schema.check_dims(dims)
    return schema.build(builder, dims)


@attrs.frozen
class HookCall:
    """One recorded hook call: its name, its arguments, the plugins called, the result."""

    name: str
    kwargs: Mapping[str, Any]
    plugins: tuple[str, ...]
    result: Any = None
    error: BaseException | None = None


class HookRecorder:
    """Records every hook call made through a plugin manager (``mprl_recorder``)."""

    def __init__(self, pm: PluginManager) -> None:
        self.calls: list[HookCall] = []

        def before(hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
            pass

        def after(outcome: Any, hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
            names = tuple(pm.get_name(i.plugin) or "?" for i in impls)
            exc = outcome.exception
            result = None if exc is not None else outcome.get_result()
            self.calls.append(HookCall(hook_name, dict(kwargs), names, result, exc))

        self.close: Callable[[], None] = pm.add_hookcall_monitoring(before, after)

    def of(self, hook: str) -> list[HookCall]:
        """The calls of ``hook``, oldest first."""
        return [c for c in self.calls if c.name == hook]

    def names(self) -> list[str]:
        """The hook names in call order."""
        return [c.name for c in self.calls]


@attrs.frozen
class SerialResult:
    """What a serial run leaves for a test to look at.

    ``run_dir`` is ``None`` when the run went to a temporary directory (removed since)."""

    summary: Summary
    run_dir: Path | None
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    optimizers: Mapping[str, torch.optim.Optimizer]
    state: SharedState
    contexts: tuple[Any, ...]
    records: list[dict[str, Any]]  # every line of metrics.jsonl

    @property
    def episode_returns(self) -> list[float]:
        """Episode returns in the order the workers reported them."""
        return [r["episode_return"] for r in self.records if "episode_return" in r]


class _Capture:
    """Hands the test's own serial backend to the run, so its objects stay readable."""

    def __init__(self, backend: SerialBackend) -> None:
        self.backend = backend

    @hookimpl(tryfirst=True)
    def mprl_register_backends(self, register: Callable[..., None]) -> None:
        register("serial", lambda: self.backend, "the serial backend of mprl.testing.run_serial")


def run_serial(
    algorithm: str,
    *,
    plugins: PluginManager | Sequence[object] | None = None,
    run_dir: str | Path | None = None,
    total_steps: int = 1000,
    workers: int = 1,
    seed: int = 0,
    config: Mapping[str, Any] | Any | None = None,
    **options: Any,
) -> SerialResult:
    """Run ``algorithm`` in this process with the serial backend (see :mod:`mprl.backends.serial`).

    :param plugins: where to find it: a plugin manager (``mprl_pm``), or a list of plugin
        modules, registered with mprl's built-ins only (default: the installed plugins).
    :param run_dir: where the run directory goes; it must not exist yet or be empty (default:
        a temporary directory, removed before this returns; the records are in the result).
    :param options: any other :class:`mprl.RunConfig` field (``env=...``).
    :raises mprl.RunFailed: a worker or train function raised; its traceback is in the message.
    """
    if plugins is None:
        pm = get_plugin_manager()
    elif isinstance(plugins, PluginManager):
        pm = plugins
    else:
        pm = plugin_manager(*plugins)
    backend = SerialBackend()
    capture = _Capture(backend)
    with contextlib.ExitStack() as stack:
        where = Path(run_dir) if run_dir is not None else None
        if where is None:
            where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mprl-"))) / "run"
        pm.register(capture)
        stack.callback(pm.unregister, capture)
        summary = run(
            algorithm,
            plugins=pm,
            config=config,
            run_dir=where,
            total_steps=total_steps,
            workers=workers,
            seed=seed,
            backend="serial",
            progress="none",
            **options,
        )
        with open(where / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
    job, state = backend.job, backend.state
    assert job is not None and state is not None
    return SerialResult(
        summary,
        None if run_dir is None else Path(summary.run_dir),
        job.model,
        job.optimizer,
        dict(job.optimizers),
        state,
        tuple(backend.contexts),
        records,
    )


# --------------------------------------------------------------------------------------------
# pytest fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture
def mprl_pm() -> PluginManager:
    """A fresh plugin manager: the core's built-ins, no entry points. Register yours inline."""
    return plugin_manager()


@pytest.fixture
def mprl_recorder(mprl_pm: PluginManager) -> Iterator[HookRecorder]:
    """Records every hook call made through ``mprl_pm``."""
    recorder = HookRecorder(mprl_pm)
    yield recorder
    recorder.close()


@pytest.fixture
def mprl_serial(mprl_pm: PluginManager, tmp_path: Path) -> Callable[..., SerialResult]:
    """``mprl_serial("my-algo", total_steps=500, workers=2, config={...})``: a serial run with
    ``mprl_pm``'s plugins, its run directory under ``tmp_path``."""
    count = 0

    def run_one(algorithm: str, **kwargs: Any) -> SerialResult:
        nonlocal count
        count += 1
        kwargs.setdefault("plugins", mprl_pm)
        kwargs.setdefault("run_dir", tmp_path / f"serial-{count}")
        return run_serial(algorithm, **kwargs)

    return run_one


@pytest.fixture
def mprl_state() -> Iterator[Callable[..., SharedState]]:
    """``mprl_state(schema_or_algorithm, workers=2, manager=False)``: the built shared state;
    ``manager=True`` builds it in a real Manager server, shut down after the test."""
    with contextlib.ExitStack() as stack:

        def build(
            schema: Schema | Algorithm, workers: int = 2, *, manager: bool = False
        ) -> SharedState:
            server = None
            if manager:
                import multiprocessing as mp
                from multiprocessing.managers import SyncManager

                server = SyncManager(ctx=mp.get_context("spawn"))
                server.start()
                stack.callback(server.shutdown)
            return build_state(schema, workers, manager=server)

        yield build
