"""How fast the local backend's children start: forkserver against spawn, in one invocation.

    python benchmarks/child_start.py [--children 4] [--repeats 3]

Each repeat starts ``--children`` processes from each start method's context (as the local
backend makes it: :func:`mprl.backends.processes.start_context`), each importing what a worker
imports (torch, gymnasium, mprl's local backend) and saying when it is ready; the forkserver is
stopped after each repeat, as a run stops it, so every repeat pays its start. Printed: seconds
until the last child is ready and the CPU seconds of the children (the forkserver's included),
median (min-max) over the repeats, and the ratios forkserver / spawn.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stats import median_range
from mprl.backends.processes import start_context, stop_forkserver


def _child(ready: mp.Queue) -> None:
    import gymnasium  # noqa: F401
    import torch  # noqa: F401

    import mprl.backends.local.backend  # noqa: F401

    ready.put(time.monotonic())


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def once(method: str, children: int) -> tuple[float, float]:
    """Seconds until every child is ready, and the CPU seconds they (and a server) took."""
    context = start_context(method)
    ready = context.Queue()
    cpu, started = _children_cpu(), time.monotonic()
    procs = [context.Process(target=_child, args=(ready,)) for _ in range(children)]
    for proc in procs:
        proc.start()
    last = max(ready.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join()
    stop_forkserver()
    return last - started, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"spawn": [], "forkserver": []}
    for _ in range(args.repeats):  # interleaved: a noisy moment hits both
        for method in results:
            results[method].append(once(method, args.children))
    for method, runs in results.items():
        print(
            f"{method:10s} all {args.children} ready after {median_range(r[0] for r in runs)} s, "
            f"CPU {median_range(r[1] for r in runs)} s"
        )
    pairs = zip(results["forkserver"], results["spawn"], strict=True)
    ratios = [(f[0] / s[0], f[1] / s[1]) for f, s in pairs]
    print(
        f"forkserver / spawn: ready {median_range(r[0] for r in ratios)}, "
        f"CPU {median_range(r[1] for r in ratios)}"
    )


if __name__ == "__main__":
    main()
