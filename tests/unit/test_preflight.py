"""Pre-flight checks: shared memory and open files, against what the run will share."""

from __future__ import annotations

import shutil

import pytest
import torch

from mprl.backends.local import preflight
from mprl.errors import UsageError


def test_shared_bytes_counts_each_storage_once():
    a = torch.zeros(1000)
    view = a[10:20]
    b = torch.zeros(10, dtype=torch.float64)
    nbytes, storages = preflight.shared_bytes([a, view, b])
    assert (nbytes, storages) == (4000 + 80, 2)


def test_more_shared_memory_than_dev_shm_has_is_refused_with_the_fix():
    free = shutil.disk_usage("/dev/shm").free
    with pytest.raises(UsageError, match=r"/dev/shm has [\d,]+ MiB free.*--shm-size"):
        preflight.check(shm_bytes=free + 2**30, storages=10, processes=3)
    assert preflight.check(shm_bytes=min(free // 2, 2**20), storages=10, processes=3) == []
