"""The transport contract (:class:`mprl.testing.TransportContract`) on a hub in a Ray actor of
this folder's cluster, every process of the test calling it through Ray."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mprl.testing import HubOverRay, TransportContract


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
