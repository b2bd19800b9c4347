"""Op profiles (``schedhub profile``): a model's kernels, each timed with TVM's default schedule and
with what a compile would serve it (a hit, a transfer from a neighbour, or a miss's CPU rules' schedule), across
thread counts.

One row per (kernel, schedule, threads): op, calls per forward pass, argument shapes, dtype,
FLOPs (TVM's estimate of the kernel), schedule (``default``, ``hit``, ``transfer`` or ``ruled``) and where it
came from (trace id), threads, latency and GFLOPS. The rows go to CSV (and parquet with pyarrow),
and a plot shows latency against threads per op. The same rows are what a cost model trains on.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


from schedhub.hooks.rewrites import Rewrites

from . import models

COLUMNS = ("op", "calls", "shapes", "dtype", "gflop", "schedule", "source", "threads", "latency_us", "gflops")
TIMING = {"number": 5, "repeat": 5, "min_repeat_ms": 20}


@dataclass(frozen=True)
class Row:
    op: str
    calls: int
    shapes: str
    dtype: str
    gflop: float
    schedule: str  # default | hit | transfer | ruled (a miss: the CPU rules' schedule)
    source: str  # the served trace id ("" for the default schedule)
    threads: int
    latency_us: float
    gflops: float


class ThreadPoolTooSmall(RuntimeError):
    """TVM's thread pool started with fewer threads than a profile asks for."""


def set_threads(count: int) -> None:
    """Size TVM's CPU thread pool for the kernels this process runs next (affinity mode 'big cores').

    The pool can shrink and grow back only up to the size it started with (``TVM_NUM_THREADS``, else
    TVM's guess of the physical cores), so the count is checked, not assumed.
    """
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(1, count)
    running = int(tvm.get_global_func("runtime.NumThreads")())
    if running != count:
        raise ThreadPoolTooSmall(f"TVM's thread pool runs {running} threads, not {count}: start the process with TVM_NUM_THREADS={count} or more")


def kernel_rows(kernel: models.Kernel, target: Any, served: tuple[str, str, Any] | None, threads: Iterable[int]) -> list[Row]:
    """Time one kernel's default schedule and, when ``served`` = (schedule, trace id, scheduled module), the served one."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    from schedhub.hooks.kernels.identity import workload_module
    from schedhub.hooks.kernels.measure import random_inputs

    default = workload_module(kernel.identity.workload)
    gflop = float(estimate_tir_flops(default)) / 1e9
    info = kernel.identity.args_info
    shapes = " ".join("x".join(str(d) for d in a[2]) for a in info)
    dtype = info[-1][1] if info else ""
    dev = tvm.cpu(0)
    tensors = [tvm.runtime.tensor(a, dev) for a in random_inputs(info)]
    variants = [("default", "", default)] + ([served] if served else [])
    rows = []
    for schedule, source, mod in variants:
        evaluator = tvm.tirx.build(mod, target=target).time_evaluator("main", dev, **TIMING)
        for count in threads:
            set_threads(count)
            secs = statistics.median(evaluator(*tensors).results)
            rows.append(Row(kernel.identity.op, kernel.calls, shapes, dtype, gflop, schedule, source, count, secs * 1e6, gflop / secs if secs else 0.0))
    return rows


def profile(mod: Any, target: Any, registry: Any, threads: list[int], say: Callable[[str], None] = lambda _: None,
            rewrites: Rewrites | None = None) -> list[Row]:  # fmt: skip
    """Every kernel of ``mod`` (a Relax module) on ``target`` after ``rewrites`` (None: none), as served by ``registry``
    (None: defaults only): a hit, a transfer, or for a miss the CPU rules' schedule (``ruled``)."""
    from schedhub.hooks import HookSession
    from schedhub.hooks.kernels.identity import workload_module
    from schedhub.hooks.serving.report import RULED

    kernels = models.kernels(mod, target, rewrites)
    session = HookSession(registry, report_misses=False) if registry is not None else None
    if session is not None:
        session.prefetch([k.identity for k in kernels])
    rows: list[Row] = []
    try:
        for i, kernel in enumerate(kernels, 1):
            served = None
            if session is not None:
                scheduled = session.scheduled(workload_module(kernel.identity.workload)["main"], target, kernel.identity.op)
                outcome = session.report.kernels[-1]
                if scheduled is not None:
                    ruled = outcome.detail.startswith(f"{RULED}:")
                    source = outcome.detail.split(":")[1] if outcome.outcome == "transfer" or ruled else outcome.detail
                    served = (RULED if ruled else outcome.outcome, source, scheduled)
            rows += kernel_rows(kernel, target, served, threads)
            say(f"[{i}/{len(kernels)}] {kernel.identity.op}: " + ", ".join(f"{r.schedule}@{r.threads} {r.latency_us:.1f} µs" for r in rows if r.op == kernel.identity.op))
    finally:
        set_threads(max(threads))
    return rows


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def write_parquet(rows: list[Row], path: Path) -> bool:
    """Parquet beside the CSV when pyarrow is installed; False otherwise."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return False
    pq.write_table(pa.Table.from_pylist([asdict(r) for r in rows]), path)
    return True


def plot(rows: list[Row], path: Path, top: int = 8) -> None:
    """Latency against threads for the ``top`` slowest ops (default: dashed; served: solid), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worst = sorted({r.op for r in rows}, key=lambda op: -max(r.latency_us * r.calls for r in rows if r.op == op))[:top]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, op in enumerate(worst):
        colour = f"C{i % 10}"
        for schedule, style in (("default", "--"), ("hit", "-"), ("transfer", "-"), ("ruled", "-")):
            points = sorted((r.threads, r.latency_us) for r in rows if r.op == op and r.schedule == schedule)
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, marker="o", color=colour, label=f"{op} ({schedule})")
    ax.set_yscale("log")
    ax.set_xlabel("threads")
    ax.set_ylabel("latency per call (µs)")
    ax.set_xticks(sorted({r.threads for r in rows}))
    ax.set_title("Kernel latency against threads: TVM's default schedule (dashed) and the registry's (solid)")
    ax.legend(fontsize=6, ncol=2)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def summary(rows: list[Row]) -> list[str]:
    """Per op at the most threads: default and served latency and the speedup."""
    most = max(r.threads for r in rows)
    lines = []
    for op in dict.fromkeys(r.op for r in rows):
        at = {r.schedule: r for r in rows if r.op == op and r.threads == most}
        d = at.get("default")
        s = at.get("hit") or at.get("transfer") or at.get("ruled")
        if d is not None:
            tail = f"; {s.schedule} {s.latency_us:.1f} µs ({d.latency_us / s.latency_us:.1f}×, {s.gflops:.1f} GFLOPS)" if s else "; nothing served"
            lines.append(f"{op}: default {d.latency_us:.1f} µs{tail}")
    return lines


__all__ = ["COLUMNS", "Row", "profile", "write_csv", "write_parquet", "plot", "summary"]
