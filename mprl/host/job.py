"""Preparing a job from the user's input: the plugin, config and run options resolved, the
environment's spaces read, the model and optimizer built (and restored from a checkpoint on
resume). Everything is checked here, before anything starts or is written: a problem raises
:class:`mprl.errors.UsageError`. Starts no process and touches no run directory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import gymnasium as gym
import torch

from mprl import kinds
from mprl.algorithm import Algorithm
from mprl.backends.base import Job, available_memory
from mprl.device import check_device
from mprl.errors import PluginError, UsageError
from mprl.host import checkpoint
from mprl.host.config import build
from mprl.host.envs import EnvFactory, check_env, check_trusted, try_env, workload
from mprl.host.plugins import PluginManager
from mprl.run_types import RunConfig
from mprl.schema import Dims


@attrs.frozen
class Resume:
    """What a resumed run takes over from its checkpoint."""

    file: Path
    data: dict[str, Any]

    @property
    def session(self) -> int:
        return int(self.data["session"]) + 1


@attrs.frozen
class Prepared:
    """A checked job, and what the host needs around it."""

    job: Job
    plugin: str
    plugin_version: str
    reward_threshold: float | None
    resume: Resume | None = None
    #: by shared-state field, what a resume did to fit its checkpointed data to this run
    state_notes: Mapping[str, str] = attrs.field(factory=dict)
    #: the distribution whose entry point loaded the plugin (``None``: registered in code)
    plugin_distribution: str | None = None


def resolve(
    plugin: str,
    pm: PluginManager,
    config: Mapping[str, Any] | Any | None,
    run_options: Mapping[str, Any],
) -> tuple[str, Algorithm, Any, RunConfig]:
    """The plugin name, algorithm, config and run options; UsageError on anything wrong."""
    plugin_name, algo = pm.algorithm(plugin)
    options = pm.run_options()
    given = {k.replace("-", "_"): v for k, v in run_options.items() if v is not None}
    # the algorithm's own defaults (dqn judges "solved" on evaluations), under the user's values
    options.unknown(algo.run_defaults, f"algorithm {algo.name!r}'s run_defaults")
    run_cfg = options.build({**algo.run_defaults, **given})
    if not run_cfg.env:
        run_cfg = attrs.evolve(run_cfg, env=algo.default_env)
    check_device(run_cfg.device, algo.name, trains_in_workers=algo.train is None)
    check_env(pm, run_cfg)
    if config is None or isinstance(config, Mapping):
        preset = algo.presets.get(workload(pm, run_cfg.env) or "", {})
        config = build(algo.config_cls, {**preset, **(config or {})}, source=f"{algo.name} config")
    elif not isinstance(config, algo.config_cls):
        raise UsageError(f"config must be a {algo.config_cls.__qualname__} or a mapping")
    return plugin_name, algo, config, run_cfg


def algorithm_of(pm: PluginManager, file: Path, data: Mapping[str, Any]) -> tuple[str, Algorithm]:
    """The plugin name and :class:`Algorithm` that wrote checkpoint ``file`` (its ``data``);
    a :class:`UsageError` naming the plugin and its distribution when it is not installed."""
    try:
        return pm.algorithm(data["algorithm"])
    except UsageError as exc:
        dist = data.get("plugin_distribution")
        version = data.get("plugin_version") or ""
        where = f"distribution {dist!r} {version}".rstrip() if dist else f"version {version}"
        claimed = data["plugin"] in pm.plugin_conflicts or data["algorithm"] in pm.conflicts
        need = "" if claimed else ", which must be installed to load it"  # installed twice
        raise UsageError(
            f"checkpoint {str(file)!r} was written by algorithm {data['algorithm']!r} of plugin "
            f"{data['plugin']!r} ({where}){need}: {exc}"
        ) from None


def _resume_inputs(
    resume: Resume,
    plugin: str | None,
    pm: PluginManager,
    config: Mapping[str, Any] | Any | None,
    options: Mapping[str, Any],
) -> tuple[str, Mapping[str, Any] | Any, dict[str, Any]]:
    """Plugin, config and run options of a resumed run: the checkpoint's, with overrides."""
    data, file = resume.data, str(resume.file)
    if plugin is not None and plugin not in (data["algorithm"], data["plugin"]):
        raise UsageError(
            f"checkpoint {file!r} was written by algorithm {data['algorithm']!r}, not "
            f"{plugin!r}; leave out --plugin when resuming"
        )
    algorithm_of(pm, resume.file, data)
    env = options.get("env")
    check_trusted(str(data["run"].get("env", "")), f"checkpoint {file!r}", env)
    if env is not None and env != data["run"].get("env"):
        raise UsageError(
            f"checkpoint {file!r} was trained on {data['run'].get('env')!r}; a resumed run "
            f"cannot change --env to {env!r}"
        )
    if config is None or isinstance(config, Mapping):
        config = {**data["config"], **(config or {})}
    saved = pm.run_options().known(data["run"])  # a plugin's that is gone: at its default
    merged = {**saved, **{k: v for k, v in options.items() if v is not None}}
    return data["algorithm"], config, merged


def load_state(
    file: Path, what: str, target: Any, state: Any, algo: Algorithm, *, resumed: bool = False
) -> None:
    """``target.load_state_dict(state)`` (a model, an optimizer) from checkpoint ``file``; a
    :class:`UsageError` naming the file and ``what`` when it does not fit."""
    try:
        target.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(
            f"checkpoint {str(file)!r}: its {what} does not fit algorithm {algo.name!r}"
            + (
                f" with this config ({first}); was the config changed with --set?"
                if resumed
                else f" ({first})"
            )
        ) from None


def _load_state(resume: Resume, what: str, target: Any, state: Any, algo: Algorithm) -> None:
    load_state(resume.file, what, target, state, algo, resumed=True)


def materialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create an optimizer's lazily made state (Adam moments, step counts) now, as zeros.

    The state must exist before the processes start to be shared; it is made with a zero-lr
    step on zero gradients and reset to zero, which is the initial state of Adam, RMSprop and
    SGD's momentum alike. State that exists already (a resumed run) is kept.
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


def _spaces(
    make: EnvFactory, env_id: str, algo: Algorithm
) -> tuple[gym.Space, gym.Space, float | None]:
    """The env's spaces, checked against ``algo``, and reward threshold; the env is reset and
    stepped once first (:func:`try_env`): one that returns NaN, a string reward ... is refused
    before anything starts."""
    probe = make(env_id)
    try:
        algo.check_spaces(env_id, probe.observation_space, probe.action_space)
        try_env(probe, env_id)
        threshold = probe.spec.reward_threshold if probe.spec is not None else None
        return probe.observation_space, probe.action_space, threshold
    finally:
        probe.close()


def _check_model_size(algo: Algorithm, dims: Dims, copies: int) -> None:
    """Refuse a model whose ``copies`` (the shared one, the optimizer's state, each process's
    own) cannot fit the machine's memory: it is built on the meta device first, which costs
    nothing. A model that cannot be built there is not checked."""
    try:
        with torch.device("meta"):
            model = algo.make_model(dims.observation_space, dims.action_space, dims.config)
        tensors = [*model.parameters(), *model.buffers()]
        numel = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
    except Exception:
        return
    available = available_memory()
    if available is not None and nbytes * copies > available:
        gib = 2**30
        raise UsageError(
            f"algorithm {algo.name!r}: its model has {numel:,} parameters "
            f"({nbytes / gib:.1f} GiB); with the optimizer's state and a copy per process the "
            f"run needs about {nbytes * copies / gib:.1f} GiB, more than the "
            f"{available / gib:.1f} GiB this machine has available. Make it smaller (its "
            "config's sizes, e.g. --set hidden=...)"
        )


def _built(algo: Algorithm, what: str, make: Any, *args: Any) -> Any:
    """``make(*args)``: a plugin's factory; whatever it raises names the algorithm."""
    try:
        return make(*args)
    except UsageError:  # the plugin's own word on bad input (a config that cannot work)
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PluginError(
            f"algorithm {algo.name!r}: {what} failed with this config: "
            f"{type(exc).__name__}: {first}"
        ) from exc


def build_model(algo: Algorithm, dims: Dims, copies: int = 1) -> torch.nn.Module:
    """The algorithm's model for ``dims``, checked: its size against the machine's memory (for
    ``copies`` copies), its type."""
    _check_model_size(algo, dims, copies)
    model = _built(
        algo, "make_model", algo.make_model, dims.observation_space, dims.action_space, dims.config
    )
    if not isinstance(model, torch.nn.Module):
        raise PluginError(
            f"algorithm {algo.name!r}: make_model returned {type(model).__name__}, "
            "expected a torch.nn.Module"
        )
    return model


def _optimizer(
    algo: Algorithm, what: str, make: Any, arg: Any, dims: Dims, saved: Any, resume: Resume | None
) -> torch.optim.Optimizer:
    """An optimizer from the algorithm's factory ``make(arg, config)``, checked, restored from
    the checkpoint's ``saved`` state on resume, its state made."""
    optimizer = _built(algo, what, make, arg, dims.config)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise PluginError(
            f"algorithm {algo.name!r}: {what} returned {type(optimizer).__name__}, "
            "expected a torch.optim.Optimizer"
        )
    if resume is not None and saved is not None:
        _load_state(resume, f"{what} state", optimizer, saved, algo)
    materialize_optimizer_state(optimizer)
    return optimizer


def _model_and_optimizers(
    algo: Algorithm, dims: Dims, seed: int, resume: Resume | None
) -> tuple[torch.nn.Module, torch.optim.Optimizer | None, dict[str, torch.optim.Optimizer]]:
    copies = 3 + dims.workers + 1  # shared, optimizer state (2), each process's own
    with torch.random.fork_rng(devices=[]):  # initial weights follow the run seed only
        torch.manual_seed(seed)
        model = build_model(algo, dims, copies)
    data = resume.data if resume is not None else {}
    if resume is not None:
        _load_state(resume, "model", model, data["model"], algo)
    optimizer = None
    if algo.make_optimizer is not None:
        optimizer = _optimizer(
            algo, "make_optimizer", algo.make_optimizer, model.parameters(), dims,
            data.get("optimizer"), resume,
        )  # fmt: skip
    saved = data.get("optimizers") or {}
    named = {
        name: _optimizer(algo, f"optimizers[{name!r}]", make, model, dims, saved.get(name), resume)
        for name, make in algo.optimizers.items()
    }
    return model, optimizer, named


def _fitted_state(
    resume: Resume, algo: Algorithm, dims: Dims, drop: Sequence[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The checkpoint's shared state made to fit this run (:meth:`mprl.schema.Schema.fit`),
    less the fields named in ``drop``; by field, what was done. A field that cannot be made to
    fit is a :class:`UsageError` unless dropped."""
    saved = dict(resume.data["shared_state"])
    fields = algo.schema.fields
    unknown = [name for name in drop if name not in fields and name not in saved]
    if unknown:
        raise UsageError(
            f"--resume-drop {','.join(unknown)}: algorithm {algo.name!r} has no shared-state "
            f"field of that name; its fields: {', '.join(fields) or 'none'}"
        )

    def field(name: str) -> str:
        decl = fields.get(name)
        return f"shared-state field {name!r}" + (f" ({decl.kind})" if decl is not None else "")

    notes = {}
    for name in drop:
        if saved.pop(name, None) is not None:
            notes[name] = f"{field(name)}: its data dropped (--resume-drop); it starts as declared"
    fitted = kinds.fit(algo.schema, saved, dims)
    if fitted.unfit:
        was, now = resume.data["run"].get("workers"), dims.workers
        changed = f" with {now} workers (it was saved with {was})" if was and was != now else ""
        which = "; ".join(
            f"{field(name)} cannot be fitted to this run: {why}"
            for name, why in fitted.unfit.items()
        )
        them = "them" if len(fitted.unfit) > 1 else "it"
        raise UsageError(
            f"cannot resume checkpoint {str(resume.file)!r}{changed}: {which}. Pass "
            f"--resume-drop {','.join(fitted.unfit)} (mprl.run(resume_drop=...)) to start {them} "
            f"as declared, its saved data dropped"
            + (f", or resume with --workers {was}" if changed else "")
        )
    notes.update({name: f"{field(name)}: {note}" for name, note in fitted.notes.items()})
    return fitted.data, notes


def prepare_job(
    pm: PluginManager,
    plugin: str | None,
    config: Mapping[str, Any] | Any | None,
    options: Mapping[str, Any],
    resume: str | Path | None = None,
    resume_drop: Sequence[str] = (),
) -> Prepared:
    """Check the input and build the job: the algorithm (``plugin``, or the checkpoint's when
    resuming), its config, the run options, the env's spaces, the model and the optimizer.
    ``resume_drop`` names shared-state fields whose checkpointed data is left out."""
    resumed = None
    if resume_drop and resume is None:
        raise UsageError("--resume-drop is for a resumed run: give --resume RUN_DIR too")
    if resume is not None:
        resumed = Resume(*checkpoint.load(resume))
        plugin, config, options = _resume_inputs(resumed, plugin, pm, config, options)
    elif plugin is None:
        installed = ", ".join(sorted(pm.algorithms())) or "none"
        raise UsageError(f"no plugin given; installed: {installed}")
    plugin_name, algo, cfg, run_cfg = resolve(plugin, pm, config, options)
    make_env = EnvFactory(pm)  # made here first: it knows which plugin makes the env
    obs_space, act_space, threshold = _spaces(make_env, run_cfg.env, algo)
    if run_cfg.target_return is not None:
        threshold = run_cfg.target_return
    dims = Dims(run_cfg.workers, obs_space, act_space, cfg)
    kinds.check_dims(algo.schema, dims)
    model, optimizer, optimizers = _model_and_optimizers(algo, dims, run_cfg.seed, resumed)
    initial_steps: tuple[int, ...] = ()
    state_snapshot: dict[str, Any] = {}
    notes: dict[str, str] = {}
    if resumed is not None:
        state_snapshot, notes = _fitted_state(resumed, algo, dims, resume_drop)
        saved = [int(x) for x in resumed.data["steps"]]
        initial_steps = (
            tuple(saved)
            if len(saved) == run_cfg.workers + 2
            else (0,) * (run_cfg.workers + 1) + (sum(saved),)
        )
    job = Job(
        algorithm=algo,
        config=cfg,
        run=run_cfg,
        dims=dims,
        model=model,
        optimizer=optimizer,
        optimizers=optimizers,
        make_env=make_env,
        initial_steps=initial_steps,
        state_snapshot=state_snapshot,
        session=0 if resumed is None else resumed.session,
    )
    _, plugin_version = pm.distribution_of(plugin_name)
    dist = checkpoint.distribution(pm, plugin_name)
    return Prepared(job, plugin_name, plugin_version, threshold, resumed, notes, dist)
