"""mprl.testing: what plugin authors test their hooks with (fixtures enabled in pyproject)."""

from __future__ import annotations

from multiprocessing.managers import BaseProxy

import pytest

from mprl import testing
from tests.plugins import mprl_testplugin


@pytest.mark.parametrize("manager", [False, True])
def test_state_without_and_with_a_manager(mprl_state, manager):
    state = mprl_state(testing.registered(mprl_testplugin)["probe"], 3, manager=manager)
    assert isinstance(state.visits, BaseProxy) is manager
    assert list(state.visits) == [0, 0, 0] and state.seen.shape == (3,)
    with state.lock:
        state.visits[1] += 2
    assert list(state.visits) == [0, 2, 0]
