"""The Ray backend: each worker and the train process is a Ray actor, on any node of a cluster.

The driver (the ``mprl run`` process) builds the shared state, starts one actor per process,
polls each about every tick (steps, heartbeat, records, the stop flag: no remote call per env
step), and writes every checkpoint to the run directory; supervision (restarts, hangs, the
stop sequence) is :class:`mprl.backends.supervisor.Supervisor`'s.

- Manager kinds live in a Manager server started by the driver and reached over TCP at the
  driver's node address, with a random per-run key (never an open port without
  authentication): the same objects, so the same semantics, as on the local backend.
- Transport fields live in a hub in the train process's actor (:mod:`mprl.transport.hub`),
  mapped by the actors of its machine, called by the others (:mod:`mprl_builtin.ray.link`):
  the driver is not on their way.
- The train process's model, optimizers and modules are fetched only when the host asks
  before it reads its copies of them (a checkpoint, the policy check, an evaluation:
  :meth:`_RaySupervisor.refresh`), and once at the end.
- A plugin without a ``Weights`` field whose workers act with ``ctx.model``: every
  :data:`MODEL_SHARE_S` seconds the train process puts its model in Ray's object store, and each
  worker loads it from there; the driver passes the reference on and never reads it.
- Shared-memory kinds (``Tensor``) and Hogwild (workers training one shared model) need one
  machine's memory: they are refused before anything starts.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mprl import kinds, startup
from mprl.backends import base
from mprl.backends.base import TICK_S, Job, Monitor, Outcome, Role
from mprl.backends.processes import ManagerServer, check_memory
from mprl.backends.supervisor import FAILED, RETURNED, RUNNING, NotStarted, Status, Supervisor
from mprl.context import Context
from mprl.errors import UsageError
from mprl.run_types import ChildFailure
from mprl.schema import SharedState
from mprl_builtin.ray import cluster
from mprl_builtin.ray import start as ray_start

INSTALL = cluster.INSTALL
#: seconds between the train process's model shares with workers that act with ``ctx.model``
#: (a plugin without a ``Weights`` field)
MODEL_SHARE_S = 1.0
#: seconds of its own work (at its rate so far) a worker is granted at most on a run with an
#: env-step budget: polls come every tick, so it never waits for one far from the budget
GRANT_AHEAD_S = 1.0
#: Ray's own processes on a machine it runs on (GCS, raylet, agents), counted as children
RAY_PROCESSES = 3
#: the longest one answer from an actor (a poll, the final state) is awaited
ANSWER_TIMEOUT_S = 30.0
#: seconds the driver waits, at the end of a run, for Ray to see its killed actors' processes end
ACTORS_GONE_S = 10.0
#: seconds an actor's poll may go unanswered before the run says so (at most half of
#: --worker-timeout): its node may be cut off
NOT_ANSWERING_S = 5.0
#: seconds an actor may wait for a node before the run asks Ray whether it waits for resources
PLACEMENT_NOTE_S = 3.0

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
        self.embedded = False  # the Ray it runs on started on this machine for it

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
        if startup.pending("ray") or not ray.is_initialized():
            address = job.run.of(cluster.RayOptions).ray_address or os.environ.get(
                "RAY_ADDRESS", ""
            )
            if not address:  # every actor on this machine, and Ray's own processes
                notes = check_memory(len(job.roles()) + RAY_PROCESSES, None, _state_bytes(job))
            self.connected, self.embedded = True, not address
            try:  # a Ctrl-C while Ray starts comes once it has started: it is stopped again
                self.session = cluster.connect(address, _cpus_needed(job))
            except BaseException:
                self.close()
                raise
        try:  # (a Ctrl-C meanwhile too: what connect() opened is closed)
            if reason := cluster.too_big(_resources_needed(job)):
                raise UsageError(reason)
        except BaseException:
            self.close()
            raise
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
        session = self.session
        if session is None and self.embedded:  # a Ctrl-C came before connect() handed it over
            session = ray_start.session_dir()
        ray.shutdown()  # a runtime this run started stops; a cluster stays up
        if session is not None:
            ray_start.end_processes_of(session)
            if not self.failed:
                ray_start.remove_session(session)


def _state_bytes(job: Job) -> int:
    """What the run holds besides its processes: the model, and the shared state (replay
    buffers and rollouts live in the hub's actor)."""
    model = sum(t.numel() * t.element_size() for t in job.model.state_dict().values())
    return kinds.memory(job.algorithm.schema, job.dims)[0] + 3 * model  # + optimizer moments


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


class _Actor:
    """A child as a Ray actor (:class:`mprl.backends.supervisor.ChildHandle`): seen through its
    run's reference and the answers to the polls its run sends (:meth:`_RaySupervisor.take`)."""

    def __init__(
        self, run: _RaySupervisor, role: Role, actor: Any, run_ref: Any, restart: bool
    ) -> None:
        self.run, self.role, self.actor, self.run_ref = run, role, actor, run_ref
        self.restart = restart  # a restart of its rank
        self.where_ref = actor.where.remote()
        self.poll_ref: Any = None
        self.poll_sent = 0.0
        self.started_at = time.monotonic()
        self.node, self.node_id, self.pid = "", "", 0  # where its process is, once placed
        self.placement_seen = 0.0  # when the run last asked Ray whether it waits for resources
        self.placement_said = False  # the run said it waits for resources
        self.late_said = False  # the run said it is not answering
        self.lost: str | None = None  # why Ray declared its node dead, when it died with it
        self.steps = 0  # this actor's
        self.answered = False  # a poll came back since the start
        self.silent: float | None = None  # its heartbeat's age at the last answer
        self.starting = True  # in start-up work at the last answer
        self.model_sent = -1  # the generation of the train process's model it was last sent
        self.limit: int | None = None  # the steps it was last granted (a budgeted worker)
        self.committed = 0  # the most steps it may reach on the grants it has been sent
        self.first = self.started_at  # its last answer before it took a step
        self.answered_at = 0.0  # when its last answer came
        self._ended: Status | None = None

    def live(self) -> bool:
        return self.actor is not None and self._ended is None

    def rate(self) -> float:
        """Its env steps a second since it started taking them (0: not known yet)."""
        if self.steps == 0:
            return 0.0
        return self.steps / max(self.answered_at - self.first, 1e-6)

    def bound(self) -> int:
        """The most steps it may reach: what it was granted, while it runs."""
        return max(self.committed, self.steps) if self.live() else self.steps

    def position(self, now: float) -> int:
        """Its steps by ``now``, as far as its rate tells (within what it may reach)."""
        if not self.live() or self.role.kind == "trainer":
            return self.steps
        guess = self.steps + int(self.rate() * (now - self.answered_at))
        return min(guess, self.bound())

    @property
    def hosts_hub(self) -> bool:
        return self.actor is not None and self.actor is self.run.hub

    def poll(self) -> Status:
        import ray

        if self._ended is not None:
            return self._ended
        if not _ready(self.run_ref):
            now = time.monotonic()
            starting = not self.answered or self.starting
            if not self.node and (unplaced := self.run.placement(self, now)) is not None:
                self._ended = unplaced  # it waited for resources no node has, for too long
                return unplaced
            if not self.answered:  # how long it has been waiting
                return Status(RUNNING, now - self.started_at, starting)
            if self.poll_ref is not None and now - self.poll_sent > 1.0:
                self.run.late(self, now - self.poll_sent)
                return Status(RUNNING, now - self.poll_sent, starting)
            return Status(RUNNING, self.silent, starting)
        where = f" on node {self.node}" if self.node else ""
        try:
            result = ray.get(self.run_ref, timeout=ANSWER_TIMEOUT_S)
        except ray.exceptions.RayActorError as exc:
            reason = f"its actor died{where}: {cluster.cause(exc)}"
            if self.node and (lost := cluster.node_death(exc)) is not None:
                self.lost = lost
                self.run.node_lost(self)
                reason = (
                    f"died with its node {self.node} ({self.node_id[:8]}), which Ray declared "
                    f"dead ({lost})"
                )
            self._ended = Status(FAILED, reason=reason)
        except ray.exceptions.RayError as exc:
            self._ended = Status(FAILED, code=1, traceback=str(exc),
                                 reason="could not start its actor")  # fmt: skip
        else:
            self.run.last_poll(self)
            if result["code"] == 0:
                self._ended = Status(RETURNED)
                if not self.hosts_hub:  # (the hub answers until the final checkpoint)
                    self.kill()
            else:
                self._ended = Status(FAILED, code=1, traceback=result["traceback"],
                                     reason=f"raised{where}")  # fmt: skip
        return self._ended

    def stop(self) -> None:
        self.run.stopping = True  # every poll from now on carries the stop flag
        if self.actor is not None and self.poll_ref is None:
            self.run.send_poll(self)
        elif self.actor is not None:  # a poll in flight may answer late (a loaded machine),
            self.actor.stop.remote()  # and a worker at its grant waits for the flag: now
        self.run.stop_waits()

    def kill(self, stack: bool = False) -> str:
        """Kill its actor; the hub's host (the train process) only once the final checkpoint
        has read the hub (:meth:`_RaySupervisor.release`), its state read first."""
        import ray

        if self.actor is None:
            return ""
        if self.hosts_hub and not stack:
            self.run.refresh(final=True)
            self._ended = self._ended or Status(FAILED, reason="killed")
            return ""
        ray.kill(self.actor, no_restart=True)
        self.actor = None
        return ""


class _RaySupervisor(Supervisor):
    """Ray actors, seen through their run references and polls."""

    startup_timeout_s = 180.0  # placement, then imports (client.START_TIMEOUT_S too)

    def __init__(self, job: Job, monitor: Monitor, session: Path | None) -> None:
        super().__init__(job, monitor)
        self.session = session  # an embedded Ray's: where its logs are
        self.base = list(self.steps())  # per slot: the steps of actors before the live ones
        self.actors: dict[int, _Actor] = {}  # by slot, the live or last one
        self.started: list[_Actor] = []  # every one, restarted ones too
        self.made: dict[int, Any] = {}  # by slot, an actor made ahead (build_state)
        self.authkey = secrets.token_bytes(32)
        self.options = job.run.of(cluster.RayOptions)
        self.learner = _learner(job)
        # workers that act with ctx.model get the train process's, by reference, every
        # MODEL_SHARE_S: unless they read weights through a Weights field (every built-in plugin)
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
        self.stopping = False  # the stop flag is up

    # -- starting ------------------------------------------------------------------------------

    def build_state(self) -> tuple[SharedState, str | None]:
        import ray

        from mprl.transport.client import START_TIMEOUT_S, Endpoint, HubBuilder, HubNotStarted
        from mprl_builtin.ray.link import RayLink

        for role in self.job.roles():  # their processes start (and import torch) together,
            self.made[role.slot] = self._new_actor(role)  # while the state is built
        self.hub = self._hub_host()
        manager = None
        if kinds.needs_manager(self.job.algorithm.schema):
            # on this node's address with the run's key, reachable by every node
            host = ray.util.get_node_ip_address()
            self.server = ManagerServer(address=(host, 0), authkey=self.authkey)
            manager = self.server.manager
        job = self.job
        builder = HubBuilder(
            manager, Endpoint(RayLink(self.hub)), job.model, job.algorithm.make_model,
            same_host=not self.options.no_shared_memory, stopping=self.stop_requested,
        )  # fmt: skip
        try:
            return job.build_state(builder)
        except HubNotStarted as exc:
            if exc.reason is not None:  # a Ctrl-C while the actors start
                raise NotStarted(Outcome(exc.reason)) from None
            trainer = job.algorithm.train is not None
            why = (
                f"did not start within {START_TIMEOUT_S:g} s: its actor (the run's transport "
                "hub) was not placed yet, or was still importing torch and the plugin; a node "
                "too busy? (`ray status` shows the cluster's load)"
            )
            who = ("trainer", -1) if trainer else ("transport hub", -1)
            raise NotStarted(Outcome("failed", [ChildFailure(*who, None, why)])) from None

    def _hub_host(self) -> Any:
        """The actor that hosts the run's transport hub: the train process's (made before the
        shared state that names it), or, in a run without one, an actor of its own pinned
        to the driver's node (it survives the loss of any other node)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from mprl_builtin.ray.actor import ChildActor

        if self.job.algorithm.train is not None:
            return self.made[self.job.run.workers]
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

    def _threads(self, role: Role) -> int:
        learner = self.learner.get("CPU", 1.0)
        cpus = self.options.worker_cpus if role.kind == "worker" else learner
        return self.job.run.torch_threads or max(1, int(cpus or 1))

    def _new_actor(self, role: Role) -> Any:
        import ray

        from mprl_builtin.ray.actor import ChildActor

        if role.kind == "worker":
            options = {"num_cpus": self.options.worker_cpus, "scheduling_strategy": "SPREAD"}
            concurrency = 4  # run, poll, and room to spare
        else:  # it hosts the hub too: every worker may be waiting in it at once
            options = cluster.actor_options(self.learner)
            concurrency = self.job.run.workers + 4
        threads = self._threads(role)
        if threads != 1:  # Ray's workers have OMP_NUM_THREADS=1 already; one with a runtime
            # env of its own cannot start in the idle worker processes Ray keeps ready
            env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
            options["runtime_env"] = {"env_vars": env}
        return (
            ray.remote(ChildActor)
            .options(max_concurrency=concurrency, **options)
            .remote(self.authkey)
        )

    def start(self, role: Role, ctx: Context) -> _Actor:
        actor = self.made.pop(role.slot, None) or self._new_actor(role)
        hub_host = None if actor is self.hub else self.hub
        run_ref = actor.run.remote(self.job.function(role), ctx, self._threads(role), hub_host)
        before = self.actors.get(role.slot)
        if before is not None:  # a restart: the slot's steps go on from the last actor's
            self.base[role.slot] += before.steps
        self.actors[role.slot] = handle = _Actor(self, role, actor, run_ref, before is not None)
        self.started.append(handle)
        return handle

    # -- seeing the children -------------------------------------------------------------------

    def take(self) -> list[int]:
        """Poll every live actor without a poll in flight, and take the answers that come
        within a few hundredths of a second."""
        import ray

        self.ticks += 1
        now = time.monotonic()
        share = self.share_model and now - self.last_sync >= MODEL_SHARE_S
        for actor in self.actors.values():
            if (
                actor.actor is not None  # (killed: a hung one, whose restart is due)
                and actor._ended is None
                and actor.poll_ref is None
                and now - actor.poll_sent >= TICK_S
            ):
                self.send_poll(actor, share=share)
        pending = [a.poll_ref for a in self.actors.values() if a.poll_ref is not None]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=0.05)
        for actor in self.actors.values():
            if actor.where_ref is not None and _ready(actor.where_ref):
                self._placed(actor)
            if actor.poll_ref is not None and _ready(actor.poll_ref):
                self._answer(actor)
        steps = list(self.base)
        for slot, actor in self.actors.items():
            steps[slot] += actor.steps
        return steps

    def send_poll(self, actor: _Actor, share: bool = False) -> None:
        """Send ``actor`` a poll: the stop flag and the run's steps in, its steps, heartbeat and
        records out, the train process's model on the way where workers act with it."""
        trainer = actor.role.kind == "trainer"
        model = None
        if not trainer and self.model_ref is not None and actor.model_sent < self.model_gen:
            model, actor.model_sent = self.model_ref, self.model_gen
        info = None if trainer else self.hub_info
        others = sum(self.steps()) - actor.steps  # the run's steps but this actor's
        limit = self.grant(actor)
        actor.poll_ref = actor.actor.poll.remote(
            self.stopping, others, limit, share and trainer, model, info
        )
        actor.poll_sent = time.monotonic()
        if share and trainer:
            self.last_sync = actor.poll_sent

    def grant(self, actor: _Actor) -> int | None:
        """The steps a worker may reach before it waits for its next poll, when the run has an
        env-step budget (``None``: no bound). The grants and the others' steps never add up
        past the budget, so the workers go past it by at most one rollout each. Within that, a
        worker gets the share of the steps left that its rate is of the workers' (an equal
        share before the rates are known), at most :data:`GRANT_AHEAD_S` of its own work,
        counted from where it is by now at its rate."""
        total = self.job.run.total_steps
        if total is None or actor.role.kind == "trainer":
            return None
        now = time.monotonic()
        others = [a for a in self.actors.values() if a is not actor]
        cap = total - sum(self.base) - sum(a.bound() for a in others)
        if cap <= actor.steps:
            actor.limit = actor.steps
        else:
            left = total - sum(self.base) - sum(a.position(now) for a in self.actors.values())
            workers = [a for a in self.actors.values() if a.role.kind != "trainer" and a.live()]
            rates = [a.rate() for a in workers]
            rate = actor.rate()
            if rate > 0 and all(r > 0 for r in rates):
                share = min(left * rate / sum(rates), rate * GRANT_AHEAD_S)
            else:
                share = left / max(1, len(workers))
            want = actor.position(now) + math.ceil(max(0.0, share))
            actor.limit = min(cap, max(actor.steps + 1, want))
        actor.committed = max(actor.committed, actor.limit)
        return actor.limit

    def stop_waits(self) -> None:
        """The workers waiting in the hub see the stop flag at once."""
        if self.hub is not None and self.stop_ref is None:
            self.stop_ref = self.hub.hub_call.remote("stop_waits")

    def _placed(self, actor: _Actor) -> None:
        import ray

        try:
            where = ray.get(actor.where_ref, timeout=ANSWER_TIMEOUT_S)
        except Exception:  # the actor died; its run ref says how
            where = None
        actor.where_ref = None
        if where is None:
            return
        actor.node, actor.node_id, actor.pid = where["ip"], where["node_id"], where["pid"]
        self.event(
            "placed",
            f"{actor.role.who} runs on node {where['ip']} ({where['node_id'][:8]}, "
            f"pid {where['pid']})",
            rank=actor.role.rank,
            node=where["ip"],
            node_id=where["node_id"],
            pid=where["pid"],
        )

    def _answer(self, actor: _Actor) -> None:
        import ray

        ref, actor.poll_ref = actor.poll_ref, None
        try:
            out = ray.get(ref, timeout=ANSWER_TIMEOUT_S)
        except Exception:  # the actor is gone: its run ref says how
            return
        if actor.late_said:
            actor.late_said = False
            self.event(
                "answering",
                f"{actor.role.who} on node {actor.node} answers again, after "
                f"{time.monotonic() - actor.poll_sent:.0f} s",
                rank=actor.role.rank,
            )
        actor.answered = True
        actor.steps = out["steps"]
        if actor.limit is not None:  # its grant is known to have arrived: it goes no further
            actor.committed = max(actor.limit, actor.steps)
        actor.answered_at = time.monotonic()
        if actor.steps == 0:  # its rate counts from its last answer before its first steps
            actor.first = actor.answered_at
        actor.silent, actor.starting = out["silent"], out["starting"]
        if out["records"]:
            self.monitor.on_records(out["records"])
        if out.get("model"):  # a reference, passed on to the workers unread
            self.model_ref, self.model_gen = out["model"], self.model_gen + 1
        if out.get("hub"):
            self.hub_info = out["hub"]

    # -- what the run says while a node is cut off -----------------------------------------------

    def late(self, actor: _Actor, silent: float) -> None:
        """Say once that ``actor``, placed, has not answered its poll for
        :data:`NOT_ANSWERING_S` (its node may be cut off), and what comes of it."""
        timeout = self.job.run.worker_timeout
        after = min(NOT_ANSWERING_S, timeout / 2) if timeout else NOT_ANSWERING_S
        if actor.late_said or silent < after or self.stopping or not actor.node:
            return
        actor.late_said = True
        seen = {True: "Ray still counts its node alive", False: "Ray has declared its node dead"}
        alive = cluster.node_alive(actor.node_id)
        then = (
            f"; waiting up to {timeout:g} s (--worker-timeout) before it counts as hung"
            if timeout
            else "; waiting for it (--worker-timeout 0)"
        )
        self.event(
            "not-answering",
            f"{actor.role.who}'s node {actor.node} ({actor.node_id[:8]}) is not answering "
            f"(no answer for {silent:.0f} s; {seen.get(alive, 'Ray did not say')}){then}",
            rank=actor.role.rank,
            node=actor.node,
            node_id=actor.node_id,
        )

    def node_lost(self, actor: _Actor) -> None:
        """Say that Ray declared ``actor``'s node dead (once per node): what of the run ran
        there goes on running, cut off, until the node is back."""
        if any(a.lost and a.node_id == actor.node_id for a in self.started if a is not actor):
            return
        self.event(
            "node-lost",
            f"node {actor.node} ({actor.node_id[:8]}) was declared dead by Ray ({actor.lost}): "
            f"{actor.role.who} ran there (pid {actor.pid}), cut off from the run now; it ends "
            "once its node is back",
            rank=actor.role.rank,
            node=actor.node,
            node_id=actor.node_id,
            pid=actor.pid,
        )

    def placement(self, actor: _Actor, now: float) -> Status | None:
        """``actor``'s failure once it has waited its bound for resources that no live node has
        free (a restart: --worker-timeout; else the start-up time); the wait said once it is
        seen, after :data:`PLACEMENT_NOTE_S`. ``None`` while it may yet be placed."""
        waited = now - actor.started_at
        timeout = self.job.run.worker_timeout
        if actor.restart and timeout:
            bound, what = timeout, "--worker-timeout"
        else:
            bound, what = self.startup_timeout, "the start-up time"
        if waited < PLACEMENT_NOTE_S or (now - actor.placement_seen < 1.0 and waited < bound):
            return None
        actor.placement_seen = now
        if cluster.actor_placed(actor.actor) is not False:  # placed, starting; or Ray said naught
            return None
        needs = self._asks(actor.role)
        fits, have = cluster.free_for(needs)
        if fits is not False:  # a node has them: it is being placed
            return None
        who = f"the restart of {actor.role.who}" if actor.restart else actor.role.who
        if not actor.placement_said:
            actor.placement_said = True
            self.event(
                "placement-waits",
                f"{who} waits for resources: it needs {cluster.resources_text(needs)}, and no "
                f"live node has them free ({have}); waiting up to {bound:g} s ({what}) for a "
                "node to free them or join",
                rank=actor.role.rank,
                needs=needs,
            )
        if waited < bound:
            return None
        return Status(
            FAILED,
            reason=f"could not be placed within {bound:g} s ({what}): it needs "
            f"{cluster.resources_text(needs)}, and no live node has them free ({have}); add a "
            "node, or run with fewer --workers or a smaller --worker-cpus / --learner-resources",
            restartable=False,
        )

    def _asks(self, role: Role) -> dict[str, float]:
        """The resources an actor of ``role`` asks Ray for."""
        if role.kind == "worker":
            return {"CPU": self.options.worker_cpus}
        return dict(self.learner)

    def last_poll(self, actor: _Actor) -> None:
        """Take what ``actor`` reported after its last poll (its function returned)."""
        import ray

        with contextlib.suppress(Exception):  # the actor is gone: nothing more to take
            if actor.poll_ref is not None:  # sent before the function returned: take it first
                ray.wait([actor.poll_ref], timeout=ANSWER_TIMEOUT_S)
                self._answer(actor)
            # then one sent now, which counts the function's last steps and records
            self.send_poll(actor)
            ray.wait([actor.poll_ref], timeout=ANSWER_TIMEOUT_S)
            self._answer(actor)

    def refresh(self, final: bool = False) -> None:
        """The train process's model, optimizers and modules of now, into the driver's copies:
        called before the host reads them (once per tick at most: a checkpoint reads them
        all). Once the run is stopping (``final``, or every child stopped) the next read is
        the last: the driver's copies are the run's from then on. A train process that is gone
        or not started yet leaves them as they were."""
        import ray

        trainer = self.actors.get(self.job.run.workers) if self.job.algorithm.train else None
        if self.final or trainer is None or trainer.actor is None:
            return
        final = final or all(a._ended is not None for a in self.actors.values())
        if not final and self.fetched_at == self.ticks:
            return
        self.fetched_at, self.final = self.ticks, final
        timeout = self.stop_grace_s if final and not _ready(trainer.run_ref) else ANSWER_TIMEOUT_S
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            state = ray.get(trainer.actor.state.remote(), timeout=timeout)
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

    def wait(self, until: float, handles: Sequence[Any]) -> None:
        import ray

        runs = [h.run_ref for h in handles]
        left = until - time.monotonic()
        if left <= 0:
            return
        if runs:
            ray.wait(runs, num_returns=1, timeout=left)
        else:
            time.sleep(left)

    # -- ending them ---------------------------------------------------------------------------

    def release(self) -> None:
        import ray

        self.final = True
        if self.stop_ref is not None:  # read, so that a hub gone meanwhile logs no error
            with contextlib.suppress(Exception):
                ray.get(self.stop_ref, timeout=1.0)
        for actor in [*self.made.values(), self.hub]:  # the hub's host among them
            if actor is not None:
                ray.kill(actor, no_restart=True)
        # a killed actor's task fails once Ray has seen its process end: wait for that, so
        # that no actor process outlives the driver's exit (bounded: Ray reaps the rest)
        deadline = time.monotonic() + ACTORS_GONE_S
        runs = [a.run_ref for a in self.started]
        with contextlib.suppress(Exception):
            ray.wait(runs, num_returns=len(runs), timeout=ACTORS_GONE_S)
        # what ran on a node Ray declared dead is out of its reach: said, not waited for
        cut_off = self._cut_off()
        # Ray sees a process end a few tens of milliseconds before it is gone: on this machine,
        # wait for that too
        here = ray.util.get_node_ip_address()
        for actor in self.started:
            while (
                actor.node == here
                and actor not in cut_off
                and _actor_alive(actor.pid)
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
        if cut_off:
            self._say_cut_off(cut_off)
        if self.server is not None:
            self.server.shutdown()
        if self.session is not None and (self.outcome is None or self.outcome.failures):
            self.event("ray-logs", f"Ray's logs of this run are in {self.session}/logs")

    def _cut_off(self) -> list[_Actor]:
        """The run's actors, placed, on nodes Ray has declared dead: killing them could not
        reach them, so their end cannot be confirmed."""
        import ray

        placed = [a for a in self.started if a.node_id]
        try:
            dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive")}
        except Exception:  # Ray did not say: those it saw die with their node
            dead = set()
        return [a for a in placed if a.lost is not None or a.node_id in dead]

    def _say_cut_off(self, cut_off: list[_Actor]) -> None:
        """Name the actors whose end the run could not confirm, and how they end."""
        names = ", ".join(
            f"{a.role.who} (pid {a.pid} on node {a.node}, {a.node_id[:8]})" for a in cut_off
        )
        self.event(
            "unconfirmed",
            f"{len(cut_off)} actor{'s' * (len(cut_off) != 1)} of this run could not be "
            f"confirmed ended, {names}: Ray declared their node dead, so it cannot reach them; "
            "each ends itself once the Ray of its node is gone (a node declared dead stops its "
            "Ray when it is back), or stop Ray there (`ray stop` on that node)",
            actors=[
                {"who": a.role.who, "pid": a.pid, "node": a.node, "node_id": a.node_id}
                for a in cut_off
            ],
        )


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
