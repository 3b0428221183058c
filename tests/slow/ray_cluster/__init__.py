"""The Ray backend on a real multi-node cluster on this machine (``ray.cluster_utils.Cluster``):
a head and two worker nodes, started once for each module of this folder (its ``conftest.py``),
so that the two modules run side by side under pytest-xdist. Runs go through the CLI, as a user
starts them, joined to the cluster with ``--ray-address``.

Every node has 2 CPUs and the tests give each worker ``--worker-cpus 2``, so two workers can only
be placed on two distinct nodes; the head (1 CPU) hosts the train process.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import child_pids, cli

WORKER = ["--worker-cpus", "2"]  # a whole node each: two workers, two nodes
#: entry points of the test plugins every node has installed
PLUGINS = {"raytest": "mprl_raytest", "testplugin": "mprl_testplugin", "docs-dqn": "mprl_docs_dqn"}


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
