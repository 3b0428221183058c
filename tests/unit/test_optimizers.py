"""Several named optimizers over parts of one shared model (the classic program's policy and
auxiliary optimizers): shared, checkpointed, restored on resume, reachable by name."""

from __future__ import annotations

import pytest

import mprl
from mprl.errors import PluginError
from tests.plugins.two_optimizers import Config, aux_optimizer, make_model, worker


def test_named_optimizers_are_checked_when_registered():
    with pytest.raises(PluginError, match=r"optimizers\['aux'\]'? .*lambda"):
        mprl.Algorithm(
            name="x", config_cls=Config, make_model=make_model, worker=worker,
            optimizers={"aux": lambda model, config: None},
        )  # fmt: skip
    with pytest.raises(PluginError, match="name 'two words' must be a Python identifier"):
        mprl.Algorithm(
            name="x", config_cls=Config, make_model=make_model, worker=worker,
            optimizers={"two words": aux_optimizer},
        )  # fmt: skip
