"""One training run, from checked input to ``summary.json``: the public :func:`run`."""

from __future__ import annotations

import copy
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import torch
from attrs import validators as v

from mprl import __version__, checkpoint, preflight
from mprl.algorithm import Algorithm
from mprl.backend import ChildFailure, Job, Outcome
from mprl.config import as_dict, build
from mprl.envs import make_env, play_episodes
from mprl.errors import PluginError, RunFailed, UsageError
from mprl.plugins import PluginManager, get_plugin_manager
from mprl.progress import Progress
from mprl.rundir import RunDir
from mprl.schema import SharedState
from mprl.stats import RunStats

METRICS_EVERY_S = 5.0  # how often the main process writes its own progress record
CHECK_EPISODES = 10  # episodes the main process plays to confirm a run is solved


def _positive_or_none(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1 or unset (no limit): {value}")


@attrs.frozen
class RunConfig:
    """Options of a run that are not the algorithm's: what ``--env``, ``--workers`` ... set."""

    env: str = attrs.field(
        default="", metadata={"help": "gymnasium env id (default: the algorithm's default env)"}
    )
    workers: int = attrs.field(
        factory=lambda: os.cpu_count() or 1,
        validator=v.ge(1),
        metadata={"help": "number of worker processes (default: number of cores)"},
    )
    seed: int = attrs.field(default=0, validator=v.ge(0), metadata={"help": "run seed"})
    total_steps: int | None = attrs.field(
        default=None,
        validator=_positive_or_none,
        metadata={"help": "stop after this many env steps (default: when solved)"},
    )
    start_interval: float = attrs.field(
        default=0.0, validator=v.ge(0), metadata={"help": "seconds to sleep between worker starts"}
    )
    torch_threads: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata={"help": "torch threads per child (0: cores / children)"},
    )
    backend: str = attrs.field(
        default="local",
        metadata={"help": "where processes run: local (spawned) or serial (see --serial)"},
    )
    max_restarts: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata={"help": "restarts allowed per worker rank before the run fails (default 0)"},
    )
    restart_delay: float = attrs.field(
        default=1.0,
        validator=v.ge(0),
        metadata={"help": "seconds before a restart; doubles with each failure in a row"},
    )
    max_consecutive_failures: int = attrs.field(
        default=3,
        validator=v.ge(1),
        metadata={"help": "give up on a worker that failed this often without taking a step"},
    )
    worker_timeout: float = attrs.field(
        default=60.0,
        validator=v.ge(0),
        metadata={"help": "seconds without a heartbeat (after start-up) until hung; 0: off"},
    )
    checkpoint_every: float = attrs.field(
        default=60.0,
        validator=v.ge(0),
        metadata={"help": "seconds between checkpoints (0: only at the end)"},
    )
    tensorboard: bool = attrs.field(
        default=False,
        metadata={
            "help": "write TensorBoard event files to RUN_DIR/tensorboard "
            '(pip install "mprl[tensorboard]")'
        },
    )


@attrs.frozen
class RunInfo:
    """What a run is, as hooks see it."""

    plugin: str
    plugin_version: str
    algorithm: str
    config: Any
    run: RunConfig
    run_dir: Path
    reward_threshold: float | None


@attrs.frozen
class Summary:
    """How a run ended; also written as ``summary.json``."""

    status: str  # "finished", "failed" or "interrupted"
    stop_reason: str
    solved: bool
    env_steps: int
    episodes: int
    wall_s: float
    mean_return_100: float | None
    best_return: float | None
    run_dir: Path
    plugin: str
    algorithm: str
    env: str
    per_worker_steps: tuple[int, ...] = ()
    restarts: tuple[int, ...] = ()  # per worker rank, in this session
    session: int = 0  # how many times the run was resumed
    shutdown_s: float | None = None  # seconds from the stop signal to the last child gone
    failures: tuple[ChildFailure, ...] = ()
    signal: int | None = None
    #: when it was found solved: ``wall_s``, ``env_steps``, ``episodes``, ``mean_return_100``
    #: (empty for a run solved before this was kept)
    solved_at: Mapping[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        """0 finished, 1 failed, 128 + signal number when stopped by a signal."""
        if self.status == "failed":
            return 1
        if self.signal is not None:
            return 128 + self.signal
        return 0

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=True)
        out["run_dir"] = str(self.run_dir)
        out["exit_code"] = self.exit_code
        return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def materialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create an optimizer's lazily made state (Adam moments, step counts) now, as zeros.

    The state must exist before the children are spawned to be shared; it is made with a
    zero-lr step on zero gradients and reset to zero, which is the initial state of Adam,
    RMSprop and SGD's momentum alike. State that exists already (a resumed run) is kept.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if all(optimizer.state.get(p) for p in params):
        return
    grads = [p.grad for p in params]
    lrs = [group.get("lr") for group in optimizer.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = 0.0
    with torch.no_grad():
        optimizer.step()
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        if lr is not None:
            group["lr"] = lr
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                value.zero_()


def _optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]


def share_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Put an optimizer's state in shared memory, in place, creating it first if needed."""
    materialize_optimizer_state(optimizer)
    for value in _optimizer_tensors(optimizer):
        value.share_memory_()


class _Signals:
    """First SIGINT / SIGTERM asks for a clean stop; a second SIGINT forces a fast exit."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.forced = False

    def handle(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            if not self.forced:  # once: the forced exit's own cleanup must not be interrupted
                self.forced = True
                raise KeyboardInterrupt
            return
        if self.received is None:
            self.received = signum

    @contextmanager
    def installed(self) -> Iterator[_Signals]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


@attrs.define
class _Resume:
    """What a resumed run takes over from its checkpoint."""

    file: Path
    data: dict[str, Any]

    @property
    def session(self) -> int:
        return int(self.data["session"]) + 1


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Torch ops on one thread in this process meanwhile. The main process plays the policy
    check while the children keep every core busy; with a second intra-op thread that gets no
    core, a 10-row forward took 0.7 ms instead of 0.02 and the check 1.4-2 s instead of 0.2."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _RunMonitor:
    """The runner's side of the backend seam: stats, metrics, reporters, progress, checkpoints,
    and the decision to stop."""

    def __init__(
        self,
        info: RunInfo,
        job: Job,
        rundir: RunDir,
        pm: PluginManager,
        progress: Progress,
        signals: _Signals,
        resume: _Resume | None,
    ) -> None:
        self.info = info
        self.job = job
        self.rundir = rundir
        self.pm = pm
        self.progress = progress
        self.signals = signals
        self.stats = RunStats(info.reward_threshold, info.run.total_steps)
        self.stats.workers = info.run.workers
        if resume is not None:
            self.stats.restore(resume.data["stats"])
        self._wall0 = time.time() - self.stats.wall_s
        self._last_main_record = time.monotonic()
        self._last_checkpoint = time.monotonic()
        self._solved_logged = self.stats.solved()  # a resumed run solved before: logged then
        self.state: SharedState | None = None
        self._check_after = 0  # episodes: the next check of the policy waits for this many
        self._player: Any = None  # (model copy, envs) that play the policy in the main process
        self._solved_weights: dict[str, torch.Tensor] | None = None

    def on_start(self, state: SharedState) -> None:
        self.state = state

    def on_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        out = []
        for record in records:
            record = dict(record)
            record["wall"] = round(record.pop("time", time.time()) - self._wall0, 4)
            self.stats.add(record)
            out.append(record)
        self._emit(out)

    def on_event(self, record: Mapping[str, Any]) -> None:
        record = {"source": "main", "step": self.stats.env_steps, **record}
        record["wall"] = round(time.time() - self._wall0, 4)
        if record["event"] == "restart":
            self.stats.restarts += 1
        tb = record.pop("traceback", "")
        self.progress.message(f"mprl: {record['message']}", tb)
        self._emit([record])

    def _emit(self, records: list[dict[str, Any]]) -> None:
        self.rundir.append_metrics(records)
        self.pm.hook.mprl_report_metrics(run=self.info, records=records)

    def on_tick(self, env_steps: int, per_worker_steps: Sequence[int]) -> str | None:
        self.stats.set_steps(per_worker_steps)
        snap = self.stats.snapshot()
        self.progress.update(snap)
        now = time.monotonic()
        if now - self._last_main_record >= METRICS_EVERY_S:
            self._last_main_record = now
            self._emit([self._main_record()])
        every = self.info.run.checkpoint_every
        if every and now - self._last_checkpoint >= every:
            self.checkpoint()
        if self.signals.received is not None:
            return signal.Signals(self.signals.received).name
        if self._solved():
            if not self._solved_logged:  # when, and at which mean: the summary's mean is the
                self._solved_logged = True  # last 100 episodes when the run ended
                self._emit([{**self._main_record(), "event": "solved"}])
            return "solved"
        total = self.info.run.total_steps
        if total is not None and env_steps >= total:
            return "total steps reached"
        return None

    def _solved(self) -> bool:
        """Solved: the mean of the last 100 training episodes reached the threshold, and the
        policy of that moment, played for :data:`CHECK_EPISODES` episodes here, reaches it too.

        Training returns lag the policy: an asynchronous run can reach the threshold on
        episodes begun by earlier, better weights while the current ones have drifted off, and
        then it would save a policy that does not play as well as "solved" says. The policy is
        copied, played with sampled actions as in training, and the copy is what the final
        checkpoint keeps. One that falls short is logged, and training goes on; the next check
        waits for another ``2 * CHECK_EPISODES`` training episodes.
        """
        stats = self.stats
        if stats.solved() or not stats.reached() or stats.episodes < self._check_after:
            return stats.solved()
        self._check_after = stats.episodes + 2 * CHECK_EPISODES
        act = getattr(self.job.model, "act", None)
        if not callable(act):  # nothing to play it with: the training returns decide alone
            stats.mark_solved()
            return True
        if self._player is None:  # an env per check episode, played together: the check
            # competes with the run's children for the CPU, and one batched forward a step
            # takes a fraction of the time of one per env and step
            run = self.info.run
            envs = [
                make_env(self.pm, run.env, seed=run.seed, index=i) for i in range(CHECK_EPISODES)
            ]
            self._player = (copy.deepcopy(self.job.model), envs)
        model, envs = self._player
        model.load_state_dict(self.job.model.state_dict())
        seed = self.info.run.seed + stats.episodes
        start = time.monotonic()
        with torch.random.fork_rng(devices=[]), torch.no_grad(), _one_torch_thread():
            torch.manual_seed(seed)
            returns, _ = play_episodes(envs, model.act, CHECK_EPISODES, False, seed)
        mean = sum(returns) / len(returns)
        threshold = self.info.reward_threshold
        record = {
            "event": "policy-check", "mean_return": mean, "check_episodes": CHECK_EPISODES,
            "check_s": round(time.monotonic() - start, 3),
        }  # fmt: skip
        if mean >= threshold:
            self._solved_weights = {k: v.clone() for k, v in model.state_dict().items()}
            stats.mark_solved()
            self._emit([{**self._main_record(), **record}])
        else:
            message = (
                f"the mean of the last 100 episodes reached {threshold:g}, but the policy now "
                f"plays {mean:.1f} over {CHECK_EPISODES} episodes; training goes on"
            )
            self.on_event({**self._main_record(), **record, "message": message})
        return stats.solved()

    def on_stop(self, per_slot_steps: Sequence[int]) -> None:
        self.stats.set_steps(per_slot_steps)
        if self._solved_weights is not None:  # every child has stopped: nothing writes it now
            self.job.model.load_state_dict(self._solved_weights)
        if self._player is not None:
            for env in self._player[1]:
                env.close()
        self.checkpoint()

    def checkpoint(self) -> Path | None:
        """Save ``checkpoints/last.pt`` now (atomically) and log it in the metrics.

        A failed write (disk full, directory gone) is reported and the run goes on with the
        previous checkpoint kept; it is not a reason to lose the run.
        """
        start = time.monotonic()
        self._last_checkpoint = start
        shared: dict[str, Any] = {}
        if self.state is not None:
            try:
                shared = self.job.algorithm.schema.snapshot(self.state)
            except (OSError, EOFError) as exc:  # the Manager server is gone
                self.on_event(
                    {"event": "checkpoint-partial", "message": f"shared state not saved: {exc!r}"}
                )
        try:
            path = self._save(shared)
        except OSError as exc:
            self.on_event(
                {
                    "event": "checkpoint-failed",
                    "message": f"checkpoint not written ({exc}); the previous one is kept",
                }
            )
            return None
        self._emit(
            [
                {
                    "source": "main",
                    "event": "checkpoint",
                    "step": self.stats.env_steps,
                    "wall": round(self.stats.wall_s, 4),
                    "path": str(path),
                    "seconds": round(time.monotonic() - start, 4),
                }
            ]
        )
        return path

    def _save(self, shared: dict[str, Any]) -> Path:
        info, job, stats = self.info, self.job, self.stats
        return self.rundir.save_checkpoint(
            {
                "format": checkpoint.FORMAT,
                "version": checkpoint.VERSION,
                "mprl_version": __version__,
                "plugin": info.plugin,
                "plugin_version": info.plugin_version,
                "algorithm": info.algorithm,
                "config": as_dict(info.config),
                "run": as_dict(info.run),
                "session": job.session,
                "model": job.model.state_dict(),
                "optimizer": job.optimizer.state_dict() if job.optimizer is not None else None,
                "env_steps": stats.env_steps,
                "episodes": stats.episodes,
                "steps": list(stats.per_worker) or [0] * (info.run.workers + 2),
                "stats": stats.state(),
                "shared_state": shared,
                "extra_state": {  # make_shared objects that have a state to keep (Weights)
                    name: obj.state_dict()
                    for name, obj in job.extra_state.items()
                    if hasattr(obj, "state_dict")
                },
                "rng": checkpoint.rng_states(),
                "time": time.time(),
            }
        )

    def _main_record(self) -> dict[str, Any]:
        s = self.stats
        return {
            "source": "main",
            "step": s.env_steps,
            "wall": round(s.wall_s, 4),
            "steps_per_s": round(s.steps_per_s, 1),
            "episodes": s.episodes,
            "mean_return_100": _finite(s.mean_return_100),
        }


def _check_main_guard() -> None:
    # spawn sets _inheriting while a child imports the parent's main module
    if getattr(mp.current_process(), "_inheriting", False):
        raise UsageError(
            "mprl.run() was called while a spawned child process was importing your script. "
            "Child processes re-import the main module, so start the run under "
            '`if __name__ == "__main__":` (see the README)'
        )


def prepare(
    plugin: str,
    pm: PluginManager,
    config: Mapping[str, Any] | Any | None,
    run_options: Mapping[str, Any],
) -> tuple[str, Algorithm, Any, RunConfig]:
    """Resolve the plugin, config and run options; raise UsageError on anything wrong."""
    plugin_name, algo = pm.algorithm(plugin)
    if config is None or isinstance(config, Mapping):
        config = build(algo.config_cls, config or {}, source=f"{algo.name} config")
    elif not isinstance(config, algo.config_cls):
        raise UsageError(f"config must be a {algo.config_cls.__qualname__} or a mapping")
    run_cfg = build(
        RunConfig, {k: v for k, v in run_options.items() if v is not None}, source="run option"
    )
    if not run_cfg.env:
        run_cfg = attrs.evolve(run_cfg, env=algo.default_env)
    return plugin_name, algo, config, run_cfg


def _resume_inputs(
    resume: _Resume,
    plugin: str | None,
    pm: PluginManager,
    config: Mapping[str, Any] | Any | None,
    options: dict[str, Any],
) -> tuple[str, Mapping[str, Any] | Any, dict[str, Any]]:
    """Plugin, config and run options of a resumed run: the checkpoint's, with overrides."""
    data, file = resume.data, str(resume.file)
    if plugin is not None and plugin not in (data["algorithm"], data["plugin"]):
        raise UsageError(
            f"checkpoint {file!r} was written by algorithm {data['algorithm']!r}, not "
            f"{plugin!r}; leave out --plugin when resuming"
        )
    try:
        pm.algorithm(data["algorithm"])
    except UsageError as exc:
        raise UsageError(
            f"checkpoint {file!r} was written by algorithm {data['algorithm']!r} of plugin "
            f"{data['plugin']!r} {data.get('plugin_version', '')}: {exc}"
        ) from None
    env = options.get("env")
    if env is not None and env != data["run"]["env"]:
        raise UsageError(
            f"checkpoint {file!r} was trained on {data['run']['env']!r}; a resumed run cannot "
            f"change --env to {env!r}"
        )
    if config is None or isinstance(config, Mapping):
        config = {**data["config"], **(config or {})}
    merged = {**data["run"], **{k: v for k, v in options.items() if v is not None}}
    return data["algorithm"], config, merged


def _load_state(resume: _Resume, what: str, target: Any, state: Any, algo: Algorithm) -> None:
    try:
        target.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(
            f"checkpoint {str(resume.file)!r}: its {what} does not fit algorithm "
            f"{algo.name!r} with this config ({first}); was the config changed with --set?"
        ) from None


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
    progress: str = "auto",
    plugins: PluginManager | None = None,
    **run_options: Any,
) -> Summary:
    """Train algorithm ``plugin`` and return how the run ended.

    Every :class:`RunConfig` field can be given as a keyword (``max_restarts=2``...).
    ``resume=RUN_DIR`` (or a checkpoint file) continues a run from its last checkpoint: the
    plugin, config and run options are the checkpoint's unless given here, counters continue
    and metrics are appended (to ``run_dir`` when given, else to the original run directory).

    Everything is checked before any process starts (plugin, config, env id, action space,
    checkpoint, shared memory and open files); a problem raises
    :class:`mprl.errors.UsageError`. A crashed child raises :class:`RunFailed` after every
    process has stopped. Ctrl-C / SIGTERM stop the run cleanly and return a summary with
    ``status="interrupted"``.
    """
    _check_main_guard()
    pm = plugins or get_plugin_manager()
    unknown = set(run_options) - set(attrs.fields_dict(RunConfig))
    if unknown:
        known = ", ".join(attrs.fields_dict(RunConfig))
        raise UsageError(f"unknown run option(s) {', '.join(sorted(unknown))}; known: {known}")
    options = {
        "env": env,
        "workers": workers,
        "seed": seed,
        "total_steps": total_steps,
        **run_options,
    }
    resumed: _Resume | None = None
    if resume is not None:
        resumed = _Resume(*checkpoint.load(resume))
        plugin, config, options = _resume_inputs(resumed, plugin, pm, config, options)
    elif plugin is None:
        installed = ", ".join(sorted(pm.algorithms())) or "none"
        raise UsageError(f"no plugin given; installed: {installed}")
    plugin_name, algo, cfg, run_cfg = prepare(plugin, pm, config, options)

    probe = make_env(pm, run_cfg.env)
    try:
        obs_space, act_space = probe.observation_space, probe.action_space
        threshold = probe.spec.reward_threshold if probe.spec is not None else None
    finally:
        probe.close()
    if not algo.supports(act_space):
        allowed = ", ".join(t.__name__ for t in algo.action_spaces)
        raise UsageError(
            f"algorithm {algo.name!r} does not support the action space of {run_cfg.env!r} "
            f"({type(act_space).__name__}); it supports: {allowed}"
        )
    runner = pm.hook.mprl_make_backend(name=run_cfg.backend)
    if runner is None:
        raise UsageError(f"no plugin provides backend {run_cfg.backend!r}; built in: local, serial")

    with torch.random.fork_rng(devices=[]):  # initial weights follow the run seed only
        torch.manual_seed(run_cfg.seed)
        model = algo.make_model(obs_space, act_space, cfg)
    if not isinstance(model, torch.nn.Module):
        raise PluginError(
            f"algorithm {algo.name!r}: make_model returned {type(model).__name__}, "
            "expected a torch.nn.Module"
        )
    if resumed is not None:
        _load_state(resumed, "model", model, resumed.data["model"], algo)
    optimizer = None
    if algo.make_optimizer is not None:
        optimizer = algo.make_optimizer(model.parameters(), cfg)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise PluginError(
                f"algorithm {algo.name!r}: make_optimizer returned {type(optimizer).__name__}, "
                "expected a torch.optim.Optimizer"
            )
        if resumed is not None and resumed.data["optimizer"] is not None:
            _load_state(resumed, "optimizer state", optimizer, resumed.data["optimizer"], algo)
        materialize_optimizer_state(optimizer)
    has_trainer = algo.train is not None
    extra: dict[str, Any] = {}
    if algo.make_shared is not None:
        extra = dict(algo.make_shared(obs_space, act_space, cfg, run_cfg.workers))
        clash = set(extra) & set(algo.schema.fields)
        if clash:
            raise PluginError(
                f"algorithm {algo.name!r}: make_shared returned {', '.join(sorted(clash))}, "
                "already a field of its schema; use other names"
            )
    tensors = [*model.parameters(), *model.buffers(), *_optimizer_tensors(optimizer)]
    nbytes, storages = preflight.shared_bytes(tensors)
    notes = preflight.check(
        shm_bytes=nbytes + algo.schema.shm_bytes(run_cfg.workers),
        storages=storages + len(algo.schema.fields) + 4 * len(extra) + 3,
        processes=run_cfg.workers + int(has_trainer) + 1,
    )
    model.share_memory()
    if optimizer is not None:
        share_optimizer_state(optimizer)

    if resumed is not None and run_dir is None:
        rundir = RunDir.reopen(resumed.file.parent.parent)
    else:
        rundir = RunDir.create(run_dir, algo.name, run_cfg.env)
    _, plugin_version = pm.distribution_of(plugin_name)
    info = RunInfo(plugin_name, plugin_version, algo.name, cfg, run_cfg, rundir.path, threshold)
    session = 0 if resumed is None else resumed.session
    rundir.write_json(
        "config.json",
        {
            "plugin": plugin_name,
            "plugin_version": plugin_version,
            "algorithm": algo.name,
            "mprl_version": __version__,
            "reward_threshold": threshold,
            "session": session,
            "run": as_dict(run_cfg),
            "config": as_dict(cfg),
        },
    )
    initial_steps: tuple[int, ...] = ()
    snapshot: dict[str, Any] = {}
    if resumed is not None:
        saved = [int(x) for x in resumed.data["steps"]]
        initial_steps = (
            tuple(saved)
            if len(saved) == run_cfg.workers + 2
            else (0,) * (run_cfg.workers + 1) + (sum(saved),)
        )
        snapshot = resumed.data.get("shared_state") or {}
        for name, saved_state in (resumed.data.get("extra_state") or {}).items():
            if hasattr(extra.get(name), "load_state_dict"):
                extra[name].load_state_dict(saved_state)
        checkpoint.set_rng_states(resumed.data["rng"])
    job = Job(
        algo,
        cfg,
        run_cfg,
        model,
        optimizer,
        tuple(pm.blocked_names()),
        initial_steps=initial_steps,
        state_snapshot=snapshot,
        session=session,
        extra_state=extra,
        run_dir=rundir.path,
        plugins=pm,
    )
    display = Progress(progress)
    signals = _Signals()
    monitor = _RunMonitor(info, job, rundir, pm, display, signals, resumed)
    try:
        pm.hook.mprl_run_start(run=info)
    except UsageError:  # a reporter cannot start (a missing package): nothing has run yet
        if resumed is None:
            rundir.discard()
        raise
    title = f"mprl: {algo.name} on {run_cfg.env}, {run_cfg.workers} workers -> {rundir.path}"
    if resumed is not None:
        title = (
            f"mprl: resuming {algo.name} on {run_cfg.env} at {sum(initial_steps):,} env steps "
            f"(session {session}), {run_cfg.workers} workers -> {rundir.path}"
        )
    display.start(title)
    for note in notes:
        display.message(f"mprl: {note}")
    if resumed is not None:
        monitor.on_event(
            {"event": "resume", "message": f"resumed from {resumed.file}", "session": session}
        )
    forced = False
    try:
        with signals.installed():
            try:
                outcome = runner.execute(job, monitor)
            except KeyboardInterrupt:
                if not signals.forced:
                    raise
                forced = True  # the second Ctrl-C: children were killed, no final checkpoint
                outcome = Outcome("second SIGINT: forced exit")
    finally:
        display.stop(monitor.stats.snapshot())
    stats = monitor.stats
    status = "failed" if outcome.failures else "finished"
    if signals.received is not None and not outcome.failures:
        status = "interrupted"
    summary = Summary(
        status=status,
        stop_reason=outcome.stop_reason,
        solved=stats.solved(),
        env_steps=stats.env_steps,
        episodes=stats.episodes,
        wall_s=round(stats.wall_s, 3),
        mean_return_100=_finite(stats.mean_return_100),
        best_return=_finite(stats.best_return),
        run_dir=rundir.path,
        plugin=plugin_name,
        algorithm=algo.name,
        env=run_cfg.env,
        per_worker_steps=stats.per_worker[: run_cfg.workers],
        restarts=tuple(outcome.restarts),
        session=session,
        shutdown_s=outcome.shutdown_s,
        failures=tuple(outcome.failures),
        signal=signals.received,
        solved_at=stats.solved_at,
    )
    rundir.write_json("summary.json", summary.to_dict())
    rundir.close()
    pm.hook.mprl_run_end(run=info, summary=summary.to_dict())
    if forced:
        print("mprl: forced exit (second Ctrl-C); kept the last checkpoint", file=sys.stderr)
    if outcome.failures:
        for f in outcome.failures:
            print(f"mprl: {f.who} {f.reason}", file=sys.stderr)
            if f.traceback:
                print(f"--- traceback of {f.who} ---\n{f.traceback.rstrip()}", file=sys.stderr)
        first = outcome.failures[0]
        raise RunFailed(f"{first.who} {first.reason}; run directory: {rundir.path}", summary)
    return summary
