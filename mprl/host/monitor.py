"""The host's side of the backend seam while a job runs: stats, metrics and reporters, the
progress display, periodic checkpoints, and the decision to stop."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from mprl import kinds
from mprl.backends.base import Job
from mprl.files import no_room
from mprl.host import checkpoint
from mprl.host.config import as_dict
from mprl.host.plugins import PluginManager
from mprl.host.policy_check import CHECK_EPISODES, Evaluation, PolicyCheck
from mprl.host.progress import Progress
from mprl.host.rundir import RunDir, WriteCut
from mprl.host.stats import RunStats
from mprl.run_types import RunInfo
from mprl.schema import SharedState

METRICS_EVERY_S = 5.0  # how often the main process writes its own progress record


class EpisodeThinning:
    """Bounds what episode records cost on disk: each is written while the run has written
    fewer than ``rate`` a second on average (a bucket of ``burst``), after that they are summed
    up per source every ``every_s`` seconds: one record with the ``episode_count`` episodes'
    mean ``episode_return`` and ``episode_length``, and the return's min and max. A short run,
    or a slow one, keeps every episode; a long fast one writes a few records a second instead of
    thousands. ``full=True`` writes every episode whatever it costs (``--full-metrics``).
    """

    def __init__(
        self, full: bool, rate: float = 50.0, burst: float = 20_000, every_s: float = 1.0
    ) -> None:
        self.full, self.rate, self.burst, self.every_s = full, rate, burst, every_s
        self.budget, self._filled = burst, time.monotonic()
        self._sums: dict[str, list[Any]] = {}  # source -> [count, sum R, min R, max R, sum L, last]
        self._flushed = time.monotonic()

    def keep(self, record: dict[str, Any]) -> bool:
        """Whether ``record`` (an episode) is written as it is; if not, it is summed up."""
        if self.full:
            return True
        now = time.monotonic()
        self.budget = min(self.burst, self.budget + (now - self._filled) * self.rate)
        self._filled = now
        if self.budget >= 1:
            self.budget -= 1
            return True
        ret, length = record["episode_return"], record.get("episode_length", 0)
        if not isinstance(ret, int | float):  # inf / nan travel as strings: kept as they are
            return True
        sums = self._sums.setdefault(record["source"], [0, 0.0, ret, ret, 0, record])
        sums[0] += 1
        sums[1] += ret
        sums[2], sums[3] = min(sums[2], ret), max(sums[3], ret)
        sums[4] += length
        sums[5] = record
        return False

    def due(self, force: bool = False) -> list[dict[str, Any]]:
        """The summed-up records, every ``every_s`` (or now, with ``force``)."""
        if not self._sums or not (force or time.monotonic() - self._flushed >= self.every_s):
            return []
        self._flushed = time.monotonic()
        out = []
        for source, (n, total, low, high, lengths, last) in self._sums.items():
            out.append(
                {
                    "source": source, "step": last["step"], "wall": last["wall"],
                    "episode_return": total / n, "episode_length": lengths / n,
                    "episode_count": n, "episode_return_min": low, "episode_return_max": high,
                }
            )  # fmt: skip
        self._sums = {}
        return out


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


#: the stop reason of a run whose metrics cannot be written (:attr:`RunMonitor.fault`)
FAULT_STOP = "metrics could not be written"
#: the stop reason of a run whose run directory was removed (or moved) while it went on
GONE_STOP = "run directory gone"
#: how often the run looks whether its run directory is still there
LOOK_EVERY_S = 1.0
#: why a checkpoint was not written when a Ctrl-C more asked to exit without it
CUT = "cut short by Ctrl-C"


class Interrupts(Protocol):
    """What the monitor asks of the run's signal handling (:class:`mprl.host.runner._Signals`):
    ``saving()`` is entered while a checkpoint is saved (a Ctrl-C then waits for it), ``cut`` is
    true once a Ctrl-C more asked to exit without it."""

    cut: bool

    def saving(self) -> contextlib.AbstractContextManager[None]: ...


class _NoInterrupts:
    cut = False

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        yield


def _said_again(failures: int) -> bool:
    """Whether a checkpoint that keeps failing is said again at its ``failures``-th failure in a
    row: the 3rd, 10th, 30th, 100th ... (the first is said in full)."""
    return failures >= 3 and str(failures).rstrip("0") in ("1", "3")


def write_error(exc: BaseException) -> OSError | None:
    """The OSError behind a failed write: ``exc`` itself, or the one ``torch.save`` turned into
    a ``RuntimeError`` ("unexpected pos ..."), which it keeps as the context."""
    while exc is not None:
        if isinstance(exc, OSError):
            return exc
        exc = exc.__context__  # type: ignore[assignment]
    return None


def describe_write_error(exc: BaseException, where: str | Path | None = None) -> str:
    """A failed write (to ``where``, when the error does not say) in words: "the disk is full:
    [Errno 28] No space left on device", or "no inodes are left on its file system"."""
    cause = write_error(exc)
    if cause is None:
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    text = f"[Errno {cause.errno}] {cause.strerror}" if cause.strerror else str(cause)
    if cause.errno == errno.ENOSPC:
        return f"{no_room(cause.filename or where or '.')}: {text}"
    if cause.filename:
        text += f": {cause.filename!r}"
    return text


class RunMonitor:
    """Called by the backend in the main process (:class:`mprl.backends.base.Monitor`).

    :param stop_signal: the signal number that asked the run to stop, or ``None``.
    """

    def __init__(
        self,
        info: RunInfo,
        job: Job,
        rundir: RunDir,
        pm: PluginManager,
        progress: Progress,
        stop_signal: Callable[[], int | None],
        stats: RunStats,
        check: PolicyCheck,
        evaluation: Evaluation | None = None,
        interrupts: Interrupts | None = None,
    ) -> None:
        self.info, self.job, self.rundir, self.pm = info, job, rundir, pm
        self.progress, self.stop_signal, self.stats, self.check = (
            progress,
            stop_signal,
            stats,
            check,
        )
        self._wall0 = time.time() - stats.wall_s
        self._last_main_record = self._last_checkpoint = time.monotonic()
        self._solved_logged = stats.solved()  # a resumed run solved before: logged then
        self.state: SharedState | None = None
        self.saved_steps: int | None = None  # env steps in the last checkpoint written
        self._check_after = 0  # episodes: the next policy check waits for this many
        self.thinning = EpisodeThinning(info.run.full_metrics)
        #: why the run must stop and fail though no process failed: the metrics cannot be
        #: written (a full disk); :data:`FAULT_STOP` is its stop reason
        self.fault: str | None = None
        #: the stop reason of :attr:`fault`: :data:`FAULT_STOP` or :data:`GONE_STOP`
        self.fault_stop = FAULT_STOP
        #: why the run directory can take nothing more (removed or moved while the run went
        #: on); also the :attr:`fault`
        self.gone: str | None = None
        self._dir = _identity(rundir.path)
        self._looked = time.monotonic()
        #: why the last checkpoint write failed, while no later one succeeded (:data:`CUT`:
        #: a Ctrl-C more asked to exit without it)
        self.checkpoint_error: str | None = None
        #: checkpoint writes that failed in this session, and in a row (since the last written)
        self.checkpoint_failures = 0
        self._failing = 0
        self._failure_shown: str | None = None  # the message of that failure, shown once
        self.interrupts: Interrupts = interrupts if interrupts is not None else _NoInterrupts()
        self._bad_fields: set[str] = set()  # fields of children's records already warned of
        #: the evaluation episodes (--eval-every): "solved" is judged on them while they play
        self.evaluation = evaluation
        #: brings the model, optimizers and modules up to date before they are read (the
        #: backend's, :meth:`mprl.backends.base.Monitor.on_start`)
        self.refresh: Callable[[], None] = lambda: None

    def on_start(self, state: SharedState, refresh: Callable[[], None] | None = None) -> None:
        self.state = state
        if refresh is not None:
            self.refresh = self.check.refresh = refresh
            if self.evaluation is not None:
                self.evaluation.refresh = refresh

    def on_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        out = []
        for record in records:
            if (problem := self.stats.check(record)) is not None:
                self._drop(record, *problem)
                continue
            record = dict(record)
            record["wall"] = round(record.pop("time", time.time()) - self._wall0, 4)
            self.stats.add(record)  # every episode counts, written or summed up
            if "episode_return" not in record or self.thinning.keep(record):
                out.append(record)
        self._emit(out + self.thinning.due())

    def _drop(self, record: Mapping[str, Any], field: str, why: str) -> None:
        """A child's record that would break the run's counters (``ctx.log(time="soon")``,
        ``ctx.log(episode_return="x")``) is dropped, and the plugin named, once per field."""
        if field in self._bad_fields:
            return
        self._bad_fields.add(field)
        info, value = self.info, repr(record.get(field))
        value = value if len(value) <= 60 else value[:57] + "..."
        self.on_event(
            {
                "event": "record-dropped",
                "message": f"algorithm {info.algorithm!r} (plugin {info.plugin!r}) logged "
                f"{field}={value} from {record.get('source', '?')}: {why}; the record is "
                f"dropped, and so is every later one with a bad {field!r}",
                "field": field,
            }
        )

    def on_event(self, record: Mapping[str, Any], show: bool = True) -> None:
        """Log a supervision event, and show it (``show``)."""
        record = {"source": "main", "step": self.stats.env_steps, **record}
        record["wall"] = round(time.time() - self._wall0, 4)
        if record["event"] == "restart":
            self.stats.restarts += 1
        tb = record.pop("traceback", "")
        if show:
            self.progress.message(f"mprl: {record['message']}", tb)
        self._emit([record])

    def _emit(self, records: list[dict[str, Any]]) -> None:
        if self.fault is None:
            try:
                self.rundir.append_metrics(records)
            except OSError as exc:  # a full disk: the run stops, its final checkpoint first
                self.fault = (
                    f"metrics could not be written to {self.rundir.path} "
                    f"({describe_write_error(exc, self.rundir.path)})"
                )
        self.pm.hook.mprl_report_metrics(run=self.info, records=records)

    def on_tick(self, env_steps: int, per_worker_steps: Sequence[int]) -> str | None:
        self.stats.set_steps(per_worker_steps)
        self.progress.update(self.stats.snapshot())
        received = self.stop_signal()
        if self.state is None:  # still starting (a backend waiting for its state to be built):
            # no checkpoint, evaluation or budget yet, only a signal that asks to stop
            return None if received is None else signal.Signals(received).name
        now = time.monotonic()
        if now - self._looked >= LOOK_EVERY_S:
            self._looked = now
            self.look()
        if now - self._last_main_record >= METRICS_EVERY_S:
            self._last_main_record = now
            self._emit([self._main_record()])
        every = self.info.run.checkpoint_every
        if every and now - self._last_checkpoint >= every:
            self.checkpoint()
        if received is not None:
            return signal.Signals(received).name
        if self.fault is not None:
            return self.fault_stop
        self._evaluate()
        if self._solved():
            if not self._solved_logged:  # when, and at which mean: the summary's mean is the
                self._solved_logged = True  # last 100 episodes when the run ended
                record = {**self._main_record(), "event": "solved", "on": self.solved_on}
                self._emit([record])
            return "solved"
        total = self.info.run.total_steps
        if total is not None and env_steps >= total:
            return "total steps reached"
        budget = self.info.run.max_time
        if budget is not None and self.stats.wall_s >= budget:  # the whole run's wall time
            return "time budget"
        return None

    @property
    def solved_on(self) -> str:
        """What "solved" is judged on: ``"eval"`` (evaluation returns, --eval-every) or
        ``"training"`` (training returns, confirmed by the policy check)."""
        evaluation = self.evaluation
        return "eval" if evaluation is not None and not evaluation.broken else "training"

    def _evaluate(self) -> None:
        """Play the evaluation going on (or start one that is due) for one slice; log an
        evaluation that ended, and mark the run solved when its mean return reached the env's
        threshold: the weights it played are what the final checkpoint keeps."""
        evaluation, stats = self.evaluation, self.stats
        if evaluation is None or evaluation.broken:
            return
        record = evaluation.advance(stats.env_steps, stats.wall_s)
        if record is None:
            return
        if "error" in record:
            message = (
                f"the evaluation episodes could not play algorithm {self.info.algorithm!r}'s "
                f"model ({record['error']}); no more are played, and the training returns "
                "decide whether it is solved"
            )
            tb = record["traceback"]
            self.on_event({"event": "eval-failed", "message": message, "traceback": tb})
            return
        stats.add_eval(record)
        self._emit([record])
        threshold = self.info.reward_threshold
        reached = threshold is not None and record["eval_return_mean"] >= threshold
        if reached and not stats.solved():  # these weights are what the final checkpoint keeps
            self.check.passed = evaluation.weights()
            stats.mark_solved(record)

    def _solved(self) -> bool:
        """Solved: the mean of the last 100 training episodes reached the threshold, and the
        policy of that moment plays as well (:mod:`mprl.host.policy_check`). A check that falls
        short is logged and training goes on; the next one waits for ``2 * CHECK_EPISODES``
        more training episodes. With evaluation episodes (--eval-every), they alone decide
        (:meth:`_evaluate`)."""
        stats = self.stats
        if self.solved_on == "eval":
            return stats.solved()
        if stats.solved() or not stats.reached() or stats.episodes < self._check_after:
            return stats.solved()
        self._check_after = stats.episodes + 2 * CHECK_EPISODES
        if self.check.broken:  # nothing to play it with: the training returns decide alone
            stats.mark_solved()
            return True
        threshold = self.info.reward_threshold
        assert threshold is not None
        result = self.check.run(threshold, self.info.run.seed + stats.episodes)
        passed, tb = result.pop("passed"), result.pop("traceback", "")
        record = {**self._main_record(), "event": "policy-check", **result}
        if "error" in result:
            message = (
                f"the policy check could not play algorithm {self.info.algorithm!r}'s model "
                f"({result['error']}); the training returns decide whether it is solved"
            )
            self.on_event({**record, "message": message, "traceback": tb})
            stats.mark_solved()
        elif passed:
            stats.mark_solved()
            self._emit([record])
        else:
            self.on_event(
                {
                    **record,
                    "message": f"the mean of the last 100 episodes reached {threshold:g}, but "
                    f"the policy now plays {result['mean_return']:.1f} over {CHECK_EPISODES} "
                    "episodes; training goes on",
                }
            )
        return stats.solved()

    def on_stop(self, per_slot_steps: Sequence[int]) -> None:
        self._emit(self.thinning.due(force=True))
        self.stats.set_steps(per_slot_steps)
        self.stats.stop_clock()  # the final checkpoint and the summary: the same wall time
        if self.check.passed is not None:  # every child has stopped: nothing writes it now
            self.job.model.load_state_dict(self.check.passed)
        self.check.close()
        if self.evaluation is not None:  # one still playing is left unfinished, unlogged
            self.evaluation.close()
        self.checkpoint()

    def checkpoint(self) -> Path | None:
        """Save ``checkpoints/last.pt`` now (atomically) and log it in the metrics.

        A failed write (disk full, directory gone) is reported and the run goes on with the
        previous checkpoint kept; it is not a reason to lose the run. ``torch.save`` turns a
        failed write into a ``RuntimeError``: caught too, and reported by its cause. The same
        failure again is said only now and then, counted (:attr:`checkpoint_failures`).
        Nothing is written once the run directory is gone, or once a Ctrl-C more asked to
        exit without the checkpoint (the write under way is then cut short, the previous
        checkpoint kept).
        """
        if self.gone is not None or self.interrupts.cut:
            return None
        with self.interrupts.saving():  # a Ctrl-C now waits for it (one more cuts it short)
            return self._checkpoint()

    def _checkpoint(self) -> Path | None:
        start = self._last_checkpoint = time.monotonic()
        shared = dict(self.job.state_snapshot)  # the state is not built yet: keep what was
        if self.state is not None:
            try:
                shared = kinds.snapshot(self.job.algorithm.schema, self.state)
            except (OSError, EOFError) as exc:  # the Manager server is gone
                self.on_event(
                    {"event": "checkpoint-partial", "message": f"shared state not saved: {exc!r}"}
                )
        # then what the children trained, where the backend keeps it elsewhere (Ray): the model
        # is no older than the weights version the shared state just read
        self.refresh()
        info, job, stats = self.info, self.job, self.stats
        interrupts = self.interrupts
        try:
            path = self.rundir.save_checkpoint(
                checkpoint.payload(
                    plugin=info.plugin,
                    plugin_version=info.plugin_version,
                    plugin_distribution=checkpoint.distribution(self.pm, info.plugin),
                    algorithm=info.algorithm,
                    config=as_dict(info.config),
                    run=info.run.to_dict(),
                    session=job.session,
                    model=job.model,
                    optimizer=job.optimizer,
                    optimizers=job.optimizers,
                    steps=list(stats.per_worker) or [0] * (info.run.workers + 2),
                    stats=stats.state(),
                    shared_state=shared,
                ),
                cut=lambda: interrupts.cut,
            )
        except (WriteCut, OSError, RuntimeError) as exc:
            if isinstance(exc, WriteCut) or interrupts.cut:  # (a forced exit in torch.save)
                self._cut()
            else:
                self._failed(exc)
            return None
        self.saved_steps = stats.env_steps
        self.checkpoint_error = self._failure_shown = None
        self._failing = 0
        record = {"source": "main", "event": "checkpoint", "step": stats.env_steps}
        record.update(wall=round(stats.wall_s, 4), path=str(path))
        self._emit([{**record, "seconds": round(time.monotonic() - start, 4)}])
        return path

    def _cut(self) -> None:
        """A checkpoint cut short by a Ctrl-C more: logged, and the run's last lines say it."""
        self.checkpoint_error = CUT
        message = f"checkpoint not written ({CUT}); {self._after_failure()}"
        self.on_event({"event": "checkpoint-cut", "message": message}, show=False)

    def _failed(self, exc: BaseException) -> None:
        """A checkpoint write that failed: said with its cause and what is kept the first time,
        and again at the 3rd, 10th, 30th ... failure in a row (counted); logged every time. One
        that failed because the run directory is gone says nothing: the run stops on it."""
        if self.look():
            return
        where = self.rundir.checkpoints
        why = describe_write_error(exc, where)
        if not where.is_dir():  # removed (or replaced) while the run goes on
            what = "is not a directory" if where.exists() else "was removed"
            why = f"{where} {what}: {why}"
        self.checkpoint_error = why
        self.checkpoint_failures += 1
        self._failing += 1
        message = f"checkpoint not written ({why}); {self._after_failure()}"
        shown, self._failure_shown = self._failure_shown, message
        show = message != shown or _said_again(self._failing)
        if message == shown:
            message = f"checkpoint still failing ({self._failing} times): {why}"
        record = {"event": "checkpoint-failed", "message": message, "failures": self._failing}
        self.on_event(record, show)

    def _after_failure(self) -> str:
        kept = self.kept()
        if kept is None:
            return "there is no earlier one: the run cannot be resumed unless one is written"
        held = "" if kept["env_steps"] is None else f", {kept['env_steps']:,} env steps"
        return f"the previous one ({kept['path']}{held}) is kept"

    def look(self) -> bool:
        """Whether the run directory is gone (removed, or moved, while the run went on: its
        path leads nowhere, or to another directory); the first time it is found gone, the
        run stops on it (:attr:`gone`, :attr:`fault`): nothing more can be written there."""
        here = self._dir
        if self.gone is None and here is not None and _identity(self.rundir.path, here) != here:
            self.gone = (
                f"the run directory {self.rundir.path} is gone (removed or moved while the run "
                "went on)"
            )
            self.fault, self.fault_stop = self.gone, GONE_STOP
        return self.gone is not None

    def kept(self) -> dict[str, Any] | None:
        """The checkpoint this run can be resumed from: its ``path`` and the ``env_steps`` it
        holds (``None`` for one of an earlier session); ``None`` when there is none."""
        path = self.rundir.checkpoints / "last.pt"
        if not path.is_file():
            return None
        steps = self.saved_steps
        if steps is None and self.job.initial_steps:  # written by the session resumed from
            steps = sum(self.job.initial_steps)
        return {"path": str(path), "env_steps": steps}

    def _main_record(self) -> dict[str, Any]:
        s = self.stats
        return {
            "source": "main",
            "step": s.env_steps,
            "wall": round(s.wall_s, 4),
            "steps_per_s": round(s.steps_per_s, 1),
            "episodes": s.episodes,
            "mean_return_100": finite(s.mean_return_100),
        }


def _identity(path: Path, unknown: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """The device and inode of directory ``path``; ``None`` when there is none there (nothing,
    a file, a stale NFS handle); ``unknown`` when it cannot be told (a search permission)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return None if exc.errno == errno.ESTALE else unknown
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
