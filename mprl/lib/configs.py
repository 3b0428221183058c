"""The config every actor-critic plugin here shares (:class:`ActorCriticConfig`), the help of a
config field (:func:`field_help`) and where the annealed learning rate ends
(:data:`MIN_LR_FRACTION`)."""

from __future__ import annotations

import attrs
from attrs import validators as v

from mprl.lib.torsos import ACTIVATIONS, TORSOS

#: where ``anneal_steps`` leaves the learning rate, as a fraction of ``lr``: a run longer than
#: ``anneal_steps`` learns on at this rate (:func:`mprl.lib.optim.annealed_lr`)
MIN_LR_FRACTION = 0.05


def field_help(text: str) -> dict[str, str]:
    """``metadata`` for an attrs config field: ``text`` becomes its ``--help`` line."""
    return {"help": text}


@attrs.frozen
class ActorCriticConfig:
    """Hyperparameters every actor-critic plugin here has; subclass it (``@attrs.frozen``) to add
    an algorithm's own fields or change a default."""

    envs_per_worker: int = attrs.field(
        default=8, validator=v.ge(1), metadata=field_help("environments each worker steps together")
    )
    gamma: float = attrs.field(
        default=0.99, validator=[v.gt(0.0), v.le(1.0)], metadata=field_help("discount factor")
    )
    lr: float = attrs.field(
        default=1e-3, validator=v.gt(0.0), metadata=field_help("Adam learning rate")
    )
    entropy_coef: float = attrs.field(
        default=0.01, validator=v.ge(0.0), metadata=field_help("weight of the entropy bonus")
    )
    value_coef: float = attrs.field(
        default=0.5, validator=v.ge(0.0), metadata=field_help("weight of the value loss")
    )
    max_grad_norm: float = attrs.field(
        default=0.5, validator=v.gt(0.0), metadata=field_help("gradient norm clip per update")
    )
    normalize_advantages: bool = attrs.field(
        default=True, metadata=field_help("normalise advantages within each update")
    )
    anneal_steps: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata=field_help(
            f"env steps over which lr falls linearly to {MIN_LR_FRACTION:g} of itself; 0: constant"
        ),
    )
    hidden: tuple[int, ...] = attrs.field(
        default=(64, 64),
        converter=tuple,
        validator=v.deep_iterable(v.and_(v.instance_of(int), v.gt(0))),
        metadata=field_help("hidden layer sizes of the policy and value MLPs"),
    )
    activation: str = attrs.field(
        default="tanh",
        validator=v.in_(tuple(ACTIVATIONS)),
        metadata=field_help("the MLPs' hidden activation: tanh or relu"),
    )
    log_std_init: float = attrs.field(
        default=0.0,
        metadata=field_help("continuous actions: the policy's log std at the start"),
    )
    torso: str = attrs.field(
        default="auto",
        validator=v.in_(TORSOS),
        metadata=field_help(
            "network over the observations: mlp, nature (CNN of Nature DQN), impala (residual "
            "CNN); auto: nature for images (uint8 HxWxC / CxHxW), else mlp"
        ),
    )
    normalize_obs: bool = attrs.field(
        default=False,
        metadata=field_help(
            "standardise flat observations by running mean/std (learned by the train process, "
            "sent to workers with the weights, checkpointed): on for MuJoCo"
        ),
    )
    sde_every: int = attrs.field(
        default=0,
        validator=v.ge(0),
        metadata=field_help(
            "continuous actions: explore with gSDE (noise a function of the state, drawn anew "
            "every this many steps); 0: a Gaussian with a learned std"
        ),
    )
    normalize_reward: bool = attrs.field(
        default=False,
        metadata=field_help(
            "divide rewards learned from by a running std of the discounted return, each "
            "worker its own (VecNormalize's norm_reward; logged returns stay raw): on for MuJoCo"
        ),
    )
