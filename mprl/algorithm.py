"""What a plugin registers: :class:`Algorithm`."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import gymnasium as gym

from mprl import deprecated
from mprl.errors import PluginError, UsageError
from mprl.schema import Schema
from mprl.spaces import agents_of

if TYPE_CHECKING:
    import torch

    from mprl.context import Context

ModelFactory = Callable[[gym.Space, gym.Space, Any], "torch.nn.Module"]
OptimizerFactory = Callable[[Iterable["torch.nn.Parameter"], Any], "torch.optim.Optimizer"]
NamedOptimizerFactory = Callable[["torch.nn.Module", Any], "torch.optim.Optimizer"]
ProcessFunction = Callable[["Context"], None]
#: what :attr:`Algorithm.agents` may be
AGENTS = ("single", "multi", "any")

__getattr__ = deprecated.forward(__name__)  # 0.1.0's SharedFactory: what replaced it


def check_importable(fn: Callable[..., Any], what: str) -> None:
    """Spawned children receive functions by reference (module + name): refuse any other kind."""
    if not callable(fn):
        raise PluginError(f"{what} must be a function, got {fn!r}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if module is None or "<lambda>" in qualname or "<locals>" in qualname:
        raise PluginError(
            f"{what} {qualname or fn!r} cannot be sent to spawned processes: define it with "
            "`def` at the top level of an importable module (no lambda, no nested function)"
        )
    if module == "__main__":
        return  # spawn re-imports the main script as __mp_main__, which is fine
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn:
        raise PluginError(
            f"{what} {module}.{qualname} is not reachable by that name in its module; spawned "
            "processes import functions by reference, so define it at the top level"
        )


def _check_config_cls(cls: Any) -> None:
    if not (isinstance(cls, type) and attrs.has(cls)):
        raise PluginError(
            f"config_cls {cls!r} must be an attrs class (decorate it with @attrs.frozen) so that "
            "the CLI can validate --set values against its fields"
        )
    try:
        default = cls()
    except TypeError as exc:
        raise PluginError(
            f"config class {cls.__qualname__} needs a default for every field: {exc}"
        ) from None
    try:
        pickle.loads(pickle.dumps(default))
    except Exception as exc:
        raise PluginError(
            f"config class {cls.__qualname__} must be picklable to reach spawned processes "
            f"(define it at module top level): {exc}"
        ) from None


def _validate(instance: Algorithm, attribute: attrs.Attribute, value: Any) -> None:
    where = f"algorithm {instance.name!r}: {attribute.name}"
    if attribute.name == "name":
        if not (isinstance(value, str) and value.replace("_", "").replace("-", "").isalnum()):
            raise PluginError(f"algorithm name {value!r} must be letters, digits, '-' or '_'")
    elif attribute.name == "config_cls":
        try:
            _check_config_cls(value)
        except PluginError as exc:
            raise PluginError(f"{where}: {exc}") from None
    elif attribute.name in ("worker", "train", "make_model", "make_optimizer"):
        if value is not None or attribute.name in ("worker", "make_model"):
            check_importable(value, where)
    elif attribute.name == "optimizers":
        if not isinstance(value, Mapping):
            raise PluginError(f"{where} must be a mapping of names to functions, got {value!r}")
        for name, make in value.items():
            if not (isinstance(name, str) and name.isidentifier()):
                raise PluginError(f"{where}: name {name!r} must be a Python identifier")
            check_importable(make, f"{where}[{name!r}]")
    elif attribute.name == "agents" and value not in AGENTS:
        raise PluginError(f"{where} must be one of {', '.join(map(repr, AGENTS))}, got {value!r}")
    elif attribute.name == "schema" and not isinstance(value, Schema):
        raise PluginError(f"{where} must be an mprl.schema.Schema, got {value!r}")


@attrs.frozen
class Algorithm:
    """An algorithm a plugin provides, registered through ``mprl_register_algorithms``.

    :param name: what users pass to ``--plugin`` / ``mprl.run(plugin=...)``.
    :param config_cls: an attrs class, every field with a default that works; per-field help goes in
        ``metadata={"help": "..."}``.
    :param make_model: ``make_model(observation_space, action_space, config) -> nn.Module``, called
        once in the main process; the model is put in shared memory and reaches every process as
        ``ctx.model``.
    :param worker: ``worker(ctx)``, run in each of the ``--workers`` processes.
    :param train: optional ``train(ctx)``, run in one separate train process.
    :param make_optimizer: optional ``make_optimizer(parameters, config) -> Optimizer``: its state
        lives in shared memory (Hogwild) and reaches every process as ``ctx.optimizer``.
    :param optimizers: optional named optimizers, ``{name: make(model, config) -> Optimizer}``,
        each over the part of the model it chooses (``model.policy.parameters()``) with its own
        settings; shared, checkpointed and restored like ``make_optimizer``'s, reachable as
        ``ctx.optimizers[name]`` (and as ``ctx.optimizer`` when it is the only optimizer).
    :param schema: the shared state the processes use (control state, tensors, and the
        transport of experience and weights), built by the backend for each run.
    :param action_spaces: the gymnasium action space types the algorithm supports.
    :param observation_spaces: the observation space types it supports (default: any).
    :param default_env: the environment used when ``--env`` is not given.
    :param description: one line shown by ``python -m mprl plugins``.
    :param agents: the envs it takes: ``"single"`` (gymnasium's, one agent), ``"multi"`` (several
        agents, PettingZoo's parallel API: observations an :class:`mprl.spaces.AgentBox`) or
        ``"any"``.
    :param presets: config values by workload, ``{"atari": {...}, "mujoco": {...}}``, applied
        under the user's own (a TOML file, ``--set``) when the env is one (the
        ``mprl_env_workload`` hook says which): the settings that work there, as rl-zoo and
        cleanrl have them.
    :param run_defaults: run options by name (``{"eval_every": 2000}``) used when the user does
        not give them (a flag, a TOML ``[run]`` table, ``mprl.run(...)``): what a run of this
        algorithm needs to mean what its defaults promise, such as judging "solved" on
        evaluation episodes for an algorithm whose behaviour policy explores. A value the user
        gives, ``--eval-every 0`` too, wins; an unknown name stops the run with exit 2.
    """

    name: str = attrs.field(validator=_validate)
    config_cls: type = attrs.field(validator=_validate)
    make_model: ModelFactory = attrs.field(validator=_validate)
    worker: ProcessFunction = attrs.field(validator=_validate)
    train: ProcessFunction | None = attrs.field(default=None, validator=_validate)
    make_optimizer: OptimizerFactory | None = attrs.field(default=None, validator=_validate)
    optimizers: Mapping[str, NamedOptimizerFactory] = attrs.field(
        factory=dict, converter=dict, validator=_validate
    )
    schema: Schema = attrs.field(factory=Schema, validator=_validate)
    action_spaces: tuple[type[gym.Space], ...] = (gym.spaces.Discrete, gym.spaces.Box)
    observation_spaces: tuple[type[gym.Space], ...] = (gym.Space,)
    default_env: str = "CartPole-v1"
    description: str = ""
    presets: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict, converter=dict)
    agents: str = attrs.field(default="single", validator=_validate)
    run_defaults: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)

    def supports(self, action_space: gym.Space) -> bool:
        return isinstance(action_space, self.action_spaces)

    def check_spaces(self, env: str, observation_space: gym.Space, action_space: gym.Space) -> None:
        """Raise :class:`UsageError` naming the space of ``env`` this algorithm cannot take."""
        self._check_agents(env, observation_space)
        for what, space, allowed in (
            ("observation", observation_space, self.observation_spaces),
            ("action", action_space, self.action_spaces),
        ):
            if not isinstance(space, allowed):
                names = ", ".join(t.__name__ for t in allowed)
                fix = (
                    "; flatten it with a wrapper (gymnasium.wrappers.FlattenObservation) in "
                    "an mprl_make_env plugin"
                    if what == "observation" and gym.spaces.Box in allowed
                    else ""
                )
                raise UsageError(
                    f"algorithm {self.name!r} does not support the {what} space of {env!r} "
                    f"({type(space).__name__}); it supports: {names}{fix}"
                )

    def _check_agents(self, env: str, observation_space: gym.Space) -> None:
        agents = agents_of(observation_space)
        if self.agents == "single" and agents is not None:
            raise UsageError(
                f"algorithm {self.name!r} takes single-agent environments, and {env!r} has "
                f"{len(agents)} agents ({', '.join(agents)}): run a multi-agent algorithm "
                "(--plugin mappo or ippo; `python -m mprl plugins` marks them)"
            )
        if self.agents == "multi" and agents is None:
            raise UsageError(
                f"algorithm {self.name!r} takes multi-agent environments (PettingZoo's parallel "
                f"API, e.g. --env mpe2:simple_spread_v3), and {env!r} has one agent: run a "
                "single-agent algorithm (--plugin ppo, a3c, ...)"
            )
