"""The child runtime: how a plugin's worker or train function runs, on every backend.

:func:`run_child` is the one place a child's life is written: torch threads, seeding, the GPU
learner (the train process's model and optimizers copied to its ``--device``, their state
copied back for checkpoints), the first heartbeat, the function, and its crash report. A
backend only says where that runs (a spawned process, a Ray actor, a thread taking turns) and
what happens to the result.
"""

from __future__ import annotations

import copy
import cProfile
import marshal
import random
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
import torch

from mprl import timeline
from mprl.context import Channel, Context, episode_record, objects_of
from mprl.device import resolve_device
from mprl.errors import UsageError
from mprl.files import open_new

#: how often a learner on a GPU copies its optimizer state back to the shared (checkpointed) one
OPTIMIZER_SYNC_S = 2.0


@attrs.frozen
class ChildExit:
    """How a plugin's function ended: ``code`` 0 when it returned, else the exit code it asked
    for (``SystemExit``) or 1 with the ``traceback`` of what it raised."""

    code: int
    traceback: str = ""


@attrs.frozen
class Trained:
    """The model and optimizers a child's function trains: the shared ones, or their copies on
    the train process's device. ``optimizer`` is ``make_optimizer``'s, ``optimizers`` the
    named ones."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    optimizers: Mapping[str, torch.optim.Optimizer]


def seed_process(seed: int) -> None:
    """Seed ``random``, numpy and torch of the process (or serial turn) about to run."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_child(
    fn: Callable[[Context], None],
    ctx: Context,
    *,
    threads: int = 0,
    stopped: tuple[type[BaseException], ...] = (),
    on_ready: Callable[[Context, Trained], None] | None = None,
    profile_to: str | None = None,
) -> ChildExit:
    """Run ``fn(ctx)`` as a child of a run and report how it ended; never raises.

    :param threads: torch's intra-op threads (0: leave as is).
    :param stopped: exceptions that mean the run stopped while the function waited (serial).
    :param on_ready: called with the context ``fn`` gets and what it trains, before ``fn``.
    :param profile_to: run ``fn`` under cProfile and write its stats there.
    """
    try:
        if threads:
            torch.set_num_threads(threads)
        seed_process(ctx.seed)
        ctx, trained, learner = _on_device(ctx)
        if on_ready is not None:
            on_ready(ctx, trained)
        _mark_first_update(ctx.source, trained)
        ctx.heartbeat()
        timeline.mark("child-ready", source=ctx.source)
        if profile_to is None:
            fn(ctx)
        else:
            profile = cProfile.Profile()
            try:
                profile.runcall(fn, ctx)
            finally:  # as dump_stats() writes them, but never through a link planted there
                profile.create_stats()
                with open(profile_to, "wb", opener=open_new) as out:
                    marshal.dump(profile.stats, out)  # type: ignore[attr-defined]
        if learner is not None:
            learner.sync()  # its optimizer state, for the final checkpoint
    except stopped:
        pass  # it was waiting when the run stopped: what SIGTERM is to a spawned process
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        return ChildExit(code, traceback.format_exc() if code else "")
    except BaseException:  # every way a function can fail is reported
        return ChildExit(1, traceback.format_exc())
    return ChildExit(0)


def _mark_first_update(source: str, trained: Trained) -> None:
    """With a timeline (:mod:`mprl.timeline`), mark this process's first optimizer step."""
    optimizers = [trained.optimizer, *trained.optimizers.values()]
    if not timeline.enabled() or not any(optimizers):
        return
    handles: list[Any] = []

    def once(*_: Any) -> None:
        timeline.mark("update", source=source)
        for handle in handles:
            handle.remove()

    handles += [opt.register_step_post_hook(once) for opt in optimizers if opt is not None]


def _on_device(ctx: Context) -> tuple[Context, Trained, DeviceLearner | None]:
    """The context ``fn`` gets: for a train process whose ``--device`` is not the CPU, with
    its model and optimizers copied there and a channel that copies the optimizer state back."""
    model, optimizer, optimizers = objects_of(ctx)
    device = resolve_device(ctx.run.device)
    if ctx.role != "trainer" or device.type == "cpu":
        return ctx, Trained(model, optimizer, optimizers), None
    shared = dict(optimizers)
    if optimizer is not None:
        shared[""] = optimizer
    learner = DeviceLearner(model, shared, device)
    named = {k: v for k, v in learner.optimizers.items() if k}
    trained = Trained(learner.model, learner.optimizers.get(""), named)
    ctx = attrs.evolve(
        ctx,
        model=trained.model,
        optimizer=trained.optimizer,
        optimizers=named,
        channel=_Syncing(ctx.channel, learner),
    )
    return ctx, trained, learner


class _Syncing:
    """A channel that lets a GPU learner copy its optimizer state back every
    :data:`OPTIMIZER_SYNC_S` seconds, at the stop checks the train function makes anyway."""

    def __init__(self, channel: Channel, learner: DeviceLearner) -> None:
        self._channel, self._learner = channel, learner

    def should_stop(self, slot: int) -> bool:
        self._learner.maybe_sync()
        return self._channel.should_stop(slot)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def _on(
    shared: torch.optim.Optimizer, params: Mapping[torch.nn.Parameter, torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """A copy of ``shared`` over the parameters ``params`` maps its own to, state included."""
    groups = [
        {**group, "params": [params[p] for p in group["params"]]} for group in shared.param_groups
    ]
    try:
        copied = type(shared)(groups, **shared.defaults)
    except TypeError as exc:
        raise UsageError(
            f"--device: the optimizer {type(shared).__name__} cannot be rebuilt on the device "
            f"from its defaults ({exc}); use --device cpu"
        ) from None
    copied.load_state_dict(shared.state_dict())  # the state moves to the parameters' device
    return copied


class DeviceLearner:
    """Copies of the shared model and optimizers on ``device``, for the train process: the
    workers keep acting on the shared CPU model, which ``weights.publishing(model)`` updates at
    the end of each update, and :meth:`sync` copies the optimizer state back.

    :param model: the shared model.
    :param optimizers: the shared optimizers (over the shared model's parameters).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Mapping[str, torch.optim.Optimizer],
        device: torch.device,
    ) -> None:
        self.device = device
        self.shared_model = model
        self.model = copy.deepcopy(model).to(device)
        params = dict(zip(model.parameters(), self.model.parameters(), strict=True))
        self.shared = dict(optimizers)
        self.optimizers = {name: _on(opt, params) for name, opt in self.shared.items()}
        self._synced = time.monotonic()

    def maybe_sync(self) -> None:
        """:meth:`sync` if it has not run for :data:`OPTIMIZER_SYNC_S` seconds."""
        if time.monotonic() - self._synced >= OPTIMIZER_SYNC_S:
            self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the optimizers' state (moments, step counts, learning rates) back to the shared
        ones, which the main process checkpoints."""
        for name, opt in self.optimizers.items():
            shared = self.shared[name]
            for mine, theirs in zip(opt.param_groups, shared.param_groups, strict=True):
                for key, value in mine.items():
                    if key != "params":
                        theirs[key] = value
                for p, q in zip(mine["params"], theirs["params"], strict=True):
                    src, dst = opt.state.get(p, {}), shared.state.setdefault(q, {})
                    for key, value in src.items():
                        if isinstance(value, torch.Tensor) and isinstance(
                            dst.get(key), torch.Tensor
                        ):
                            dst[key].copy_(value)
                        else:
                            dst[key] = value
        self._synced = time.monotonic()


class ChildChannel:
    """A :class:`mprl.context.Channel` of plain attributes, one per child, for a backend whose
    child runs in the main process's memory or reports through calls (a thread, a Ray actor):
    the backend reads :attr:`steps`, :attr:`last_beat` and :meth:`take` and sets
    :attr:`stopping` and the others' steps (:meth:`counted`: ``env_steps()`` counts from
    them).

    A driver that counts by polls and has an env-step budget (``--total-steps``) grants each
    worker the steps it may take (:meth:`counted`'s ``limit``, in the child's own steps); a
    worker at its grant waits for the next one (or the stop) in :meth:`add_steps`, so that the
    workers together go past the budget by at most one rollout each.
    """

    def __init__(self) -> None:
        self.stopping = False
        self.steps = 0
        self.total = 0  # the run's env steps at the driver's last poll
        self.steps_at_total = 0  # this actor's steps then
        self.limit: int | None = None  # the steps it may reach (None: no bound)
        self.last_beat = 0.0  # time.monotonic(); negative while in start-up work
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def beat(self, slot: int, starting: bool = False) -> None:
        now = time.monotonic()
        self.last_beat = -now if starting else now

    def should_stop(self, slot: int) -> bool:
        self.beat(slot)
        return self.stopping

    def idle(self, slot: int, seconds: float) -> bool:
        time.sleep(seconds)
        return self.should_stop(slot)

    def add_steps(self, slot: int, n: int) -> None:
        """Count ``n`` steps; at the driver's grant, wait for the next grant or the stop (no
        time bound: the driver grants every tick while the run lives, and a bound would be an
        overshoot whenever the driver is slower than it, as on a loaded machine)."""
        self.steps += n
        self.beat(slot)
        while self.limit is not None and self.steps >= self.limit and not self.stopping:
            time.sleep(0.005)
            self.beat(slot)

    def counted(self, others: int, limit: int | None = None) -> None:
        """The env steps of the run's other processes as the driver last counted them, and
        (a budgeted worker) the steps this child may reach before it waits again."""
        self.total, self.steps_at_total = others + self.steps, self.steps
        if limit is not None:
            self.limit = limit

    def env_steps(self) -> int:
        return self.total + self.steps - self.steps_at_total

    def send(self, slot: int, record: dict[str, Any]) -> None:
        with self._lock:
            self.records.append(record)
        self.beat(slot)

    def episode(self, slot: int, source: str, episode_return: float, episode_length: int) -> None:
        now, steps = time.time(), self.env_steps()
        self.send(slot, episode_record(source, steps, now, episode_return, episode_length))

    def flush(self) -> None:
        pass  # the driver's poll takes the records

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self.records = self.records, []
        return out


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor object over ``t``'s memory: writes show in both, autograd versions do not."""
    alias = torch.empty(0, dtype=t.dtype).set_(
        t.untyped_storage(), t.storage_offset(), t.size(), t.stride()
    )
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(alias, requires_grad=t.requires_grad)
    return alias


def own_objects(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    optimizers: Mapping[str, torch.optim.Optimizer],
) -> tuple[Any, Any, Any]:
    """What unpickling gives a spawned process, for a child in the main process's memory (a
    thread): its own model and optimizers whose tensors are new tensor objects over the same
    memory.

    So, as across processes, one process's ``optimizer.step()`` changes the values another one
    computes with but not the autograd version of its tensors (its ``backward()`` does not fail
    with "modified by an inplace operation"), and each process has its own ``.grad``.
    """
    tensors = [*model.parameters(), *model.buffers()]
    for one in [*([optimizer] if optimizer is not None else []), *optimizers.values()]:
        for state in one.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    memo: dict[int, Any] = {id(t): _alias(t) for t in tensors}
    return copy.deepcopy((model, optimizer, dict(optimizers)), memo)
