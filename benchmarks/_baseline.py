"""Running an older mprl tree beside this one, in the same invocation.

An older tree (a ``git worktree`` of an older commit) goes first on ``PYTHONPATH`` (its
``mprl`` and its ``plugins/``), and so does a distribution of its own that says what its
``pyproject.toml`` registers: without it, the installed distribution's entry points (this
tree's: ``mprl_builtin.a3c``, the ``mprl.early`` group) would send the older mprl to this
tree's plugins. ``importlib.metadata`` takes the first ``mprl`` distribution on the path.
"""

from __future__ import annotations

import os
from pathlib import Path

import tomllib


def environ(tree: str | Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a subprocess runs ``tree``'s mprl in."""
    tree = Path(tree)
    dist = tree / ".bench-dist"
    info = dist / "mprl-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: mprl\nVersion: {project['version']}\n"
    )
    lines = []
    for group, entries in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in entries.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    path = os.pathsep.join([str(dist), str(tree), str(tree / "plugins")])
    return {**(base if base is not None else os.environ), "PYTHONPATH": path}
