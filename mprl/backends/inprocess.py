"""Manager objects without a Manager server, for a backend whose children share the main
process (the serial backend, a threads backend) and for :func:`mprl.testing.build_state`. Lists
and dicts are plain ones; locks, events, barriers and queues wait by calling ``pause()`` (by
default a short sleep; the serial backend gives the other processes their turn there)."""

from __future__ import annotations

import array
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import SimpleNamespace
from typing import Any

Pause = Callable[[], None]


def _sleep_pause() -> None:
    time.sleep(0.0005)


def _poll(attempt: Callable[[], bool], pause: Pause, timeout: float | None) -> bool:
    """Call ``attempt()`` until it succeeds, pausing between tries; False on timeout."""
    deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
    while not attempt():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        pause()
    return True


class _Lock:
    def __init__(self, pause: Pause, inner: Any) -> None:
        self._pause, self._inner = pause, inner

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking:
            return self._inner.acquire(blocking=False)
        return _poll(lambda: self._inner.acquire(blocking=False), self._pause, timeout)

    def release(self) -> None:
        self._inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Event:
    def __init__(self, pause: Pause) -> None:
        self._pause, self._flag = pause, False

    def set(self) -> None:
        self._flag = True

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        return _poll(self.is_set, self._pause, timeout)


class _Condition:
    def __init__(self, pause: Pause) -> None:
        self._pause = pause
        self._lock = _Lock(pause, threading.RLock())
        self._waiters: list[list[bool]] = []
        self.acquire, self.release = self._lock.acquire, self._lock.release

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        token = [False]
        self._waiters.append(token)
        self._lock.release()
        try:
            return _poll(lambda: token[0], self._pause, timeout)
        finally:
            if token in self._waiters:
                self._waiters.remove(token)
            self._lock.acquire()

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        for token in self._waiters[:n]:
            token[0] = True
        del self._waiters[:n]

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class _Barrier:
    def __init__(self, pause: Pause, parties: int) -> None:
        self._pause, self.parties = pause, parties
        self.n_waiting, self._generation = 0, 0
        self._lock = threading.Lock()  # never held across a wait

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            index, generation = self.n_waiting, self._generation
            self.n_waiting += 1
            if self.n_waiting == self.parties:
                self.n_waiting, self._generation = 0, generation + 1
                return index
        if not _poll(lambda: self._generation != generation, self._pause, timeout):
            raise threading.BrokenBarrierError
        return index


class _Queue(queue.Queue):
    def __init__(self, pause: Pause, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._pause = pause

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if block and not _poll(lambda: not self.full(), self._pause, timeout):
            raise queue.Full
        super().put(item, block=False)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and not _poll(lambda: not self.empty(), self._pause, timeout):
            raise queue.Empty
        return super().get(block=False)


class _Value:
    def __init__(self, typecode: str, value: Any) -> None:
        self.typecode, self.value = typecode, value

    def get(self) -> Any:
        return self.value

    def set(self, value: Any) -> None:
        self.value = value


class _Namespace(SimpleNamespace):
    def _getvalue(self) -> SimpleNamespace:  # what a Manager's Namespace proxy answers
        return SimpleNamespace(**vars(self))


class InProcessManager:
    """Builds a schema's Manager objects in this process (what :class:`SyncManager` would make
    in its server), for the serial backend, a threads backend and tests: a builder's
    ``manager`` (:func:`mprl.kinds.build`).

    :param pause: called while a lock, semaphore, condition, event, barrier or queue waits; the
        serial backend gives the other processes their turn there. Default: sleep 0.5 ms, so
        real threads can share the objects too.
    """

    def __init__(self, pause: Pause | None = None) -> None:
        self._pause = pause or _sleep_pause

    # named as SyncManager names them
    def list(self, items: Iterable[Any] = ()) -> list[Any]:
        return list(items)

    def dict(self, items: Any = ()) -> dict[Any, Any]:
        return dict(items)

    def Namespace(self, **attrs: Any) -> _Namespace:
        return _Namespace(**attrs)

    def Lock(self) -> _Lock:
        return _Lock(self._pause, threading.Lock())

    def RLock(self) -> _Lock:
        return _Lock(self._pause, threading.RLock())

    def Semaphore(self, value: int = 1) -> _Lock:
        return _Lock(self._pause, threading.Semaphore(value))

    def BoundedSemaphore(self, value: int = 1) -> _Lock:
        return _Lock(self._pause, threading.BoundedSemaphore(value))

    def Condition(self) -> _Condition:
        return _Condition(self._pause)

    def Event(self) -> _Event:
        return _Event(self._pause)

    def Barrier(self, parties: int) -> _Barrier:
        return _Barrier(self._pause, parties)

    def Queue(self, maxsize: int = 0) -> _Queue:
        return _Queue(self._pause, maxsize)

    def Value(self, typecode: str, value: Any) -> _Value:
        return _Value(typecode, value)

    def Array(self, typecode: str, sequence: Sequence[Any]) -> array.array:
        return array.array(typecode, sequence)
