"""The supervisor base on its own: a backend whose "processes" are scripted objects in this
process, so restarts, hang detection, the stop sequence and the end reasons are checked without
starting anything. The real backends' faults are in tests/integration/test_faults*.py."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from mprl.backends.base import Outcome, Role, end_reason
from mprl.backends.supervisor import FAILED, RETURNED, RUNNING, NotStarted, Status, Supervisor
from mprl.run_types import ChildFailure, RunConfig


@attrs.define
class Plan:
    """What one start of a child does: ends with ``code`` after ``after`` seconds (never when
    ``None``), beats unless ``hangs``, stops at the stop flag unless ``ignores`` it or is
    ``starting`` (then it runs until killed), takes ``steps`` steps."""

    code: int | None = None
    after: float = 0.0
    hangs: bool = False
    ignores: bool = False
    steps: int = 10
    starting: bool = False  # stays in its start-up work (and so never sees the stop flag)


class Proc:
    """A scripted child (a :class:`mprl.backends.supervisor.ChildHandle`)."""

    def __init__(self, sup: Scripted, slot: int, plan: Plan) -> None:
        self.sup, self.slot, self.plan = sup, slot, plan
        self.started = time.monotonic()
        self.code: int | None = None
        self.stopped = False

    def _end(self, code: int) -> None:
        if self.code is None:
            self.code = code
            self.sup.counts[self.slot] += self.plan.steps  # its steps, counted as it ends

    def poll(self) -> Status:
        plan = self.plan
        if self.code is None:
            if plan.code is not None and time.monotonic() - self.started >= plan.after:
                self._end(plan.code)
            elif self.stopped and not (plan.ignores or plan.hangs or plan.starting):
                self._end(0)
        if self.code is None:
            silent = time.monotonic() - self.started if plan.hangs else 0.0
            return Status(RUNNING, silent, plan.starting)
        return Status(RETURNED) if self.code == 0 else Status(FAILED, code=self.code)

    def stop(self) -> None:
        self.stopped = True

    def kill(self, stack: bool = False) -> str:
        if self.code is None:
            self.sup.killed.append((self.slot, stack))
            self._end(-signal.SIGKILL)
        return "File 'worker.py', line 3 in loop" if stack else ""


class Job:
    """As much of :class:`mprl.backends.base.Job` as the supervisor reads."""

    initial_steps = ()

    def __init__(self, workers: int, trainer: bool, **run: Any) -> None:
        self.run = RunConfig(workers=workers, **run)
        self.algorithm = type("Algo", (), {"train": object() if trainer else None})()

    def roles(self) -> list[Role]:
        n = self.run.workers
        workers = [Role("worker", rank, rank) for rank in range(n)]
        return ([Role("trainer", -1, n)] if self.algorithm.train is not None else []) + workers

    def context(self, role: Role, state: Any, channel: Any, restarts: int = 0) -> Any:
        return (role, restarts)


class Monitor:
    def __init__(self, stop_after: float | None = None, signal_name: str | None = None):
        self.events: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.stopped_with: list[int] | None = None
        self.signal_name = signal_name
        self.deadline = None if stop_after is None else time.monotonic() + stop_after

    def on_start(self, state: Any, refresh: Any = None) -> None:
        pass

    def on_event(self, record: dict[str, Any]) -> None:
        self.events.append(dict(record))

    def on_stop(self, per_slot_steps: Sequence[int]) -> None:
        assert self.stopped_with is None, "on_stop is called once"
        self.stopped_with = list(per_slot_steps)

    def on_records(self, records: Any) -> None:
        self.records.extend(dict(r) for r in records)

    def on_tick(self, env_steps: int, per_worker_steps: Sequence[int]) -> str | None:
        if self.signal_name is not None:
            return self.signal_name
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "total steps reached"
        return None


class Scripted(Supervisor):
    """A backend whose children follow :class:`Plan` s, one per start of each slot."""

    startup_timeout_s = 0.3
    stop_grace_s = 0.2

    def __init__(self, job: Job, monitor: Monitor, plans: dict[int, list[Plan]]) -> None:
        super().__init__(job, monitor)  # type: ignore[arg-type]
        self.plans = plans
        self.launches: dict[int, list[Any]] = {}
        self.counts = [0] * (job.run.workers + 2)
        self.killed: list[tuple[int, bool]] = []
        self.released = False

    def build_state(self) -> tuple[Any, str | None]:
        return object(), None

    def start(self, role: Role, ctx: Any) -> Proc:
        slot = role.slot
        self.launches.setdefault(slot, []).append(ctx)
        plans = self.plans.get(slot, [Plan()])
        return Proc(self, slot, plans[min(len(self.launches[slot]) - 1, len(plans) - 1)])

    def take(self) -> list[int]:
        return list(self.counts)

    def release(self) -> None:
        self.released = True


def run(plans: dict[int, list[Plan]], workers: int = 2, trainer: bool = False,
        monitor: Monitor | None = None, **run_options: Any) -> tuple[Outcome, Scripted, Monitor]:  # fmt: skip
    monitor = monitor or Monitor(stop_after=0.6)
    options = {"worker_timeout": 0.2, "restart_delay": 0.0, **run_options}
    sup = Scripted(Job(workers, trainer, **options), monitor, plans)
    outcome = sup.execute()
    assert sup.released and monitor.stopped_with is not None  # the template's last steps ran
    return outcome, sup, monitor


def test_children_that_keep_running_stop_with_the_monitors_reason():
    outcome, _, monitor = run({})
    assert outcome.stop_reason == "total steps reached" and not outcome.failures
    assert outcome.restarts == (0, 0) and outcome.shutdown_s is not None
    assert monitor.stopped_with == [10, 10, 0, 0]  # the steps counted when they returned


def test_a_crashed_worker_is_restarted_on_its_rank_until_its_restarts_are_spent():
    crash = Plan(code=3, after=0.05)
    outcome, sup, monitor = run({1: [crash]}, max_restarts=1, max_consecutive_failures=5)
    assert outcome.stop_reason == "failed" and outcome.restarts == (0, 1)
    (f,) = outcome.failures
    assert (f.role, f.rank, f.exitcode) == ("worker", 1, 3)
    assert f.reason == "exited with code 3; no restarts left (1 of 1 spent)"
    assert [ctx[1] for ctx in sup.launches[1]] == [0, 1]  # the context knows its restarts
    restart = next(e for e in monitor.events if e["event"] == "restart")
    assert restart["rank"] == 1 and "restart 1 of 1" in restart["message"]


def test_failures_in_a_row_without_a_step_give_up_before_the_restarts_are_spent():
    crash = Plan(code=1, after=0.0, steps=0)
    outcome, _, _ = run({0: [crash]}, max_restarts=10, max_consecutive_failures=2)
    (f,) = outcome.failures
    assert "failed 2 times in a row without taking a step" in f.reason
    assert outcome.restarts == (1, 0)


def test_a_silent_worker_is_killed_as_hung_with_its_stack():
    outcome, sup, _ = run({0: [Plan(hangs=True)]})
    assert sup.killed == [(0, True)]
    (f,) = outcome.failures
    assert f.reason.startswith("hung: no heartbeat for ") and f.reason.endswith("; killed")
    assert "--worker-timeout 0.2" in f.reason and "worker.py" in f.traceback


def test_a_trainer_that_returns_ends_the_job_and_is_never_restarted():
    outcome, _, _ = run({2: [Plan(code=0, after=0.05)]}, trainer=True)
    assert outcome.stop_reason == "trainer finished" and not outcome.failures
    crashed, _, _ = run({2: [Plan(code=1, after=0.05)]}, trainer=True, max_restarts=3)
    assert [f.who for f in crashed.failures] == ["trainer"]


def test_children_that_ignore_the_stop_flag_are_killed_after_the_grace():
    outcome, sup, monitor = run({0: [Plan(ignores=True)], 1: [Plan()]})
    kills = [(e["event"], e["rank"]) for e in monitor.events if e["event"] == "kill"]
    assert kills == [("kill", 0)] and sup.killed == [(0, False)]
    assert "worker 0 did not stop within 0.2 s; killed" in monitor.events[0]["message"]
    assert outcome.shutdown_s is not None and 0.2 <= outcome.shutdown_s < 2.0  # bounded
    assert not outcome.failures  # a kill at the stop is reported, not a failure


def test_a_child_still_starting_at_the_stop_is_killed_after_the_grace_and_only_logged():
    # (a run that ends as it starts, or a loaded machine: its start-up outlasts the grace)
    outcome, sup, monitor = run({0: [Plan(starting=True)], 1: [Plan(ignores=True)]})
    assert sorted(sup.killed) == [(0, False), (1, False)]
    said = [e["message"] for e in monitor.events if e["event"] == "kill"]
    assert said == ["worker 1 did not stop within 0.2 s; killed"]  # it ran, and ignored it
    (logged,) = [r for r in monitor.records if r.get("event") == "kill"]
    assert logged["rank"] == 0 and logged["source"] == "main"
    assert logged["message"] == "worker 0 was still starting when the run stopped; killed"
    assert not outcome.failures and 0.2 <= outcome.shutdown_s < 2.0


def test_a_child_ended_by_a_signal_the_main_process_also_got_is_a_stop_not_a_crash():
    monitor = Monitor(signal_name="SIGTERM")
    outcome, _, _ = run({0: [Plan(code=-signal.SIGTERM)]}, monitor=monitor)
    assert outcome.stop_reason == "SIGTERM" and not outcome.failures


def test_a_job_that_cannot_start_ends_with_the_backends_outcome_and_releases():
    class Unstartable(Scripted):
        def build_state(self) -> tuple[Any, str | None]:
            why = ChildFailure("Manager server", -1, None, "failed to start")
            raise NotStarted(Outcome("failed", [why]))

    sup = Unstartable(Job(1, False), Monitor(), {})  # type: ignore[arg-type]
    outcome = sup.execute()
    assert outcome.failures[0].who == "Manager server" and sup.released and not sup.launches


def test_the_end_reason_needs_every_worker_or_the_trainer():
    job = Job(2, True)
    w0, w1, trainer = Role("worker", 0, 0), Role("worker", 1, 1), Role("trainer", -1, 2)
    assert end_reason(job, [w0]) is None  # type: ignore[arg-type]
    assert end_reason(job, [w0, w1]) == "workers finished"  # type: ignore[arg-type]
    assert end_reason(job, [trainer]) == "trainer finished"  # type: ignore[arg-type]


@pytest.mark.parametrize("start_interval", [0.0, 0.15])
def test_children_start_in_order_the_trainer_first_and_workers_staggered(start_interval):
    monitor = Monitor(stop_after=0.5)
    sup = Scripted(Job(3, True, start_interval=start_interval), monitor, {})  # type: ignore[arg-type]
    launched: list[tuple[int, float]] = []
    original = sup.start

    def start(role: Role, ctx: Any) -> Proc:
        launched.append((role.slot, time.monotonic()))
        return original(role, ctx)

    sup.start = start  # type: ignore[method-assign]
    sup.execute()
    assert [slot for slot, _ in launched] == [3, 0, 1, 2]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(launched[1:])]  # the workers'
    assert all(g >= start_interval for g in gaps)


class Budget(Monitor):
    """Stops at an env-step budget, and keeps the step count of every look."""

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total, self.looks = total, []

    def on_tick(self, env_steps: int, per_worker_steps: Sequence[int]) -> str | None:
        self.looks.append(env_steps)
        return "total steps reached" if env_steps >= self.total else None


class Steady(Scripted):
    """Children that step at ``rate`` env steps a second from their launch."""

    rate = 2000.0
    t0: float | None = None

    def start(self, role: Role, ctx: Any) -> Proc:
        self.t0 = self.t0 or time.monotonic()
        return super().start(role, ctx)

    def take(self) -> list[int]:
        moving = 0 if self.t0 is None else int(self.rate * (time.monotonic() - self.t0))
        return [moving, 0, 0, 0]


def test_a_run_with_a_step_budget_is_looked_at_when_the_budget_is_due_not_a_tick_later():
    """2,000 steps a second and a budget of 600: due at 0.3 s. Looks a tick (0.25 s) apart
    would see 500, then 1,000 steps; the supervisor looks again when the rate says it is due."""
    monitor = Budget(total=600)
    sup = Steady(Job(1, False, total_steps=600, restart_delay=0.0), monitor, {})
    outcome = sup.execute()
    assert outcome.stop_reason == "total steps reached"
    assert 600 <= monitor.looks[-1] < 800, monitor.looks  # seen within 0.1 s of being due
