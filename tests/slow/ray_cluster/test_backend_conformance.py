"""The backend conformance suite (:class:`mprl.testing.BackendConformance`) on the Ray backend,
joined to this folder's cluster."""

from __future__ import annotations

from typing import Any

import pytest

from mprl.testing import BackendConformance


class TestRay(BackendConformance):
    @pytest.fixture
    def backend(self):
        return "ray"

    @pytest.fixture
    def backend_options(self, cluster: Any):
        return {"ray_address": cluster.address}
