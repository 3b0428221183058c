"""The Ray backend's connection: joining a cluster or starting Ray for one run, what the run
asks of the cluster, and Ray's errors in words. Ray is imported only when a run uses it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
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


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray's actor options for ``resources`` (``{"CPU": 1, "GPU": 1, "custom": 2}``)."""
    out: dict[str, Any] = {"num_cpus": resources.get("CPU", 0.0)}
    if resources.get("GPU"):
        out["num_gpus"] = resources["GPU"]
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        out["resources"] = custom
    return out


def connect(address: str, cpus_needed: float) -> Path | None:
    """Join the Ray cluster at ``address``, or start Ray on this machine for the run when it is
    empty; the embedded Ray's session directory (``None`` for a cluster)."""
    import ray

    quiet = {"log_to_driver": False, "logging_level": "WARNING"}
    if address:
        reachable(address)  # ray.init would retry an address with nobody there for minutes
        ray.init(address=address, **quiet)
        return None
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, int(-(-cpus_needed // 1))),
        include_dashboard=False,
        # Ray starts workers at nice 15; the run's processes are the work here
        _system_config={"worker_niceness": 0},
        **quiet,
    )
    with contextlib.suppress(Exception):  # Ray's logs of this run: removed unless it fails
        node = ray._private.worker._global_node  # no public accessor
        return Path(node.get_session_dir_path())
    return None


def remove_session(session: Path) -> None:
    """Remove an embedded Ray's session directory (its logs) and the link to it."""
    shutil.rmtree(session, ignore_errors=True)
    latest = session.parent / "session_latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() and Path(os.readlink(latest)) in (session, Path(session.name)):
            latest.unlink()


def too_big(need: Mapping[str, float]) -> str | None:
    """Why the cluster cannot hold resources ``need`` (placement would wait forever)."""
    import ray

    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) < v}
    if not short:
        return None
    what = ", ".join(f"{v:g} {k} (the cluster has {h:g})" for k, (v, h) in short.items())
    return (
        f"the Ray cluster cannot hold this run: it needs {what}; use fewer --workers, "
        "a smaller --worker-cpus / --learner-resources, or add nodes"
    )


def reachable(address: str, timeout: float = 10.0) -> None:
    """Raise ``ConnectionError`` unless something listens at ``address`` (``HOST:PORT``; Ray's
    other forms, ``auto`` or ``ray://``, are left to Ray)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address}: {exc}") from None


def unreachable(exc: BaseException) -> str:
    return (
        f"cannot join the Ray cluster ({cause(exc)}); check --ray-address / RAY_ADDRESS, that "
        "`ray start --head` runs there, and that this machine holds the cluster's token "
        "(~/.ray/auth_token)"
    )


def cause(exc: BaseException) -> str:
    """The first line of a Ray error."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
