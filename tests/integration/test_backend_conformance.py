"""The backend conformance suite (:class:`mprl.testing.BackendConformance`) on the local backend
(spawned processes) and the serial one (threads of the test's process taking turns, which by
design neither restarts nor watches for hangs: its own tests say so, tests/unit/test_serial.py).
The Ray backend passes it in tests/slow/ray_cluster/test_backend_conformance.py, the threads
example backend in examples/mprl-threads."""

from __future__ import annotations

import pytest

from mprl.testing import BackendConformance


class TestLocal(BackendConformance):
    @pytest.fixture
    def backend(self):
        return "local"


class TestSerial(BackendConformance):
    restarts = False  # a crash ends a serial run
    hangs_killed = False  # no hang detection: a debugger's breakpoint is not a hang
    exits = False  # its processes are the test's own threads
    bounded_stop = False  # a function that never returns keeps its turn

    @pytest.fixture
    def backend(self):
        return "serial"
