"""The restart policy alone: pure decisions from the run's limits."""

from __future__ import annotations

import pytest

from mprl.backends.restart import MAX_DELAY_S, RestartPolicy
from mprl.run_types import RunConfig


def test_a_worker_is_restarted_with_the_delay_doubling_per_failure_in_a_row():
    policy = RestartPolicy(max_restarts=10, delay=0.5, max_consecutive=5)
    assert [policy.decide("worker", 0, n).delay for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert RestartPolicy(10, 7.0, 50).decide("worker", 0, 20).delay == MAX_DELAY_S


def test_failures_in_a_row_start_again_after_a_step():
    assert RestartPolicy.in_a_row(2, progressed=False) == 3
    assert RestartPolicy.in_a_row(2, progressed=True) == 1


def test_spent_restarts_end_the_rank_saying_how_many():
    policy = RestartPolicy(max_restarts=2, delay=1.0, max_consecutive=9)
    assert policy.decide("worker", 1, 1).delay == 1.0
    decision = policy.decide("worker", 2, 1)
    assert decision.delay is None and decision.why_not == "; no restarts left (2 of 2 spent)"
    # with no restarts allowed there is nothing to add to the failure
    assert RestartPolicy().decide("worker", 0, 1).why_not == ""


def test_failing_again_and_again_without_a_step_ends_the_rank_before_the_limit():
    decision = RestartPolicy(max_restarts=10, delay=1.0, max_consecutive=3).decide("worker", 4, 3)
    assert decision.delay is None
    assert "failed 3 times in a row without taking a step" in decision.why_not
    assert "(--max-consecutive-failures 3), 4 of 10 restarts spent" in decision.why_not


@pytest.mark.parametrize("role", ["trainer", "Manager server"])
def test_only_workers_are_ever_restarted(role):
    decision = RestartPolicy(max_restarts=5).decide(role, 0, 1)
    assert decision.delay is None and decision.why_not == ""


def test_the_policy_of_a_run_takes_its_options():
    run = RunConfig(max_restarts=3, restart_delay=0.25, max_consecutive_failures=2)
    assert RestartPolicy.of(run) == RestartPolicy(3, 0.25, 2)
