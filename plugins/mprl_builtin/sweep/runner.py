"""Running a sweep: Optuna asks for configs, each config's seeds run as ``python -m mprl run``
subprocesses, ``--parallel`` at a time, in sessions of their own; a signal stops it cleanly and
``--resume`` (Optuna's storage and the run directories) continues it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mprl.errors import UsageError
from mprl.host.config import parse_value
from mprl.host.plugins import PluginManager
from mprl.host.progress import say
from mprl.tools.report import format_wall, read_run
from mprl_builtin.sweep.results import is_done, objective_value, write_results
from mprl_builtin.sweep.spec import SPEC_FILE, Spec, config_key, read_spec, toml_text, trial_inputs

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
        self.study = optuna.create_study(
            storage=f"sqlite:///{self.root / 'optuna.db'}", study_name=STUDY,
            direction=self.spec.direction, sampler=sampler, load_if_exists=True,
        )  # fmt: skip
        trials = self.study.get_trials(deepcopy=False)
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
        (self.root / "configs").mkdir(exist_ok=True)
        (self.root / "configs" / f"{config.key}.toml").write_text(
            toml_text(config_toml, run_options)
        )
        trial.set_user_attr("key", config.key)
        self.in_flight.append(config)
        for seed in self.spec.seeds:
            path = self.root / "trials" / f"{config.key}-seed{seed}"
            if is_done(path):  # an earlier session ran it: its result stands
                self._result(config, seed, path)
                continue
            if any(r.path == path for r in (*self.pending, *self.running)):
                raise RuntimeError(f"config {config.key} seed {seed} asked twice")  # a bug
            if path.exists():  # interrupted: run again from scratch
                shutil.rmtree(path)
            self.pending.append(_Run(config, seed, path, self.root / "logs" / f"{path.name}.log"))
        if not config.left:
            self._tell(config)
        return config

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
        run.path.parent.mkdir(parents=True, exist_ok=True)
        run.log.parent.mkdir(parents=True, exist_ok=True)
        with run.log.open("wb") as log:
            # its own session: a Ctrl-C at the terminal reaches the sweep alone, which passes
            # one SIGINT on to each run (two would force the run's fast exit)
            run.proc = subprocess.Popen(
                self._command(run), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
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

    def execute(self) -> int:
        """Run until every config is done or a signal stops it; the exit code."""
        with self._signals():
            while True:
                while self.signal is None and len(self.running) < self.parallel:
                    run = self._next_run()
                    if run is None:
                        break
                    self._start(run)
                if not self.running:
                    break
                time.sleep(POLL_S)
                for run in list(self.running):
                    assert run.proc is not None
                    code = run.proc.poll()
                    if code is not None:
                        self._ended(run, code)
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


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold ``SWEEP_DIR/.lock`` while the sweep runs: a second session is refused."""
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UsageError(f"sweep directory {str(root)!r} is in use by pid {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def _prepare_dir(root: Path, spec: Spec | None) -> Spec:
    """The spec the sweep in ``root`` runs: ``spec`` written to a new directory, the stored one
    for ``--resume`` (``spec`` None); a directory holding another sweep is refused."""
    if spec is None:
        return read_spec(root)
    if (root / SPEC_FILE).is_file():
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
    root.mkdir(parents=True, exist_ok=True)
    (root / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
    return spec


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
    if spec is None and not (root / SPEC_FILE).is_file():
        raise UsageError(f"--resume {str(root)!r}: not a sweep directory (no {SPEC_FILE})")
    if spec is not None and not (root / SPEC_FILE).is_file():
        root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        spec = _prepare_dir(root, spec)
        if trials is not None:
            if not spec.is_search:
                raise UsageError("--trials is the number of configs a --search tries")
            spec.trials = trials
            (root / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        if parallel is not None and parallel < 1:
            raise UsageError(f"--parallel {parallel}: give 1 or more")
        if parallel is not None and parallel != spec.parallel:  # kept for --resume
            spec.parallel = parallel
            (root / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
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
