"""The Ray backend: each worker and the train process is a Ray actor, on any node of a cluster.

The driver (the ``mprl run`` process) builds the shared state, starts one actor per process,
polls each about every tick (steps, heartbeat, records, the stop flag: no remote call per env
step), and writes every checkpoint to the run directory; supervision (restarts, hangs, the
stop sequence) is :class:`mprl.backends.supervisor.Supervisor`'s.

- Manager kinds live in a Manager server started by the driver and reached over TCP at the
  driver's node address, with a random per-run key (never an open port without
  authentication): the same objects, so the same semantics, as on the local backend.
- Transport fields live in a hub in the train process's actor (:mod:`mprl.transport.hub`),
  mapped by the actors of its machine, called by the others (:mod:`mprl.transport.raylink`):
  the driver is not on their way.
- The train process's model, optimizers and modules are fetched only when the host asks
  before it reads its copies of them (a checkpoint, the policy check, an evaluation:
  :meth:`_RaySupervisor.refresh`), and once at the end.
- A plugin without a ``Weights`` field whose workers act with ``ctx.model``: every
  :data:`SYNC_S` seconds the train process puts its model in Ray's object store, and each
  worker loads it from there; the driver passes the reference on and never reads it.
- Shared-memory kinds (``Tensor``) and Hogwild (workers training one shared model) need one
  machine's memory: they are refused before anything starts.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from mprl.backends import base, ray_start
from mprl.backends.base import Job, Monitor, Outcome
from mprl.backends.processes import ManagerServer, check_memory
from mprl.backends.ray import cluster
from mprl.backends.supervisor import RUNNING, Child, NotStarted, Supervisor
from mprl.context import Context
from mprl.errors import UsageError
from mprl.run_types import ChildFailure
from mprl.schema import SharedState

INSTALL = cluster.INSTALL
#: seconds between the train process's model shares with workers that act with ``ctx.model``
#: (a plugin without a ``Weights`` field)
SYNC_S = 1.0
#: seconds children get to return after the stop flag, before their actors are killed
STOP_GRACE_S = 5.0
#: Ray's own processes on a machine it runs on (GCS, raylet, agents), counted as children
RAY_PROCESSES = 3
#: the longest one answer from an actor (a poll, the final state) is awaited
CALL_TIMEOUT_S = 30.0
#: seconds the driver waits, at the end of a run, for Ray to see its killed actors' processes end
ACTORS_GONE_S = 10.0

#: schema kinds that need one machine's memory or are not built on Ray yet, and what to use
REFUSED = {
    "Tensor": "a Tensor is shared memory of one machine; on --backend ray use Array or Value "
    "(Manager kinds, shared across nodes) for small data, Rollouts or Weights for bulk data",
}


class RayBackend(base.Backend):
    """Runs a job's processes as Ray actors (``--backend ray``)."""

    name = "ray"

    def __init__(self) -> None:
        self.connected = False  # this run started or joined Ray, and leaves it in close()
        self.session: Path | None = None  # an embedded Ray's, removed unless the run failed
        self.failed = False  # the run failed (or raised): its Ray's logs are kept

    def prepare(self, job: Job) -> list[str]:
        """Refuse what cannot run across machines, before anything starts: Ray missing,
        shared-memory fields, Hogwild; then join the cluster (or start Ray here) and refuse a
        run it cannot hold. A cluster that cannot be joined is bad usage too (exit 2): nothing
        is made before it is joined."""
        try:
            import ray
        except ImportError:
            raise UsageError(f"--backend ray needs Ray, an optional extra: {INSTALL}") from None
        name = job.algorithm.name
        for field_name, field in job.algorithm.schema.fields.items():
            if field.kind in REFUSED:
                raise UsageError(
                    f"algorithm {name!r}: shared-state field {field_name!r} ({field.kind}) "
                    f"cannot run on --backend ray: {REFUSED[field.kind]}"
                )
        if job.algorithm.train is None and job.all_optimizers():
            raise UsageError(
                f"algorithm {name!r} trains one shared model in every worker (Hogwild), which "
                "needs the model in one machine's memory; on --backend ray use an algorithm "
                "with a train process (impala, ppo), or run it with --backend local"
            )
        import ray

        notes: list[str] = []
        # before mprl's signal handlers go in: Ray's init sets its own
        # else the caller's session, left as it is
        if ray_start.started_early() or not ray.is_initialized():
            address = job.run.of(cluster.RayOptions).ray_address or os.environ.get(
                "RAY_ADDRESS", ""
            )
            if not address:  # every actor on this machine, and Ray's own processes
                notes = check_memory(len(job.roles()) + RAY_PROCESSES, None, _state_bytes(job))
            self.connected = True
            try:  # a Ctrl-C while Ray starts comes once it has started: it is stopped again
                self.session = cluster.connect(address, _cpus_needed(job))
            except BaseException:
                self.close()
                raise
        if reason := cluster.too_big(_resources_needed(job)):
            self.close()
            raise UsageError(reason)
        return notes

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        self.failed = True  # until it has ended without a failure
        outcome = _RaySupervisor(job, monitor, self.session).execute()
        self.failed = bool(outcome.failures)
        return outcome

    def close(self) -> None:
        import ray

        if not self.connected:  # the caller's session stays as it was
            return
        self.connected = False
        ray.shutdown()  # a runtime this run started stops; a cluster stays up
        if self.session is not None and not self.failed:
            ray_start.remove_session(self.session)


def _state_bytes(job: Job) -> int:
    """What the run holds besides its processes: the model, and the shared state (replay
    buffers and rollouts live in the hub's actor)."""
    model = sum(t.numel() * t.element_size() for t in job.model.state_dict().values())
    return job.algorithm.schema.memory(job.dims)[0] + 3 * model  # + optimizer moments


def _learner(job: Job) -> dict[str, float]:
    return cluster.learner_resources(job.run.of(cluster.RayOptions).learner_resources)


def _cpus_needed(job: Job) -> float:
    workers = job.run.workers * job.run.of(cluster.RayOptions).worker_cpus
    return workers + (_learner(job).get("CPU", 0.0) if job.algorithm.train else 0.0)


def _resources_needed(job: Job) -> dict[str, float]:
    need: dict[str, float] = {"CPU": _cpus_needed(job)}
    if job.algorithm.train:
        for key, value in _learner(job).items():
            if key != "CPU":
                need[key] = need.get(key, 0.0) + value
    return need


@attrs.define(eq=False)
class _RayChild(Child):
    """A rank and the actor running it (``handle``), with what its polls said."""

    run_ref: Any = None
    where_ref: Any = None
    poll_ref: Any = None
    poll_sent: float = 0.0
    node: str = ""
    pid: int = 0  # its actor's process, on ``node``
    base_steps: int = 0  # the slot's steps before this actor
    steps: int = 0  # this actor's steps
    answered: bool = False  # a poll came back since the start
    silent: float | None = None  # its heartbeat's age at the last answer
    starting: bool = True  # in start-up work at the last answer
    model_sent: int = -1  # the generation of the train process's model it was last sent


class _RaySupervisor(Supervisor):
    """Ray actors, seen through their run references and polls."""

    startup_timeout_s = 180.0  # placement, then imports (transport.START_TIMEOUT_S too)
    escalation = ((STOP_GRACE_S, "kill"),)
    kill_words = "its actor was killed"
    child_type = _RayChild

    def __init__(self, job: Job, monitor: Monitor, session: Path | None) -> None:
        super().__init__(job, monitor)
        self.session = session  # an embedded Ray's: where its logs are
        self.initial = list(job.initial_steps) or [0] * (job.run.workers + 2)
        for child in self._children():
            child.base_steps = self.initial[child.role.slot]
        self.authkey = secrets.token_bytes(32)
        self.options = job.run.of(cluster.RayOptions)
        self.learner = _learner(job)
        # workers that act with ctx.model get the train process's, by reference, every SYNC_S:
        # unless they read weights through a Weights field (every built-in plugin)
        fields = job.algorithm.schema.fields.values()
        self.share_model = job.algorithm.train is not None and not any(
            f.kind == "Weights" for f in fields
        )
        self.model_ref: list[Any] | None = None
        self.hub_info: dict[str, Any] | None = None  # the hub's versions and totals, to pass on
        self.model_gen = 0
        self.last_sync = time.monotonic()
        #: the times the driver fetched the train process's state (checkpoints, the policy
        #: check, evaluations, the end), each also a ``learner-state`` record in the metrics
        self.state_fetches = 0
        self.ticks = 0  # take() calls: one fetch per tick at most
        self.fetched_at = -1  # the tick of the last fetch
        self.final = False  # the final state is read: the driver's copies are the run's now
        self.hub: Any = None
        self.stop_ref: Any = None  # the hub's answer to the stop (read before it is killed)
        self.server: ManagerServer | None = None

    def _children(self) -> list[_RayChild]:
        return self.children  # type: ignore[return-value]

    # -- starting ------------------------------------------------------------------------------

    def build_state(self) -> tuple[SharedState, str | None]:
        import ray

        from mprl.transport.client import START_TIMEOUT_S, Endpoint, HubBuilder, HubNotStarted
        from mprl.transport.raylink import RayLink

        for child in self._children():  # their processes start (and import torch) together,
            self._new_actor(child)  # while the state is built
        self.hub = self._hub_host()
        manager = None
        if self.job.algorithm.schema.needs_manager():
            # on this node's address with the run's key, reachable by every node
            host = ray.util.get_node_ip_address()
            self.server = ManagerServer(address=(host, 0), authkey=self.authkey)
            manager = self.server.manager
        job = self.job
        builder = HubBuilder(
            manager, Endpoint(RayLink(self.hub)), job.model, job.algorithm.make_model,
            same_host=not self.options.no_shared_memory, stopping=self._stop_requested,
        )  # fmt: skip
        try:
            state, skipped = job.build_state(builder)
        except HubNotStarted as exc:
            if exc.reason is not None:  # a Ctrl-C while the actors start
                raise NotStarted(Outcome(exc.reason)) from None
            trainer = any(c.role.role == "trainer" for c in self._children())
            why = (
                f"did not start within {START_TIMEOUT_S:g} s: its actor (the run's transport "
                "hub) was not placed yet, or was still importing torch and the plugin; a node "
                "too busy? (`ray status` shows the cluster's load)"
            )
            who = ("trainer", -1) if trainer else ("transport hub", -1)
            raise NotStarted(Outcome("failed", [ChildFailure(*who, None, why)])) from None
        return state, skipped

    def _hub_host(self) -> Any:
        """The actor that hosts the run's transport hub: the train process's (made before the
        shared state that names it), or, in a run without one, an actor of its own pinned
        to the driver's node (it survives the loss of any other node)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from mprl.backends.ray.actor import ChildActor

        trainer = next((c for c in self._children() if c.role.role == "trainer"), None)
        if trainer is not None:
            return trainer.handle
        here = ray.get_runtime_context().get_node_id()
        options = {
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(here, False),
        }
        return (
            ray.remote(ChildActor)
            .options(max_concurrency=self.job.run.workers + 4, **options)
            .remote(self.authkey)
        )

    def _threads(self, child: Child) -> int:
        learner = self.learner.get("CPU", 1.0)
        cpus = self.options.worker_cpus if child.role.role == "worker" else learner
        return self.job.run.torch_threads or max(1, int(cpus or 1))

    def _new_actor(self, child: _RayChild) -> None:
        import ray

        from mprl.backends.ray.actor import ChildActor

        job = self.job
        if child.role.role == "worker":
            options = {"num_cpus": self.options.worker_cpus, "scheduling_strategy": "SPREAD"}
            concurrency = 4  # run, poll, and room to spare
        else:  # it hosts the hub too: every worker may be waiting in it at once
            options = cluster.actor_options(self.learner)
            concurrency = job.run.workers + 4
        threads = self._threads(child)
        if threads != 1:  # Ray's workers have OMP_NUM_THREADS=1 already; one with a runtime
            # env of its own cannot start in the idle worker processes Ray keeps ready
            env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
            options["runtime_env"] = {"env_vars": env}
        child.handle = (
            ray.remote(ChildActor)
            .options(max_concurrency=concurrency, **options)
            .remote(self.authkey)
        )

    def launch(self, child: Child, ctx: Context) -> None:
        assert isinstance(child, _RayChild)
        if child.handle is None:
            self._new_actor(child)
        child.where_ref = child.handle.where.remote()
        fn = self.job.function(child.role)
        hub_host = None if child.handle is self.hub else self.hub
        child.run_ref = child.handle.run.remote(fn, ctx, self._threads(child), hub_host)
        child.poll_ref, child.answered, child.steps, child.model_sent = None, False, 0, -1

    # -- seeing the children -------------------------------------------------------------------

    def steps(self) -> list[int]:
        steps = list(self.initial)
        for child in self._children():
            steps[child.role.slot] = child.base_steps + child.steps
        return steps

    def take(self) -> None:
        self.ticks += 1
        self._poll_all(stop=False, wait_s=0.05)

    def request_stop(self) -> None:
        self._poll_all(stop=True, wait_s=0.0)
        if self.hub is not None:  # the workers waiting in the hub see the stop flag at once
            self.stop_ref = self.hub.hub_call.remote("stop_waits")

    def _poll_all(self, stop: bool, wait_s: float) -> None:
        """Send a poll to every live child without one in flight, then take the answers
        that come within ``wait_s``."""
        import ray

        now = time.monotonic()
        share = self.share_model and now - self.last_sync >= SYNC_S
        total = sum(self.steps())
        for child in self._children():
            if not child.live() or (
                not stop and (child.poll_ref is not None or now - child.poll_sent < base.TICK_S)
            ):
                continue
            is_trainer = child.role.role == "trainer"
            model = None
            if not is_trainer and self.model_ref is not None and child.model_sent < self.model_gen:
                model, child.model_sent = self.model_ref, self.model_gen
            info = None if is_trainer else self.hub_info
            child.poll_ref = child.handle.poll.remote(
                stop, total, share and is_trainer, model, info
            )
            child.poll_sent = now
            if share and is_trainer:
                self.last_sync = now
        pending = [c.poll_ref for c in self._children() if c.poll_ref is not None and c.live()]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        for child in self._children():
            if child.where_ref is not None and _ready(child.where_ref):
                self._placed(child)
            if child.poll_ref is not None and _ready(child.poll_ref):
                self._answer(child)

    def _placed(self, child: _RayChild) -> None:
        import ray

        try:
            where = ray.get(child.where_ref, timeout=CALL_TIMEOUT_S)
        except Exception:  # the actor died; its run ref says how
            where = None
        child.where_ref = None
        if where is None:
            return
        child.node, child.pid = where["ip"], where["pid"]
        self.event(
            "placed",
            f"{child.role.who} runs on node {where['ip']} ({where['node_id'][:8]}, "
            f"pid {where['pid']})",
            rank=child.role.rank,
            node=where["ip"],
            node_id=where["node_id"],
            pid=where["pid"],
        )

    def _answer(self, child: _RayChild) -> None:
        import ray

        ref, child.poll_ref = child.poll_ref, None
        try:
            out = ray.get(ref, timeout=CALL_TIMEOUT_S)
        except Exception:  # the actor is gone: its run ref says how
            return
        child.answered = True
        child.steps = out["steps"]
        child.silent, child.starting = out["silent"], out["starting"]
        if out["records"]:
            self.monitor.on_records(out["records"])
        if out.get("model"):  # a reference, passed on to the workers unread
            self.model_ref, self.model_gen = out["model"], self.model_gen + 1
        if out.get("hub"):
            self.hub_info = out["hub"]

    def refresh(self, timeout: float = CALL_TIMEOUT_S) -> None:
        """The train process's model, optimizers and modules of now, into the driver's copies:
        called before the host reads them (once per tick at most: a checkpoint reads them
        all), and once at the end. A train process that is gone or not started yet leaves them
        as they were."""
        import ray

        trainer = next((c for c in self._children() if c.role.role == "trainer"), None)
        if self.final or self.fetched_at == self.ticks or trainer is None or trainer.handle is None:
            return
        self.fetched_at = self.ticks
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            state = ray.get(trainer.handle.state.remote(), timeout=timeout)
            if state:
                self._load_state(state, timeout)
                self.state_fetches += 1
                # a record, not an event: logged, not shown (and no number for the progress line)
                record = {"source": "main", "event": "learner-state", "time": time.time()}
                self.monitor.on_records([{**record, "step": sum(self.steps())}])

    def _load_state(self, state: Mapping[str, list[Any]], timeout: float) -> None:
        """The train process's model, optimizers and modules, into the driver's copies."""
        import ray

        job = self.job
        model = ray.get(state["model"][0], timeout=timeout)
        job.model.load_state_dict(model)
        optimizers = ray.get(state["optimizers"][0], timeout=timeout)
        if job.optimizer is not None and optimizers["optimizer"] is not None:
            job.optimizer.load_state_dict(optimizers["optimizer"])
        for name, saved in optimizers["optimizers"].items():
            if name in job.optimizers:
                job.optimizers[name].load_state_dict(saved)
        modules = ray.get(state["modules"][0], timeout=timeout)
        for name, saved in modules.items():
            getattr(self.state, name).load_state_dict(saved)

    def pause(self, until: float, children: Sequence[Child]) -> None:
        import ray

        runs = [c.run_ref for c in self._children() if c in children]
        left = until - time.monotonic()
        if left <= 0:
            return
        if runs:
            ray.wait(runs, num_returns=1, timeout=left)
        else:
            time.sleep(left)

    def life(self, child: Child, now: float) -> tuple[float | None, bool]:
        """Its heartbeat's age at the last answer, or, when a poll is not answered, how long
        it has been waiting."""
        assert isinstance(child, _RayChild)
        starting = not child.answered or child.starting
        if not child.answered:
            return now - child.started_at, starting
        if child.poll_ref is not None and now - child.poll_sent > 1.0:
            return now - child.poll_sent, starting
        return child.silent, starting

    def running(self, child: Child) -> bool:
        return not _ready(child.run_ref)  # type: ignore[attr-defined]

    def exit_of(self, child: Child) -> ChildFailure | None:
        """``child``'s run returned or its actor died: ``None`` when it returned normally."""
        import ray

        assert isinstance(child, _RayChild)
        if not _ready(child.run_ref):
            return RUNNING
        where = f" on node {child.node}" if child.node else ""
        try:
            result = ray.get(child.run_ref, timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as exc:
            reason = f"its actor died{where}: {cluster.cause(exc)}"
            return base.failure(child.role, None, reason=reason)
        except ray.exceptions.RayError as exc:
            return base.failure(child.role, 1, str(exc), reason="could not start its actor")
        self._last_poll(child)
        if result["code"] == 0:
            if child.role.role != "trainer":  # the train process's final state is read later
                self.kill(child)
            return None
        return base.failure(child.role, 1, result["traceback"], reason=f"raised{where}")

    def _last_poll(self, child: _RayChild) -> None:
        """Take what ``child`` reported after its last poll (its function returned)."""
        import ray

        with contextlib.suppress(Exception):  # the actor is gone: nothing more to take
            if child.poll_ref is not None:  # sent before the function returned: take it first
                ray.wait([child.poll_ref], timeout=CALL_TIMEOUT_S)
                self._answer(child)
            # then one sent now, which counts the function's last steps and records
            child.poll_ref = child.handle.poll.remote(False, sum(self.steps()))
            ray.wait([child.poll_ref], timeout=CALL_TIMEOUT_S)
            self._answer(child)

    # -- ending them ---------------------------------------------------------------------------

    def kill(self, child: Child, hung: bool = False) -> tuple[int | None, str]:
        import ray

        if child.handle is not None:
            ray.kill(child.handle, no_restart=True)
            child.handle = None
        return None, ""

    def discard(self, child: Child) -> None:
        """Kill the failed actor (what it committed is in the hub), keep its steps."""
        assert isinstance(child, _RayChild)
        self.kill(child)
        child.base_steps += child.steps
        child.steps = 0

    def escalate(self, child: Child, action: str) -> str:
        return "killing its actor"  # after_stop kills it, once the final state is read

    def stop_failure(self, child: Child) -> ChildFailure | None:
        import ray

        assert isinstance(child, _RayChild)
        if not _ready(child.run_ref):
            return None
        try:
            result = ray.get(child.run_ref, timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayError:
            return None
        self._last_poll(child)
        if result["code"] != 0:
            return base.failure(child.role, 1, result["traceback"], reason="raised")
        return None

    def after_stop(self) -> None:
        """The train process's final state (of one that did not stop in time too: its actor is
        still there), then every actor but the hub killed (the hub answers the final
        checkpoint)."""
        trainer = next((c for c in self._children() if c.role.role == "trainer"), None)
        if trainer is not None:
            self.fetched_at = -1
            self.refresh(CALL_TIMEOUT_S if _ready(trainer.run_ref) else STOP_GRACE_S)
        self.final = True  # what the final checkpoint reads (the policy check's weights too)
        for child in self.children:
            if child.handle is not self.hub:
                self.kill(child)

    def kill_all(self) -> None:
        self.final = True
        for child in self.children:
            self.kill(child)

    def release(self) -> None:
        import ray

        if self.stop_ref is not None:  # read, so that a hub gone meanwhile logs no error
            with contextlib.suppress(Exception):
                ray.get(self.stop_ref, timeout=1.0)
        if self.hub is not None:
            ray.kill(self.hub, no_restart=True)
        # a killed actor's task fails once Ray has seen its process end: wait for that, so
        # that no actor process outlives the driver's exit (bounded: Ray reaps the rest)
        deadline = time.monotonic() + ACTORS_GONE_S
        runs = [c.run_ref for c in self._children() if c.run_ref is not None]
        with contextlib.suppress(Exception):
            ray.wait(runs, num_returns=len(runs), timeout=ACTORS_GONE_S)
        # Ray sees a process end a few tens of milliseconds before it is gone: on this machine,
        # wait for that too
        here = ray.util.get_node_ip_address()
        for child in self._children():
            while child.node == here and _actor_alive(child.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        if self.server is not None:
            self.server.shutdown()
        if self.session is not None and (self.outcome is None or self.outcome.failures):
            self.event("ray-logs", f"Ray's logs of this run are in {self.session}/logs")


def _actor_alive(pid: int) -> bool:
    """A Ray actor's process ``pid`` is still there on this machine (a zombie is gone)."""
    try:
        return pid > 0 and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::")
    except OSError:
        return False


def _ready(ref: Any) -> bool:
    import ray

    if ref is None:
        return False
    done, _ = ray.wait([ref], timeout=0)
    return bool(done)
