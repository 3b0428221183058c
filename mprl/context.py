"""The one object a worker or train function receives."""

from __future__ import annotations

import importlib
import math
import queue as _queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from mprl import timeline

if TYPE_CHECKING:
    from collections.abc import Mapping

    import gymnasium as gym
    import torch

    from mprl.device import Staging
    from mprl.run_types import RunConfig
    from mprl.schema import SharedState


class Channel(Protocol):
    """What a backend provides to the processes it runs: the stop flag, step counters,
    heartbeats and metric records, none of which may cost a remote call per step."""

    def should_stop(self, slot: int) -> bool: ...
    def add_steps(self, slot: int, n: int) -> None: ...
    def beat(self, slot: int, starting: bool = False) -> None: ...
    def env_steps(self) -> int: ...
    def send(self, slot: int, record: dict[str, Any]) -> None: ...
    def episode(self, slot: int, source: str, episode_return: float, episode_length: int) -> None:
        """Send the record of a finished episode (:func:`episode_record`); called thousands of
        times a second, so a channel may pack them until it sends."""

    def flush(self) -> None: ...

    # optional (a channel without it sleeps): ``idle(slot, seconds) -> bool``, where a process
    # waiting in :meth:`Context.wait_until` gives its time away (a sleep; serial: the turn to
    # the others) and beats; True once the run is stopping


#: the longest a stop-aware wait (:meth:`Context.get` ...) waits between looks at the stop flag
WAIT_STEP_S = 0.1
#: :meth:`Context.wait_until` sleeps between looks, backing off from the first to the second
IDLE_S = (0.0001, 0.001)

#: ``make_env(env_id, seed=, rank=, index=)``: an environment through the ``mprl_make_env`` hook
EnvMaker = Callable[..., "gym.Env"]


def episode_record(
    source: str, step: int, time: float, episode_return: float, episode_length: int
) -> dict[str, Any]:
    """The metrics record of a finished episode."""
    return {
        "source": source,
        "step": step,
        "time": time,
        "episode_return": _finite(episode_return),
        "episode_length": episode_length,
    }


def _finite(value: Any) -> Any:
    """``value``, or its string when a float JSON cannot hold (NaN, inf)."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def derive_seed(*parts: int) -> int:
    """A well-mixed 31-bit seed from the run seed and a process / environment index."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0] & 0x7FFFFFFF)


@attrs.define(eq=False)
class Context:
    """Given to ``worker(ctx)`` and ``train(ctx)``; everything they may use.

    Worker and train functions never touch ``multiprocessing``: they read ``ctx.state`` (the
    plugin's shared-state schema, built), update ``ctx.model`` / ``ctx.optimizer`` (shared), create
    environments with :meth:`make_env`, count steps with :meth:`add_steps`, report with
    :meth:`log_episode` / :meth:`log`, and return when :meth:`should_stop` says so.

    :ivar role: ``"worker"`` or ``"trainer"``.
    :ivar rank: the worker's rank ``0..n_workers-1``; ``-1`` for the train process.
    :ivar n_workers: how many workers the run has.
    :ivar seed: this process's seed, derived from the run seed, the rank, the session (0 for a
        new run, 1 after the first ``--resume`` ...) and the restart count, so a resumed run
        does not replay the first session's random draws (torch, numpy and ``random`` are
        already seeded with it).
    :ivar config: the algorithm's config instance.
    :ivar run: the run's :class:`mprl.RunConfig` (env id, workers, seed, step budget).
    :ivar restarts: how many times this rank was restarted before this process (0 at first).
    """

    role: str
    rank: int
    n_workers: int
    seed: int
    config: Any
    run: RunConfig
    _shared: SharedState = attrs.field(alias="state")
    _model: torch.nn.Module = attrs.field(alias="model")
    _optimizer: torch.optim.Optimizer | None = attrs.field(alias="optimizer")
    channel: Channel
    _make_env: EnvMaker = attrs.field(alias="make_env")
    restarts: int = 0
    _optimizers: dict[str, torch.optim.Optimizer] = attrs.field(alias="optimizers", factory=dict)
    _state: SharedState | None = attrs.field(default=None, init=False, repr=False)
    _optimizer_ready: bool = attrs.field(default=False, init=False, repr=False)
    _staging: Staging | None = attrs.field(default=None, init=False, repr=False)

    @property
    def device(self) -> torch.device:
        """Where this process learns, a :class:`torch.device`: the train process's ``--device``
        (``torch.device("cuda")`` for ``auto`` where there is a GPU, ``cuda:1`` as given),
        ``torch.device("cpu")`` for workers. On a GPU, :attr:`model` and the optimizers
        of the train process are copies there; move batches with :meth:`to_device`."""
        from mprl.device import resolve_device

        if self.role != "trainer":
            import torch

            return torch.device("cpu")
        return resolve_device(self.run.device)

    @property
    def model(self) -> torch.nn.Module:
        """The model: the shared one (parameters in shared memory on the local backend); in a
        train process on a GPU, its copy there, which ``weights.publishing(model)`` copies
        back into the shared one the workers act with."""
        return self._model

    def to_device(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` (``{name: tensor}``, a ``take_batch`` or ``sample``) on :attr:`device`, in
        one pinned, non-blocking copy on a GPU; on the CPU, the same tensors."""
        if self._staging is None:
            from mprl.device import Staging

            self._staging = Staging(self.device)
        return self._staging(batch)

    @property
    def state(self) -> SharedState:
        """The shared state built from the algorithm's schema, as this process uses it (its
        transport fields know this process's rank and stop when the run does)."""
        if self._state is None:
            self._state = self._shared.bound(self._slot, self.should_stop)
        return self._state

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The shared optimizer: ``make_optimizer``'s, or the only one of ``optimizers``;
        ``None`` when the algorithm declares neither. Only declared optimizers are shared,
        checkpointed and restored: one a function builds for itself is its own."""
        opt = self._optimizer
        if opt is None and len(self._optimizers) == 1:
            opt = next(iter(self._optimizers.values()))
        return self._ready(opt)

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The algorithm's named optimizers (``Algorithm(optimizers=...)``), shared."""
        for opt in self._optimizers.values():
            self._ready(opt)
        return self._optimizers

    def _ready(self, opt: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
        if opt is not None and not self._optimizer_ready and getattr(opt, "needs_dynamo", True):
            # torch.optim imports torch._dynamo on an optimizer's first use (seconds; why: see
            # benchmarks/README.md, "torch._dynamo on an optimizer's first use"): start-up, not
            # a hang, so it is done now, under the start-up grace (mprl.lib.nets.Adam skips it)
            self.channel.beat(self._slot, starting=True)
            importlib.import_module("torch._dynamo")
            self.channel.beat(self._slot)
            self._optimizer_ready = True
        return opt

    @property
    def source(self) -> str:
        return "trainer" if self.role == "trainer" else f"worker:{self.rank}"

    @property
    def _slot(self) -> int:
        return self.n_workers if self.rank < 0 else self.rank

    def should_stop(self) -> bool:
        """True once the run is stopping (solved, budget spent, Ctrl-C, a crash elsewhere).

        Cheap (a shared-memory read, no Manager round trip): call it every step. It is also
        this process's heartbeat, like :meth:`add_steps` and :meth:`log`. With an env-step
        budget (``--total-steps``) it is true as soon as the run's count (:attr:`env_steps`)
        reaches it, without waiting for the main process to say so: a worker that checks it
        before each rollout goes at most one rollout past the budget.
        """
        if self.channel.should_stop(self._slot):
            return True
        total = self.run.total_steps
        return total is not None and self.channel.env_steps() >= total

    def add_steps(self, n: int) -> None:
        """Count ``n`` environment steps taken by this process (shared memory, no round trip)."""
        self.channel.add_steps(self._slot, n)

    def heartbeat(self) -> None:
        """Tell the supervisor this process is alive.

        :meth:`should_stop`, :meth:`add_steps` and :meth:`log` do it already; call this only
        inside work that calls none of them for longer than ``--worker-timeout`` seconds.
        """
        self.channel.beat(self._slot)

    @property
    def env_steps(self) -> int:
        """Environment steps taken so far by all workers together (the run's total)."""
        return self.channel.env_steps()

    def log_episode(self, episode_return: float, episode_length: int, **values: float) -> None:
        """Report a finished episode; the main process tracks returns and checks "solved".

        Numbers only: ``episode_return`` a number (an int, a float, a numpy scalar or a 0-d
        tensor), ``episode_length`` an int; a string is refused with ``TypeError``. ``values``
        (a loss, an epsilon) are numbers too, as in :meth:`log`: a string there is written to
        ``metrics.jsonl`` as it is, but counted nowhere else (``metrics.csv``, the progress
        display, TensorBoard and ``mprl plot`` read numbers)."""
        if isinstance(episode_return, str | bytes) or isinstance(episode_length, str | bytes):
            raise TypeError(
                f"log_episode({episode_return!r}, {episode_length!r}): an episode's return and "
                "length are numbers, not strings"
            )
        if values:
            self.log(
                episode_return=float(episode_return), episode_length=int(episode_length), **values
            )
        else:  # the common case, thousands of times a second: no record built here
            self.channel.episode(
                self._slot, self.source, float(episode_return), int(episode_length)
            )

    def log(self, **values: Any) -> None:
        """Report scalar metrics (losses, entropy, ...) to ``metrics.jsonl`` and the reporters.

        Numbers (ints, floats, numpy scalars, 0-d tensors) are what ``metrics.csv``, the
        progress display, TensorBoard and ``mprl plot`` read; any other value JSON can hold (a
        string) is written to ``metrics.jsonl`` as it is, and counted nowhere else."""
        record = {"source": self.source, "step": self.channel.env_steps(), "time": time.time()}
        for key, value in values.items():
            record[key] = _finite(value.item() if hasattr(value, "item") else value)
        self.channel.send(self._slot, record)

    # -- waiting on shared state, stop-aware ---------------------------------------------------

    def _until(self, attempt: Callable[[float], Any], timeout: float | None) -> Any:
        """Call ``attempt(t)`` (which waits at most ``t`` seconds and gives ``None`` when it
        did not succeed) until it succeeds; ``None`` once the run stops or on ``timeout``.
        :meth:`should_stop` is asked between tries: it is the heartbeat, and on the serial
        backend it gives the other processes their turn."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.should_stop():
            left = (
                WAIT_STEP_S if deadline is None else min(WAIT_STEP_S, deadline - time.monotonic())
            )
            if left < 0:
                return None
            result = attempt(max(left, 0.0))
            if result is not None:
                return result
        return None

    def wait(self, event: Any, timeout: float | None = None) -> bool:
        """Wait until ``event`` (an ``Event`` or ``Condition`` field) is set / notified; ``True``
        then, ``False`` once the run stops or after ``timeout`` seconds."""
        if hasattr(event, "is_set"):
            return self._until(lambda t: True if event.wait(t) else None, timeout) is True

        def notified(t: float) -> bool | None:
            with event:
                return True if event.wait(t) else None

        return self._until(notified, timeout) is True

    def get(self, queue: Any, timeout: float | None = None) -> Any:
        """The next item of ``queue`` (a ``Queue`` field), waiting for one; ``None`` once the
        run stops or after ``timeout`` seconds (so never put ``None`` on a queue yourself)."""

        def take(t: float) -> Any:
            try:
                return queue.get(timeout=t)
            except _queue.Empty:
                return None

        return self._until(take, timeout)

    def put(self, queue: Any, item: Any, timeout: float | None = None) -> bool:
        """Put ``item`` on ``queue`` (a ``Queue`` field), waiting while it is full; ``True``
        once it is there, ``False`` once the run stops or after ``timeout`` seconds."""

        def give(t: float) -> bool | None:
            try:
                queue.put(item, timeout=t)
            except _queue.Full:
                return None
            return True

        return self._until(give, timeout) is True

    def wait_until(self, predicate: Callable[[], Any], timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` is true: ``True`` then, ``False`` once the run stops or
        after ``timeout`` seconds. For conditions on what the shared state counts (``lambda:
        state.updates.value >= n``), without a polling loop of your own.

        Between looks the process sleeps on its backend's own terms: on the local and Ray
        backends a sleep backing off from 0.1 ms to 1 ms (a waiting process takes next to no
        CPU, and sees the condition within a millisecond); on the serial backend it hands the
        turn to the other processes (every process waiting 10 s is a deadlock, reported as
        one). Each look beats the heartbeat. ``predicate`` runs in this process: on Ray, give it
        what is cached there (``Counter.value``, ``ctx.env_steps``), not a remote call."""
        idle = getattr(self.channel, "idle", None)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = IDLE_S[0]
        if self.should_stop():
            return False
        while True:
            if predicate():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if idle is not None:
                stopping = idle(self._slot, pause)
            else:  # a channel of its own (a test's): sleep, then the heartbeat's look
                time.sleep(pause)
                stopping = self.should_stop()
            if stopping:
                return False
            pause = min(pause * 2, IDLE_S[1])

    def wait_steps(self, n: int, timeout: float | None = None) -> bool:
        """Wait until the run has taken ``n`` env steps (:attr:`env_steps`): :meth:`wait_until`
        of ``ctx.env_steps >= n``. On Ray the train process sees the workers' steps four
        times a second (the driver's poll): it waits up to a quarter second longer there."""
        return self.wait_until(lambda: self.env_steps >= n, timeout)

    def env_seed(self, index: int = 0) -> int:
        """The seed environment ``index`` of this process is reset with first."""
        return derive_seed(self.seed, index)

    def make_env(self, index: int = 0) -> gym.Env:
        """Create environment ``index`` of this process through the ``mprl_make_env`` hook.

        The environment is already seeded: its first ``reset()`` without a seed is deterministic
        for the run seed, rank and index.
        """
        seed = self.env_seed(index)
        env = self._make_env(self.run.env, seed=seed, rank=self.rank, index=index)
        env.reset(seed=seed)
        env.action_space.seed(seed)
        timeline.on_first_call(env, "step", "env-step", source=self.source, index=index)
        return env

    def __getstate__(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in attrs.fields(type(self))}
        state["_state"] = None  # bound again in the process that unpickles it
        state["_staging"] = None  # made again there, on its device
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)


def objects_of(
    ctx: Context,
) -> tuple[torch.nn.Module, torch.optim.Optimizer | None, dict[str, torch.optim.Optimizer]]:
    """The model, ``make_optimizer``'s optimizer and the named optimizers ``ctx`` was given, as
    given (no first-use work): for the child runtime, which moves them to a device, and for a
    backend that reads what a child trains. Replace them with ``attrs.evolve(ctx, model=...,
    optimizer=..., optimizers=...)``."""
    return ctx._model, ctx._optimizer, dict(ctx._optimizers)


def shared_of(ctx: Context) -> SharedState:
    """The shared state ``ctx`` was given, unbound (``ctx.state`` is it bound to the process):
    for a backend that attaches what every process of its own needs to its fields."""
    return ctx._shared
