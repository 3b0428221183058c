"""How the Ray backend's Manager kinds were chosen: a Manager server over TCP (with a key)
against a Ray state actor, for the operations a plugin's control state makes.

Both are called from a Ray actor (as a worker would), on this machine's address, in one run:

- ``manager``: ``SyncManager(address=(node_ip, 0), authkey=...)``, the proxies unpickled in the
  actor (what ``--backend ray`` builds);
- ``actor``: the same objects held by a Ray actor, each operation one ``ray.get(actor.op.remote())``
  (the alternative the issue names).

Operations: read a ``Value``, ``list[i] += 1`` (a read and a write), ``Queue`` put + get of a
small item, ``Lock`` acquire + release. Reported: microseconds per operation, median of
``--repeats`` rounds of ``--n`` operations each, and the ratio actor / manager.

Usage: ``python benchmarks/ray_state_costs.py``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import secrets
import statistics
import threading
import time
from multiprocessing.managers import SyncManager
from typing import Any

import ray


class StateActor:
    def __init__(self) -> None:
        self.value, self.items = 0, [0, 0]
        self.queue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()

    def get_value(self) -> int:
        return self.value

    def get_item(self, i: int) -> int:
        return self.items[i]

    def set_item(self, i: int, v: int) -> None:
        self.items[i] = v

    def put(self, item: Any) -> None:
        self.queue.put(item)

    def get(self) -> Any:
        return self.queue.get()

    def acquire(self) -> bool:
        return self.lock.acquire()

    def release(self) -> None:
        self.lock.release()


class Caller:
    def __init__(self, authkey: bytes) -> None:
        mp.current_process().authkey = authkey

    def manager_ops(self, objs: dict[str, Any], n: int) -> dict[str, float]:
        value, items, q, lock = objs["value"], objs["items"], objs["queue"], objs["lock"]
        return {
            "Value read": _time(lambda: value.value, n),
            "list[i] += 1": _time(lambda: items.__setitem__(0, items[0] + 1), n),
            "Queue put + get": _time(lambda: (q.put((0, 1)), q.get()), n),
            "Lock acquire + release": _time(lambda: (lock.acquire(), lock.release()), n),
        }

    def actor_ops(self, a: Any, n: int) -> dict[str, float]:
        def incr() -> None:
            v = ray.get(a.get_item.remote(0))
            ray.get(a.set_item.remote(0, v + 1))

        return {
            "Value read": _time(lambda: ray.get(a.get_value.remote()), n),
            "list[i] += 1": _time(incr, n),
            "Queue put + get": _time(
                lambda: (ray.get(a.put.remote((0, 1))), ray.get(a.get.remote())), n
            ),
            "Lock acquire + release": _time(
                lambda: (ray.get(a.acquire.remote()), ray.get(a.release.remote())), n
            ),
        }


def _time(op: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        op()
    return (time.perf_counter() - start) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    key = secrets.token_bytes(32)
    manager = SyncManager(address=(ray.util.get_node_ip_address(), 0), authkey=key)
    manager.start()
    try:
        objs = {"value": manager.Value("i", 0), "items": manager.list([0, 0]),
                "queue": manager.Queue(), "lock": manager.Lock()}  # fmt: skip
        state = ray.remote(StateActor).options(max_concurrency=4).remote()
        caller = ray.remote(Caller).remote(key)
        rounds: dict[str, dict[str, list[float]]] = {"manager": {}, "actor": {}}
        for _ in range(args.repeats):  # alternated, so load hits both alike
            for name, out in (
                ("manager", ray.get(caller.manager_ops.remote(objs, args.n), timeout=600)),
                ("actor", ray.get(caller.actor_ops.remote(state, args.n), timeout=600)),
            ):
                for op, us in out.items():
                    rounds[name].setdefault(op, []).append(us)
        print(f"{'operation':<24} {'manager us':>11} {'actor us':>9} {'actor/manager':>22}")
        for op in rounds["manager"]:
            m, a = rounds["manager"][op], rounds["actor"][op]
            ratios = [x / y for x, y in zip(a, m, strict=True)]
            print(
                f"{op:<24} {statistics.median(m):>11.0f} {statistics.median(a):>9.0f} "
                f"{statistics.median(ratios):>8.1f} ({min(ratios):.1f}-{max(ratios):.1f})"
            )
    finally:
        manager.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
