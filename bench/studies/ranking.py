"""Judge transfer rankings again on a recorded transfer run, without running it again.

    python -m bench.studies.ranking --source-store DIR [--results bench/results/quick/transfer.json] [--out FILE]
    python -m bench.studies.ranking --source-store DIR --held-out resnet18:batch=1,image=128 [--held-out …] [--out FILE]

DIR is the registry the run transferred from (``bench.transfer --source-store DIR``). The cost model
is trained on it as ``bench.transfer`` trains it; every held-out kernel's candidates are replayed on
the kernel and ranked by each of ``bench.transfer.ALTERNATIVE_RANKINGS``; each ranking's pick is
looked up in the candidate timings the run measured. A new ranking is judged on the same
measurements as the ones before it.

With ``--held-out``, the rankings are judged on shapes no run measured: each network is compiled
through the hook twice, once as it serves (the hook's pick) and once measuring every applicable
candidate on this machine (``use(..., measure=)``, checked against the default schedule), and every
ranking's pick is looked up in those timings (``ranking_held_out.json``). Shapes chosen after a
ranking was are the fair check of it.

    python -m bench.studies.ranking --pool RESULTS.json [RESULTS.json …] [--out FILE]

With ``--pool``, no registry is needed: each ranking's pick is recomputed from the candidate attributes
recorded runs kept beside their timings (``transfer.json``, ``ranking_held_out.json``), and judged against
the hook's fit ranking network by network over all of them. One run's figures move with its registry
(each fill tunes anew) and its machine; a ranking worth its cost beats fit across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import tvm_env

from .. import transfer
from ..torch_export import RELAX


def rejudge(results: dict[str, Any], source_store: Path) -> dict[str, Any]:
    """Each row's ranking summary (``bench.transfer.ranking_summary``) recomputed over its recorded measurements."""
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"source_store": str(source_store), "results": results.get("command"), "started": results.get("started"), "rows": {}}
    with tempfile.TemporaryDirectory(prefix="schedhub-rank-") as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(source_store, root)  # opening a store may back-fill its indexes: never touch the original
        with LocalRegistry(root) as registry:
            model, out["cost_model"] = transfer.cost_model(registry)
            for row in results["rows"]:
                held = transfer._held_out(row["network"], row["shape"], row["frontend"], target, Path(tmp))
                candidates = transfer._candidates(registry, held, model)
                keys = {k.name: k.identity.key for k in held.kernels}
                kernels = [transfer.alternative_picks({**k, "key": k.get("key") or keys[k["op"]]}, candidates) for k in row["ranking"]["kernels"]]
                out["rows"][row["label"]] = transfer.ranking_summary(kernels)
    return out


MEASURE_SECS = 900.0  # enough for every candidate of a ResNet-18 (about 80, ~1 s each)


def judge_held_out(source_store: Path, held_out: list[tuple[str, dict[str, int]]]) -> dict[str, Any]:
    """Each held-out network's ranking summary over candidate timings measured here, now."""
    import tvm

    from schedhub import hooks

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"source_store": str(source_store), "target": tvm_env.host_target(), "rows": {}}
    with tempfile.TemporaryDirectory(prefix="schedhub-rank-") as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(source_store, root)
        with LocalRegistry(root) as registry:
            model, out["cost_model"] = transfer.cost_model(registry)
            for i, (name, shape) in enumerate(held_out):
                held = transfer._held_out(name, shape, RELAX, target, Path(tmp))
                candidates = transfer._candidates(registry, held, model)
                with hooks.use(registry, target, report_misses=False, cache=Path(tmp) / f"served-{i}") as served:
                    tvm.compile(held.mod, target)
                with hooks.use(registry, target, report_misses=False, cache=Path(tmp) / f"measured-{i}", measure=MEASURE_SECS) as measured:
                    tvm.compile(held.mod, target)
                out["rows"][held.label] = transfer._ranking(served.report, measured.report, candidates)
    return out


#: What a recorded candidate needs for every ranking to be recomputed from it.
RANKED_ON = ("relation", "order", "retiled", "source_speed", "source_gflops", "source_us", "predicted_log2_gflops")
#: A network row counts as better or worse for a ranking when its summed time differs from fit's by more than this.
MARGIN = 0.05


def pool(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each of ``transfer.ALTERNATIVE_RANKINGS`` against the hook's fit ranking over the network rows of
    several recorded runs (name → the run's JSON): per row, the summed time of each ranking's picks over
    the fit ranking's, on the kernels whose every measured candidate kept the attributes the rankings read
    (:data:`RANKED_ON`); then per ranking the geometric mean of those ratios, the rows it was faster or
    slower on (beyond :data:`MARGIN`), and its picks' time over the fastest candidates', pooled."""
    rows = []
    for name, run in runs.items():
        for label, ranking in _recorded_rankings(run):
            kernels = [k["measured"] for k in ranking.get("kernels", [])
                       if len(k.get("measured", [])) >= 2 and all(all(a in m for a in RANKED_ON) for m in k["measured"])]  # fmt: skip
            if not kernels:
                continue
            picks = {r: sum(min(ms, key=key)["us"] for ms in kernels) for r, key in transfer.ALTERNATIVE_RANKINGS.items()}
            rows.append({"run": name, "network": label, "kernels": len(kernels), "best_us": sum(min(m["us"] for m in ms) for ms in kernels),
                         "picks_us": picks})  # fmt: skip
    rankings = {}
    for r in transfer.ALTERNATIVE_RANKINGS:
        ratios = [row["picks_us"][r] / row["picks_us"]["fit"] for row in rows]
        rankings[r] = {"rows": len(ratios), "vs_fit_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
                       "faster_rows": sum(x < 1 - MARGIN for x in ratios), "slower_rows": sum(x > 1 + MARGIN for x in ratios),
                       "vs_best_pooled": sum(row["picks_us"][r] for row in rows) / sum(row["best_us"] for row in rows) if rows else None}  # fmt: skip
    return {"runs": list(runs), "rows": rows, "rankings": rankings}


def _recorded_rankings(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(network, ranking summary) of a ``transfer.json`` (rows: a list) or a ``ranking_held_out.json`` (rows: by network)."""
    rows = run.get("rows", [])
    if isinstance(rows, dict):
        return list(rows.items())
    return [(row["label"], row["ranking"]) for row in rows if isinstance(row.get("ranking"), dict)]


def _network(text: str) -> tuple[str, dict[str, int]]:
    """``resnet18:batch=1,image=128`` → ("resnet18", {"batch": 1, "image": 128})."""
    name, _, dims = text.partition(":")
    try:
        return name, {k: int(v) for k, v in (d.split("=") for d in dims.split(",") if d)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NETWORK:dim=N,dim=N") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-store", type=Path, help="the registry the recorded run transferred from (not with --pool)")
    parser.add_argument("--results", type=Path, default=transfer.REPO / "bench" / "results" / "quick" / "transfer.json")
    parser.add_argument("--held-out", type=_network, action="append", default=[], metavar="NETWORK:dim=N,…",
                        help="judge on this network at these shapes, measuring every candidate here (repeatable)")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="RESULTS", help="judge the rankings over these recorded runs' measurements, against fit")
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: beside --results, ranking.json or ranking_held_out.json)")
    args = parser.parse_args()
    if args.pool:
        pooled = pool({str(p): json.loads(p.read_text()) for p in args.pool})
        for name, r in pooled["rankings"].items():
            print(f"{name}: {r['rows']} networks, time {r['vs_fit_geomean']:.3f}x fit's (geometric mean), faster on {r['faster_rows']}, "
                  f"slower on {r['slower_rows']}; picks {r['vs_best_pooled']:.2f}x the fastest candidates'")  # fmt: skip
        if args.out:
            args.out.write_text(json.dumps(pooled, indent=1))
        return
    if args.source_store is None:
        parser.error("--source-store is required (except with --pool)")
    if args.held_out:
        judged = judge_held_out(args.source_store, args.held_out)
    else:
        judged = rejudge(json.loads(args.results.read_text()), args.source_store)
    for label, summary in judged["rows"].items():
        cells = [f"served {summary['served_is_best']}/{summary['compared']} {summary['time_served_vs_best']:.2f}"]
        for name, alt in summary["alternatives"].items():
            if alt["compared"]:
                cells.append(f"{name} {alt[f'{name}_is_best']}/{alt['compared']} {alt[f'time_{name}_vs_best']:.2f}")
        print(f"{label}: " + ", ".join(cells))
    out = args.out or args.results.with_name("ranking_held_out.json" if args.held_out else "ranking.json")
    out.write_text(json.dumps(judged, indent=1, default=str))
    print(f"wrote {out} (cost model: {judged['cost_model']})")


if __name__ == "__main__":
    main()
