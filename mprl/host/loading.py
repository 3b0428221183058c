"""A checkpoint read back as objects: :func:`load` (``mprl.load``) and :class:`Checkpoint`.

The model is rebuilt by the algorithm that wrote the checkpoint (its ``make_model``, with the
checkpoint's config, for the env's spaces), so loading needs that algorithm's plugin installed.
``mprl eval`` plays what this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import gymnasium as gym
import torch

from mprl.algorithm import Algorithm
from mprl.errors import UsageError
from mprl.host import checkpoint
from mprl.host.envs import check_trusted, make_env
from mprl.host.job import algorithm_of, build_model, load_state, resolve
from mprl.host.plugins import PluginManager, get_plugin_manager
from mprl.run_types import RunConfig
from mprl.schema import Dims, obs_dtype


@attrs.frozen(repr=False)
class Checkpoint:
    """A run's checkpoint, loaded: what :func:`mprl.load` returns.

    ``model`` is the algorithm's model with the checkpoint's weights, on the CPU, in eval mode;
    :meth:`act` plays it. The optimizers' states are ``state_dict``\\ s: build an optimizer
    with the algorithm's factory (``spec.optimizers[name](model, config)``) and
    ``load_state_dict`` one into it to train on. ``data`` is the file's whole content, as
    ``docs/reference.md`` ("Checkpoints") describes it.
    """

    #: the checkpoint file
    path: Path
    #: the algorithm's name, the plugin that registers it and that plugin's version
    algorithm: str
    plugin: str
    plugin_version: str
    #: the :class:`mprl.Algorithm` that wrote the checkpoint, as installed here
    spec: Algorithm
    #: the algorithm's config (an instance of ``spec.config_cls``) and the run options
    config: Any
    run: RunConfig
    model: torch.nn.Module
    observation_space: gym.Space
    action_space: gym.Space
    #: ``make_optimizer``'s optimizer's state (``None``: the algorithm has none)
    optimizer_state: dict[str, Any] | None
    #: the named optimizers' states (``Algorithm(optimizers=...)``), by name
    optimizer_states: dict[str, dict[str, Any]]
    #: the shared state's data, by field (``Schema.snapshot``: replay rows, counters, ...)
    shared_state: dict[str, Any]
    #: env steps and episodes of every session so far; 0 for a new run, 1 after one resume ...
    env_steps: int
    episodes: int
    session: int
    #: the checkpoint's format version, and the mprl that wrote it
    format_version: int
    mprl_version: str
    data: Mapping[str, Any]

    def act(self, obs_batch: Any, deterministic: bool = False) -> Any:
        """The model's actions for a batch of observations (a tensor or an array, the batch
        along dim 0): ``model.act(obs_batch, deterministic)`` without gradients. The models of
        :mod:`mprl.lib.nets` and the built-in algorithms have one."""
        act = getattr(self.model, "act", None)
        if not callable(act):
            raise TypeError(
                f"algorithm {self.algorithm!r}: its model ({type(self.model).__name__}) has no "
                "act(obs_batch, deterministic) method"
            )
        batch = torch.as_tensor(obs_batch, dtype=obs_dtype(self.observation_space))
        with torch.no_grad():
            return act(batch, deterministic)

    def __repr__(self) -> str:
        return (
            f"Checkpoint({str(self.path)!r}, algorithm={self.algorithm!r}, "
            f"env={self.run.env!r}, env_steps={self.env_steps}, session={self.session})"
        )


def load(
    path_or_run_dir: str | Path,
    *,
    env: str | None = None,
    plugins: PluginManager | None = None,
) -> Checkpoint:
    """Load a run's last checkpoint (a run directory) or a checkpoint file.

    The model is rebuilt by the checkpoint's algorithm with its config, for the spaces of its
    env (made once to read them), its weights loaded; it is on the CPU, in eval mode.
    ``env`` must be the checkpoint's env id when given: an id that imports a module
    (``module:Env-v0``) is made only when you give it. ``plugins``: where the algorithm is
    found (default: the installed plugins).

    :raises mprl.errors.UsageError: no checkpoint there, a file that is not an mprl checkpoint
        or is truncated (naming the file), an algorithm whose plugin is not installed (naming
        the plugin and its distribution), a model that does not fit.
    """
    file, data = checkpoint.load(path_or_run_dir)
    checked_env(file, data, env)
    pm = plugins or get_plugin_manager()
    plugin, algo, config, run = resolved(pm, file, data)
    probe = make_env(pm, run.env)
    try:
        spaces = probe.observation_space, probe.action_space
    finally:
        probe.close()
    return restored(file, data, pm, plugin, algo, config, run, *spaces)


def checked_env(file: Path, data: Mapping[str, Any], env: str | None) -> None:
    """Refuse to make a checkpoint's env that imports a module unless the user gave it (``env``),
    and an ``env`` other than the checkpoint's."""
    saved = str(data["run"].get("env", ""))
    check_trusted(saved, f"checkpoint {str(file)!r}", env)
    if env is not None and env != saved:
        raise UsageError(f"checkpoint {str(file)!r} was trained on {saved!r}, not {env!r}")


def resolved(
    pm: PluginManager, file: Path, data: Mapping[str, Any]
) -> tuple[str, Algorithm, Any, RunConfig]:
    """The checkpoint's plugin, algorithm, config and run options, as a run resolves them; the
    run options of a plugin not installed here are left out."""
    plugin, algo = algorithm_of(pm, file, data)
    saved = pm.run_options().known(data["run"])
    # what only a run needs of this machine (a GPU, EnvPool) is not asked for here
    here = {"device": "cpu", "env_batch": "gym"}
    try:
        _, algo, config, run = resolve(algo.name, pm, data["config"], {**saved, **here})
    except UsageError as exc:
        raise UsageError(
            f"checkpoint {str(file)!r} was written by algorithm {algo.name!r} of plugin "
            f"{plugin!r}: {exc}"
        ) from None
    kept = {k: saved[k] for k in here if k in saved}
    return plugin, algo, config, attrs.evolve(run, **kept) if kept else run


def restored(
    file: Path,
    data: Mapping[str, Any],
    pm: PluginManager,
    plugin: str,
    algo: Algorithm,
    config: Any,
    run: RunConfig,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> Checkpoint:
    """The :class:`Checkpoint` of ``data``: the model rebuilt for the spaces, weights loaded."""
    dims = Dims(run.workers, observation_space, action_space, config)
    model = build_model(algo, dims)
    load_state(file, "model", model, data["model"], algo)
    model.eval()
    return Checkpoint(
        path=file,
        algorithm=algo.name,
        plugin=plugin,
        plugin_version=str(data.get("plugin_version") or pm.distribution_of(plugin)[1]),
        spec=algo,
        config=config,
        run=run,
        model=model,
        observation_space=observation_space,
        action_space=action_space,
        optimizer_state=data["optimizer"],
        optimizer_states=dict(data.get("optimizers") or {}),
        shared_state=dict(data["shared_state"]),
        env_steps=int(data["env_steps"]),
        episodes=int(data["episodes"]),
        session=int(data["session"]),
        format_version=int(data.get("version", 1)),
        mprl_version=str(data.get("mprl_version", "")),
        data=data,
    )
