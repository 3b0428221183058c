"""Agent groups with a network each (BenchMARL's groups, RLlib's policy mapping): ``--set
groups=names`` gives each team (:func:`mprl.spaces.teams_of`: ``adversary_0``, ``adversary_1``
-> ``adversary``) its own actor and critic, ``--set
"groups=hunters:adversary_0,adversary_1;prey:agent_0"`` names the groups and their agents.
Inside a group one network serves its agents (the agent-id input tells them apart), as
``share_params`` does for all of them.

A model's groups are a tuple of the rows of each group's agents; :func:`run_groups` runs each
group's network over its rows and puts the outputs back in the agents' order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mprl.errors import UsageError
from mprl.spaces import teams_of

__all__ = ["check_groups", "in_order", "model_groups", "run_groups", "take"]

Groups = tuple[tuple[int, ...], ...]


def check_groups(instance: object, attribute: object, value: str) -> None:
    """The config field's validator: ``""``, ``"names"`` or ``"group:agent,agent;..."``."""
    if value in ("", "names"):
        return
    for part in value.split(";"):
        name, colon, agents = part.partition(":")
        if not colon or not name.strip() or not all(a.strip() for a in agents.split(",")):
            raise ValueError(
                f"groups {value!r}: give 'names' (a group per team of the agents' names) or "
                "'group:agent,agent;group:agent' (each group's agents), e.g. "
                "'hunters:adversary_0,adversary_1;prey:agent_0'"
            )


def model_groups(groups: str, share_params: bool, agents: Sequence[str]) -> Groups:
    """The rows of each network's agents: one group of all (``share_params``), one per agent,
    or the config's ``groups`` (``names``: the teams; else each named group's agents, every
    agent in exactly one).

    :raises UsageError: a group names an agent the env does not have, an agent is in two
        groups or in none.
    """
    if groups and not share_params:
        raise UsageError(
            "groups gives each group of agents its own networks, and share_params=false each "
            "agent: set one of them"
        )
    if not groups:
        return (
            (tuple(range(len(agents))),)
            if share_params
            else tuple((i,) for i in range(len(agents)))
        )
    if groups == "names":
        return tuple(teams_of(agents).values())
    rows = {a: i for i, a in enumerate(agents)}
    found: list[tuple[int, ...]] = []
    seen: dict[str, str] = {}
    for part in groups.split(";"):
        name, _, names = part.partition(":")
        members = [a.strip() for a in names.split(",")]
        unknown = [a for a in members if a not in rows]
        if unknown:
            raise UsageError(
                f"groups: group {name.strip()!r} names {', '.join(unknown)}, which the env does "
                f"not have; its agents: {', '.join(agents)}"
            )
        twice = [a for a in members if a in seen]
        if twice:
            raise UsageError(f"groups: {', '.join(twice)} in two groups ({seen[twice[0]]!r} too)")
        seen.update({a: name.strip() for a in members})
        found.append(tuple(rows[a] for a in members))
    missing = [a for a in agents if a not in seen]
    if missing:
        raise UsageError(f"groups: agents {', '.join(missing)} are in no group; name each agent")
    return tuple(found)


def inverse_order(groups: Groups) -> list[int] | None:
    """Where each agent's row is in the groups' outputs put side by side, ``None`` where that
    is already the agents' order."""
    order = [row for group in groups for row in group]
    if order == sorted(order):
        return None
    inverse = [0] * len(order)
    for position, row in enumerate(order):
        inverse[row] = position
    return inverse


def run_groups(
    nets: Sequence[Callable[..., torch.Tensor]], groups: Groups, x: torch.Tensor, dim: int
) -> torch.Tensor:
    """Each group's net over its agents' rows of ``x`` (the agents along ``dim``), the outputs
    put back in the agents' order along ``dim``."""
    outs = [net(take(x, dim, g)) for g, net in zip(groups, nets, strict=True)]
    return in_order(torch.cat(outs, dim), dim, groups)


def take(x: torch.Tensor, dim: int, rows: Sequence[int]) -> torch.Tensor:
    """``x``'s ``rows`` along ``dim`` (indexed by a list: a trace for ``mprl export`` keeps it
    as a constant without a warning)."""
    return x[(slice(None),) * dim + (list(rows),)]


def in_order(x: torch.Tensor, dim: int, groups: Groups) -> torch.Tensor:
    """The groups' rows side by side along ``dim`` put back in the agents' order."""
    inverse = inverse_order(groups)
    return x if inverse is None else take(x, dim, inverse)
