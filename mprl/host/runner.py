"""One training run, from checked input to ``summary.json``: the public :func:`run`.

A run is three steps: prepare the job (:func:`mprl.host.job.prepare_job`: input checked, model
built, nothing started), execute it on a backend with a :class:`~mprl.host.monitor.RunMonitor`
watching, and finish (summary, reporters, exit status).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from mprl.backends.base import Backend, Outcome, stop_unused_starts
from mprl.errors import RunFailed, UsageError
from mprl.host import checkpoint
from mprl.host.config import as_dict
from mprl.host.envs import make_env
from mprl.host.job import Prepared, prepare_job
from mprl.host.monitor import CUT, RunMonitor, describe_write_error, finite
from mprl.host.plugins import PluginManager, get_plugin_manager
from mprl.host.policy_check import CHECK_EPISODES, Evaluation, PolicyCheck
from mprl.host.progress import Progress, check_mode, say
from mprl.host.rundir import RunDir
from mprl.host.stats import RunStats
from mprl.run_types import RunInfo, Summary
from mprl.timeline import mark
from mprl.version import __version__

#: what a Ctrl-C after the first says while a checkpoint is being saved
WAITING = "mprl: saving the checkpoint; Ctrl-C again to exit without it"
#: what a run started with SIGINT ignored (a background job of a script) says as it starts
IGNORED_SIGINT = (
    "mprl: SIGINT was ignored when the run started (as in a background job) and stays so: "
    "Ctrl-C does not stop the run; SIGTERM does, cleanly (kill {pid})"
)


class _Signals:
    """First SIGINT / SIGTERM / SIGHUP asks for a clean stop; a second SIGINT forces a fast exit.

    SIGHUP (the terminal was closed, an ssh session ended) is a stop like SIGTERM, exit 129.
    A SIGINT or SIGHUP ignored when the run starts stays ignored for the whole run, as asked:
    SIGHUP under ``nohup``, SIGINT in a background job of a script (the shell's way to keep a
    Ctrl-C at the terminal from reaching it); SIGTERM still stops the run cleanly (143).

    While a checkpoint is being saved (:meth:`saving`), a SIGINT after the first says that the
    run waits for it (:data:`WAITING`); one more asks to exit without it (:attr:`cut`): the
    write stops at its next chunk, and the previous checkpoint is kept. One more after that
    (a save stuck before its write starts) forces the exit.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.forced = False
        #: a Ctrl-C more, during a checkpoint's save, asked to exit without it
        self.cut = False
        self._saving = False
        self._answered = False  # a Ctrl-C during this save was told it waits
        #: the terminal's signals ignored when the run started, left so (:meth:`installed`)
        self.kept: tuple[int, ...] = ()

    def handle(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            if self._saving and not self.cut:  # the save goes on, or stops at its next chunk
                if not self._answered:
                    self._answered = True
                    with contextlib.suppress(RuntimeError):  # (stderr was being written)
                        say(WAITING)
                else:
                    self.cut = True
                return
            # one more after the cut (a save stuck before its write, or in it), or no save
            if not self.forced:  # once: the forced exit's own cleanup must not be interrupted
                self.forced = True
                raise KeyboardInterrupt
            return
        if self.received is None:
            self.received = signum

    @contextmanager
    def saving(self) -> Iterator[None]:
        """A checkpoint is being saved: a Ctrl-C waits for it (one more cuts it short)."""
        self._saving, self._answered = True, False
        try:
            yield
        finally:
            self._saving = self._answered = False

    @contextmanager
    def installed(self) -> Iterator[_Signals]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        # nohup's SIGHUP, a background job's SIGINT: left ignored (Python, started with SIGINT
        # ignored, keeps it so; nothing before the run puts in a handler for either then)
        terminal = (signal.SIGINT, signal.SIGHUP)
        self.kept = tuple(s for s in terminal if signal.getsignal(s) is signal.SIG_IGN)
        wanted = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if s not in self.kept]
        old = {s: signal.signal(s, self.handle) for s in wanted}
        try:
            yield self
        finally:
            for s, h in old.items():  # None: one set outside Python (Ray's), not restorable
                signal.signal(s, h if h is not None else signal.SIG_DFL)


def run(
    plugin: str | None = None,
    *,
    config: Mapping[str, Any] | Any | None = None,
    env: str | None = None,
    workers: int | None = None,
    seed: int | None = None,
    total_steps: int | None = None,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    resume_drop: str | Sequence[str] = (),
    progress: str = "auto",
    plugins: PluginManager | None = None,
    **run_options: Any,
) -> Summary:
    """Train algorithm ``plugin`` and return how the run ended.

    Every run option can be given as a keyword (``max_restarts=2``...): the fields of
    :class:`RunConfig` and those plugins register (``mprl_register_options``).
    ``resume=RUN_DIR`` (or a checkpoint file) continues a run from its last checkpoint: the
    plugin, config and run options are the checkpoint's unless given here, counters continue
    and metrics are appended (to ``run_dir`` when given, else to the original run directory).
    Its shared state is fitted to the run (another ``workers``: replay rows re-partitioned,
    per-worker lists extended or cut, each said in a line); ``resume_drop`` names fields
    (``"a,b"`` or a list) whose checkpointed data is left out, which a field that cannot be
    fitted (a ``Tensor`` sized by the workers) needs.

    ``progress`` is what the run prints to stderr while it goes on: ``"auto"`` (the default: a
    live panel on a terminal, else ``"plain"``), ``"live"``, ``"plain"`` (a line every 5 s)
    or ``"none"`` (only the lines that must be seen: restarts, failures); any other value is
    a :class:`mprl.errors.UsageError` naming these.

    Everything is checked before any process starts (plugin, config, env id, action space,
    checkpoint, what the backend needs); a problem raises :class:`mprl.errors.UsageError`. A
    crashed child raises :class:`RunFailed` after every process has stopped. Ctrl-C / SIGTERM
    stop the run cleanly and return a summary with ``status="interrupted"``; a SIGINT or
    SIGHUP this process ignores when the run starts (a background job, ``nohup``) stays ignored.
    """
    check_mode(progress)
    pm = plugins or get_plugin_manager()
    pm.run_options().unknown(run_options, "mprl.run()")
    options = {"env": env, "workers": workers, "seed": seed, "total_steps": total_steps}
    drop = resume_drop.split(",") if isinstance(resume_drop, str) else resume_drop
    drop = [name.strip() for name in drop if name.strip()]
    plan = prepare_job(pm, plugin, config, {**options, **run_options}, resume, drop)
    _check_evaluation(plan)
    backend = pm.backend(plan.job.run.backend)
    notes = backend.prepare(plan.job)
    with contextlib.closing(backend):  # what prepare() opened (a cluster connection)
        stop_unused_starts()
        mark("prepared")
        return _run_prepared(plan, backend, notes, run_dir, progress, pm)


def _check_evaluation(plan: Prepared) -> None:
    """``--eval-every`` plays the model's ``act(obs_batch, deterministic)``: a model without
    one is refused before anything starts."""
    job = plan.job
    if job.run.eval_every and not callable(getattr(job.model, "act", None)):
        raise UsageError(
            f"--eval-every {job.run.eval_every}: algorithm {job.algorithm.name!r} of plugin "
            f"{plan.plugin!r} has a model ({type(job.model).__name__}) without an "
            "act(obs_batch, deterministic) method, which evaluation episodes play with; add "
            "one to the model (returning one action per observation, the mode of the policy "
            "when deterministic is true; the networks in mprl.lib.nets have one), or leave "
            "--eval-every out"
        )


def _run_prepared(
    plan: Prepared,
    backend: Backend,
    notes: list[str],
    run_dir: str | Path | None,
    progress: str,
    pm: PluginManager,
) -> Summary:
    """The run of a prepared job: its run directory, the backend's execution, the summary."""
    signals = _Signals()
    # from here on a SIGINT / SIGTERM (to the whole process group, too) is a clean stop with a
    # summary: one that comes as the run directory is made finds it made, and the run stops
    # before its first child starts; the directory stays locked until the run is over
    with signals.installed():
        rundir, info = _open_rundir(plan, run_dir)
        with contextlib.closing(rundir):
            display = Progress(progress)
            monitor = _monitor(plan, info, rundir, pm, display, signals)
            try:
                pm.hook.mprl_run_start(run=info)
            except UsageError:  # a reporter cannot start (a missing package): nothing ran yet
                if plan.resume is None:
                    rundir.discard()
                raise
            outcome = _execute(plan, backend, monitor, display, signals, notes)
            return _finish(plan, info, rundir, outcome, monitor, pm, signals)


def _open_rundir(plan: Prepared, run_dir: str | Path | None) -> tuple[RunDir, RunInfo]:
    """The run directory (a new one, or the resumed run's) with ``config.json`` written.

    One that cannot be made or written (a full disk, a read-only directory, a link planted in
    it, a name too long) is refused with a :class:`UsageError` naming it before anything
    starts, and what was made of a new one is removed; so is resuming a checkpoint other than
    the run's ``last.pt`` in place (:func:`checkpoint.resumed_run_dir`).
    """
    job = plan.job
    if plan.resume is not None and run_dir is None:
        rundir = RunDir.reopen(checkpoint.resumed_run_dir(plan.resume.file))
    else:
        rundir = RunDir.create(run_dir, job.algorithm.name, job.run.env)
    info = RunInfo(
        plan.plugin, plan.plugin_version, job.algorithm.name, job.config, job.run, rundir.path,
        plan.reward_threshold,
    )  # fmt: skip
    try:
        _write_config(rundir, plan)
    except BaseException:
        rundir.discard()  # what create() made; a resumed run's directory is only closed
        raise
    return rundir, info


def _write_config(rundir: RunDir, plan: Prepared) -> None:
    job = plan.job
    rundir.write_config(
        {
            "plugin": plan.plugin,
            "plugin_version": plan.plugin_version,
            "plugin_distribution": plan.plugin_distribution,
            "algorithm": job.algorithm.name,
            "mprl_version": __version__,
            "reward_threshold": plan.reward_threshold,
            "session": job.session,
            "run": job.run.to_dict(),
            "config": as_dict(job.config),
        },
    )


def _monitor(
    plan: Prepared,
    info: RunInfo,
    rundir: RunDir,
    pm: PluginManager,
    display: Progress,
    signals: _Signals,
) -> RunMonitor:
    job = plan.job
    stats = RunStats(plan.reward_threshold, job.run.total_steps, job.run.max_time)
    stats.workers = job.run.workers
    if plan.resume is not None:
        stats.restore(plan.resume.data["stats"])
        stats.set_steps(job.initial_steps)  # the run's step from the start (the resume record)
        checkpoint.set_rng_states(plan.resume.data["rng"])

    def make_envs() -> list[Any]:
        run = job.run
        return [make_env(pm, run.env, seed=run.seed, index=i) for i in range(CHECK_EPISODES)]

    check = PolicyCheck(job.model, make_envs, job.algorithm.name)
    evaluation = None
    if job.run.eval_every:
        run = job.run
        side_by_side = min(run.eval_episodes, CHECK_EPISODES)

        def make_eval_envs() -> list[Any]:
            return [make_env(pm, run.env, seed=run.seed, index=i) for i in range(side_by_side)]

        evaluation = Evaluation(
            job.model, make_eval_envs, job.algorithm.name, every=run.eval_every,
            episodes=run.eval_episodes, seed=run.seed, env_steps=sum(job.initial_steps),
        )  # fmt: skip
    job = attrs.evolve(job, run_dir=rundir.path)
    return RunMonitor(
        info, job, rundir, pm, display, lambda: signals.received, stats, check, evaluation,
        interrupts=signals,
    )  # fmt: skip


def _execute(
    plan: Prepared,
    backend: Backend,
    monitor: RunMonitor,
    display: Progress,
    signals: _Signals,
    notes: list[str],
) -> Outcome:
    """Run the job on ``backend`` with the progress display up and the signal handlers in."""
    job = monitor.job
    title = f"mprl: {job.algorithm.name} on {job.run.env}, {job.run.workers} workers"
    if plan.resume is not None:
        title = (
            f"mprl: resuming {job.algorithm.name} on {job.run.env} at "
            f"{sum(job.initial_steps):,} env steps (session {job.session}), "
            f"{job.run.workers} workers"
        )
    display.start(f"{title} -> {monitor.rundir.path}")
    if signal.SIGINT in signals.kept and display.mode != "none":  # (nohup says its own)
        display.message(IGNORED_SIGINT.format(pid=os.getpid()))
    for note in notes:
        display.message(f"mprl: {note}")
    if plan.resume is not None:
        monitor.on_event(
            {
                "event": "resume",
                "message": f"resumed from {plan.resume.file}",
                "session": job.session,
            }
        )
        for name, note in plan.state_notes.items():  # what fitting the shared state did
            monitor.on_event(
                {
                    "event": "resume-state",
                    "message": f"resume: {note}",
                    "field": name,
                }
            )
    try:
        return backend.execute(job, monitor)
    except KeyboardInterrupt:
        if not signals.forced:
            raise
        return Outcome("second SIGINT: forced exit")  # the children were killed
    finally:
        display.stop(monitor.stats.snapshot())


def _finish(
    plan: Prepared,
    info: RunInfo,
    rundir: RunDir,
    outcome: Outcome,
    monitor: RunMonitor,
    pm: PluginManager,
    signals: _Signals,
) -> Summary:
    """Write ``summary.json``, tell the reporters, and raise :class:`RunFailed` on a crash, or
    when the run had to stop because its metrics could not be written (a full disk)."""
    summary = _summary(plan, rundir, outcome, monitor, signals)
    try:
        rundir.write_json("summary.json", summary.to_dict())
        unwritten = ""
    except OSError as exc:  # a full disk: said, and the run ends as it would have
        unwritten = f"summary.json not written ({describe_write_error(exc, rundir.path)})"
        if monitor.fault is None and not outcome.failures:  # else the last line says it
            say(f"mprl: {unwritten}")
        if monitor.fault is not None or not outcome.failures:  # with its cause, once
            unwritten = "summary.json not written"
    _close(rundir)
    pm.hook.mprl_run_end(run=info, summary=summary.to_dict())
    _say_end(summary, outcome, monitor, signals, rundir, unwritten)
    mark("finished")
    return summary


def _summary(
    plan: Prepared, rundir: RunDir, outcome: Outcome, monitor: RunMonitor, signals: _Signals
) -> Summary:
    """What ``summary.json`` says of the run."""
    stats, job = monitor.stats, plan.job
    status = "failed" if outcome.failures or monitor.fault else "finished"
    if signals.received is not None:  # stopped by the user, whatever happened after
        status = "interrupted"
    return Summary(
        status=status,
        stop_reason=outcome.stop_reason,
        solved=stats.solved(),
        env_steps=stats.env_steps,
        episodes=stats.episodes,
        wall_s=round(stats.wall_s, 3),
        mean_return_100=finite(stats.mean_return_100),
        best_return=finite(stats.best_return),
        run_dir=rundir.path,
        plugin=plan.plugin,
        algorithm=job.algorithm.name,
        env=job.run.env,
        per_worker_steps=stats.per_worker[: job.run.workers],
        restarts=tuple(outcome.restarts),
        session=job.session,
        shutdown_s=outcome.shutdown_s,
        failures=tuple(outcome.failures),
        signal=signals.received,
        solved_at=stats.solved_at,
        checkpoint=monitor.kept(),
        solved_on=_solved_on(stats.solved_at, monitor.solved_on),
        last_eval=stats.last_eval,
        checkpoint_failures=monitor.checkpoint_failures,
    )


def _say_end(
    summary: Summary,
    outcome: Outcome,
    monitor: RunMonitor,
    signals: _Signals,
    rundir: RunDir,
    unwritten: str,
) -> None:
    """The last lines of a run that did not simply finish; raise :class:`RunFailed` where it
    failed (a child's crash first, then the main process's own fault)."""
    kept, steps = summary.checkpoint, monitor.stats.env_steps
    cut = monitor.checkpoint_error == CUT
    if signals.forced:
        saved = None if kept is None else kept["env_steps"]
        say(
            "mprl: forced exit (second Ctrl-C): the children were killed; "
            + (f"its checkpoint was {CUT}; " if cut else "")
            + (
                "no checkpoint was written, so this run cannot be resumed"
                if kept is None
                else f"the checkpoint holds {saved or 0:,} env steps (--resume {rundir.path})"
            )
        )
    elif monitor.checkpoint_error is not None and monitor.fault is None:  # the final one failed
        say(f"mprl: {_checkpoint_line(kept, steps, rundir, cut=cut)}")
    failed = summary.status == "failed"
    if outcome.failures:  # reported, also when the user stopped the run
        first = outcome.failures[0]
        for f in outcome.failures:
            if f is not first or f.who != "run" or f.traceback:  # the run's own: the last line
                say(f"mprl: {f.who} {f.reason}")
            if f.traceback:
                say(f"--- traceback of {f.who} ---\n{f.traceback.rstrip()}")
        if failed:
            line = f"{first.who} {first.reason}"
            raised = [x for x in first.traceback.strip().splitlines() if x.strip()][-1:]
            line += f" ({raised[0].strip()[:300]})" if raised else ""  # the cause, at the end too
            line += f"; {unwritten}" if unwritten else ""
            raise RunFailed(f"{line}; run directory: {rundir.path}", summary)
    elif monitor.gone is not None:  # nothing of the run's end could be written there
        line = (
            f"{monitor.gone}: the run stopped after {steps:,} env step{'s' * (steps != 1)}, "
            "and nothing more could be saved there (no final checkpoint, no summary.json)"
        )
        if failed:
            raise RunFailed(line, summary)
        say(f"mprl: {line}")
    elif monitor.fault is not None and not failed:
        say(f"mprl: {monitor.fault}")
    elif monitor.fault is not None:
        after = (
            f"the run was stopped after its final checkpoint ({steps:,} env steps)"
            if monitor.checkpoint_error is None
            else _checkpoint_line(kept, steps, rundir, either=True, cut=cut)
        )
        after += f"; {unwritten}" if unwritten else ""
        raise RunFailed(f"{monitor.fault}: {after}; run directory: {rundir.path}", summary)


def _solved_on(solved_at: Mapping[str, Any] | None, rule: str) -> str:
    """What "solved" was judged on: for a solved run, what solved it (an earlier session's rule
    may have been the other one), else the rule of this session."""
    if not solved_at:
        return rule
    return "eval" if "eval_return_mean" in solved_at else "training"


def _checkpoint_line(
    kept: Mapping[str, Any] | None,
    env_steps: int,
    rundir: RunDir,
    either: bool = False,
    cut: bool = False,
) -> str:
    """What the run's end left to resume from, when its final checkpoint was not written
    (``cut``: a Ctrl-C more asked to exit without it)."""
    not_written = f"the final checkpoint was not written{' either' * either}"
    if cut:
        not_written += f" ({CUT})"
    if kept is None:
        ended = "the run ended with no checkpoint, so it cannot be resumed"
        return f"{not_written}: {ended}" if cut else ended
    held = (
        ""
        if kept["env_steps"] is None
        else f" holds {kept['env_steps']:,} of {env_steps:,} env steps"
    )
    return (
        f"{not_written}; the last one ({kept['path']}){held}: "
        f"--resume {rundir.path} continues from it"
    )


def _close(rundir: RunDir) -> None:
    """Close the run directory; metrics that a full disk left unflushed are given up (each of
    its files raises once, as it closes)."""
    for _ in range(3):
        try:
            rundir.close()
            return
        except OSError:
            continue
