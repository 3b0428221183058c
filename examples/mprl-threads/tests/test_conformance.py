"""The threads backend against mprl's backend conformance suite."""

from __future__ import annotations

import pytest

from mprl.testing import BackendConformance


class TestThreads(BackendConformance):
    exits = False  # a thread's os._exit would end the test's own process

    @pytest.fixture
    def backend(self):
        return "threads"
