"""The transport contract (:class:`mprl.testing.TransportContract`) on a hub in a Ray actor of
this folder's cluster, every process of the test calling it through Ray."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mprl.testing import TransportContract
from mprl.testing.transport import PATIENCE_S, Endpoint, _HubPlacement


class HubOverRay(_HubPlacement):
    """A hub in a Ray actor (Ray joined by the caller), every process of the test calling it
    (no process maps its memory: each is another machine, as far as it knows)."""

    def __init__(self) -> None:
        import ray

        from mprl_builtin.ray.actor import ChildActor

        self.actor = ray.remote(ChildActor).options(max_concurrency=32).remote(b"contract")

    def link(self) -> Any:
        from mprl_builtin.ray.link import RayLink

        return RayLink(self.actor)

    def local(self) -> Endpoint:
        return Endpoint(self.link())  # the learner calls too

    def stopping(self) -> None:
        import ray

        ray.get(self.actor.hub_call.remote("stop_waits"), timeout=PATIENCE_S)

    def close(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)


@pytest.fixture(scope="module")
def joined(cluster: Any) -> Iterator[None]:
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


class TestHubOverRay(TransportContract):
    @pytest.fixture
    def placement(self, joined):
        return HubOverRay()
