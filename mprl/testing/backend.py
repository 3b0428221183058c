"""The backend conformance suite: what every backend keeps, as tests to inherit.

:class:`BackendConformance` holds the tests; a test class that inherits them names the backend
under test (a ``backend`` fixture: its registered name) and what it cannot do, in the shape of
fsspec's abstract tests. mprl runs it on ``local``, ``serial`` and ``ray``; the ``threads``
backend in ``examples/mprl-threads`` runs it on itself::

    from mprl.testing import BackendConformance

    class TestThreads(BackendConformance):
        hangs_killed = False  # a thread cannot be killed in a C call: said, not done

        @pytest.fixture
        def backend(self):
            return "threads"

Each test is a real run of the algorithm ``mprl-conformance`` (this module's, registered by the
suite), whose workers and train process do what the test asks through its config: raise, fall
silent, leave their process, ignore the stop flag, send the main process a Ctrl-C. A run goes
through :func:`mprl.run` in the test's process, so the backend must be registered in the test's
plugin manager (installed, or given by a ``backend_plugins`` fixture).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

import mprl
from mprl import schema
from mprl.errors import RunFailed
from mprl.hookspecs import hookimpl

NAME = "mprl-conformance"
#: the seconds every test allows beyond what the backend's own bounds say
SLACK_S = 15.0


@attrs.frozen
class ConformanceConfig:
    """What the conformance algorithm's processes do. ``who``: ``"worker:RANK"``,
    ``"trainer"`` or ``""`` (nobody)."""

    crash: str = attrs.field(default="", metadata={"help": "who raises (first start only)"})
    hang: str = attrs.field(default="", metadata={"help": "who falls silent (first start only)"})
    exit: str = attrs.field(default="", metadata={"help": "who ends its process, code 3"})
    ignore_stop: str = attrs.field(default="", metadata={"help": "who ignores the stop flag"})
    after: int = attrs.field(default=50, metadata={"help": "env steps before the fault"})
    interrupt: int = attrs.field(
        default=0, metadata={"help": "episodes after which the main process gets SIGINT"}
    )


def _who(ctx: mprl.Context) -> str:
    return "trainer" if ctx.role == "trainer" else f"worker:{ctx.rank}"


def _fault(ctx: mprl.Context, taken: int) -> None:
    """Do what the config asks of this process once it has taken ``taken`` env steps."""
    config, who = ctx.config, _who(ctx)
    if taken < config.after:
        return
    if config.crash == who and ctx.restarts == 0:
        raise RuntimeError(f"conformance: injected crash in {who}")
    if config.hang == who and ctx.restarts == 0:
        while True:  # silent: no heartbeat, no stop check
            time.sleep(0.05)
    if config.exit == who:
        os._exit(3)


def _stubborn(ctx: mprl.Context) -> None:
    """Go on beating after the stop flag, never returning."""
    while True:
        time.sleep(0.01)
        ctx.heartbeat()


def worker(ctx: mprl.Context) -> None:
    taken = 0
    while not ctx.should_stop():
        time.sleep(0.002)
        ctx.add_steps(5)
        taken += 5
        if taken % 25 == 0:
            ctx.log_episode(1.0, 25)
        _fault(ctx, taken)
    if ctx.config.ignore_stop == _who(ctx):
        _stubborn(ctx)


def train(ctx: mprl.Context) -> None:
    while not ctx.should_stop():
        time.sleep(0.01)
        ctx.state.updates.add(1)
        _fault(ctx, ctx.env_steps)
    if ctx.config.ignore_stop == "trainer":
        _stubborn(ctx)


def make_model(observation_space: Any, action_space: Any, config: Any) -> torch.nn.Module:
    return torch.nn.Linear(4, 2)


ALGORITHM = mprl.Algorithm(
    name=NAME,
    config_cls=ConformanceConfig,
    make_model=make_model,
    worker=worker,
    train=train,
    schema=schema.Schema(updates=schema.Counter()),
    description="the backend conformance suite's processes (mprl.testing.BackendConformance)",
)


class _Plugin:
    """The suite's plugin: the algorithm, and the Ctrl-C a test asks for."""

    def __init__(self) -> None:
        self.episodes = 0
        self.sent = False

    @hookimpl
    def mprl_register_algorithms(self, register: Callable[[mprl.Algorithm], None]) -> None:
        register(ALGORITHM)

    @hookimpl
    def mprl_report_metrics(self, run: Any, records: Sequence[Mapping[str, Any]]) -> None:
        self.episodes += sum("episode_return" in r for r in records)
        wanted = getattr(run.config, "interrupt", 0)
        if wanted and self.episodes >= wanted and not self.sent:
            self.sent = True  # here, in the main process while the run's handlers are in
            os.kill(os.getpid(), signal.SIGINT)


def _children() -> set[int]:
    """The live processes whose parent is this one, but for its resource tracker
    (multiprocessing's, which lives as long as this process, whichever run started it)."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) != me or fields[0] == "Z":
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in command:
            out.add(int(entry.name))
    return out


class BackendConformance:
    """The tests every backend passes (see the module's docstring). A capability set to
    ``False`` in the subclass marks its test an expected failure, with the reason."""

    #: a failed worker is started again on its rank (``--max-restarts``)
    restarts = True
    #: a silent child is noticed (``--worker-timeout``) and killed
    hangs_killed = True
    #: a child can end its process (``os._exit``) without ending the test's
    exits = True
    #: a child that ignores the stop flag is ended within the backend's grace
    bounded_stop = True
    #: the backend's grace after the stop flag (``Supervisor.stop_grace_s``)
    stop_grace_s = 5.0

    @pytest.fixture
    def backend(self) -> str:
        raise NotImplementedError("give the backend's registered name as a `backend` fixture")

    @pytest.fixture
    def backend_plugins(self) -> Sequence[object]:
        """Plugins to register besides mprl's built-ins: the backend's, when not installed."""
        return ()

    @pytest.fixture
    def backend_options(self) -> Mapping[str, Any]:
        """Run options every run of the suite gets (``ray_address=...``)."""
        return {}

    @pytest.fixture
    def run_job(
        self,
        backend: str,
        backend_plugins: Sequence[object],
        backend_options: Mapping[str, Any],
        tmp_path: Path,
    ) -> Iterator[Callable[..., mprl.Summary]]:
        """``run_job(config={...}, **run_options)``: a run of the conformance algorithm on the
        backend; its summary, whether it finished or failed. Checks afterwards that it left no
        process and no thread of its own."""
        from mprl.host.plugins import get_plugin_manager

        before, children = set(threading.enumerate()), _children()
        count = 0

        def run(config: Mapping[str, Any] | None = None, **options: Any) -> mprl.Summary:
            nonlocal count
            count += 1
            pm = get_plugin_manager()  # the installed plugins: a backend among them
            for plugin in (_Plugin(), *backend_plugins):
                pm.register(plugin)
            pm.check()
            # max_time: a net for a run that would never end (a backend that lost a child),
            # not a bound any check relies on; a loaded machine can take a minute to start
            # a Ray run's actors
            options = {"workers": 2, "total_steps": 10**9, "max_time": 240.0, **options}
            try:
                return mprl.run(
                    NAME, config=dict(config or {}), backend=backend, plugins=pm,
                    run_dir=tmp_path / f"run{count}", progress="none",
                    **backend_options, **options,
                )  # fmt: skip
            except RunFailed as exc:
                assert exc.summary is not None
                return exc.summary  # type: ignore[return-value]

        yield run
        deadline = time.monotonic() + SLACK_S
        while (_children() - children or set(threading.enumerate()) - before) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        left_over = _children() - children
        assert not left_over, f"processes left behind: {sorted(left_over)}"
        left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
        assert not left, f"threads left behind: {left}"

    def _need(self, capability: str, why: str) -> None:
        if not getattr(self, capability):
            pytest.xfail(f"this backend {why}")

    # -- the tests ---------------------------------------------------------------------------

    def test_a_job_runs_to_its_budget_and_stops(self, run_job):
        summary = run_job(total_steps=400)
        assert summary.status == "finished" and summary.stop_reason == "total steps reached"
        assert summary.env_steps >= 400 and summary.episodes > 0
        # the workers' counts are the run's (one may have spent a budget this small before the
        # other started: a process sees the budget spent as soon as the run's count reaches it)
        assert sum(summary.per_worker_steps) == summary.env_steps, summary
        assert summary.exit_code == 0

    @pytest.mark.parametrize("who", ["worker:1", "trainer"])
    def test_a_process_that_raises_fails_the_run_with_its_traceback_and_role(self, run_job, who):
        start = time.monotonic()
        summary = run_job(config={"crash": who})
        assert summary.status == "failed" and summary.exit_code == 1
        (failure,) = summary.failures
        assert f"{failure.role}:{failure.rank}".replace("trainer:-1", "trainer") == who
        assert f"injected crash in {who}" in failure.traceback
        # ended by the failure, long before the run's net (max_time 240 s), with room for a
        # loaded machine's start-up (Ray's actors took 90-100 s to start beside three busy
        # processes on 2 cores)
        assert time.monotonic() - start < 120 + SLACK_S

    def test_a_failed_worker_is_restarted_on_its_rank(self, run_job):
        self._need("restarts", "does not restart a failed worker")
        # a budget the other worker alone takes seconds to spend (2,500 steps/s): worker 0 may
        # start seconds after it (Ray actors on a loaded machine), and a crash that comes once
        # the budget is spent, while the run stops, fails the run
        summary = run_job(config={"crash": "worker:0"}, total_steps=20_000, max_restarts=1,
                          restart_delay=0.1)  # fmt: skip
        assert summary.status == "finished", summary.failures
        assert summary.restarts[0] == 1 and summary.restarts[1] == 0

    def test_a_silent_worker_is_killed_as_hung(self, run_job):
        self._need("hangs_killed", "cannot kill a silent child")
        summary = run_job(config={"hang": "worker:0"}, worker_timeout=2.0)
        assert summary.status == "failed"
        (failure,) = summary.failures
        assert failure.rank == 0 and failure.reason.startswith("hung: no heartbeat")

    def test_a_process_that_ends_itself_fails_the_run_naming_it(self, run_job):
        self._need("exits", "runs its children in the test's own process")
        summary = run_job(config={"exit": "worker:1"})
        assert summary.status == "failed"
        (failure,) = summary.failures
        assert (failure.role, failure.rank) == ("worker", 1) and failure.reason
        if failure.exitcode is not None:  # where the backend can know it (not through Ray)
            assert failure.exitcode == 3 and "exited with code 3" in failure.reason

    def test_a_process_that_ignores_the_stop_is_ended_within_the_grace(self, run_job):
        self._need("bounded_stop", "cannot end a child that ignores the stop flag")
        summary = run_job(config={"ignore_stop": "worker:0"}, total_steps=300)
        assert summary.status == "finished" and not summary.failures
        assert summary.shutdown_s is not None
        assert self.stop_grace_s <= summary.shutdown_s < self.stop_grace_s + SLACK_S

    def test_a_ctrl_c_to_the_main_process_stops_the_run_cleanly(self, run_job, tmp_path):
        summary = run_job(config={"interrupt": 3})
        assert summary.status == "interrupted" and summary.stop_reason == "SIGINT"
        assert summary.exit_code == 130 and not summary.failures
        assert (Path(summary.run_dir) / "checkpoints" / "last.pt").is_file()
