"""Start-up marks, for measuring where a run's first seconds go.

With ``MPRL_TIMELINE=FILE`` in the environment, every process of a run (the main process, its
children, a Ray actor on this machine) appends one JSON line to ``FILE`` as it passes a mark:
``{"mark": "child-ready", "t": <time.time()>, "pid": ..., "ppid": ..., ...}``.
``benchmarks/startup.py`` reads them; without the variable a mark costs one dictionary lookup
and nothing is written.

The marks, in the order a run passes them: ``forkserver`` (``python -m mprl run`` forked its
children's server, pid ``server``), ``ray-starting`` (``python -m mprl run --backend ray``
began to start a Ray on this machine, in a thread, as its first act), ``ray-started`` (a Ray
on this machine answers, started by ``thread``: ``mprl-ray-start`` when it was started ahead;
it may come after ``main`` and ``plugins``), ``main`` (the CLI's imports done), ``plugins``
(plugins discovered), ``prepared`` (job and backend prepared), ``manager`` (a Manager server
answers), ``state`` (shared state built), ``launch`` (a child started, ``source``), ``child-
main`` and ``child-ready`` (in the child: its entry, then seeded and about to run the plugin's
function), ``env-step`` (an env's first ``step`` returned), ``update`` (a process's first
optimizer step), ``stopping``, ``stopped`` (every child ended), ``released`` and ``finished``
(the summary is written).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

VARIABLE = "MPRL_TIMELINE"


def enabled() -> bool:
    """Whether this process writes marks."""
    return bool(os.environ.get(VARIABLE))


def mark(name: str, **fields: Any) -> None:
    """Append mark ``name`` (with ``fields``) to the timeline file, when there is one."""
    path = os.environ.get(VARIABLE)
    if not path:
        return
    line = json.dumps(
        {"mark": name, "t": time.time(), "pid": os.getpid(), "ppid": os.getppid(), **fields}
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())  # one write: lines of processes never interleave
    finally:
        os.close(fd)


def on_first_call(obj: Any, method: str, name: str, **fields: Any) -> None:
    """Mark ``name`` when ``obj.method`` first returns (an env's ``step``), when enabled."""
    if not enabled():
        return
    original = getattr(obj, method)
    own = method in getattr(obj, "__dict__", {})

    def first(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        mark(name, **fields)
        if own:
            setattr(obj, method, original)
        else:
            delattr(obj, method)  # the class's method again
        return result

    setattr(obj, method, first)
