"""The Ray backend on a real multi-node cluster on this machine (``ray.cluster_utils.Cluster``):
a head and two worker nodes, started once for each module of this folder (its ``conftest.py``),
so that the two modules run side by side under pytest-xdist. Runs go through the CLI, as a user
starts them, joined to the cluster with ``--ray-address``.

Every node has 2 CPUs and the tests give each worker ``--worker-cpus 2``, so two workers can only
be placed on two distinct nodes; the head (1 CPU) hosts the train process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HERE, child_pids, cli, write_distribution

WORKER = ["--worker-cpus", "2"]  # a whole node each: two workers, two nodes
#: entry points of the test plugins every node has installed
PLUGINS = {"raytest": "mprl_raytest", "testplugin": "mprl_testplugin", "docs-dqn": "mprl_docs_dqn"}


@contextlib.contextmanager
def started_cluster(
    tmp_path_factory: pytest.TempPathFactory, system_config: dict[str, Any] | None = None
) -> Iterator[Any]:
    """A head (1 CPU) and two worker nodes (2 CPUs each), with the test plugin installed where
    every node's Python finds it, and Ray's ``system_config`` when given. Ray's temp dir and
    ``HOME`` are the module's own."""
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
    # a ray.init() in this process (a module's own) sets it to Ray's debugger for what this
    # process starts later: unset again with the module's cluster (empty: Python's default)
    env.setenv("PYTHONBREAKPOINT", "")
    env.syspath_prepend(str(site))
    head = {"num_cpus": 1, "temp_dir": str(temp / "ray"), "include_dashboard": False}
    if system_config:
        head["_system_config"] = system_config
    made = Cluster(initialize_head=True, head_node_args=head)
    try:
        made.add_node(num_cpus=2)
        made.add_node(num_cpus=2)
        made.wait_for_nodes(timeout=120)
        yield made
    finally:
        made.shutdown()
        env.undo()
        shutil.rmtree(temp, ignore_errors=True)


def ray_processes(title: str) -> list[int]:
    """Live processes of this module's cluster (descendants of this process: the cluster's nodes
    are our children) whose command line starts with ``ray::TITLE`` (an actor's process); another
    Ray cluster on the machine is not ours to count."""
    out = []
    for pid in child_pids(os.getpid()):
        entry = Path("/proc") / str(pid)
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmd.startswith(f"ray::{title}"):
            out.append(pid)
    return out


def run_ray(cluster: Any, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli("run", "--backend", "ray", "--ray-address", cluster.address, *args, timeout=timeout)


def placed(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Who ran where: the last ``placed`` event of each process, by its name."""
    out = {}
    for r in records:
        if r.get("event") == "placed":
            who = "trainer" if r["rank"] < 0 else f"worker {r['rank']}"
            out[who] = r
    return out
