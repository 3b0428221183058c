"""The Ray backend: each worker and the train process is a Ray actor, on any node of a cluster.

The driver (the ``mprl run`` process) builds the shared state, starts one actor per process,
polls each about every tick (steps, heartbeat, records, the stop flag: no remote call per env
step), restarts or stops them, and writes every checkpoint to the run directory.

- Manager kinds live in a Manager server started by the driver and reached over TCP at the
  driver's node address, with a random per-run key (never an open port without
  authentication): the same objects, so the same semantics, as on the local backend.
- Rollouts and weights go to a hub in the train process's actor, inline when small, through
  Ray's object store when large (:mod:`mprl.backends.ray.transport`).
- The train process's model and optimizers are fetched every :data:`SYNC_S` seconds: they are
  what checkpoints and the policy check read, and workers' ``ctx.model`` follows them.
- Shared-memory kinds (``Tensor``) and Hogwild (workers training one shared model) need one
  machine's memory: they are refused before anything starts.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import secrets
import shutil
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mprl.backends import base
from mprl.backends.base import Job, Monitor, Outcome, Role
from mprl.backends.restart import RestartPolicy
from mprl.errors import UsageError
from mprl.run_types import ChildFailure

INSTALL = 'pip install "mprl[ray]"'
#: seconds between fetches of the train process's model and optimizers
SYNC_S = 1.0
#: seconds children get to return after the stop flag, before their actors are killed
STOP_GRACE_S = 5.0
#: a child's first heartbeat comes after its actor is placed and has imported torch
STARTUP_TIMEOUT_S = 180.0
#: the longest one answer from an actor (a poll, the final state) is awaited
CALL_TIMEOUT_S = 30.0

#: schema kinds that need one machine's memory or are not built on Ray yet, and what to use
REFUSED = {
    "Tensor": "a Tensor is shared memory of one machine; on --backend ray use Array or Value "
    "(Manager kinds, shared across nodes) for small data, Rollouts or Weights for bulk data",
}


def learner_resources(text: str) -> dict[str, float]:
    """``--learner-resources`` read: a JSON object of resource names to amounts."""
    if not text:
        return {"CPU": 1.0}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--learner-resources {text!r}: not JSON ({exc}); e.g. '{{\"GPU\": 1}}'"
        ) from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        raise UsageError(
            f"--learner-resources {text!r}: expected an object of resource names to amounts "
            '>= 0, e.g. \'{"CPU": 1, "GPU": 1}\''
        )
    return {k: float(v) for k, v in value.items()}


def _actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"num_cpus": resources.get("CPU", 0.0)}
    if resources.get("GPU"):
        out["num_gpus"] = resources["GPU"]
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        out["resources"] = custom
    return out


class RayBackend(base.Backend):
    """Runs a job's processes as Ray actors (``--backend ray``)."""

    name = "ray"

    def prepare(self, job: Job) -> list[str]:
        """Refuse what cannot run across machines, before anything starts: Ray missing,
        shared-memory fields, Hogwild, bad resource options."""
        try:
            import ray  # noqa: F401
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
        if job.run.worker_cpus <= 0:
            raise UsageError(f"--worker-cpus must be > 0: {job.run.worker_cpus}")
        learner_resources(job.run.learner_resources)
        return []

    def execute(self, job: Job, monitor: Monitor) -> Outcome:
        return _RayRun(job, monitor).execute()


@attrs.define(eq=False)
class _Child:
    """One rank of the job and the actor currently running it."""

    role: Role
    actor: Any = None
    run_ref: Any = None
    where_ref: Any = None
    poll_ref: Any = None
    poll_sent: float = 0.0
    node: str = ""
    restarts: int = 0
    in_a_row: int = 0
    base_steps: int = 0  # the slot's steps before this actor
    steps: int = 0  # this actor's steps
    started_at: float = 0.0
    answered: bool = False  # a poll came back since the start
    silent: float | None = None  # its heartbeat's age at the last answer
    starting: bool = True  # in start-up work at the last answer
    model_sent: int = -1  # the generation of the train process's model it was last sent
    restart_at: float | None = None
    done: bool = False

    def live(self) -> bool:
        return not self.done and self.restart_at is None and self.actor is not None


class _RayRun:
    """One job on Ray: connect, start, supervise, stop, disconnect."""

    def __init__(self, job: Job, monitor: Monitor) -> None:
        self.job, self.monitor = job, monitor
        self.policy = RestartPolicy.of(job.run)
        self.children = [_Child(role) for role in job.roles()]
        n = job.run.workers
        self.initial = list(job.initial_steps) or [0] * (n + 2)
        for child in self.children:
            child.base_steps = self.initial[child.role.slot]
        self.authkey = secrets.token_bytes(32)
        self.learner = learner_resources(job.run.learner_resources)
        self.model_ref: list[Any] | None = None
        self.hub_info: dict[str, Any] | None = None  # the hub's versions and totals, to pass on
        self.model_gen = 0
        self.last_sync = time.monotonic()
        self.state: Any = None
        self._stopped = False
        self.session_dir: Path | None = None  # an embedded Ray's, removed after the run
        self.failed = True  # until the run ends without failures

    # -- connection ----------------------------------------------------------------------------

    def _connect(self) -> bool:
        """Start Ray for this run, or join the cluster at ``--ray-address`` / ``RAY_ADDRESS``;
        False when the caller had connected already (its session is left as it is)."""
        import ray

        if ray.is_initialized():
            return False
        address = self.job.run.ray_address or os.environ.get("RAY_ADDRESS", "")
        quiet = {"log_to_driver": False, "logging_level": "WARNING"}
        if address:
            _reachable(address)  # ray.init would retry an address with nobody there for minutes
            ray.init(address=address, **quiet)
            return True
        need = self._cpus_needed()
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, int(-(-need // 1))),
            include_dashboard=False,
            # Ray starts workers at nice 15; the run's processes are the work here
            _system_config={"worker_niceness": 0},
            **quiet,
        )
        with contextlib.suppress(Exception):  # Ray's logs of this run: removed unless it fails
            node = ray._private.worker._global_node  # no public accessor
            self.session_dir = Path(node.get_session_dir_path())
        return True

    def _remove_session(self, failed: bool) -> None:
        """Remove the embedded Ray's session directory (its logs), unless the run failed."""
        session = self.session_dir
        if session is None:
            return
        if failed:
            self._event("ray-logs", f"Ray's logs of this run are in {session}/logs")
            return
        shutil.rmtree(session, ignore_errors=True)
        latest = session.parent / "session_latest"
        with contextlib.suppress(OSError):
            if latest.is_symlink() and Path(os.readlink(latest)) in (session, Path(session.name)):
                latest.unlink()

    def _cpus_needed(self) -> float:
        workers = self.job.run.workers * self.job.run.worker_cpus
        return workers + (self.learner.get("CPU", 0.0) if self.job.algorithm.train else 0.0)

    def _too_big(self) -> str | None:
        """Why the cluster cannot hold the job (placement would wait forever), or ``None``."""
        import ray

        have = ray.cluster_resources()
        need: dict[str, float] = {"CPU": self._cpus_needed()}
        if self.job.algorithm.train:
            for key, value in self.learner.items():
                if key != "CPU":
                    need[key] = need.get(key, 0.0) + value
        short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) < v}
        if not short:
            return None
        what = ", ".join(f"{v:g} {k} (the cluster has {h:g})" for k, (v, h) in short.items())
        return (
            f"the Ray cluster cannot hold this run: it needs {what}; use fewer --workers, "
            "a smaller --worker-cpus / --learner-resources, or add nodes"
        )

    # -- the run -------------------------------------------------------------------------------

    def execute(self) -> Outcome:
        import ray

        manager = None
        self.hub = None
        connected = False
        try:
            try:
                connected = self._connect()
            except Exception as exc:  # an address with no cluster, a missing token ...
                return Outcome("failed", [ChildFailure("Ray cluster", -1, None, _unreachable(exc))])
            if reason := self._too_big():
                return Outcome("failed", [ChildFailure("Ray cluster", -1, None, reason)])
            from mprl.backends.ray.transport import RayStateBuilder

            self.hub = self._hub_host()
            if self.job.algorithm.schema.needs_manager():
                manager = self._start_manager()
            builder = RayStateBuilder(
                manager, self.hub, self.job.model, self.job.algorithm.make_model
            )
            self.state, skipped = self.job.build_state(builder)
            if skipped:
                self._event("state-not-restored", skipped)
            self.monitor.on_start(self.state)
            reason = self._start_all()
            failures: list[ChildFailure] = []
            if reason is None:
                reason, failures = self._supervise()
            stop_start = time.monotonic()
            failures += self._stop()
            shutdown_s = time.monotonic() - stop_start
            self._on_stop()
            restarts = tuple(c.restarts for c in self.children if c.role.role == "worker")
            self.failed = bool(failures)
            return Outcome(reason, failures, restarts, round(shutdown_s, 3))
        finally:
            for child in self.children:
                self._kill(child)
            if self.state is not None:  # every actor is gone: save what was learned
                with contextlib.suppress(Exception):
                    self._on_stop()
            if self.hub is not None:
                ray.kill(self.hub, no_restart=True)
            if manager is not None:
                manager.shutdown()
            if connected:  # a runtime this run started stops; a cluster stays up
                ray.shutdown()
                self._remove_session(failed=self.failed)

    def _here(self) -> Any:
        """Pin an actor to the driver's node (it survives the loss of any other node)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)

    def _start_manager(self) -> Any:
        """A Manager server on this node's address with the run's key, reachable by every
        node; the same objects the local backend's Manager holds."""
        from multiprocessing.managers import SyncManager

        import ray

        from mprl.backends.local.backend import _child_environment, _init_manager

        host = ray.util.get_node_ip_address()
        server = SyncManager(address=(host, 0), authkey=self.authkey, ctx=mp.get_context("spawn"))
        with _child_environment(1):
            server.start(initializer=_init_manager, initargs=("mprl-manager", ()))
        return server

    def _on_stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.monitor.on_stop(self._steps())

    def _steps(self) -> list[int]:
        steps = list(self.initial)
        for child in self.children:
            steps[child.role.slot] = child.base_steps + child.steps
        return steps

    def _event(self, kind: str, message: str, **fields: Any) -> None:
        self.monitor.on_event({"event": kind, "message": message, **fields})

    def _stop_reason(self) -> str | None:
        steps = self._steps()
        return self.monitor.on_tick(sum(steps), steps)

    # -- starting ------------------------------------------------------------------------------

    def _start_all(self) -> str | None:
        interval = self.job.run.start_interval
        for i, child in enumerate(self.children):
            if reason := self._stop_reason():
                return reason
            self._start(child)
            if child.role.role != "worker" or i == len(self.children) - 1:
                continue
            deadline = time.monotonic() + interval
            while time.monotonic() < deadline:
                tick = time.monotonic()
                self._poll_all(stop=False, wait_s=0.05)
                if reason := self._stop_reason():
                    return reason
                self._pause(min(deadline, tick + base.TICK_S))
        return None

    def _hub_host(self) -> Any:
        """The actor that hosts the run's transport hub: the train process's (made now, before
        the shared state that names it), or, in a run without one, an actor of its own pinned
        to the driver's node."""
        import ray

        from mprl.backends.ray.actor import ChildActor

        trainer = next((c for c in self.children if c.role.role == "trainer"), None)
        if trainer is not None:
            self._new_actor(trainer)
            return trainer.actor
        options = {"num_cpus": 0, "scheduling_strategy": self._here()}
        concurrency = self.job.run.workers + 4
        return (
            ray.remote(ChildActor)
            .options(max_concurrency=concurrency, **options)
            .remote(self.authkey)
        )

    def _threads(self, child: _Child) -> int:
        learner = self.learner.get("CPU", 1.0)
        cpus = self.job.run.worker_cpus if child.role.role == "worker" else learner
        return self.job.run.torch_threads or max(1, int(cpus or 1))

    def _new_actor(self, child: _Child) -> None:
        import ray

        from mprl.backends.ray.actor import ChildActor

        job, role = self.job, child.role
        if role.role == "worker":
            options = {"num_cpus": job.run.worker_cpus, "scheduling_strategy": "SPREAD"}
            concurrency = 4  # run, poll, and room to spare
        else:  # it hosts the hub too: every worker may be waiting in it at once
            options = _actor_options(self.learner)
            concurrency = job.run.workers + 4
        env = {k: str(self._threads(child)) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        child.actor = (
            ray.remote(ChildActor)
            .options(max_concurrency=concurrency, runtime_env={"env_vars": env}, **options)
            .remote(self.authkey)
        )

    def _start(self, child: _Child) -> None:
        job, role = self.job, child.role
        if child.actor is None:
            self._new_actor(child)
        threads = self._threads(child)
        child.where_ref = child.actor.where.remote()
        context = job.context(role, self.state, None, child.restarts)  # type: ignore[arg-type]
        child.run_ref = child.actor.run.remote(job.function(role), context, threads)
        child.poll_ref, child.answered, child.steps = None, False, 0
        child.model_sent = -1
        child.started_at = time.monotonic()
        child.restart_at = None

    def _kill(self, child: _Child) -> None:
        import ray

        if child.actor is not None:
            ray.kill(child.actor, no_restart=True)
            child.actor = None

    # -- supervision ---------------------------------------------------------------------------

    def _poll_all(self, stop: bool, wait_s: float = base.TICK_S) -> None:
        """Send a poll to every live child without one in flight, then take the answers
        that come within ``wait_s``."""
        import ray

        now = time.monotonic()
        want_state = self.job.algorithm.train is not None and now - self.last_sync >= SYNC_S
        total = sum(self._steps())
        for child in self.children:
            if not child.live() or (
                not stop and (child.poll_ref is not None or now - child.poll_sent < base.TICK_S)
            ):
                continue
            is_trainer = child.role.role == "trainer"
            model = None
            if not is_trainer and self.model_ref is not None and child.model_sent < self.model_gen:
                model, child.model_sent = self.model_ref, self.model_gen
            info = None if is_trainer else self.hub_info
            child.poll_ref = child.actor.poll.remote(
                stop, total, want_state and is_trainer, model, info
            )
            child.poll_sent = now
            if want_state and is_trainer:
                self.last_sync = now
        pending = [c.poll_ref for c in self.children if c.poll_ref is not None and c.live()]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        for child in self.children:
            if child.where_ref is not None and _ready(child.where_ref):
                self._placed(child)
            if child.poll_ref is not None and _ready(child.poll_ref):
                self._answer(child)

    def _placed(self, child: _Child) -> None:
        import ray

        try:
            where = ray.get(child.where_ref, timeout=CALL_TIMEOUT_S)
        except Exception:  # the actor died; its run ref says how
            where = None
        child.where_ref = None
        if where is None:
            return
        child.node = where["ip"]
        self._event(
            "placed",
            f"{child.role.who} runs on node {where['ip']} ({where['node_id'][:8]}, "
            f"pid {where['pid']})",
            rank=child.role.rank,
            node=where["ip"],
            node_id=where["node_id"],
            pid=where["pid"],
        )

    def _answer(self, child: _Child) -> None:
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
        if out.get("state"):
            self._load_state(out["state"])
        if out.get("hub"):
            self.hub_info = out["hub"]

    def _load_state(self, state: Mapping[str, list[Any]]) -> None:
        """The train process's model and optimizers, into the driver's copies (checkpoints and
        the policy check read them) and on to the workers."""
        import ray

        job = self.job
        model = ray.get(state["model"][0], timeout=CALL_TIMEOUT_S)
        job.model.load_state_dict(model)
        optimizers = ray.get(state["optimizers"][0], timeout=CALL_TIMEOUT_S)
        if job.optimizer is not None and optimizers["optimizer"] is not None:
            job.optimizer.load_state_dict(optimizers["optimizer"])
        for name, saved in optimizers["optimizers"].items():
            if name in job.optimizers:
                job.optimizers[name].load_state_dict(saved)
        modules = ray.get(state["modules"][0], timeout=CALL_TIMEOUT_S)
        for name, saved in modules.items():
            getattr(self.state, name).load_state_dict(saved)
        self.model_ref, self.model_gen = state["model"], self.model_gen + 1

    def _supervise(self) -> tuple[str, list[ChildFailure]]:
        timeout = self.job.run.worker_timeout
        cores = os.cpu_count() or 1
        startup = STARTUP_TIMEOUT_S * max(1.0, len(self.children) / cores)
        while True:
            tick = time.monotonic()
            self._poll_all(stop=False, wait_s=0.05)
            asked = self._stop_reason()
            if asked is not None and asked.startswith("SIG"):
                return asked, []
            failures = []
            now = time.monotonic()
            for child in self.children:
                if not child.live():
                    continue
                failure = None
                if _ready(child.run_ref):
                    failure = self._ended(child)
                    if failure is None:
                        continue
                else:
                    silent = self._silence(child, now)
                    limit = timeout if child.answered and not child.starting else startup
                    if not timeout or silent is None or silent < max(limit, timeout):
                        continue
                    failure = base.failure(
                        child.role,
                        None,
                        reason=f"hung: no heartbeat for {silent:.0f} s (--worker-timeout "
                        f"{timeout:g}); its actor was killed",
                    )
                    self._kill(child)
                failure = self._restart_or_fail(child, failure)
                if failure is not None:
                    failures.append(failure)
            if failures:
                return "failed", failures
            for child in self.children:
                if child.restart_at is not None and now >= child.restart_at:
                    self._start(child)
            done = [c.role for c in self.children if c.done]
            if reason := base.end_reason(self.job, done) or asked:
                return reason, []
            self._pause(tick + base.TICK_S)

    def _pause(self, until: float) -> None:
        """Wait until ``until``, or until a child's function returns or its actor dies."""
        import ray

        runs = [c.run_ref for c in self.children if c.live()]
        left = until - time.monotonic()
        if left <= 0:
            return
        if runs:
            ray.wait(runs, num_returns=1, timeout=left)
        else:
            time.sleep(left)

    def _silence(self, child: _Child, now: float) -> float | None:
        """Seconds since ``child`` last showed life: its heartbeat's age at the last answer,
        or, when a poll is not answered, how long it has been waiting."""
        if not child.answered:
            return now - child.started_at
        if child.poll_ref is not None and now - child.poll_sent > 1.0:
            return now - child.poll_sent
        return child.silent

    def _ended(self, child: _Child) -> ChildFailure | None:
        """``child``'s run returned or its actor died: ``None`` when it returned normally."""
        import ray

        try:
            result = ray.get(child.run_ref, timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as exc:
            where = f" on node {child.node}" if child.node else ""
            return base.failure(child.role, None, reason=f"its actor died{where}: {_cause(exc)}")
        except ray.exceptions.RayError as exc:
            return base.failure(child.role, 1, str(exc), reason="could not start its actor")
        self._last_poll(child)
        if result["code"] == 0:
            child.done = True
            if child.role.role != "trainer":  # the train process's final state is read later
                self._kill(child)
            return None
        where = f" on node {child.node}" if child.node else ""
        return base.failure(child.role, 1, result["traceback"], reason=f"raised{where}")

    def _last_poll(self, child: _Child) -> None:
        """Take what ``child`` reported after its last poll (its function returned)."""
        import ray

        with contextlib.suppress(Exception):  # the actor is gone: nothing more to take
            if child.poll_ref is not None:  # sent before the function returned: take it first
                ray.wait([child.poll_ref], timeout=CALL_TIMEOUT_S)
                self._answer(child)
            # then one sent now, which counts the function's last steps and records
            child.poll_ref = child.actor.poll.remote(False, sum(self._steps()), False, None)
            ray.wait([child.poll_ref], timeout=CALL_TIMEOUT_S)
            self._answer(child)

    def _restart_or_fail(self, child: _Child, failure: ChildFailure) -> ChildFailure | None:
        progressed = child.steps > 0
        self._kill(child)
        if self.hub is not None and child.role.role == "worker":
            for field in _transport_fields(self.state):
                self.hub.hub_call.remote("forget", field, child.role.rank)
        child.base_steps += child.steps
        child.steps = 0
        child.in_a_row = self.policy.in_a_row(child.in_a_row, progressed)
        decision = self.policy.decide(child.role.role, child.restarts, child.in_a_row)
        if decision.delay is None:
            child.done = True
            return attrs.evolve(failure, reason=failure.reason + decision.why_not)
        child.restarts += 1
        child.restart_at = time.monotonic() + decision.delay
        self._event(
            "restart",
            f"{failure.who} {failure.reason}; restarting it in {decision.delay:.1f} s "
            f"(restart {child.restarts} of {self.policy.max_restarts})",
            rank=child.role.rank,
            restarts=child.restarts,
            reason=failure.reason,
            traceback=failure.traceback,
        )
        return None

    def _stop(self) -> list[ChildFailure]:
        """Stop flag to every actor, a bounded wait for their functions to return, the train
        process's final state, then every actor killed."""
        import ray

        self._poll_all(stop=True, wait_s=0.0)
        running = [c for c in self.children if c.live()]
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            left = [c.run_ref for c in running if not _ready(c.run_ref)]
            if not left:
                break
            ray.wait(left, num_returns=len(left), timeout=min(0.25, deadline - time.monotonic()))
            self._poll_all(stop=False, wait_s=0.0)
        failures = []
        for child in running:
            if not _ready(child.run_ref):
                self._event(
                    "kill",
                    f"{child.role.who} did not stop within {STOP_GRACE_S:g} s; killing its actor",
                    rank=child.role.rank,
                )
                continue
            try:
                result = ray.get(child.run_ref, timeout=CALL_TIMEOUT_S)
            except ray.exceptions.RayError:
                continue
            self._last_poll(child)
            if result["code"] != 0:
                failures.append(base.failure(child.role, 1, result["traceback"], reason="raised"))
        trainer = next((c for c in running if c.role.role == "trainer"), None)
        if trainer is not None and trainer.actor is not None and _ready(trainer.run_ref):
            with contextlib.suppress(Exception):  # gone: the last synced state is kept
                ref = trainer.actor.poll.remote(True, sum(self._steps()), True, None)
                out = ray.get(ref, timeout=CALL_TIMEOUT_S)
                if out.get("state"):
                    self._load_state(out["state"])
        for child in self.children:
            if child.actor is not self.hub:  # the hub answers the final checkpoint
                self._kill(child)
            child.done = True
        return failures


def _reachable(address: str, timeout: float = 10.0) -> None:
    """Raise ``ConnectionError`` unless something listens at ``address`` (``HOST:PORT``; Ray's
    other forms, ``auto`` or ``ray://``, are left to Ray)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address}: {exc}") from None


def _unreachable(exc: BaseException) -> str:
    return (
        f"cannot join the Ray cluster ({_cause(exc)}); check --ray-address / RAY_ADDRESS, that "
        "`ray start --head` runs there, and that this machine holds the cluster's token "
        "(~/.ray/auth_token)"
    )


def _transport_fields(state: Any) -> list[str]:
    from mprl.backends.ray.transport import RayRollouts

    return [v.field for v in vars(state).values() if isinstance(v, RayRollouts)] if state else []


def _ready(ref: Any) -> bool:
    import ray

    if ref is None:
        return False
    done, _ = ray.wait([ref], timeout=0)
    return bool(done)


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
