"""The Ray backend's connection: joining a cluster or starting Ray for one run, what the run
asks of the cluster, and Ray's errors in words. Ray is imported only when a run uses it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mprl import startup
from mprl.errors import UsageError
from mprl_builtin.ray import start as ray_start
from mprl_builtin.ray.options import INSTALL, RayOptions, learner_resources  # noqa: F401


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray's actor options for ``resources`` (``{"CPU": 1, "GPU": 1, "custom": 2}``; Ray's
    ``memory``, in bytes, is an option of its own)."""
    out: dict[str, Any] = {"num_cpus": resources.get("CPU", 0.0)}
    if resources.get("GPU"):
        out["num_gpus"] = resources["GPU"]
    if resources.get("memory"):
        out["memory"] = resources["memory"]
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
    if custom:
        out["resources"] = custom
    return out


#: the longest joining a cluster may take before it is given up
CONNECT_TIMEOUT_S = 60.0


def connect(address: str, cpus_needed: float) -> Path | None:
    """Join the Ray cluster at ``address``, or start Ray on this machine for the run when it is
    empty (or take the one started ahead, :func:`mprl_builtin.ray.start.start`, when it has
    the CPUs); the embedded Ray's session directory (``None`` for a cluster). Raises
    :class:`UsageError` naming the address when there is no Ray cluster to join."""
    import ray

    early = startup.claim("ray")
    if early is not None:
        session, failed = early.take()
        if failed is None and not address and ray.cluster_resources().get("CPU", 0) >= cpus_needed:
            return session
        early.stop()  # a config file's address, more CPUs, or it failed: started anew
    if address:
        check_address(address)  # ray.init would retry one with no Ray there for minutes
        with ray_start.without(ray_start.INIT_LOGGER, ray_start.THREAD_NOTE):
            _in_time(lambda: ray.init(address=address, **ray_start.QUIET), address)
        return None
    return ray_start.start_here(cpus_needed)


def _in_time(join: Any, address: str) -> None:
    """``join()`` in a thread, waited for at most :data:`CONNECT_TIMEOUT_S` from this one, so
    Ctrl-C keeps working (a KeyboardInterrupt here; Ray's wait would swallow it)."""
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            join()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=attempt, name="mprl-ray-connect", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT_S)
    if thread.is_alive():
        raise UsageError(
            f"--ray-address {address}: no Ray cluster answered in {CONNECT_TIMEOUT_S:g} s; "
            "check the address and that `ray start --head` runs there"
        )
    if failed:
        raise UsageError(unreachable(failed[0], address)) from None


def check_address(address: str) -> None:
    """Refuse an address that is not ``HOST:PORT`` (``[IPv6]:PORT``), ``auto`` or ``ray://...``,
    or where nothing answers, or where what answers is no Ray cluster (its GCS speaks gRPC)."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--ray-address {address!r}: expected HOST:PORT (port 1-65535), auto or "
            "ray://HOST:PORT, e.g. --ray-address 10.0.0.5:6379"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            grpc = _speaks_grpc(sock)
    except OSError as exc:
        raise UsageError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); check the "
            "address and that `ray start --head` runs there"
        ) from None
    if not grpc:
        raise UsageError(
            f"--ray-address {address}: something answers there, but not a Ray cluster (no "
            "gRPC); give the port `ray start --head` printed (6379 by default)"
        )


def _speaks_grpc(sock: socket.socket) -> bool:
    """Whether the server on ``sock`` answers an HTTP/2 preface with a SETTINGS frame, as a
    gRPC server (Ray's GCS) does; an HTTP/1 server answers otherwise or not at all."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    try:
        sock.settimeout(5)
        sock.sendall(preface)
        head = sock.recv(9)
    except OSError:
        return False
    return len(head) >= 4 and head[3] == 4  # frame type 4: SETTINGS


def too_big(need: Mapping[str, float]) -> str | None:
    """Why the cluster cannot hold resources ``need`` (placement would wait forever)."""
    import ray

    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) < v}
    if not short:
        return None
    what = ", ".join(f"{v:g} {k} (it has {h:g})" for k, (v, h) in short.items())
    return (
        f"the Ray cluster cannot hold this run: the run needs {what}; use fewer --workers, "
        "a smaller --worker-cpus / --learner-resources, or add nodes"
    )


def unreachable(exc: BaseException, address: str) -> str:
    """Why joining the cluster at ``address`` failed, and what to check or set on this machine
    (a token without ``RAY_AUTH_MODE=token``, or the mode without a token, named)."""
    from mprl_builtin.ray import auth

    return f"cannot join the Ray cluster at {address} ({cause(exc)}); {auth.join_advice()}"


def cause(exc: BaseException) -> str:
    """The first line of a Ray error."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def node_death(exc: BaseException) -> str | None:
    """Why Ray declared the node of a dead actor dead, when it died with its node (``exc``: the
    ``ActorDiedError`` of one of its tasks), in Ray's words (``health check failed due to
    missing too many heartbeats``); ``None`` when it died otherwise."""
    lines = [line.strip() for line in str(exc).splitlines()]
    if not any("its node has died" in line for line in lines):
        return None
    for line in lines:  # "the actor's node was terminated unexpectedly: health check failed ..."
        if line.startswith("the actor's node was"):
            return line.split(":", 1)[-1].strip()[:200] or "its node died"
    return "its node died"


def resources_text(resources: Mapping[str, float]) -> str:
    """``{CPU: 2, GPU: 1}``: resources as a line says them."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in resources.items()) + "}"


def free_for(need: Mapping[str, float]) -> tuple[bool | None, str]:
    """Whether a live node of the cluster has ``need`` free now (``None``: Ray did not say),
    and what the live nodes have, in words (``2 live nodes: 3 CPU, 1 free, at most 1 on one
    node; 1 node lost``)."""
    import ray

    try:  # per node, from Ray's control store (not public API: a Ray without it says less)
        from ray._private import state

        free = state.available_resources_per_node()
    except Exception:
        free = None
    try:
        nodes = ray.nodes()
    except Exception:
        return None, "the cluster did not say what it has"
    live = [n for n in nodes if n.get("Alive")]
    lost = len(nodes) - len(live)
    parts = []
    for key in need:
        total = sum(n.get("Resources", {}).get(key, 0.0) for n in live)
        part = f"{total:g} {key}"
        if free is not None:
            each = [free.get(n["NodeID"], {}).get(key, 0.0) for n in live]
            part += f", {sum(each):g} free, at most {max(each, default=0.0):g} on one node"
        parts.append(part)
    text = f"{len(live)} live node{'s' * (len(live) != 1)}: " + "; ".join(parts)
    if lost:
        text += f"; {lost} node{'s' * (lost != 1)} lost"
    if free is None:
        return None, text
    fits = any(
        all(free.get(n["NodeID"], {}).get(k, 0.0) >= v for k, v in need.items()) for n in live
    )
    return fits, text


def node_alive(node_id: str) -> bool | None:
    """Whether Ray counts the node ``node_id`` (hex) alive; ``None`` when it does not say."""
    import ray

    try:
        for node in ray.nodes():
            if node.get("NodeID") == node_id:
                return bool(node.get("Alive"))
    except Exception:
        return None
    return None


def actor_placed(actor: Any) -> bool | None:
    """Whether Ray has given the actor a process (``None`` when Ray does not say): one whose
    process starts has its pid in Ray's actor table, one that waits for resources has none
    (although Ray may have named a node for it already)."""
    try:  # Ray's actor table (a developer API: a Ray without it says nothing)
        from ray._private import state

        entry = state.actors(actor_id=actor._actor_id.hex())
    except Exception:
        return None
    if not isinstance(entry, dict) or "Pid" not in entry:
        return None
    return entry.get("State") == "ALIVE" or bool(entry["Pid"])
