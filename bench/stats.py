"""Small statistics helpers shared by the benchmarks."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median with min and max (the form every figure in bench/ is reported in), and the samples in order."""
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1], "n": len(ordered), "samples": list(values)}


def summary_ms(seconds: Sequence[float]) -> dict[str, Any]:
    """:func:`summary` of timings in seconds, reported in milliseconds."""
    return summary([s * 1e3 for s in seconds])


def ratio(num: dict[str, Any], den: dict[str, Any], paired: bool) -> dict[str, Any]:
    """``num / den`` of two summaries, with its noise.

    ``paired``: the two were sampled side by side, round by round (sample i of each from the same
    round), so the ratio is summarized over the per-round ratios. Otherwise (or when the samples
    are missing) the median ratio with the widest bounds the two ranges allow.
    """
    a, b = num.get("samples"), den.get("samples")
    if paired and a and b and len(a) == len(b):
        return summary([x / y for x, y in zip(a, b)])
    return {"median": num["median"] / den["median"], "min": num["min"] / den["max"], "max": num["max"] / den["min"], "n": 0}


def overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether the [min, max] ranges of two summaries overlap: they agree within their reported noise."""
    return max(a["min"], b["min"]) <= min(a["max"], b["max"])


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile: the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def machine_probe(reps: int = 7) -> dict[str, Any]:
    """Milliseconds of a fixed single-threaded pure-Python workload: how fast this shared machine is right now."""

    def work() -> float:
        start = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        sorted(range(100_000, 0, -1), key=lambda v: v % 1000)
        return time.perf_counter() - start

    work()
    return summary_ms([work() for _ in range(reps)])


def medians_by_cell(rows: Iterable[dict[str, Any]], cell: Callable[[dict[str, Any]], str],
                    values: Callable[[dict[str, Any]], dict[str, float]]) -> dict[str, dict[str, float]]:  # fmt: skip
    """A study's summary: per cell (``cell(row)``, a network and its shape), the median over its rows (one a run) of
    each of ``values(row)``."""
    found: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        into = found.setdefault(cell(row), {})
        for name, value in values(row).items():
            into.setdefault(name, []).append(value)
    return {name: {k: statistics.median(v) for k, v in c.items()} for name, c in found.items()}


def timings_and_compiles(row: dict[str, Any]) -> dict[str, float]:
    """A row's median milliseconds (``<label> ms``) and compile seconds (``compile_s <label>``) of each executable."""
    return {f"{label} ms": t["median"] for label, t in row["timing"].items()} | {f"compile_s {label}": secs for label, secs in row["compile_secs"].items()}


def study_arguments(parser: argparse.ArgumentParser) -> None:
    """What every study beside the benches takes: ``--runs``, ``--rounds`` (of side-by-side timing) and ``--out``."""
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)


def store_study_main(doc: str, run: Callable[..., dict[str, Any]], switches: dict[str, str] | None = None) -> None:
    """The command line of a study over one registry: ``--source-store DIR`` (filled as ``bench.transfer --quick``
    fills its source when empty), :func:`study_arguments` and each of ``switches`` (flag name: help; passed to
    ``run`` as a keyword, dashes as underscores); ``run(store, runs, rounds, **switches)`` is written by :func:`write_study`."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-store", type=Path, required=True, help="a registry filled as bench.transfer --quick fills it (filled here when empty)")
    for name, text in (switches or {}).items():
        parser.add_argument(f"--{name}", action="store_true", help=text)
    study_arguments(parser)
    args = parser.parse_args()
    chosen = {name.replace("-", "_"): getattr(args, name.replace("-", "_")) for name in switches or {}}
    write_study(run(args.source_store, args.runs, args.rounds, **chosen), args.out)


def write_study(result: dict[str, Any], out: Path | None) -> None:
    """A study's whole result to ``out`` (when given) as JSON, and its summary to stdout."""
    if out:
        out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
