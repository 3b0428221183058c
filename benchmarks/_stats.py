"""What the benchmark scripts share: how a spread of runs is shown."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def median_range(values: Iterable[float | None], fmt: str = ".2f", sep: str = "-") -> str:
    """``median (min<sep>max)`` of the values given (``None``s, runs without one, left out),
    or ``-`` where none is left."""
    kept = [v for v in values if v is not None]
    if not kept:
        return "-"
    return f"{statistics.median(kept):{fmt}} ({min(kept):{fmt}}{sep}{max(kept):{fmt}})"
