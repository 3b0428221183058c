"""--device read and checked before anything starts with a GPU faked so the
parsing is checked on a machine without one."""

from __future__ import annotations

import pytest
import torch

from mprl.device import check_device, resolve_device
from mprl.errors import UsageError


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.version, "cuda", "12.4")


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:1", "cpu", "auto"])
def test_a_gpu_that_is_there_is_accepted(two_gpus, spec):
    check_device(spec, "ppo", trains_in_workers=False)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cuda:2", r"there are 2 GPU\(s\), numbered from 0; use --device cuda:0"),
        ("cuda:128", r"there are 2 GPU\(s\)"),
        ("cuda:00", r"'cuda:00' is not one of auto, cpu, cuda, cuda:N"),
        ("cuda:01", r"is not one of"),
        ("cuda:" + "9" * 30, r"is not one of"),  # torch would wrap it round
        ("cuda:-1", r"is not one of"),
        ("gpu", r"is not one of"),
        ("CUDA", r"is not one of"),
    ],
)
def test_a_gpu_index_that_is_not_there_is_refused_naming_the_fix(two_gpus, spec, message):
    with pytest.raises(UsageError, match=message):
        check_device(spec, "ppo", trains_in_workers=False)


def test_hogwild_cannot_learn_on_a_gpu(two_gpus):
    with pytest.raises(UsageError, match="trains one shared model in every worker"):
        check_device("cuda:0", "a3c", trains_in_workers=True)
    assert resolve_device("auto", trains_in_workers=True) == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda")
