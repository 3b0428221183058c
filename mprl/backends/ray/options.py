"""The Ray backend's run options, and what they say, read without importing Ray or torch
(the early start reads them too: :mod:`mprl.backends.ray.start`)."""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
from attrs import validators as v

from mprl.errors import UsageError

INSTALL = 'pip install "mprl[ray]"'


def _resources(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    try:
        learner_resources(value)
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
        default=1.0, validator=v.gt(0), metadata={"help": "CPUs each worker actor reserves"}
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
    return {k: float(v) for k, v in value.items()}
