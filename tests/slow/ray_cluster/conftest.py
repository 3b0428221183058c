"""The module-scoped Ray cluster of this folder's modules, and their leftover check."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HERE, Leftovers, marked_pids, write_distribution
from tests.slow.ray_cluster import PLUGINS, ray_processes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A head (1 CPU) and two worker nodes (2 CPUs each), with the test plugin installed where
    every node's Python finds it. Ray's temp dir and ``HOME`` are this module's own."""
    from ray.cluster_utils import Cluster

    site = tmp_path_factory.mktemp("raysite")
    modules = {m: (HERE / "plugins" / f"{m}.py").read_text() for m in PLUGINS.values()}
    write_distribution(site, "mprl-raytest", PLUGINS, modules)
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths
    (temp / "ray").mkdir()  # where RAY_TMPDIR points Ray
    env = pytest.MonkeyPatch()
    env.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    env.setenv("RAY_TMPDIR", str(temp))
    env.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    env.delenv("RAY_ADDRESS", raising=False)
    env.syspath_prepend(str(site))
    made = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "temp_dir": str(temp / "ray"), "include_dashboard": False},
    )
    try:
        made.add_node(num_cpus=2)
        made.add_node(num_cpus=2)
        made.wait_for_nodes(timeout=120)
        yield made
    finally:
        made.shutdown()
        env.undo()
        shutil.rmtree(temp, ignore_errors=True)


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
    assert not actors, f"actor processes left behind: {actors}"
    assert not orphans, f"processes left behind: {orphans}"
    assert not shm, f"shared memory left: {sorted(shm)}"
