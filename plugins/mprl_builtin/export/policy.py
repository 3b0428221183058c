"""What an export holds: a checkpoint's policy as a module of tensor operations (its model's
``export_policy()``), with example inputs, the names, shapes and dtypes of its inputs and
outputs, and the check that it acts as the model's ``act(obs, deterministic=True)`` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch
from torch import nn

import mprl
from mprl.errors import MprlError, UsageError
from mprl.schema import obs_dtype

#: the batch size the policy is traced with: not 1, which a trace could take for a constant
EXAMPLE_BATCH = 2
#: the checks' batches of sampled observations (a recurrent policy: the first, for every step)
CHECK_BATCHES = (5, 1, 8)
CHECK_STEPS = 3
#: how far a continuous action may be from act()'s (an ONNX runtime's kernels round otherwise)
ATOL, RTOL = 1e-5, 1e-4
#: what the docs say a model needs to be exported
HOW = (
    "a method export_policy() on its model that returns a torch.nn.Module computing "
    "act(obs, deterministic=True) in tensor operations (docs/export.md)"
)

#: a runner of an exported file: arrays in (obs, then the state), arrays out (action, state)
Runner = Callable[..., Sequence[np.ndarray]]


class ExportFailed(MprlError):
    """A plugin's ``export_policy()`` broke its contract, or the export came out wrong: nothing
    was written. The command exits 1."""


@attrs.frozen
class TensorInfo:
    """An input or output of an exported policy: its name, its shape (``"batch"`` for the
    batch axis, dynamic) and its dtype's name."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorInfo:
        dtype = str(tensor.dtype).removeprefix("torch.")
        return cls(name, ("batch", *tensor.shape[1:]), dtype)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    def __str__(self) -> str:
        return f"{self.name} [{', '.join(str(n) for n in self.shape)}] {self.dtype}"


@attrs.frozen
class Policy:
    """A checkpoint's policy, ready to be written: ``module(obs, *state)`` returns the action
    batch (and the next state, in the order of ``state_shapes``)."""

    checkpoint: mprl.Checkpoint
    module: nn.Module
    #: each state tensor's name and the shape of one env's (without the batch axis)
    state_shapes: dict[str, tuple[int, ...]]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    #: what the module is traced with: a batch of sampled observations, zero states
    example: tuple[torch.Tensor, ...]

    @property
    def who(self) -> str:
        return who(self.checkpoint)

    def metadata(self) -> dict[str, Any]:
        """What the exported file says of itself (TorchScript: the extra file ``mprl.json``;
        ONNX: the metadata property ``mprl``)."""
        ckpt = self.checkpoint
        agents = getattr(ckpt.observation_space, "agents", None)
        return {
            "format": "mprl-policy",
            "format_version": 1,
            "algorithm": ckpt.algorithm,
            "plugin": ckpt.plugin,
            "plugin_version": ckpt.plugin_version,
            "mprl_version": mprl.__version__,
            "env": ckpt.run.env,
            "env_steps": ckpt.env_steps,
            "observation_space": str(ckpt.observation_space),
            "action_space": str(ckpt.action_space),
            **({"agents": list(agents)} if agents is not None else {}),
            "deterministic": True,
            "inputs": [t.as_dict() for t in self.inputs],
            "outputs": [t.as_dict() for t in self.outputs],
            "state": {name: list(shape) for name, shape in self.state_shapes.items()},
            "initial_state": "zeros",
        }


def who(ckpt: mprl.Checkpoint) -> str:
    return f"algorithm {ckpt.algorithm!r} of plugin {ckpt.plugin!r}"


def observations(space: gym.Space, n: int, seed: int) -> torch.Tensor:
    """``n`` observations sampled from ``space`` (seeded), as ``act`` takes them."""
    space.seed(seed)
    batch = np.stack([np.asarray(space.sample()) for _ in range(n)])
    return torch.as_tensor(batch, dtype=obs_dtype(space))


def policy_of(ckpt: mprl.Checkpoint) -> Policy:
    """The checkpoint's policy as its model exports it, run once on example inputs to read its
    outputs. :raises UsageError: a model without ``export_policy``; :raises ExportFailed: one
    that raises or breaks the contract."""
    module = _module(ckpt)
    state_shapes = _state_shapes(ckpt, module)
    obs = observations(ckpt.observation_space, EXAMPLE_BATCH, seed=0)
    state = tuple(torch.zeros(EXAMPLE_BATCH, *shape) for shape in state_shapes.values())
    try:
        with torch.no_grad():
            out = module(obs, *state)
    except Exception as exc:
        raise ExportFailed(
            f"{who(ckpt)}: its export_policy() module fails on a batch of observations "
            f"{tuple(obs.shape)} {obs.dtype}: {_first_line(exc)}"
        ) from None
    outs = out if isinstance(out, tuple | list) else (out,)
    _check_outputs(ckpt, outs, state_shapes)
    names = list(state_shapes)
    return Policy(
        checkpoint=ckpt,
        module=module,
        state_shapes=state_shapes,
        inputs=(
            TensorInfo.of("obs", obs),
            *(TensorInfo.of(n, s) for n, s in zip(names, state, strict=True)),
        ),
        outputs=(
            TensorInfo.of("action", outs[0]),
            *(TensorInfo.of(f"next_{n}", o) for n, o in zip(names, outs[1:], strict=True)),
        ),
        example=(obs, *state),
    )


def _module(ckpt: mprl.Checkpoint) -> nn.Module:
    export = getattr(ckpt.model, "export_policy", None)
    if not callable(export):
        raise UsageError(
            f"{who(ckpt)} cannot be exported: its model ({type(ckpt.model).__name__}) has no "
            f"export_policy() method; the plugin would need {HOW}"
        )
    try:
        module = export()
    except Exception as exc:
        raise ExportFailed(
            f"{who(ckpt)}: its model's export_policy() raised {_first_line(exc)}"
        ) from None
    if not isinstance(module, nn.Module):
        raise ExportFailed(
            f"{who(ckpt)}: its model's export_policy() returned {type(module).__name__}, not a "
            "torch.nn.Module"
        )
    return module.eval()


def _state_shapes(ckpt: mprl.Checkpoint, module: nn.Module) -> dict[str, tuple[int, ...]]:
    shapes = getattr(module, "state_shapes", None) or {}
    try:
        out = {str(k): tuple(int(n) for n in v) for k, v in dict(shapes).items()}
    except (TypeError, ValueError):
        out = {}
    fine = bool(out) or not shapes
    fine = fine and all(k.isidentifier() and all(n > 0 for n in v) for k, v in out.items())
    if not fine or "obs" in out or "action" in out:
        raise ExportFailed(
            f"{who(ckpt)}: its export_policy() module's state_shapes is {shapes!r}; it must map "
            "each state tensor's name (an identifier, not obs or action) to one env's shape, "
            "such as {'h': (64,), 'c': (64,)}"
        )
    return out


def _check_outputs(
    ckpt: mprl.Checkpoint, outs: Sequence[Any], state_shapes: dict[str, tuple[int, ...]]
) -> None:
    expected = 1 + len(state_shapes)
    shapes = [tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__ for o in outs]
    fine = len(outs) == expected and all(isinstance(o, torch.Tensor) for o in outs)
    fine = fine and all(o.shape[:1] == (EXAMPLE_BATCH,) for o in outs)
    wanted = [(EXAMPLE_BATCH, *s) for s in state_shapes.values()]
    if not fine or shapes[1:] != wanted:
        state = f" and the next state {wanted}" if state_shapes else ""
        raise ExportFailed(
            f"{who(ckpt)}: its export_policy() module returned {shapes} for a batch of "
            f"{EXAMPLE_BATCH}; it must return the actions (a tensor, the batch first){state}"
        )


def check(policy: Policy, run: Runner) -> str:
    """Play the exported file (``run``) against the model's ``act(obs, deterministic=True)``
    on sampled observations; what was checked, in words. :raises ExportFailed: they differ."""
    ckpt, recurrent = policy.checkpoint, bool(policy.state_shapes)
    batches = (CHECK_BATCHES[0],) * CHECK_STEPS if recurrent else CHECK_BATCHES
    state = [np.zeros((batches[0], *s), np.float32) for s in policy.state_shapes.values()]
    for step, batch in enumerate(batches):
        obs = observations(ckpt.observation_space, batch, seed=1 + step)
        expected = np.asarray(ckpt.act(obs, deterministic=True))
        action, *state = (np.asarray(o) for o in run(obs.numpy(), *state))
        problem = _difference(expected, action)
        if problem:
            raise ExportFailed(
                f"{policy.who}: the exported policy's actions are not its model's "
                f"act(obs, deterministic=True) on sampled observations (step {step + 1}, a batch "
                f"of {batch}: {problem}); its export_policy() does not compute what act() does"
            )
    if recurrent:
        return (
            f"the same actions as act(obs, deterministic=True) over {CHECK_STEPS} steps of "
            f"{batches[0]} envs of sampled observations, the state carried"
        )
    return (
        f"the same actions as act(obs, deterministic=True) on batches of "
        f"{', '.join(map(str, batches))} sampled observations"
    )


def _difference(expected: np.ndarray, got: np.ndarray) -> str:
    if expected.shape != got.shape:
        return f"shape {got.shape}, act() gives {expected.shape}"
    if expected.dtype.kind in "iub":
        wrong = int((expected != got).sum())
        return f"{wrong} of {expected.size} actions differ" if wrong else ""
    if not np.allclose(got, expected, atol=ATOL, rtol=RTOL):
        return f"up to {float(np.abs(got - expected).max()):.3g} apart"
    return ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
