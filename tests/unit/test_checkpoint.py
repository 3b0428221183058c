"""Checkpoints on disk: atomic under SIGKILL, resumable, and refused with a clear error when
they are truncated, foreign or incompatible."""

from __future__ import annotations

import torch


def test_a_version_1_checkpoint_keeps_its_transport_state(tmp_path):
    # version 1 kept make_shared objects (the weights' version) apart from the shared state
    from mprl.host import checkpoint

    v1 = checkpoint.payload(
        plugin="impala", plugin_version="0.1.0", algorithm="impala", config={}, run={},
        session=0, model=torch.nn.Linear(2, 2), optimizer=None, optimizers={}, steps=[5, 0, 0],
        stats={"episodes": 1, "returns": [1.0], "best_return": 1.0, "wall_s": 1.0},
        shared_state={"collected": [3]},
    )  # fmt: skip
    v1["version"], v1["extra_state"] = 1, {"weights": {"version": 42}}
    del v1["optimizers"]  # version 1 had one optimizer only
    torch.save(v1, tmp_path / "old.pt")
    _, data = checkpoint.load(tmp_path / "old.pt")
    assert data["shared_state"] == {"collected": [3], "weights": {"version": 42}}
