"""The Ray backend's run options, and what they say, read without importing Ray or torch
(the early start reads them too: :mod:`mprl_builtin.ray.start`)."""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from mprl.errors import UsageError

INSTALL = 'pip install "mprl[ray]"'


#: Ray counts every resource in units of 1/10,000 (``RESOURCE_UNIT_SCALING``), and refuses an
#: amount above 0 but below one unit with a ValueError (``ray_option_utils``: "The precision of
#: the fractional quantity of resource ... cannot go beyond 0.0001"); it takes any other
#: amount, 1.5 CPUs included
UNITS = 10_000
RESOURCE_UNIT = 1 / UNITS

#: resource names that Ray takes as options of their own, not in an actor's ``resources``
#: (``memory`` is one: :func:`mprl_builtin.ray.cluster.actor_options` passes it so)
NOT_RESOURCES = ("object_store_memory",)


def _below_a_unit(amount: float) -> bool:
    """Whether Ray refuses ``amount`` as too small a fraction (its own test)."""
    return amount != 0 and int(amount * UNITS) == 0


def _resources(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    try:
        learner_resources(value)
    except UsageError as exc:
        raise ValueError(str(exc)) from None


def _cpus(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    try:
        worker_cpus(value)
    except UsageError as exc:
        raise ValueError(str(exc)) from None


@attrs.frozen
class RayOptions:
    """The Ray backend's run options (``--backend ray``), registered by it."""

    ray_address: str = attrs.field(
        default="",
        metadata={
            "help": "join the Ray cluster at HOST:PORT (default: $RAY_ADDRESS, else start Ray "
            "on this machine for the run)"
        },
    )
    worker_cpus: float = attrs.field(
        default=1.0,
        validator=_cpus,
        metadata={"help": "CPUs each worker actor reserves (0.0001 or more)"},
    )
    learner_resources: str = attrs.field(
        default="",
        validator=_resources,
        metadata={
            "help": "what the train process's actor reserves, as JSON "
            """(default '{"CPU": 1}'; e.g. '{"CPU": 1, "GPU": 1}')"""
        },
    )
    no_shared_memory: bool = attrs.field(
        default=False,
        metadata={
            "help": "every rollout and weights version goes through Ray calls, also for the "
            "workers on the train process's machine (which by default use shared memory)"
        },
    )


def learner_resources(text: str) -> dict[str, float]:
    """``--learner-resources`` read: a JSON object of resource names to amounts."""
    if not text:
        return {"CPU": 1.0}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--learner-resources {text!r}: not JSON ({exc}); e.g. '{{\"GPU\": 1}}'"
        ) from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and isinstance(n, int | float)
        and not isinstance(n, bool)
        and math.isfinite(n)
        and n >= 0
        for k, n in value.items()
    ):
        raise UsageError(
            f"--learner-resources {text!r}: expected an object of resource names to finite "
            'amounts >= 0, e.g. \'{"CPU": 1, "GPU": 1}\''
        )
    for name, amount in value.items():
        if not name.strip():
            raise UsageError(
                f"--learner-resources {text!r}: a resource name is blank ({name!r}); give "
                'the names the cluster has, e.g. \'{"CPU": 1, "GPU": 1}\''
            )
        if name in NOT_RESOURCES:
            raise UsageError(
                f"--learner-resources {text!r}: {name!r} is not a resource an actor reserves "
                "on Ray; leave it out"
            )
        if _below_a_unit(amount):
            raise UsageError(
                f"--learner-resources {text!r}: {name} {amount:g} is less than Ray reserves: "
                f"it counts resources in units of {RESOURCE_UNIT:g}; give 0, or "
                f"{RESOURCE_UNIT:g} or more"
            )
    return {k: float(v) for k, v in value.items()}


def worker_cpus(value: float) -> float:
    """``--worker-cpus`` checked: more than 0, and at least Ray's smallest amount."""
    if not (math.isfinite(value) and value > 0) or _below_a_unit(value):
        raise UsageError(
            f"--worker-cpus {value:g}: give the CPUs each worker reserves, a finite number of "
            f"{RESOURCE_UNIT:g} or more (Ray counts resources in units of {RESOURCE_UNIT:g})"
        )
    return value
