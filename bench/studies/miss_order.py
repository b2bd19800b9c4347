"""How soon a worker's first passes speed a held-out network up, by the order a compile queues its misses.

A compile reports its misses costliest first (``HookSession.miss_cost``: calls × the served schedule's time
per call, measured or estimated), and the queue hands out jobs of equal demand in the order they were first
reported, so one worker's first passes (``TuneOptions.first_pass``) take the kernels that cost the network
most first. Before, they came in the order TVM looked the kernels up. This measures both orders in one run:

1. each held-out network (the quick transfer bench's) is compiled through the hook on a registry filled as
   ``bench.transfer --quick`` fills it (``--source-store``), and every kernel is timed as served
   (``schedhub profile``'s timing: a transfer, or TVM's default);
2. each queued kernel gets its first pass, one job at a time, timed (the cost model is trained before, on
   another network's kernel, so no job pays for it);
3. every kernel is timed again as its first pass left it (a hit).

The network's latency after the first k jobs of an order is estimated as the sum over its kernels of calls ×
(the first pass's time if done, else the served one's). Per order: the tuning seconds until half, 80% and 90%
of the gap between the served network and the fully first-passed one were closed, the share closed after 30,
60 and 120 s, and the share left open on average over the whole run. The jobs' seconds are the same in both
orders (measured once), so only the order differs. Not part of ``bench all``.

    python -m bench.studies.miss_order --source-store DIR [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models, profile

from ..models import MODES as MODEL_MODES
from ..transfer import MODEL_WARM_UP, QUICK_CONVNETS, tune_kernels

SHARES = (0.5, 0.8, 0.9)
AFTER = (30.0, 60.0, 120.0)


def run(source_store: Path) -> dict[str, Any]:
    import tvm

    from schedhub import hooks

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    options = MODEL_MODES["quick"]["options"].first_pass()
    out: dict[str, Any] = {"target": tvm_env.host_target(), "options": asdict(options), "networks": []}
    with tempfile.TemporaryDirectory(prefix="schedhub-miss-order-") as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(source_store, root)
        cluster.start()
        with LocalRegistry(root) as registry:
            warm = models.kernels(models.export(MODEL_WARM_UP[0], **MODEL_WARM_UP[1])[0], target, NO_REWRITES)
            tune_kernels(registry, warm[:1], options)
            for name, shape in QUICK_CONVNETS:
                mod, _, _ = models.export(name, **shape)
                by_key = {k.identity.key: k for k in models.kernels(mod, target, NO_REWRITES)}
                with hooks.use(registry, target, cache=Path(tmp) / f"cache-{name}") as session:
                    tvm.compile(mod, target)
                module_order = list(dict.fromkeys(k.key for k in session.report.kernels if k.key in by_key))
                leases = registry.lease("bench.studies.miss_order", max_jobs=len(by_key), lease_secs=3600)
                reported = [lease.job["key"] for lease in leases]
                for lease in leases:  # the first passes are run (and timed) here, one job at a time
                    registry.ack(lease.key, lease.lease_id)
                served = _latencies(mod, target, registry)
                job_secs = {}
                for key in reported:
                    started = time.perf_counter()
                    tune_kernels(registry, [by_key[key]], options)
                    job_secs[key] = time.perf_counter() - started
                first_passed = _latencies(mod, target, registry)
                calls = {k: by_key[k].calls for k in by_key}
                orders = {"reported": reported, "module": [k for k in module_order if k in job_secs]}
                row = {"network": name, "shape": shape, "kernels": len(by_key), "jobs": len(reported), "job_secs": job_secs,
                       "served_us": served, "first_passed_us": first_passed, "calls": calls,
                       "orders": {o: _curve(keys, job_secs, calls, served, first_passed) for o, keys in orders.items()}}  # fmt: skip
                out["networks"].append(row)
                print(json.dumps({"network": name, **{o: {k: c[k] for k in ("to_close", "closed_after", "mean_gap_left")} for o, c in row["orders"].items()}}), flush=True)
        cluster.stop()
    return out


def _latencies(mod: Any, target: Any, registry: LocalRegistry) -> dict[str, float]:
    """Each kernel's µs per call as the registry serves it now (``schedhub profile``'s timing, this machine's threads)."""
    threads = [int(target.attrs["num-cores"])]
    by_op = {k.identity.op: k.identity.key for k in models.kernels(mod, target, NO_REWRITES)}
    rows = profile.profile(mod, target, registry, threads)
    served = {by_op[r.op]: r.latency_us for r in rows if r.schedule != "default"}
    default = {by_op[r.op]: r.latency_us for r in rows if r.schedule == "default"}
    return {key: served.get(key, default[key]) for key in default}


def _curve(order: list[str], job_secs: dict[str, float], calls: dict[str, int], served: dict[str, float], done: dict[str, float]) -> dict[str, Any]:
    """The network's estimated ms after each job of ``order`` (:func:`closing` of them: how soon they speed it up)."""
    now = dict(served)
    points, elapsed = [(0.0, sum(calls[k] * now[k] for k in now) / 1e3)], 0.0
    for key in order:
        elapsed += job_secs[key]
        now[key] = done[key]
        points.append((elapsed, sum(calls[k] * now[k] for k in now) / 1e3))
    return {"points": points, **closing(points)}


def closing(points: list[tuple[float, float]]) -> dict[str, Any]:
    """Of a curve of (tuning seconds, estimated ms) from the served network to the fully first-passed one: the
    seconds until each of :data:`SHARES` of the gap was closed, the share closed after each of :data:`AFTER`
    seconds, and the share of the gap left on average over the whole run (the area above the curve)."""
    start, end, duration = points[0][1], points[-1][1], points[-1][0]
    gap = start - end
    if gap <= 0 or duration <= 0:  # the first passes made the network no faster: nothing to close
        return {"to_close": dict.fromkeys((f"{share:.0%}" for share in SHARES)), "closed_after": dict.fromkeys(f"{secs:g} s" for secs in AFTER), "mean_gap_left": None}

    def left(t: float) -> float:  # share of the gap still open after t seconds
        return ([ms for when, ms in points if when <= t][-1] - end) / gap

    to_close = {f"{share:.0%}": next((t for t, ms in points if start - ms >= share * gap), None) for share in SHARES}
    closed_after = {f"{secs:g} s": 1 - left(secs) for secs in AFTER}
    mean_left = sum((b[0] - a[0]) * (a[1] - end) for a, b in zip(points, points[1:])) / gap / duration
    return {"to_close": to_close, "closed_after": closed_after, "mean_gap_left": mean_left}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per network and order, the median over ``runs`` of each :func:`closing` figure (recomputed from the points)."""
    out: dict[str, Any] = {}
    for network in dict.fromkeys(n["network"] for run in runs for n in run["networks"]):
        rows = [n for run in runs for n in run["networks"] if n["network"] == network]
        out[network] = {}
        for order in rows[0]["orders"]:
            figures = [closing([tuple(p) for p in n["orders"][order]["points"]]) for n in rows]
            out[network][order] = {
                "mean_gap_left": statistics.median(f["mean_gap_left"] for f in figures),
                "closed_after": {k: statistics.median(f["closed_after"][k] for f in figures) for k in figures[0]["closed_after"]},
                "to_close": {k: statistics.median(f["to_close"][k] for f in figures) for k in figures[0]["to_close"]},
                "runs": len(figures),
            }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source-store", type=Path, required=True, help="a registry filled as bench.transfer --quick fills it (kept by --source-store there)")
    parser.add_argument("--runs", type=int, default=3, help="independent runs (each from a fresh copy of the registry), medians reported")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = [run(args.source_store) for _ in range(args.runs)]
    results = {"command": f"python -m bench.studies.miss_order --source-store DIR --runs {args.runs}", "summary": summarize(runs), "runs": runs}
    print(json.dumps(results["summary"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
