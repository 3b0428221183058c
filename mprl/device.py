"""The train process's device (``--device``): which one a spec stands for, and how batches reach
it (:class:`Staging`, behind :meth:`mprl.Context.to_device`).

On the CPU the train process updates the shared model and optimizers in place. On a GPU the
child runtime (:mod:`mprl.backends.child`) gives it copies there before its function starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from mprl.errors import UsageError

#: an index without leading zeros and short enough for torch (a longer one wrapped around)
_DEVICE = re.compile(r"^(auto|cpu|cuda(:(0|[1-9]\d{0,3}))?)$")


def check_device(spec: str, algorithm: str, trains_in_workers: bool) -> None:
    """Refuse a ``--device`` that cannot be had here, with the option that works."""
    if not _DEVICE.match(spec):
        raise UsageError(
            f"run option 'device': {spec!r} is not one of auto, cpu, cuda, cuda:N "
            "(N a GPU's number, 0 for the first: cuda:0)"
        )
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
    index = int(spec.partition(":")[2] or 0)  # torch.device("cuda:128").index is -128
    if index >= torch.cuda.device_count():
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
