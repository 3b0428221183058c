"""The mixers of value decomposition: how the agents' chosen Q values make the team's
``Q_tot(s, a)``. VDN (Sunehag et al. 2018) sums them; QMIX (Rashid et al. 2018) mixes them
with a two-layer network whose weights a hypernetwork makes from the global state, taken in
absolute value so that ``Q_tot`` is monotonic in every agent's Q (``dQ_tot / dQ_a >= 0``): each
agent's greedy action is then the team's. Both take ``qs [B, A]`` and ``state [B, S]`` and
return ``[B]``."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class VDNMixer(nn.Module):
    """``Q_tot`` = the sum of the agents' Q values (no parameters; the state is not used)."""

    def forward(self, qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return qs.sum(-1)


class QMixer(nn.Module):
    """QMIX's monotonic mixing network, as pymarl and EPyMARL build it (``hypernet_layers=2``):
    ``Q_tot = w2 . elu(qs . W1 + b1) + b2`` with ``W1 = |hyper_w1(s)|`` ``[A, embed]``,
    ``w2 = |hyper_w2(s)|`` ``[embed]``, ``b1`` a linear function of ``s`` and ``b2`` a one-hidden-
    layer one.

    :param n_agents: ``A``.
    :param state_dim: ``S``, the global state's width.
    :param embed: the mixing layer's width (``mixing_embed_dim``, 32).
    :param hyper: the hypernetworks' hidden width (``hypernet_embed``, 64).
    """

    def __init__(self, n_agents: int, state_dim: int, embed: int = 32, hyper: int = 64) -> None:
        super().__init__()
        self.n_agents, self.embed = n_agents, embed
        self.hyper_w1 = nn.Sequential(
            nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, n_agents * embed)
        )
        self.hyper_w2 = nn.Sequential(
            nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, embed)
        )
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.hyper_b2 = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        b = qs.shape[0]
        w1 = self.hyper_w1(state).abs().view(b, self.n_agents, self.embed)
        b1 = self.hyper_b1(state).view(b, 1, self.embed)
        hidden = F.elu(torch.bmm(qs.view(b, 1, self.n_agents), w1) + b1)
        w2 = self.hyper_w2(state).abs().view(b, self.embed, 1)
        b2 = self.hyper_b2(state).view(b, 1, 1)
        return (torch.bmm(hidden, w2) + b2).view(b)
