"""Does a cost model trained on a registry's log rank a workload it never saw? Leave one workload out, offline.

    python -m bench.studies.logrank --store DIR [--min-trials 16] [--out FILE]

For every workload in the registry's verified log whose structure the log holds at other shapes too, a model is
trained as a warm search's would be (:func:`schedhub.tuner.workloads.logmodel.pretrained`) on those other workloads alone, and
ranks the held-out workload's own logged schedules. Recorded per workload: how many of them one would measure in the
model's order before one within 5% of their best (against the median over random orders), Spearman's correlation of
the predictions with the speeds, and the best of the model's top five against the best. No tuning, no timing: the
log's own times are the truth.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import tvm_env
from schedhub.tuner.workloads.logmodel import logged, pretrained, replayed

from ..report import REPO, environment

WITHIN = 1.05  # a schedule this close to the best counts as finding it
RANDOM_ORDERS = 200


def measured_until_best(order: np.ndarray, secs: np.ndarray, within: float = WITHIN) -> int:
    """How many of ``secs`` one measures in ``order`` until one is within ``within`` of their best."""
    best = float(secs.min())
    return next(n for n, i in enumerate(order, start=1) if secs[i] <= best * within)


def random_until_best(secs: np.ndarray, orders: int = RANDOM_ORDERS) -> float:
    """:func:`measured_until_best`'s median over ``orders`` random orders (seeded)."""
    return float(statistics.median(measured_until_best(np.random.RandomState(seed).permutation(len(secs)), secs) for seed in range(orders)))


def held_out(entry: Any, others: list[Any]) -> dict[str, Any] | None:
    """``entry``'s logged schedules ranked by a model trained on ``others`` (None: nothing to train on or rank)."""
    from scipy.stats import spearmanr
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.kernels.identity import target_from_text, workload_module

    target = target_from_text(entry.identity.target)
    model = pretrained([logged(e) for e in others], target)
    if model is None:
        return None
    mod = workload_module(entry.identity.workload)
    candidates, secs = replayed(mod, logged(entry)[1])
    times = np.array(secs)
    predicted = model.predict(ms.TuneContext(mod=mod, target=target), candidates)
    order = np.argsort(-predicted)
    return {"op": entry.identity.op, "key": entry.identity.key, "schedules": len(times), "trained_on": len(others),
            "model_until_best": measured_until_best(order, times), "random_until_best": random_until_best(times),
            "spearman": float(spearmanr(predicted, -times).correlation), "top5_best_over_best": float(times[order[:5]].min() / times.min())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.logrank", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a registry (LMDB folder) whose log holds several shapes of a structure")
    parser.add_argument("--min-trials", type=int, default=16, help="workloads with fewer logged trials are left out")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "logrank.json")
    args = parser.parse_args()
    tvm_env.prepare()
    with LocalRegistry(args.store) as reg:
        entries = [e for e in reg.iter_trial_logs(verified_only=True) if len(e.trials) >= args.min_trials]
    by_structure: dict[str, list[Any]] = defaultdict(list)
    for entry in entries:
        by_structure[entry.identity.structure].append(entry)
    rows = []
    for group in (g for g in by_structure.values() if len(g) > 1):
        for entry in group:
            row = held_out(entry, [e for e in group if e is not entry])
            if row:
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {"workloads": len(rows), "median_model_until_best": statistics.median(r["model_until_best"] for r in rows),
               "median_random_until_best": statistics.median(r["random_until_best"] for r in rows),
               "median_spearman": statistics.median(r["spearman"] for r in rows)} if rows else {}  # fmt: skip
    print(json.dumps(summary))
    result = {"command": f"python -m bench.studies.logrank --store DIR --min-trials {args.min_trials}", "store": str(args.store), "summary": summary,
              "rows": rows, "environment": environment()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
