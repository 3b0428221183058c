"""The Ray backend's connection: joining a cluster or starting Ray for one run, what the run
asks of the cluster, and Ray's errors in words. Ray is imported only when a run uses it."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import threading
from collections.abc import Iterator, Mapping
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


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray's actor options for ``resources`` (``{"CPU": 1, "GPU": 1, "custom": 2}``)."""
    out: dict[str, Any] = {"num_cpus": resources.get("CPU", 0.0)}
    if resources.get("GPU"):
        out["num_gpus"] = resources["GPU"]
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        out["resources"] = custom
    return out


#: the longest joining a cluster may take before it is given up
CONNECT_TIMEOUT_S = 60.0


def connect(address: str, cpus_needed: float) -> Path | None:
    """Join the Ray cluster at ``address``, or start Ray on this machine for the run when it is
    empty; the embedded Ray's session directory (``None`` for a cluster). Raises
    :class:`UsageError` naming the address when there is no Ray cluster to join."""
    import ray

    quiet = {"log_to_driver": False, "logging_level": "WARNING"}
    if address:
        check_address(address)  # ray.init would retry one with no Ray there for minutes
        with _without(_INIT_LOGGER, THREAD_NOTE):
            _in_time(lambda: ray.init(address=address, **quiet), address)
        return None
    # Ray's processes (GCS, raylet, the actors they start) inherit a mask with the terminal's
    # signals blocked: Ctrl-C and a closed terminal reach the whole process group, but they are
    # the driver's to act on (a clean stop), as they are for the local backend's children
    terminal = {signal.SIGINT, signal.SIGHUP}
    with _without_auth_note(), _blocked(terminal):
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


@contextlib.contextmanager
def _blocked(signals: set[signal.Signals]) -> Iterator[None]:
    """``signals`` blocked in this thread (a signal that comes meanwhile is delivered after)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


#: what Ray (2.5x and later) logs on every ``ray.init()`` that starts a cluster while
#: ``RAY_AUTH_MODE`` is unset, having turned token authentication on for it
AUTH_NOTE = "Token authentication is enabled for this Ray cluster"
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
#: what Ray logs when ``ray.init()`` runs outside the main thread (:func:`_in_time`): the
#: driver's SIGTERM is mprl's to handle, as on every backend
THREAD_NOTE = "SIGTERM handler is not set because current thread is not the main thread"
_INIT_LOGGER = "ray._private.worker"


class _Drop(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def _without(logger_name: str, text: str) -> Iterator[None]:
    """Ray's log records that contain ``text`` left out meanwhile: news about something that
    is not the user's to act on. Everything else Ray says is said."""
    logger = logging.getLogger(logger_name)
    drop = _Drop(text)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _without_auth_note() -> contextlib.AbstractContextManager[None]:
    """Ray's :data:`AUTH_NOTE` left out while mprl starts its own throw-away cluster for one
    run: news about a cluster the user never sees. Authentication is as Ray sets it (token
    authentication on, as the note says); joining a cluster (``--ray-address``) goes
    elsewhere, and whatever Ray says there about it is said."""
    return _without(_AUTH_LOGGER, AUTH_NOTE)


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
    what = ", ".join(f"{v:g} {k} (it has {h:g})" for k, (v, h) in short.items())
    return (
        f"the Ray cluster cannot hold this run: the run needs {what}; use fewer --workers, "
        "a smaller --worker-cpus / --learner-resources, or add nodes"
    )


def unreachable(exc: BaseException, address: str) -> str:
    return (
        f"cannot join the Ray cluster at {address} ({cause(exc)}); check --ray-address / "
        "RAY_ADDRESS, that `ray start --head` runs there, and that this machine holds the "
        "cluster's token (~/.ray/auth_token)"
    )


def cause(exc: BaseException) -> str:
    """The first line of a Ray error."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
