"""What runs inside a Ray actor: one worker or the train process of a run.

The plugin's function runs in the actor's :meth:`ChildActor.run`; the driver calls
:meth:`ChildActor.poll` (another thread of the same actor) about every tick. A poll brings the
stop flag and the env steps of the run's other processes in, and takes the step count, the
heartbeat's age and the pending metric records out: the function itself never makes a remote
call to report.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import ray
import torch

from mprl.backends.child import ChildChannel, Trained, run_child
from mprl.context import Context, shared_of
from mprl.timeline import mark
from mprl.transport.client import ANSWER_TIMEOUT_S, Direct, Endpoint, connect
from mprl.transport.hub import Hub

#: the longest a read of the train process's state waits for its update in progress to end
UPDATE_WAIT_S = 2.0
#: seconds between two looks of an actor at the raylet that started it
RAYLET_WATCH_S = 0.5


class ChildActor:
    """One process of a run on a Ray node (made a Ray actor by the backend)."""

    def __init__(self, authkey: bytes) -> None:
        # the Manager's proxies in the context read the run's key from here when unpickled
        mp.current_process().authkey = authkey
        if ray.get_runtime_context().get_actor_id() is not None:  # a Ray actor's process
            raylet = os.getppid()
            _killed_with_raylet(raylet)
            watch = threading.Thread(
                target=_end_with_raylet, args=(raylet,), name="mprl-raylet-watch", daemon=True
            )
            watch.start()
        self.channel = ChildChannel()
        self.ctx: Context | None = None
        self.trained: Trained | None = None  # what the function trains (on its device)
        self.hub = Hub()  # used when this actor hosts the run's transport
        self.endpoint: Endpoint | None = None  # this process's end of the run's hub

    def hub_call(self, method: str, *args: Any) -> Any:
        """A call to the run's transport hub (:class:`mprl.transport.hub.Hub`)."""
        return getattr(self.hub, method)(*args)

    def where(self) -> dict[str, Any]:
        """The node this actor runs on."""
        runtime = ray.get_runtime_context()
        return {"node_id": runtime.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}  # fmt: skip

    def run(
        self, fn: Callable[[Context], None], ctx: Context, threads: int, hub_host: Any = None
    ) -> dict[str, Any]:
        """Run the plugin's function; ``{"code": 0}``, or ``{"code": 1, "traceback": ...}``.
        ``hub_host``: the actor that hosts the run's hub, ``None`` when this one does."""
        from mprl_builtin.ray.link import RayLink

        if hub_host is None:
            self.endpoint = Endpoint(Direct(self.hub), self.hub)
        else:
            self.endpoint = Endpoint(RayLink(hub_host))
        endpoint = self.endpoint
        connect(shared_of(ctx), endpoint)

        def fn_then_flush(ctx: Context) -> None:
            fn(ctx)
            endpoint.flush()  # its last counter adds and replay rows

        mark("child-main", source=ctx.source)
        if ctx.run.total_steps is not None and ctx.role == "worker" and self.channel.limit is None:
            self.channel.limit = 0  # a budgeted worker: its steps wait for the driver's grant
        ctx = attrs.evolve(ctx, channel=self.channel)
        ended = run_child(fn_then_flush, ctx, threads=threads, on_ready=self._ready)
        return {"code": ended.code, "traceback": ended.traceback}

    def _ready(self, ctx: Context, trained: Trained) -> None:
        self.ctx, self.trained = ctx, trained

    def stop(self) -> None:
        """The stop flag, at once (the driver's poll carries it too)."""
        self.channel.stopping = True

    def poll(
        self,
        stop: bool,
        others: int,
        limit: int | None,
        share_model: bool = False,
        model: list[Any] | None = None,
        info: dict[str, Any] | None = None,
    ) -> dict:
        """Exchange with the driver: see the module's docstring. ``share_model`` asks the train
        process to put its model's weights in Ray's object store, for workers that act with
        ``ctx.model`` (the answer's ``model``: a reference, which the driver passes on without
        reading it); ``model`` is such a reference, copied into this worker's ``ctx.model``;
        ``info`` refreshes this process's cache of the transport hub's versions and totals,
        and the answer carries the hub's own when this actor hosts it. ``limit``: the steps a
        budgeted worker may reach before it waits for the next poll."""
        if self.endpoint is not None:
            self.endpoint.note(info)
        channel = self.channel
        if stop:
            channel.stopping = True
        channel.counted(others, limit)
        ctx = self.ctx
        out: dict[str, Any] = {"steps": channel.steps, "records": channel.take()}
        beat = channel.last_beat
        out["silent"] = None if beat == 0 else time.monotonic() - abs(beat)
        out["starting"] = beat <= 0
        if ctx is not None and model is not None:
            # owned by the train process: gone with it (the run is failing then)
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                weights = ray.get(model[0], timeout=ANSWER_TIMEOUT_S)
                with torch.no_grad():
                    ctx.model.load_state_dict(weights)
        if ctx is not None and self.trained is not None and share_model:
            weights = self.trained.model.state_dict()
            copied = {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
            out["model"] = [ray.put(copied)]
        if ctx is not None and ctx.role == "trainer":
            out["hub"] = self.hub.info()
        return out

    def state(self) -> dict[str, list[Any]] | None:
        """References to the train process's model, optimizer and module states, copied to
        the CPU between two of its ``Weights`` updates (it waits meanwhile: a checkpoint holds
        a whole update, its model and optimizers of the same moment). The driver asks when it
        writes a checkpoint or plays the model. ``None`` before the function started, or when
        an optimizer changed shape under the read (a learner that publishes no weights is
        read while it trains, as the local backend's checkpoint reads shared memory)."""
        ctx, trained = self.ctx, self.trained
        if ctx is None or trained is None:
            return None
        # a learner stuck inside an update (or one that publishes none) is read as it is
        whole = self.hub.publishing.acquire(timeout=UPDATE_WAIT_S)
        try:
            optimizer = trained.optimizer
            copied = _on_cpu(
                {
                    "model": trained.model.state_dict(),
                    "optimizers": {
                        "optimizer": optimizer.state_dict() if optimizer is not None else None,
                        "optimizers": {k: o.state_dict() for k, o in trained.optimizers.items()},
                    },
                    "modules": {
                        name: value.state_dict()
                        for name, value in vars(ctx.state).items()
                        if isinstance(value, torch.nn.Module)
                    },
                }
            )
        except RuntimeError:  # a dict changed size during iteration: asked again next time
            return None
        finally:
            if whole:
                self.hub.publishing.release()
        return {name: [ray.put(part)] for name, part in copied.items()}


def _killed_with_raylet(raylet: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent, the raylet that started it, ends
    (``PR_SET_PDEATHSIG``, Linux): that works whatever the process is doing, where
    :func:`_end_with_raylet`'s thread needs the interpreter (a process whose threads were stuck
    in Ray's own calls was seen to outlive its raylet by minutes)."""
    if not sys.platform.startswith("linux") or raylet <= 1:
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != raylet:  # it ended before that
            os._exit(1)


def _end_with_raylet(raylet: int) -> None:
    """End this actor's process once the raylet that started it (its parent) is gone. A
    raylet Ray declared dead (its node cut off, or stopped, for longer than Ray's health checks
    allow) exits as soon as it runs again and learns it, and Ray leaves the processes it
    started running, cut off from the run (the driver's kill cannot reach them): they end here,
    whatever the plugin's function is doing."""
    if raylet <= 1:  # started by no raylet (adopted already): nothing to watch
        return
    while os.getppid() == raylet:
        time.sleep(RAYLET_WATCH_S)
    with contextlib.suppress(Exception):
        print(
            f"mprl: the raylet that started this actor (pid {raylet}) is gone; the actor ends",
            file=sys.stderr,
            flush=True,
        )
    os._exit(1)


def _on_cpu(value: Any) -> Any:
    """``value`` (state dicts: dicts, lists, tensors, numbers) with every tensor copied to the
    CPU, detached: a snapshot the owner's next update does not change."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(v) for v in value)
    return value
