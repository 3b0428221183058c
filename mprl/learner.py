"""The train process's device (``--device``): where its model and optimizers live, how batches
reach it, and how its optimizer state gets back to the shared copies that are checkpointed.

On the CPU the train process updates the shared model and optimizers in place, as always. On a
GPU it trains copies of them there (:class:`DeviceLearner`): the workers keep acting on the
shared CPU model, which ``weights.publishing(model)`` updates at the end of each update, and the
optimizer state is copied back now and then (:data:`SYNC_S`) and when the train function
returns, so a checkpoint holds it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

import torch

from mprl.errors import UsageError

#: how often a learner on a GPU copies its optimizer state back to the shared (checkpointed) one
SYNC_S = 2.0

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(spec: str, algorithm: str, trains_in_workers: bool) -> None:
    """Refuse a ``--device`` that cannot be had here, with the option that works."""
    if not _DEVICE.match(spec):
        raise UsageError(f"run option 'device': {spec!r} is not one of auto, cpu, cuda, cuda:N")
    if not spec.startswith("cuda"):
        return
    if trains_in_workers:
        raise UsageError(
            f"--device {spec}: algorithm {algorithm!r} trains one shared model in every worker "
            "(Hogwild, CPU shared memory), so it cannot learn on a GPU; use --device cpu"
        )
    if not torch.cuda.is_available():
        why = "this torch is a CPU build" if torch.version.cuda is None else "no GPU is visible"
        raise UsageError(f"--device {spec}: {why}; use --device cpu (or auto)")
    index = torch.device(spec).index
    if index is not None and index >= torch.cuda.device_count():
        raise UsageError(
            f"--device {spec}: there are {torch.cuda.device_count()} GPU(s), numbered from 0; "
            f"use --device cuda:0"
        )


def resolve_device(spec: str, trains_in_workers: bool = False) -> torch.device:
    """The device ``spec`` stands for here (``auto``: the first GPU where there is one and the
    algorithm has a train process, else the CPU)."""
    if spec == "auto":
        use_gpu = torch.cuda.is_available() and not trains_in_workers
        return torch.device("cuda" if use_gpu else "cpu")
    return torch.device(spec)


def _on(
    shared: torch.optim.Optimizer, params: Mapping[torch.nn.Parameter, torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """A copy of ``shared`` over the parameters ``params`` maps its own to, state included."""
    groups = [
        {**group, "params": [params[p] for p in group["params"]]} for group in shared.param_groups
    ]
    try:
        copy = type(shared)(groups, **shared.defaults)
    except TypeError as exc:
        raise UsageError(
            f"--device: the optimizer {type(shared).__name__} cannot be rebuilt on the device "
            f"from its defaults ({exc}); use --device cpu"
        ) from None
    copy.load_state_dict(shared.state_dict())  # the state moves to the parameters' device
    return copy


class DeviceLearner:
    """Copies of the shared model and optimizers on ``device``, for the train process.

    :param model: the shared model.
    :param optimizers: the shared optimizers (over the shared model's parameters).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Mapping[str, torch.optim.Optimizer],
        device: torch.device,
    ) -> None:
        import copy

        self.device = device
        self.shared_model = model
        self.model = copy.deepcopy(model).to(device)
        params = dict(zip(model.parameters(), self.model.parameters(), strict=True))
        self.shared = dict(optimizers)
        self.optimizers = {name: _on(opt, params) for name, opt in self.shared.items()}
        self._synced = time.monotonic()

    def maybe_sync(self) -> None:
        """:meth:`sync` if it has not run for :data:`SYNC_S` seconds."""
        if time.monotonic() - self._synced >= SYNC_S:
            self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the optimizers' state (moments, step counts, learning rates) back to the shared
        ones, which the main process checkpoints."""
        for name, opt in self.optimizers.items():
            shared = self.shared[name]
            for mine, theirs in zip(opt.param_groups, shared.param_groups, strict=True):
                for key, value in mine.items():
                    if key != "params":
                        theirs[key] = value
                for p, q in zip(mine["params"], theirs["params"], strict=True):
                    src, dst = opt.state.get(p, {}), shared.state.setdefault(q, {})
                    for key, value in src.items():
                        if isinstance(value, torch.Tensor) and isinstance(
                            dst.get(key), torch.Tensor
                        ):
                            dst[key].copy_(value)
                        else:
                            dst[key] = value
        self._synced = time.monotonic()


class Staging:
    """Moves batches (``{name: tensor}``) to a device in one copy: each field's bytes are put
    side by side in one (pinned, on CUDA) buffer, copied over without blocking, and viewed back
    as the fields there. The buffer is kept and grown as needed. On the CPU the batch is
    already where it goes and stays as it is (``pack=True`` packs it all the same)."""

    def __init__(self, device: torch.device, pack: bool | None = None) -> None:
        self.device = device
        self.pack = device.type != "cpu" if pack is None else pack
        self.buffer: torch.Tensor | None = None
        self.copied: torch.cuda.Event | None = None  # the last copy out of the buffer

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.pack:
            return dict(batch)
        layout, offset = [], 0
        for name, tensor in batch.items():
            nbytes = tensor.numel() * tensor.element_size()
            layout.append((name, tensor, offset, nbytes))
            offset += -(-nbytes // 64) * 64  # each field 64-byte aligned
        if self.copied is not None:  # the buffer is still being read by the last copy
            self.copied.synchronize()
        if self.buffer is None or self.buffer.numel() < offset:
            pin = self.device.type == "cuda"
            self.buffer = torch.empty(offset, dtype=torch.uint8, pin_memory=pin)
        for _, tensor, start, nbytes in layout:
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            self.buffer[start : start + nbytes].copy_(flat)
        there = self.buffer[:offset].to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self.copied = torch.cuda.Event()
            self.copied.record()
        return {
            name: there[start : start + nbytes].view(tensor.dtype).view(tensor.shape)
            for name, tensor, start, nbytes in layout
        }
