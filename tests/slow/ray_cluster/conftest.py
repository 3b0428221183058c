"""The module-scoped Ray cluster of this folder's modules, and their leftover check."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Leftovers, marked_pids
from tests.slow.ray_cluster import ray_processes, started_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A head (1 CPU) and two worker nodes (2 CPUs each), with the test plugin installed where
    every node's Python finds it. Ray's temp dir and ``HOME`` are this module's own."""
    with started_cluster(tmp_path_factory) as made:
        yield made


@pytest.fixture(autouse=True)
def no_leftovers(monkeypatch: pytest.MonkeyPatch, cluster: Any) -> Iterator[None]:
    """This module's leftover check (the cluster's own processes live as long as the module):
    no actor process of a run, no process the test started, no new shared memory."""
    mark = uuid.uuid4().hex
    leftovers = Leftovers(mark, Path(tempfile.gettempdir())).start(monkeypatch)
    yield
    # Ray reaps a killed actor's process asynchronously: soon on a quiet machine, up to tens of
    # seconds with the rest of the suite beside it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        actors = ray_processes("ChildActor") + ray_processes("Hub")
        orphans = marked_pids(mark)
        shm = leftovers.shm()  # new entries no process outside this test holds
        if not actors and not orphans and not shm:
            break
        time.sleep(0.2)
    assert not actors, f"actor processes left behind: {[_described(pid) for pid in actors]}"
    assert not orphans, f"processes left behind: {orphans}"
    assert not shm, f"shared memory left: {sorted(shm)}"


def _described(pid: int) -> str:
    """``pid``, its parent and its command line, as far as /proc says (a leftover's report)."""
    try:
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} (parent {parent}): {command[:200]}"
