"""Running a sweep: Optuna asks for configs, each config's seeds run as ``python -m mprl run``
subprocesses, ``--parallel`` at a time, in sessions of their own; a signal stops it cleanly and
``--resume`` (Optuna's storage and the run directories) continues it."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mprl.errors import UsageError
from mprl.files import NotRegularFile, exists_as, held_by
from mprl.host.config import parse_value
from mprl.host.plugins import PluginManager
from mprl.host.progress import say
from mprl.tools.report import format_wall, read_run
from mprl_builtin.sweep.results import is_done, objective_value, write_results
from mprl_builtin.sweep.spec import SPEC_FILE, Spec, config_key, read_spec, toml_text, trial_inputs
from mprl_builtin.sweep.sweepdir import (
    check,
    check_database,
    locked,
    make_dir,
    open_log,
    remove_run_dir,
    write,
)

INSTALL = 'pip install "mprl[sweep]"'
STUDY = "mprl-sweep"
POLL_S = 0.2


# -- running a sweep ---------------------------------------------------------------------------


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise UsageError(f"mprl sweep needs Optuna, which is not installed: {INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _database_errors() -> tuple[type[BaseException], ...]:
    """What opening a study raises for a database it cannot read (SQLAlchemy comes with
    Optuna)."""
    import sqlalchemy.exc

    return (sqlalchemy.exc.SQLAlchemyError,)


def default_parallel(spec: Spec, pm: PluginManager) -> int:
    """How many runs go on at once by default: the cores (a Ray cluster's CPUs with
    ``--backend ray --ray-address``) over the processes one run has (workers, and its train
    process), at least 1."""
    _, algo = pm.algorithm(spec.plugin)
    cores = os.cpu_count() or 1
    workers = [int(parse_value(v)) for v in spec.grid.get("workers", [])] or [
        spec.run.get("workers") or cores
    ]
    per_run = max(workers) + (1 if algo.train is not None else 0)
    backend = spec.run.get("backend", "local")
    if backend == "serial":
        per_run = 1
    address = spec.run.get("ray_address") or os.environ.get("RAY_ADDRESS", "")
    if backend == "ray" and address:
        cores = cluster_cpus(address) or cores
    return max(1, int(cores // per_run))


def cluster_cpus(address: str) -> float | None:
    """The CPUs of the Ray cluster at ``address``, asked once in a subprocess (a Ray session in
    the sweep's own process would outlive its runs); ``None`` when it cannot be reached."""
    code = (
        f"import ray; ray.init(address={address!r}, logging_level='ERROR', "
        "log_to_driver=False); print(ray.cluster_resources().get('CPU', 0)); ray.shutdown()"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        return float(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return None


@dataclass
class _Config:
    """An Optuna trial in flight: one config, one run per seed."""

    trial: Any
    params: dict[str, Any]
    key: str
    left: set[int]
    results: dict[int, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)


@dataclass
class _Run:
    config: _Config
    seed: int
    path: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0


class Sweep:
    """One session of a sweep: asks Optuna for configs, runs each config's seeds as
    ``python -m mprl run`` subprocesses, ``parallel`` at a time, and tells Optuna each config's
    objective once all its seeds are done."""

    def __init__(self, root: Path, spec: Spec, parallel: int, pm: PluginManager) -> None:
        self.root, self.spec, self.parallel, self.pm = root, spec, parallel, pm
        _, algo = pm.algorithm(spec.plugin)
        self.config_cls, self.known = algo.config_cls, pm.run_options()
        self.pending: list[_Run] = []
        self.running: list[_Run] = []
        self.in_flight: list[_Config] = []
        self.signal: int | None = None
        self.forced = False
        self.error: str | None = None
        self.done = 0
        self.study: Any = None

    # the study, and what an earlier session left
    def open_study(self) -> str:
        """Load (or create) the Optuna study; a config an earlier session left unfinished is
        failed and asked again. Returns what the session resumes, for its first line."""
        optuna = _optuna()
        sampler = (
            optuna.samplers.RandomSampler()
            if self.spec.sampler == "random"
            else optuna.samplers.TPESampler(constant_liar=True)
        )
        database = check_database(self.root)
        try:
            self.study = optuna.create_study(
                storage=f"sqlite:///{database}", study_name=STUDY,
                direction=self.spec.direction, sampler=sampler, load_if_exists=True,
            )  # fmt: skip
            trials = self.study.get_trials(deepcopy=False)
        except _database_errors() as exc:  # a SQLite file cut short or not Optuna's
            cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            raise UsageError(
                f"cannot open the sweep's Optuna study {str(database)!r}: {cause}; restore it, "
                "or remove it to start the study anew"
            ) from None
        if not trials:
            # a grid (seeds alone: its one point, {}) is asked in order, as enqueued
            for params in self.spec.grid_points() if not self.spec.is_search else []:
                self.study.enqueue_trial(params)
            return ""
        State = optuna.trial.TrialState
        stale = [t for t in trials if t.state == State.RUNNING]
        for t in stale:  # this session holds the sweep's lock: no one else is running it
            self.study.tell(t.number, state=State.FAIL)
        retried = {t.user_attrs.get("retry_of") for t in trials}
        failed = [t for t in self.study.get_trials(deepcopy=False, states=(State.FAIL,))]
        again = [t for t in failed if t.number not in retried]
        for t in again:
            self.study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
        done = len(self.study.get_trials(deepcopy=False, states=(State.COMPLETE,)))
        self.done = done * len(self.spec.seeds)
        return f"resuming: {done} configs done, {len(again)} to run again"

    def total_configs(self) -> int:
        if self.spec.is_search:
            return self.spec.trials
        return max(1, len(self.spec.grid_points()))

    def _next_config(self) -> _Config | None:
        optuna = _optuna()
        State = optuna.trial.TrialState
        waiting = self.study.get_trials(deepcopy=False, states=(State.WAITING,))
        if self.spec.is_search:
            complete = self.study.get_trials(deepcopy=False, states=(State.COMPLETE,))
            if len(complete) + len(self.in_flight) >= self.spec.trials:
                return None
        elif not waiting:
            return None
        trial = self.study.ask(self.spec.distributions())
        params = {name: trial.params[name] for name in self.spec.axes}
        config = _Config(trial, params, config_key(params), set(self.spec.seeds))
        config_toml, run_options = trial_inputs(self.spec, params, self.config_cls, self.known)
        configs = make_dir(self.root, "configs")
        write(configs / f"{config.key}.toml", toml_text(config_toml, run_options).encode())
        trial.set_user_attr("key", config.key)
        self.in_flight.append(config)
        trials = make_dir(self.root, "trials")
        for seed in self.spec.seeds:
            path = trials / f"{config.key}-seed{seed}"
            if any(r.path == path for r in (*self.pending, *self.running)):
                raise RuntimeError(f"config {config.key} seed {seed} asked twice")  # a bug
            if not self._wait_free(path):  # a signal came meanwhile: asked again on --resume
                break
            if is_done(path):  # an earlier session ran it: its result stands
                self._result(config, seed, path)
                continue
            if os.path.lexists(path):  # interrupted: run again from scratch
                remove_run_dir(self.root, path)
            self.pending.append(_Run(config, seed, path, self.root / "logs" / f"{path.name}.log"))
        if not config.left:
            self._tell(config)
        return config

    def _wait_free(self, path: Path) -> bool:
        """Wait while another process holds run directory ``path`` (a run of a sweep session
        that was killed, still stopping): it is neither removed nor run again meanwhile. False
        when a signal stopped the sweep first."""
        holder = held_by(path)
        if holder is None:
            return True
        say(f"mprl sweep: {str(path)!r} is in use by pid {holder} (a run left by an earlier "
            "session of this sweep?); waiting for it to end (Ctrl-C stops the sweep)")  # fmt: skip
        while self.signal is None:
            time.sleep(POLL_S)
            self._poll()
            if held_by(path) is None:
                return True
        return False

    def _next_run(self) -> _Run | None:
        while not self.pending:
            if self._next_config() is None:
                return None
        return self.pending.pop(0)

    def _command(self, run: _Run) -> list[str]:
        blocked = [arg for name in self.spec.blocked for arg in ("-p", f"no:{name}")]
        return [
            sys.executable, "-m", "mprl", "run", *blocked, "--plugin", self.spec.plugin,
            "--config", str(self.root / "configs" / f"{run.config.key}.toml"),
            "--seed", str(run.seed), "--run-dir", str(run.path), "--quiet",
        ]  # fmt: skip

    def _start(self, run: _Run) -> None:
        make_dir(self.root, "trials")
        make_dir(self.root, "logs")
        with open_log(run.log) as log:
            # its own session: a Ctrl-C at the terminal reaches the sweep alone, which passes
            # one SIGINT on to each run (two would force the run's fast exit); a SIGTERM when
            # the sweep dies (SIGKILL, OOM): the run stops cleanly instead of going on unseen
            run.proc = subprocess.Popen(
                self._command(run), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_stop_with(os.getpid()),
            )  # fmt: skip
        run.started = time.monotonic()
        self.running.append(run)
        if self.signal is not None:  # a signal came while it started
            run.proc.send_signal(signal.SIGINT)

    # results
    def _result(self, config: _Config, seed: int, path: Path, started: float | None = None) -> None:
        run = read_run(path)
        summary, options = run.summary or {}, run.config.get("run") or {}
        config.results[seed] = (summary, options)
        config.left.discard(seed)
        self.done += 1
        total = self.total_configs() * len(self.spec.seeds)
        when = "done earlier"
        if started is not None:
            elapsed = format_wall(time.monotonic() - started)
            when = f"run {format_wall(summary.get('wall_s'))}, {elapsed} with its start"
        outcome = _outcome(summary)
        say(f"mprl sweep: [{self.done}/{total}] {config.key} seed {seed}: {outcome} ({when})")

    def _tell(self, config: _Config) -> None:
        runs = [config.results[s] for s in self.spec.seeds]
        config.trial.set_user_attr("run_dirs", [f"{config.key}-seed{s}" for s in self.spec.seeds])
        self.study.tell(config.trial, objective_value(self.spec.objective, runs))
        self.in_flight.remove(config)

    def _ended(self, run: _Run, code: int) -> None:
        self.running.remove(run)
        if is_done(run.path):
            self._result(run.config, run.seed, run.path, run.started)
            if not run.config.left:
                self._tell(run.config)
            return
        if code == 2 and self.error is None:  # refused before it started: every run would be
            self.error = _last_line(run.log) or f"a run exited 2; see {run.log}"
            self.stop(signal.SIGINT)
        elif self.signal is None and self.error is None:  # someone stopped it, or it was killed
            say(f"mprl sweep: {run.path.name} ended with exit code {code} and no result "
                f"(see {run.log}); stopping the sweep")  # fmt: skip
            self.stop(signal.SIGINT)

    # stopping
    def stop(self, signum: int) -> None:
        """Stop starting runs and pass ``signum`` on to the running ones (they stop cleanly)."""
        if self.signal is None:
            self.signal = signum
        elif signum == signal.SIGINT:
            self.forced = True
        for run in self.running:
            with contextlib.suppress(ProcessLookupError):
                assert run.proc is not None
                run.proc.send_signal(signum)

    def _handle(self, signum: int, frame: Any) -> None:
        self.stop(signum)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        wanted = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
        old = {s: signal.signal(s, self._handle) for s in wanted}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def _poll(self) -> None:
        """Take the result of each run that has ended."""
        for run in list(self.running):
            assert run.proc is not None
            code = run.proc.poll()
            if code is not None:
                self._ended(run, code)

    def execute(self) -> int:
        """Run until every config is done or a signal stops it; the exit code."""
        with self._signals():
            while True:
                while self.signal is None and len(self.running) < self.parallel:
                    try:
                        run = self._next_run()
                        if run is None:
                            break
                        self._start(run)
                    except UsageError as exc:  # a link planted meanwhile: stop what runs
                        self.error = str(exc)
                        self.stop(signal.SIGINT)
                if not self.running:
                    break
                time.sleep(POLL_S)
                self._poll()
        optuna = _optuna()
        for config in list(self.in_flight):  # asked again when the sweep is resumed
            self.study.tell(config.trial, state=optuna.trial.TrialState.FAIL)
            self.in_flight.remove(config)
        if self.error is not None:
            raise UsageError(self.error)
        return 0 if self.signal is None else 128 + self.signal


def _outcome(summary: Mapping[str, Any]) -> str:
    if not summary:
        return "no summary.json"
    mean = summary.get("mean_return_100")
    tail = f"return(100) {mean:.1f}" if isinstance(mean, int | float) else "no episodes"
    if summary.get("status") == "failed":
        return f"FAILED ({summary.get('stop_reason')}), {tail}"
    at = summary.get("solved_at") or {}
    if summary.get("solved"):
        steps = at.get("env_steps", 0)
        return f"solved at {format_wall(at.get('wall_s'))}, {steps:,} env steps, {tail}"
    return f"not solved ({summary.get('stop_reason')}), {tail}"


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].removeprefix("mprl: error: ") if lines else ""


def _stop_with(sweep: int) -> Callable[[], None] | None:
    """What a run does first, before it is ``python -m mprl run``: ask the kernel for a SIGTERM
    (a clean stop, as a Ctrl-C passed on) when the sweep ``sweep`` dies, however it dies
    (``PR_SET_PDEATHSIG``; Linux only: elsewhere a resume waits for runs left going)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: nothing to load after fork

    def stop_with_the_sweep() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != sweep:  # the sweep died before that: stop now
            os.kill(os.getpid(), signal.SIGTERM)

    return stop_with_the_sweep


def _prepare_dir(root: Path, spec: Spec | None) -> Spec:
    """The spec the sweep in ``root`` runs: ``spec`` written to a new directory, the stored one
    for ``--resume`` (``spec`` None); a directory holding another sweep is refused."""
    if spec is None:
        return read_spec(root)
    if os.path.lexists(root / SPEC_FILE):
        stored = read_spec(root)
        if stored.identity() != spec.identity():
            differs = [k for k, v in spec.identity().items() if stored.identity().get(k) != v]
            raise UsageError(
                f"--sweep-dir {str(root)!r} holds another sweep (its {', '.join(differs)} "
                f"differ); give another --sweep-dir, or --resume {root} to continue that one"
            )
        spec.trials = max(spec.trials, stored.trials)
    elif any(p.name != ".lock" for p in root.iterdir()):
        raise UsageError(
            f"--sweep-dir {str(root)!r} exists and is not a sweep directory; give another"
        )
    _write_spec(root, spec)
    return spec


def _write_spec(root: Path, spec: Spec) -> None:
    write(root / SPEC_FILE, (json.dumps(spec.to_dict(), indent=2) + "\n").encode())


def _sweep_dir(root: Path, new: bool) -> None:
    """Check that ``root`` is a directory (a link to one the user named is theirs), making it
    for a new sweep; one line naming what is there instead, or why it cannot be made.

    :raises UsageError: it is not a directory (a file, a dangling link) or cannot be made.
    """
    try:
        if root.is_dir():
            return
        if os.path.lexists(root):
            exists_as(root, directory=True)  # raises, saying what it is
        if not new:
            raise UsageError(f"--resume {str(root)!r}: not a sweep directory (no {SPEC_FILE})")
        root.mkdir(parents=True)
    except NotRegularFile as exc:
        raise UsageError(f"--sweep-dir {exc.strerror}; give another") from None
    except OSError as exc:
        raise UsageError(
            f"cannot create sweep directory {str(root)!r}: {exc.strerror}; give another --sweep-dir"
        ) from None


def run_sweep(
    pm: PluginManager,
    spec: Spec | None,
    sweep_dir: str | Path | None,
    *,
    parallel: int | None = None,
    trials: int | None = None,
) -> int:
    """Run (or, with ``spec`` None, resume) the sweep in ``sweep_dir``; print a line per
    finished run, then the results table. Returns the exit code: 0 done, 128 + the signal's
    number when a signal stopped it (the sweep can be resumed).

    :raises UsageError: Optuna is missing, the directory holds another sweep or is in use, a
        run refused its config.
    """
    _optuna()
    if sweep_dir is None:
        assert spec is not None
        env = str(spec.run.get("env", "default")).replace("/", "_").replace(":", "_")
        sweep_dir = Path("sweeps") / f"{spec.plugin}-{env}-{time.strftime('%Y%m%d-%H%M%S')}"
    root = Path(sweep_dir)
    _sweep_dir(root, new=spec is not None)
    if spec is None and not os.path.lexists(root / SPEC_FILE):
        raise UsageError(f"--resume {str(root)!r}: not a sweep directory (no {SPEC_FILE})")
    with locked(root):
        check(root)  # a link planted in it (or a FIFO...): refused before anything starts
        spec = _prepare_dir(root, spec)
        if trials is not None:
            if not spec.is_search:
                raise UsageError("--trials is the number of configs a --search tries")
            spec.trials = trials
            _write_spec(root, spec)
        if parallel is not None and parallel < 1:
            raise UsageError(f"--parallel {parallel}: give 1 or more")
        if parallel is not None and parallel != spec.parallel:  # kept for --resume
            spec.parallel = parallel
            _write_spec(root, spec)
        k = spec.parallel or default_parallel(spec, pm)
        sweep = Sweep(root, spec, k, pm)
        resumed = sweep.open_study()
        n = sweep.total_configs()
        what = f"{n} config{'s' * (n != 1)}" + (" (search)" if spec.is_search else "")
        seeds = len(spec.seeds)
        runs = f"{k} run{'s' * (k != 1)} at a time"
        say(f"mprl sweep: {spec.plugin}: {what} x {seeds} seeds, {runs} -> {root}")
        if resumed:
            say(f"mprl sweep: {resumed}")
        code = sweep.execute()
        print(write_results(root), flush=True)
        if code:
            say(f"mprl sweep: stopped; continue with: python -m mprl sweep --resume {root}")
        return code
