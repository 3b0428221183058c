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
- ``mprl_bench``: a :class:`Bench` with ``mprl_pm``'s plugins: one worker or the train process
  at a time, called by the test itself (``worker(bench.context(0, steps=100))``).

The functions work without pytest too: :func:`plugin_manager`, :func:`registered`,
:func:`call_hook`, :func:`build_state`, :func:`run_serial`, :class:`Bench`.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import torch

from mprl import kinds
from mprl.algorithm import Algorithm
from mprl.backends.base import Job, Role
from mprl.backends.child import _on_device, own_objects, seed_process
from mprl.backends.inprocess import InProcessManager
from mprl.backends.serial import SerialBackend
from mprl.context import Context, episode_record
from mprl.errors import PluginError, UsageError
from mprl.hookspecs import hookimpl
from mprl.host.config import build
from mprl.host.envs import make_env
from mprl.host.job import prepare_job
from mprl.host.plugins import PluginManager, get_plugin_manager
from mprl.host.runner import run
from mprl.run_types import RunConfig, Summary
from mprl.schema import Dims, Schema, SharedState
from mprl.testing.backend import BackendConformance
from mprl.testing.transport import (
    HubInProcess,
    InProcess,
    Placement,
    SharedMemory,
    TransportContract,
)
from mprl.transport.memory import MemoryBuilder, MemoryReplay, _Bound

__all__ = [
    "BENCH_TIMEOUT_S",
    "BackendConformance",
    "Bench",
    "HookCall",
    "HookRecorder",
    "HubInProcess",
    "InProcess",
    "Placement",
    "SerialResult",
    "SharedMemory",
    "TransportContract",
    "build_state",
    "call_hook",
    "mprl_bench",
    "mprl_pm",
    "mprl_recorder",
    "mprl_serial",
    "mprl_state",
    "plugin_manager",
    "registered",
    "run_serial",
]


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
    (:class:`mprl.backends.inprocess.InProcessManager`: lists, dicts, locks...). Pass a started
    ``multiprocessing.managers.SyncManager`` for the real thing (the ``mprl_state`` fixture starts
    and shuts one down with ``manager=True``). Sizes that come from the spaces and the config
    use ``env`` (default: the algorithm's default env), made through ``plugins`` (default: the
    built-ins; pass your plugin's manager for an env only it makes), and ``config``: the
    algorithm's config instance, or a mapping of its fields, checked as ``--set`` values are
    (default: the algorithm's defaults; for a bare schema, a mapping's keys are what
    ``"config.FIELD"`` sizes read). ``Weights`` and ``Module`` fields need an algorithm (its
    model).

    The state is unbound: a test acts as one process through ``state.bound(slot)``, its
    transport fields bound to that process: a worker's ``slot`` is its rank, the train
    process's is ``state.trainer_slot`` (the number of workers). To call a worker or train
    function itself, use a :class:`Bench`.
    """
    algorithm = schema if isinstance(schema, Algorithm) else None
    if algorithm is not None:
        schema = algorithm.schema
        if config is None or isinstance(config, Mapping):
            source = f"{algorithm.name} config"
            config = build(algorithm.config_cls, dict(config or {}), source=source)
    elif isinstance(config, Mapping):
        config = SimpleNamespace(**config)
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
    builder = MemoryBuilder(manager or InProcessManager(), model, make, share=True, sleep=True)  # type: ignore[arg-type]
    assert isinstance(schema, Schema)
    kinds.check_dims(schema, dims)
    return kinds.build(schema, builder, dims)


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


#: what :func:`run_serial` gives a new run where the test gives nothing
_NEW_RUN = {"total_steps": 1000, "workers": 1, "seed": 0}


def run_serial(
    algorithm: str,
    *,
    plugins: PluginManager | Sequence[object] | None = None,
    run_dir: str | Path | None = None,
    total_steps: int | None = None,
    workers: int | None = None,
    seed: int | None = None,
    config: Mapping[str, Any] | Any | None = None,
    resume: str | Path | None = None,
    **options: Any,
) -> SerialResult:
    """Run ``algorithm`` in this process with the serial backend (see :mod:`mprl.backends.serial`).

    :param plugins: where to find it: a plugin manager (``mprl_pm``), or a list of plugin
        modules, registered with mprl's built-ins only (default: the installed plugins).
    :param run_dir: where the run directory goes; it must not exist yet or be empty (default:
        a temporary directory, removed before this returns; the records are in the result).
    :param total_steps: the env-step budget (default 1000; resuming: the checkpoint's).
    :param workers: how many workers (default 1; resuming: the checkpoint's).
    :param seed: the run seed (default 0; resuming: the checkpoint's).
    :param resume: a run directory (or checkpoint file) to continue, as ``mprl.run(resume=)``:
        its algorithm, config and run options unless given here, into ``run_dir`` when given,
        else into its own directory (``--resume`` in place).
    :param options: any other :class:`mprl.RunConfig` field (``env=...``), or
        ``resume_drop=``.
    :raises mprl.RunFailed: a worker or train function raised; its traceback is in the message.
    """
    if plugins is None:
        pm = get_plugin_manager()
    else:
        pm = plugins if isinstance(plugins, PluginManager) else plugin_manager(*plugins)
    given = {"total_steps": total_steps, "workers": workers, "seed": seed}
    if resume is None:  # a new run's defaults; a resumed run keeps the checkpoint's
        given = {k: v if v is not None else _NEW_RUN[k] for k, v in given.items()}
    backend = SerialBackend()
    capture = _Capture(backend)
    with contextlib.ExitStack() as stack:
        where = Path(run_dir) if run_dir is not None else None
        if where is None and resume is None:
            where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mprl-"))) / "run"
        pm.register(capture)
        stack.callback(pm.unregister, capture)
        summary = run(
            algorithm, plugins=pm, config=config, run_dir=where, resume=resume, **given,
            backend="serial", progress="none", **options,
        )  # fmt: skip
        with open(Path(summary.run_dir) / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
    job, state = backend.job, backend.state
    assert job is not None and state is not None
    kept = where is None or run_dir is not None  # not the temporary directory
    return SerialResult(
        summary, Path(summary.run_dir) if kept else None, job.model, job.optimizer,
        dict(job.optimizers), state, tuple(backend.contexts), records,
    )  # fmt: skip


#: how long a :class:`Bench` context runs (from when it is made) before its next call to
#: ``should_stop()``, ``add_steps()`` or a wait raises ``TimeoutError``: a function whose stop
#: never comes fails the test instead of hanging it
BENCH_TIMEOUT_S = 60.0


class _Stop:
    """When one bench context's ``should_stop()`` turns true, for good."""

    def __init__(
        self,
        who: str,
        steps: int | None,
        stop_after: int | None,
        stop_when: Callable[[Context], Any] | None,
        timeout: float | None,
    ) -> None:
        for name, value in (("steps", steps), ("stop_after", stop_after)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name}={value!r}: an int or None")
        self.who, self.steps, self.stop_after, self.stop_when = who, steps, stop_after, stop_when
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.ctx: Context | None = None
        self.taken = 0  # env steps this context counted
        self.checks = 0  # stop checks answered so far
        self.stopped = False

    def guard(self) -> None:
        """Raise ``TimeoutError`` once the context has run past its timeout, still not stopped."""
        if self.stopped or self.deadline is None or time.monotonic() < self.deadline:
            return
        waiting = _waiting_in(self.ctx)
        if waiting is not None:
            raise TimeoutError(
                f"mprl.testing.Bench: {self.who} has not stopped after {self.timeout:g} s: it "
                f"waits in {waiting}"
            )
        raise TimeoutError(
            f"mprl.testing.Bench: {self.who} has not stopped after {self.timeout:g} s; give its "
            "context steps=, stop_after= or stop_when= that its function reaches (or a longer "
            "timeout=)"
        )

    def check(self, everyone: bool) -> bool:
        self.guard()
        if not self.stopped:
            self.stopped = (
                everyone
                or (self.steps is not None and self.taken >= self.steps)
                or (self.stop_after is not None and self.checks >= self.stop_after)
                or (self.stop_when is not None and bool(self.stop_when(self.ctx)))
            )
        self.checks += 1
        return self.stopped


def _waiting_in(ctx: Context | None) -> str | None:
    """The transport wait the calling context is in (``replay.add``, ``rollouts.acquire`` ...)
    and what it waits for, read off the stack; ``None`` when it is in none."""
    frame = sys._getframe(2)
    while frame is not None and not (
        frame.f_code.co_name == "_wait" and isinstance(frame.f_locals.get("self"), _Bound)
    ):
        frame = frame.f_back
    if frame is None or frame.f_back is None:
        return None
    store, call = frame.f_locals["self"], frame.f_back.f_code.co_name
    names = [] if ctx is None else [k for k, v in vars(ctx.state).items() if v is store]
    where = f"{names[0] if names else type(store).__name__}.{call}"
    pace = getattr(store, "pace", None)
    if isinstance(store, MemoryReplay) and pace is not None and call in ("add", "sample"):
        added, sampled, _ = store.counts()
        if call == "sample":
            return (
                f"{where} for rows: at the declared replay ratio ({pace.ratio:g} rows sampled "
                f"per row added, from learning_starts={pace.starts:,} rows on) the rows added "
                f"({added:,}; {sampled:,} sampled) do not allow its batch; call a worker first "
                "(worker(bench.context(0, steps=N)))"
            )
        assert pace.lead is not None  # (a worker waits only with a max_lead)
        want = int(store.counts()[2])
        limit = pace.starts + pace.lead + math.ceil((sampled + want) / pace.ratio)
        return (
            f"{where} for the learner: at a declared replay ratio the workers run max_lead rows "
            "ahead of the learner, so a worker waits once the rows added reach learning_starts "
            "+ max_lead + (rows sampled + the learner's batch) / replay_ratio (here "
            f"{pace.starts:,} + {pace.lead:,} + ({sampled:,} + {want:,}) / {pace.ratio:g} = "
            f"{limit:,}; {added:,} added), and on a bench no learner runs unless the test "
            f"calls it: give the worker's context steps={limit:,} or fewer, sample in between "
            "(bench.state.bound('trainer').replay.sample(n)) or call the train function, or "
            "declare the buffer with max_lead=None"
        )
    return (
        f"{where}, for what another process does: on a bench one runs only when the test "
        "calls it; call it first, or give this context a stop that comes before the wait "
        "(steps=, stop_after=, stop_when=)"
    )


class _BenchChannel:
    """The :class:`mprl.context.Channel` of a :class:`Bench`: counters and records in this
    process, each context's stop rule."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.stops: dict[int, _Stop] = {}
        self.current: _Stop | None = None  # the context that called last (for Manager waits)

    def _stop(self, slot: int) -> _Stop:
        self.current = self.stops[slot]
        return self.current

    def should_stop(self, slot: int) -> bool:
        return self._stop(slot).check(self.bench.stopping)

    def idle(self, slot: int, seconds: float) -> bool:
        """A wait's pause (``ctx.wait_until``): nothing else runs here, so only a stop check."""
        return self.should_stop(slot)

    def add_steps(self, slot: int, n: int) -> None:
        stop = self._stop(slot)
        stop.guard()
        stop.taken += n
        self.bench._steps[slot] += n

    def beat(self, slot: int, starting: bool = False) -> None:
        self._stop(slot).guard()

    def env_steps(self) -> int:
        return sum(self.bench._steps)

    def send(self, slot: int, record: dict[str, Any]) -> None:
        self._stop(slot).guard()
        self.bench.records.append(record)

    def episode(self, slot: int, source: str, episode_return: float, episode_length: int) -> None:
        step = self.env_steps()
        self.send(slot, episode_record(source, step, time.time(), episode_return, episode_length))

    def flush(self) -> None:
        pass

    def pause(self) -> None:
        """Where a Manager kind waits (a lock, a queue): a short sleep, and the timeout."""
        time.sleep(0.0005)
        if self.current is not None:
            self.current.guard()


class _Registers:
    """A plugin that registers one algorithm: a :class:`Bench` of an unregistered one."""

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = algorithm

    @hookimpl
    def mprl_register_algorithms(self, register: Callable[[Algorithm], None]) -> None:
        register(self.algorithm)


class Bench:
    """An algorithm's job built as a run builds it, for calling its worker and train functions
    one at a time in the test's own process, as plain functions.

    The config is checked, the env made once for its spaces, the model built with torch seeded
    from ``seed``, the declared optimizers made and the schema's shared state built, as the
    serial backend builds them (in this process, nothing started). Then :meth:`context` gives
    the :class:`mprl.Context` of one process, a worker of rank N or the train process, over that
    state, with a stop of the test's choosing so that the function returns::

        bench = Bench(my_algo.ALGORITHM, workers=2, config={"buffer_size": 1000})
        my_algo.worker(bench.context(0, steps=200))  # returns after 200 env steps
        assert bench.state.replay.size() == 200 and bench.env_steps == 200
        my_algo.train(bench.context("trainer", stop_after=50))  # 50 stop checks
        assert bench.state.updates.value > 0

    Every context of a bench shares its state, model (each context has its own objects over the
    same memory, as a process has), step count and records. Making a context seeds ``random``,
    numpy and torch with its seed, as a process starts: make it right before calling the
    function. Functions run in the calling thread, one at a time; to run them together, use
    :func:`run_serial`. So a wait for another process lasts until the context's stop or its
    timeout, whose ``TimeoutError`` names the wait: a worker adding to a replay buffer at a
    declared ratio waits after ``learning_starts + max_lead`` rows when no learner samples.

    :param algorithm: an :class:`mprl.Algorithm`, or the name of one ``plugins`` registers.
    :param plugins: a plugin manager (``mprl_pm``) or a list of plugin modules, for the
        algorithm's name and the env (default: the installed plugins for a name, mprl's
        built-ins for an :class:`~mprl.Algorithm`).
    :param config: the config instance, or a mapping of its fields (checked as ``--set``).
    :param run_options: any other :class:`mprl.RunConfig` field (``env_batch=...``).
    :raises mprl.errors.UsageError: what a run would refuse before it starts (a bad config
        value, an env of the wrong kind).
    """

    def __init__(
        self,
        algorithm: Algorithm | str,
        *,
        workers: int = 2,
        config: Mapping[str, Any] | Any | None = None,
        env: str | None = None,
        seed: int = 0,
        plugins: PluginManager | Sequence[object] | None = None,
        **run_options: Any,
    ) -> None:
        if isinstance(plugins, PluginManager):
            pm = plugins
        elif plugins is not None:
            pm = plugin_manager(*plugins)
        else:
            pm = get_plugin_manager() if isinstance(algorithm, str) else plugin_manager()
        name, extra = _registered_as(pm, algorithm)
        options = {"env": env, "workers": workers, "seed": seed, **run_options}
        try:
            job = prepare_job(pm, name, config, options).job
        finally:
            if extra is not None:
                pm.unregister(extra)
        self._job: Job = job
        self._steps = [0] * (job.run.workers + 2)  # per slot, as a run counts them
        self._channel = _BenchChannel(self)
        builder = MemoryBuilder(
            InProcessManager(self._channel.pause), job.model, job.algorithm.make_model,
            share=False, sleep=False,
        )  # fmt: skip
        #: the shared state, unbound (``state.bound(slot)``); a context's ``ctx.state`` is it,
        #: bound to that process
        self.state: SharedState = job.build_state(builder)[0]
        #: every record the contexts logged (``ctx.log``, ``ctx.log_episode``), oldest first
        self.records: list[dict[str, Any]] = []
        #: whether :meth:`stop` was called: every context's ``should_stop()`` is true then
        self.stopping = False

    @property
    def algorithm(self) -> Algorithm:
        return self._job.algorithm

    @property
    def config(self) -> Any:
        """The algorithm's config instance."""
        return self._job.config

    @property
    def run(self) -> RunConfig:
        """The run options (``ctx.run``): env, workers, seed ..."""
        return self._job.run

    @property
    def model(self) -> torch.nn.Module:
        """The shared model: what the contexts' models write to."""
        return self._job.model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self._job.optimizer

    @property
    def optimizers(self) -> Mapping[str, torch.optim.Optimizer]:
        return dict(self._job.optimizers)

    @property
    def env_steps(self) -> int:
        """Env steps the contexts counted (``ctx.add_steps``), all together: ``ctx.env_steps``."""
        return sum(self._steps)

    @property
    def episode_returns(self) -> list[float]:
        """Returns of the episodes the contexts logged, oldest first."""
        return [r["episode_return"] for r in self.records if "episode_return" in r]

    def context(
        self,
        rank: int | str = 0,
        *,
        steps: int | None = None,
        stop_after: int | None = None,
        stop_when: Callable[[Context], Any] | None = None,
        timeout: float | None = BENCH_TIMEOUT_S,
    ) -> Context:
        """The :class:`mprl.Context` of one process: worker ``rank`` (``0 .. workers - 1``) or
        the train process (``"trainer"`` or ``-1``), over this bench's state.

        Its ``should_stop()`` turns true (and stays true) at the first of: ``steps`` env steps
        counted by this context (``ctx.add_steps``); ``stop_after`` stop checks answered
        false (every ``should_stop()``, and every look of a stop-aware wait); ``stop_when(ctx)``
        true; :meth:`stop`. With none of them it never does, and once ``timeout`` seconds
        have passed (``None``: never) its next stop check, step count, log or wait raises
        ``TimeoutError``. For the train process, which counts no steps, give ``stop_after``
        or ``stop_when`` (``lambda ctx: ctx.state.updates.value >= 10``).
        """
        role = self._role(rank)
        stop = _Stop(role.who, steps, stop_after, stop_when, timeout)
        ctx = self._job.context(role, self.state, self._channel)
        model, optimizer, optimizers = own_objects(
            self._job.model, self._job.optimizer, self._job.optimizers
        )
        ctx = attrs.evolve(ctx, model=model, optimizer=optimizer, optimizers=optimizers)
        seed_process(ctx.seed)
        ctx = _on_device(ctx)[0]  # a train process on a GPU (--device): copies there
        stop.ctx = ctx
        self._channel.stops[role.slot] = stop
        return ctx

    def stop(self) -> None:
        """Stop every context, as a run stops: their ``should_stop()`` is true from now on."""
        self.stopping = True

    def _role(self, rank: int | str) -> Role:
        n = self._job.run.workers
        if rank in ("trainer", -1):
            if self._job.algorithm.train is None:
                raise ValueError(
                    f"algorithm {self._job.algorithm.name!r} has no train function, so no "
                    "train process"
                )
            return Role("trainer", -1, n)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
            raise ValueError(
                f"rank {rank!r}: a worker's rank is 0 .. {n - 1}, the train process is "
                "'trainer' (or -1)"
            )
        return Role("worker", rank, rank)


def _registered_as(pm: PluginManager, algorithm: Algorithm | str) -> tuple[str, object | None]:
    """The name ``pm`` knows ``algorithm`` by, and the plugin registered for it (to unregister
    after), when it had to be registered."""
    if isinstance(algorithm, str):
        return algorithm, None
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"{algorithm!r}: an mprl.Algorithm or the name of one")
    known = pm.algorithms().get(algorithm.name)
    if known is not None and known[1] == algorithm:
        return algorithm.name, None
    if known is not None or algorithm.name in pm.conflicts:
        raise ValueError(
            f"algorithm {algorithm.name!r}: the plugin manager registers another algorithm of "
            "that name; pass the name, or a plugin manager without it"
        )
    extra = _Registers(algorithm)
    pm.register(extra, name=f"mprl.testing:{algorithm.name}")
    return algorithm.name, extra


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
    """``mprl_state(schema_or_algorithm, workers=2, manager=False, env=None, config=None,
    plugins=None)``: the built shared state (:func:`build_state`); ``manager=True`` builds it
    in a real Manager server, shut down after the test."""
    with contextlib.ExitStack() as stack:

        def build(
            schema: Schema | Algorithm,
            workers: int = 2,
            *,
            manager: bool = False,
            env: str | None = None,
            config: Any = None,
            plugins: PluginManager | None = None,
        ) -> SharedState:
            server = None
            if manager:
                import multiprocessing as mp
                from multiprocessing.managers import SyncManager

                server = SyncManager(ctx=mp.get_context("spawn"))
                server.start()
                stack.callback(server.shutdown)
            return build_state(
                schema, workers, manager=server, env=env, config=config, plugins=plugins
            )

        yield build


@pytest.fixture
def mprl_bench(mprl_pm: PluginManager) -> Callable[..., Bench]:
    """``mprl_bench(algorithm, workers=2, config=None, env=None, seed=0, **run_options)``: a
    :class:`Bench` with ``mprl_pm``'s plugins (an algorithm given by name must be registered
    there; an :class:`mprl.Algorithm` needs nothing)."""

    def make(algorithm: Algorithm | str, **kwargs: Any) -> Bench:
        kwargs.setdefault("plugins", mprl_pm)
        return Bench(algorithm, **kwargs)

    return make
