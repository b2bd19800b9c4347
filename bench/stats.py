"""Small statistics helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median with min and max (the form every figure in bench/ is reported in)."""
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1], "n": len(ordered)}


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """:func:`summary` of timings in seconds, reported in milliseconds."""
    return {k: v * 1e3 if k != "n" else v for k, v in summary(seconds).items()}


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]
