"""The transport contract (:class:`mprl.testing.TransportContract`) on every placement that runs
in this process: shared memory (the local backend), in-process (the serial backend), a hub
called by its workers, a hub whose workers map its memory. The hub in a Ray actor passes it in
tests/slow/ray_cluster/test_transport_contract.py."""

from __future__ import annotations

import pytest

from mprl.testing import HubInProcess, InProcess, SharedMemory, TransportContract


class TestSharedMemory(TransportContract):
    @pytest.fixture
    def placement(self):
        return SharedMemory()


class TestInProcess(TransportContract):
    @pytest.fixture
    def placement(self):
        return InProcess()


class TestHubCalled(TransportContract):
    @pytest.fixture
    def placement(self):
        return HubInProcess(same_host=False)


class TestHubMapped(TransportContract):
    @pytest.fixture
    def placement(self):
        return HubInProcess(same_host=True)
