"""Replaying stored sequences through a recurrent cell as batched tensor ops, for the learners
of recurrent policies (:mod:`mprl.lib.recurrent`, mappo's ``core=gru|lstm``).

A worker steps an ``nn.GRUCell`` / ``nn.LSTMCell`` one env step at a time and zeroes an env's
hidden state where its episode ended. A learner replays ``N`` stored sequences of ``L`` steps:
:class:`Segments` cuts them at the episode ends into pieces, each starting from its stored
state (a sequence's first piece) or from zeros (a piece after an episode's end), and runs all
the pieces through one ``nn.GRU`` / ``nn.LSTM`` call with the cell's own weights (a packed
sequence: cuDNN on a GPU, one C++ loop on the CPU). The outputs are the worker's, to float
rounding (``tests/unit/test_sequences.py``).

:func:`chunk` cuts rollouts ``[T, N, ...]`` into the chunks of ``data_chunk_length`` steps
that MAPPO's recurrent training samples (Yu et al. 2022; ``onpolicy/utils/shared_buffer.py``'s
``recurrent_generator``), the last chunk of each rollout padded and masked where ``T`` is not
a multiple of the length.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

__all__ = ["Segments", "chunk", "chunk_starts", "run_cell"]


@functools.lru_cache(maxsize=64)
def _shell(lstm: bool, n_in: int, size: int) -> nn.Module:
    """An ``nn.LSTM`` / ``nn.GRU`` of these sizes whose own weights are never used: it is
    called with a cell's (:func:`torch.func.functional_call`), so the models keep their
    ``nn.*Cell`` parameters (their checkpoints' names, their optimizer states' order)."""
    return (nn.LSTM if lstm else nn.GRU)(n_in, size)


def run_cell(
    cell: nn.Module, x: torch.Tensor | nn.utils.rnn.PackedSequence, state: torch.Tensor
) -> tuple[Any, torch.Tensor]:
    """``cell`` (an ``nn.GRUCell`` or ``nn.LSTMCell``) over the sequences ``x`` ``[L, B, in]``
    (or a packed sequence) in one call from ``state`` ``[k, B, size]`` (an LSTM's ``h`` and
    ``c``, a GRU's ``h``): ``(outputs, state after the last step)``."""
    lstm = isinstance(cell, nn.LSTMCell)
    shell = _shell(lstm, cell.input_size, cell.hidden_size)
    params = {
        "weight_ih_l0": cell.weight_ih,
        "weight_hh_l0": cell.weight_hh,
        "bias_ih_l0": cell.bias_ih,
        "bias_hh_l0": cell.bias_hh,
    }
    hx = (state[0:1].contiguous(), state[1:2].contiguous()) if lstm else state.contiguous()
    out, last = functional_call(shell, params, (x, hx))
    return out, torch.cat(last) if lstm else last


class Segments:
    """``N`` sequences of ``L`` steps cut at their episode ends: ``dones`` ``[L - 1, N]``
    (``dones[t]``: an episode ended after step ``t``, the state is zeroed before ``t + 1``).
    :meth:`run` replays a cell over them all at once."""

    def __init__(self, dones: torch.Tensor, length: int, n: int) -> None:
        self.length, self.n = length, n
        starts = torch.zeros(n, length, dtype=torch.bool, device=dones.device)
        starts[:, 0] = True
        if length > 1:
            starts[:, 1:] = dones[: length - 1].T > 0
        flat = starts.reshape(-1)  # step t of sequence j at j * L + t
        first = flat.nonzero().squeeze(1)  # where each piece starts
        self.pieces = int(first.shape[0])
        if self.pieces == n:  # no episode ends inside: the sequences as they are
            return
        self.piece = flat.long().cumsum(0) - 1  # the piece of each step
        self.pos = torch.arange(n * length, device=dones.device) - first[self.piece]
        self.lengths = torch.diff(first, append=first.new_tensor([n * length])).cpu()
        self.heads = (first % length == 0).nonzero().squeeze(1)  # each sequence's first piece
        self.tails = self.piece.view(n, length)[:, -1]  # and its last
        self.longest = int(self.lengths.max())

    def run(
        self, cell: nn.Module, x: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cell`` over ``x`` ``[L, N, in]`` from ``state`` ``[k, N, size]`` (the state
        before step 0), zeroed at the episode ends: ``(outputs [L, N, size], the state after
        each sequence's last step [k, N, size])``."""
        if self.pieces == self.n:
            return run_cell(cell, x, state)
        size = cell.hidden_size
        rows = x.transpose(0, 1).reshape(self.n * self.length, x.shape[-1])
        padded = x.new_zeros(self.longest, self.pieces, x.shape[-1])
        padded = padded.index_put((self.pos, self.piece), rows)
        start = state.new_zeros(state.shape[0], self.pieces, size)
        start = start.index_copy(1, self.heads, state)
        packed = pack_padded_sequence(padded, self.lengths, enforce_sorted=False)
        out, last = run_cell(cell, packed, start)
        out = pad_packed_sequence(out, total_length=self.longest)[0][self.pos, self.piece]
        return out.view(self.n, self.length, size).transpose(0, 1), last[:, self.tails]


def chunk_starts(steps: int, length: int) -> list[int]:
    """The steps where the chunks of ``length`` steps of a rollout of ``steps`` start."""
    return list(range(0, steps, length))


def chunk(x: torch.Tensor, length: int) -> torch.Tensor:
    """Rollouts ``[T, N, ...]`` as chunks ``[length, C * N, ...]`` (chunk ``c`` of rollout
    ``j`` at column ``c * N + j``); where ``length`` does not divide ``T`` the last chunks are
    padded with zeros (a mask chunked alike tells the padding: its zeros)."""
    steps, n = x.shape[:2]
    count = -(-steps // length)
    pad = count * length - steps
    if pad:
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    x = x.view(count, length, n, *x.shape[2:]).transpose(0, 1)
    return x.reshape(length, count * n, *x.shape[3:])
