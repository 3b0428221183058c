"""The link to a hub hosted by a Ray actor (:class:`mprl.transport.client.Link`).

The actor that hosts the hub has a method ``hub_call(method, *args)`` that calls its
:class:`~mprl.transport.hub.Hub`; Ray carries the arguments and the answer, inline when small
and through its object store when large (a rollout of images), so the transport code says
nothing of the way and a payload is never copied through anything but the call.
"""

from __future__ import annotations

from typing import Any

import ray


class RayLink:
    """Calls the hub of the actor ``host`` (a Ray actor handle with ``hub_call``)."""

    errors: tuple[type[BaseException], ...] = (ray.exceptions.RayError,)

    def __init__(self, host: Any) -> None:
        self.host = host

    def call(self, method: str, *args: Any) -> Any:
        return self.host.hub_call.remote(method, *args)

    def get(self, pending: Any, timeout: float) -> Any:
        return ray.get(pending, timeout=timeout)  # (GetTimeoutError is a TimeoutError)

    def ready(self, pending: Any, timeout: float) -> bool:
        return bool(ray.wait([pending], timeout=timeout)[0])
