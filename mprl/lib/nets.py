"""Actor-critic networks for Discrete (categorical) and Box (diagonal Gaussian) action spaces
over flat or image observations, their config, and an Adam for shared use: for algorithm plugins
to build on (the built-in a3c, impala and ppo use them)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch
from attrs import validators as v
from torch import nn

from mprl.errors import ConfigError

#: the torsos :class:`ActorCritic` knows; ``auto``: ``nature`` for image observations, else ``mlp``
TORSOS = ("auto", "mlp", "nature", "impala")


#: the hidden layers' activations an MLP can have (config field ``activation``)
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def mlp(
    n_in: int, hidden: tuple[int, ...], n_out: int, out_gain: float, activation: str = "tanh"
) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        linear = nn.Linear(n_in, h)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATIONS[activation]()]
        n_in = h
    head = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(head.weight, out_gain)
    nn.init.zeros_(head.bias)
    layers.append(head)
    return nn.Sequential(*layers)


def is_image(space: gym.Space) -> bool:
    """Whether ``space`` holds images: a uint8 ``Box`` of shape HxWxC or CxHxW."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image shape is HxWxC (a few channels last) rather than CxHxW."""
    return shape[-1] <= 4 < shape[0]


def merge_moments(
    mean: Any, var: Any, count: Any, batch_mean: Any, batch_var: Any, n: int
) -> tuple:
    """Running ``(mean, var, count)`` with a batch's mean and variance folded in (Chan et
    al.'s parallel update): plain arithmetic, so tensors and numpy values alike."""
    total = count + n
    delta = batch_mean - mean
    var = (var * count + batch_var * n + delta**2 * count * n / total) / total
    return mean + delta * n / total, var, total


class ObsNorm(nn.Module):
    """Observations standardised by a running mean and variance (Chan et al.'s parallel
    update), kept as buffers: they travel with the model's weights to the workers, into
    checkpoints and into ``mprl eval``. Only :meth:`update` changes them (the learner calls it
    with each batch); until then it passes observations through unchanged."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Fold a batch ``[..., *shape]`` of observations into the statistics."""
        batch = obs.reshape(-1, *self.mean.shape).to(self.mean.dtype)
        merged = merge_moments(
            self.mean, self.var, self.count, batch.mean(0), batch.var(0, unbiased=False), len(batch)
        )
        for buffer, value in zip((self.mean, self.var, self.count), merged, strict=True):
            buffer.copy_(value)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        std = (self.var + 1e-8).sqrt().to(obs.dtype)
        normed = ((obs - self.mean.to(obs.dtype)) / std).clamp(-self.clip, self.clip)
        # nothing seen yet: the identity (chosen on the device: no sync of a GPU learner)
        return torch.where(self.count > 0, normed, obs)


class ImageScale(nn.Module):
    """uint8 frames (HxWxC or CxHxW) to float CxHxW in [0, 1], on whatever device they are:
    frames travel as uint8 and are converted only where the network runs."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.last = channels_last(shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.last:
            obs = obs.movedim(-1, -3)
        return obs.float() / 255.0


def _init(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)  # type: ignore[arg-type]
    nn.init.zeros_(layer.bias)  # type: ignore[arg-type]
    return layer


def nature_cnn(shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """The convolutional torso of Mnih et al. 2015 (Nature DQN) for frames of ``shape``, and
    its output size (512)."""
    c, h, w = (shape[2], shape[0], shape[1]) if channels_last(shape) else shape
    convs = nn.Sequential(
        _init(nn.Conv2d(c, 32, 8, stride=4)), nn.ReLU(),
        _init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
        _init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
        nn.Flatten(),
    )  # fmt: skip
    with torch.no_grad():
        n_flat = convs(torch.zeros(1, c, h, w)).shape[1]
    return nn.Sequential(ImageScale(shape), convs, _init(nn.Linear(n_flat, 512)), nn.ReLU()), 512


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def impala_cnn(
    shape: tuple[int, ...], channels: tuple[int, ...] = (16, 32, 32)
) -> tuple[nn.Module, int]:
    """The residual torso of Espeholt et al. 2018 (IMPALA's "deep" network) for frames of
    ``shape``, and its output size (256)."""
    c, h, w = (shape[2], shape[0], shape[1]) if channels_last(shape) else shape
    layers: list[nn.Module] = [ImageScale(shape)]
    for out in channels:
        layers += [
            nn.Conv2d(c, out, 3, padding=1),
            nn.MaxPool2d(3, stride=2, padding=1),
            _Residual(out),
            _Residual(out),
        ]
        c, h, w = out, (h + 1) // 2, (w + 1) // 2
    layers += [nn.ReLU(), nn.Flatten(), _init(nn.Linear(c * h * w, 256)), nn.ReLU()]
    return nn.Sequential(*layers), 256


def resolve_torso(obs_space: gym.Space, torso: str) -> str:
    """The torso ``torso`` stands for with ``obs_space`` (``auto``: ``nature`` for images, else
    ``mlp``); a ``ConfigError`` for a choice that cannot work, with the one that does."""
    if torso not in TORSOS:
        raise ConfigError(f"config field 'torso': {torso!r} is not one of {', '.join(TORSOS)}")
    image = is_image(obs_space)
    if torso == "auto":
        return "nature" if image else "mlp"
    if image and torso == "mlp":
        raise ConfigError(
            f"config field 'torso': the observations are images {tuple(obs_space.shape)} uint8, "
            f"which an MLP cannot learn from; use --set torso=nature (or impala, or auto)"
        )
    if not image and torso != "mlp":
        raise ConfigError(
            f"config field 'torso': {torso!r} needs image observations (a uint8 Box HxWxC or "
            f"CxHxW), and these are {obs_space}; use --set torso=mlp (or auto)"
        )
    return torso


class ActorCritic(nn.Module):
    """A policy and a value function; ``forward`` gives (logits or Gaussian mean, value).

    Over flat observations the policy and the value are separate MLPs (``torso="mlp"``);
    over images they share a convolutional torso (``nature`` or ``impala``) that takes the
    uint8 frames as they are and scales them itself. :meth:`policy` and :meth:`value` run one side.
    With ``normalize_obs``, flat observations are standardised first (:class:`ObsNorm`,
    ``self.obs_norm``, which the learner updates).
    """

    def __init__(
        self,
        obs_space: gym.Space,
        act_space: gym.Space,
        hidden: tuple[int, ...],
        torso: str = "auto",
        normalize_obs: bool = False,
        sde_every: int = 0,
        *,
        activation: str = "tanh",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        n_act = int(act_space.n) if self.discrete else int(np.prod(act_space.shape))
        if sde_every and self.discrete:
            raise ConfigError(
                f"config field 'sde_every': state-dependent exploration is for continuous "
                f"actions, and these are {act_space}; use --set sde_every=0"
            )
        self.n_act, self.sde_every = n_act, sde_every
        self._noise: torch.Tensor | None = None  # gSDE: each env's exploration matrix
        self._noise_age = 0
        self.torso_kind = resolve_torso(obs_space, torso)
        if normalize_obs and self.torso_kind != "mlp":
            raise ConfigError(
                "config field 'normalize_obs': image observations are scaled to [0, 1] already; "
                "use --set normalize_obs=false"
            )
        self.obs_norm = ObsNorm(tuple(obs_space.shape)) if normalize_obs else None
        if self.torso_kind == "mlp":
            n_obs = int(np.prod(obs_space.shape))
            self.pi = mlp(n_obs, hidden, n_act, 0.01, activation)
            self.v = mlp(n_obs, hidden, 1, 1.0, activation)
            self.torso = None
        else:
            build = nature_cnn if self.torso_kind == "nature" else impala_cnn
            self.torso, n_features = build(tuple(obs_space.shape))
            self.pi_head = _init(nn.Linear(n_features, n_act), 0.01)
            self.v_head = _init(nn.Linear(n_features, 1), 1.0)
        if sde_every:  # one log std per (latent feature, action): Raffin et al.'s gSDE (2021)
            latent = self.pi[-1].in_features if self.torso is None else self.pi_head.in_features
            self.log_std = nn.Parameter(torch.full((latent, n_act), log_std_init))
        elif not self.discrete:
            self.log_std = nn.Parameter(torch.full((n_act,), log_std_init))
        if not self.discrete:
            self.register_buffer("low", torch.as_tensor(act_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(act_space.high, dtype=torch.float32))

    def observe(self, obs: torch.Tensor) -> None:
        """Fold a batch of observations into the normalisation statistics (with
        ``normalize_obs``; else nothing). The learner calls it as it publishes an update, so the
        workers get the statistics with the weights."""
        if self.obs_norm is not None:
            self.obs_norm.update(obs)

    def _in(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.torso is None:
            obs = self._in(obs)
            return self._pi(obs, self.pi), self.v(obs).squeeze(-1)
        features = self.torso(obs)
        return self._pi(features, self.pi_head), self.v_head(features).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's output alone, what acting needs: logits, or the Gaussian's mean (with
        gSDE, the mean and then the latent features its noise is a function of)."""
        if self.torso is None:
            return self._pi(self._in(obs), self.pi)
        return self._pi(self.torso(obs), self.pi_head)

    def _pi(self, x: torch.Tensor, net: nn.Module) -> torch.Tensor:
        if not self.sde_every:
            return net(x)
        if net is self.pi:  # the MLP's last hidden layer is the latent of the noise
            x = net[:-1](x)
            net = net[-1]
        return torch.cat([net(x), x.detach()], -1)

    def _gaussian(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and standard deviation of the action distribution of a policy output."""
        if not self.sde_every:
            return out, self.log_std.exp().expand_as(out)
        mean, latent = out[..., : self.n_act], out[..., self.n_act :]
        variance = latent.pow(2) @ self.log_std.exp().pow(2)
        return mean, (variance + 1e-6).sqrt()

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """The value of each observation of a batch, ``[B]``."""
        if self.torso is None:
            return self.v(self._in(obs)).squeeze(-1)
        return self.v_head(self.torso(obs)).squeeze(-1)

    def sample(self, out: torch.Tensor) -> torch.Tensor:
        """Actions drawn for a batch of policy outputs. With gSDE (``sde_every`` k) the noise
        is each env's latent features times its own exploration matrix, drawn anew every k
        calls: exploration that is smooth in time and a function of the state."""
        if self.discrete:
            return torch.multinomial(torch.softmax(out, -1), 1).squeeze(-1)
        if not self.sde_every:
            return out + self.log_std.exp() * torch.randn_like(out)
        mean, latent = out[..., : self.n_act], out[..., self.n_act :]
        rows = latent.reshape(-1, latent.shape[-1])
        noise = self._noise
        if noise is None or len(noise) != len(rows) or self._noise_age >= self.sde_every:
            std = self.log_std.detach().exp()
            noise = self._noise = std * torch.randn(len(rows), *std.shape, device=std.device)
            self._noise_age = 0
        self._noise_age += 1
        return mean + (rows.unsqueeze(-2) @ noise).squeeze(-2).view(mean.shape)

    def log_prob_entropy(
        self, out: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            logp = torch.log_softmax(out, -1)
            chosen = logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return chosen, -(logp.exp() * logp).sum(-1)
        mean, std = self._gaussian(out)
        log_std = std.log()
        z = (actions - mean) / std
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)
        return logp, entropy

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations, as the env takes them: sampled, or the most
        likely (argmax / the Gaussian's mean) when ``deterministic``. ``mprl eval`` uses it."""
        with torch.no_grad():
            out = self.policy(obs)
            if not deterministic:
                actions = self.sample(out)
            else:
                actions = out.argmax(-1) if self.discrete else out[..., : self.n_act]
        return self.to_env(actions)

    def to_env(self, actions: torch.Tensor) -> np.ndarray:
        """Actions as the env takes them (Box actions clipped to the bounds)."""
        if self.discrete:
            return actions.cpu().numpy()
        return torch.max(torch.min(actions, self.high), self.low).cpu().numpy()


def field_help(text: str) -> dict[str, str]:
    """``metadata`` for an attrs config field: ``text`` becomes its ``--help`` line."""
    return {"help": text}


#: where ``anneal_steps`` leaves the learning rate, as a fraction of ``lr``: a run longer than
#: ``anneal_steps`` learns on at this rate
MIN_LR_FRACTION = 0.05


def annealed_lr(config: Any, env_steps: int) -> float:
    """``config.lr``, falling linearly over ``config.anneal_steps`` env steps to
    :data:`MIN_LR_FRACTION` of itself (constant where that is 0 or not a field)."""
    steps = getattr(config, "anneal_steps", 0)
    if not steps:
        return config.lr
    return config.lr * max(MIN_LR_FRACTION, 1.0 - env_steps / steps)


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


def make_model(obs_space: gym.Space, act_space: gym.Space, config: ActorCriticConfig) -> nn.Module:
    """An :class:`ActorCritic` with the config's network fields (an ``Algorithm.make_model``):
    ``hidden``, ``torso``, ``normalize_obs``, ``sde_every``, ``activation``, ``log_std_init``;
    a config without the later ones (a plugin's own, written before them) gets their defaults."""
    return ActorCritic(
        obs_space,
        act_space,
        config.hidden,
        getattr(config, "torso", "auto"),
        getattr(config, "normalize_obs", False),
        getattr(config, "sde_every", 0),
        activation=getattr(config, "activation", "tanh"),
        log_std_init=getattr(config, "log_std_init", 0.0),
    )


_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
_ADD_PARAM_GROUP = inspect.unwrap(torch.optim.Optimizer.add_param_group)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` without torch.optim's ``torch.compile`` wrappers around ``step``,
    ``zero_grad``, ``add_param_group`` (which the constructor calls), ``state_dict`` and
    ``load_state_dict``.

    Those wrappers import ``torch._dynamo`` the first time they run: a second of CPU in every
    process that touches the optimizer (the main process that builds it, each a3c worker, every
    learner), paid at its start-up and on two cores straight off the time to solve. The
    update is Adam's own code, unchanged (``inspect.unwrap`` reaches it; with a torch that does
    not wrap, nothing changes). Do not ``torch.compile`` a step of this optimizer; use
    ``torch.optim.Adam`` for that.
    """

    #: :attr:`mprl.Context.optimizer` does not import ``torch._dynamo`` ahead for it
    needs_dynamo = False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        return _ADAM_STEP(self, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)


def make_optimizer(
    params: Iterable[nn.Parameter], config: ActorCriticConfig
) -> torch.optim.Optimizer:
    """:class:`Adam` with ``config.lr`` (an ``Algorithm.make_optimizer``); the fused kernel where
    this torch has it on the CPU (why: see benchmarks/README.md, "Fused Adam")."""
    params = list(params)
    try:
        return Adam(params, lr=config.lr, eps=1e-5, fused=True)
    except RuntimeError:  # torch < 2.4: no fused Adam on CPU
        return Adam(params, lr=config.lr, eps=1e-5)
