"""Whether a failed process is restarted, and when: the run's restart limits as a pure object."""

from __future__ import annotations

import attrs

from mprl.run_types import RunConfig

MAX_DELAY_S = 60.0


@attrs.frozen
class Decision:
    """``delay``: seconds until the restart, ``None`` for none; ``why_not`` completes the
    failure's reason when there is none (``"; no restarts left (2 of 2 spent)"``)."""

    delay: float | None
    why_not: str = ""


@attrs.frozen
class RestartPolicy:
    """``--max-restarts`` per worker rank, ``--restart-delay`` doubling with each failure in a
    row, and ``--max-consecutive-failures`` failures in a row without a step between them."""

    max_restarts: int = 0
    delay: float = 1.0
    max_consecutive: int = 3

    @classmethod
    def of(cls, run: RunConfig) -> RestartPolicy:
        return cls(run.max_restarts, run.restart_delay, run.max_consecutive_failures)

    @staticmethod
    def in_a_row(before: int, progressed: bool) -> int:
        """Failures in a row counting this one: a failure after a step starts again at 1."""
        return 1 if progressed else before + 1

    def decide(self, role: str, spent: int, in_a_row: int) -> Decision:
        """What to do about a failure of a ``role`` process whose rank has ``spent`` restarts
        and failed ``in_a_row`` times in a row (this one included)."""
        if role != "worker":  # the train process holds the learner's state: never restarted
            return Decision(None)
        if spent >= self.max_restarts:
            left = f"; no restarts left ({spent} of {self.max_restarts} spent)"
            return Decision(None, left if self.max_restarts else "")
        if in_a_row >= self.max_consecutive:
            return Decision(
                None,
                f"; failed {in_a_row} times in a row without taking a step "
                f"(--max-consecutive-failures {self.max_consecutive}), "
                f"{spent} of {self.max_restarts} restarts spent",
            )
        return Decision(min(self.delay * 2 ** (in_a_row - 1), MAX_DELAY_S))
