"""The networks over observations that the actor-critics are built from: an MLP for flat
observations (:func:`mlp`), the convolutional torsos of Nature DQN and IMPALA for uint8 frames,
and :func:`encoder`, which picks one for an observation space."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from mprl.errors import ConfigError

#: the torsos :class:`~mprl.lib.nets.ActorCritic` knows; ``auto``: ``nature`` for image
#: observations, else ``mlp``
TORSOS = ("auto", "mlp", "nature", "impala")


#: the hidden layers' activations an MLP can have (config field ``activation``)
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _init(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    """``layer`` with orthogonal weights of ``gain`` and zero biases."""
    nn.init.orthogonal_(layer.weight, gain)  # type: ignore[arg-type]
    nn.init.zeros_(layer.bias)  # type: ignore[arg-type]
    return layer


def _hidden(n_in: int, hidden: tuple[int, ...], activation: str) -> tuple[list[nn.Module], int]:
    """An MLP's hidden layers (each a linear layer of orthogonal weights of gain sqrt(2), then
    ``activation``) and their output size."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_init(nn.Linear(n_in, h)), ACTIVATIONS[activation]()]
        n_in = h
    return layers, n_in


def mlp(
    n_in: int, hidden: tuple[int, ...], n_out: int, out_gain: float, activation: str = "tanh"
) -> nn.Sequential:
    """A multi-layer perceptron ``n_in -> hidden... -> n_out`` (also importable as
    ``mprl.lib.nets.mlp``), initialised as PPO's implementations do (Huang et al. 2022, "The
    37 implementation details of PPO"): every weight matrix orthogonal
    (``nn.init.orthogonal_``), every bias zero; the hidden layers with gain ``sqrt(2)``
    (ReLU's gain, which those use for ``tanh`` too), each followed by ``activation``
    (:data:`ACTIVATIONS`: ``"tanh"`` or ``"relu"``); the output layer linear, with gain
    ``out_gain``. An ``nn.Sequential`` of ``[Linear, activation] * len(hidden) + [Linear]``:
    ``net[-1]`` is the output layer, ``net[:-1]`` the hidden features.

    ``out_gain`` is the orthogonal initialisation's gain of the output layer alone: every
    singular value of its weight matrix is ``out_gain``, so it sets the scale of the
    outputs at the start, relative to the last hidden layer's features (whose values are of
    order 1). 0.01 for a policy's logits or Gaussian means (a nearly uniform first policy,
    whatever the observation), 1.0 for a value or a Q value (of the scale of the features,
    so its first errors give gradients of that scale). A network initialised as PyTorch's
    ``nn.Linear`` is (as TD3's and SAC's authors' code) is
    :func:`mprl.lib.continuous.plain_mlp`.
    """
    layers, n_in = _hidden(n_in, hidden, activation)
    return nn.Sequential(*layers, _init(nn.Linear(n_in, n_out), out_gain))


def is_image(space: gym.Space) -> bool:
    """Whether ``space`` holds images: a uint8 ``Box`` of shape HxWxC or CxHxW."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image shape is HxWxC (a few channels last) rather than CxHxW."""
    return shape[-1] <= 4 < shape[0]


class ImageScale(nn.Module):
    """uint8 frames (HxWxC or CxHxW) to float CxHxW in [0, 1], on whatever device they are:
    frames travel as uint8 and are converted only where the network runs."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.last = channels_last(shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.last:  # dims counted from the front: ONNX's Transpose takes no negative one
            obs = obs.movedim(obs.dim() - 1, obs.dim() - 3)
        return obs.float() / 255.0


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


def encoder(
    obs_space: gym.Space, hidden: tuple[int, ...], torso: str = "auto", activation: str = "tanh"
) -> tuple[nn.Module, int]:
    """The network over observations of ``obs_space``, and its output size: the image torso
    ``torso`` stands for (:func:`resolve_torso`), or over flat observations ``hidden``'s layers
    of :func:`mlp` (each with ``activation``), the observations flattened first."""
    kind = resolve_torso(obs_space, torso)
    if kind != "mlp":
        return (nature_cnn if kind == "nature" else impala_cnn)(tuple(obs_space.shape))
    flatten: list[nn.Module] = [nn.Flatten(-len(obs_space.shape))] if obs_space.shape else []
    layers, n_out = _hidden(int(np.prod(obs_space.shape)), hidden, activation)
    return nn.Sequential(*flatten, *layers), n_out
