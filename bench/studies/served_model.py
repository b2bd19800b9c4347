"""What a served cost model does for a compile that misses: the transfers it picks, and what it costs.

A worker trains a target's model on the verified measurement log and the registry serves it
(``schedhub.tuner.workloads.publish``); a compile ranks its transfer candidates by the model's predicted speed on
its own kernels instead of the fit ranking (``hooks.metaschedule.ranking``), paying only the candidates' features.
This compares both in one run:

1. a registry filled as ``bench.transfer --quick`` fills it (``--source-store DIR``: filled there when
   empty, which publishes the model as ``schedhub tune`` does; a store without one gets it published
   here, timed: the worker's cost);
2. each held-out Relax network of the quick transfer bench is compiled plainly (TVM's defaults), through
   the hook with the fit ranking (the served model hidden), and through the hook with the served model,
   each hooked compile with an empty kernel cache, then once more with the model and its warm cache;
3. the executables are timed side by side in interleaved rounds.

Per network and run: latency by configuration (and the model's over the fit ranking's), compile seconds,
transfers served, and on how many kernels the two rankings picked differently. ``--runs`` repeats 2-3.
Not part of ``bench all``.

    python -m bench.studies.served_model --source-store DIR [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models

from ..models import check_agreement, network_input, time_side_by_side
from ..stats import store_study_main
from ..transfer import MODES, RELAX, compile_and_load, fill

NETWORKS = [(name, shape) for name, shape, frontend in MODES["quick"]["held_out"] if frontend == RELAX]


@contextlib.contextmanager
def model_hidden() -> Iterator[None]:
    """Sessions that see no served model: the fit ranking, as a registry without one gives."""
    from schedhub.hooks.metaschedule.synthesis import LogModel

    real = LogModel.served
    LogModel.served = lambda self, target: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        LogModel.served = real  # type: ignore[method-assign]


def run(source_store: Path, runs: int, rounds: int) -> dict[str, Any]:
    import tvm

    from schedhub.hooks.metaschedule.costmodel import FEATURES
    from schedhub.hooks.kernels.identity import compiler_fingerprint, target_text
    from schedhub.tuner.workloads.publish import publish_cost_model

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"target": tvm_env.host_target(), "rounds": rounds, "runs": []}
    if not (source_store / "data.mdb").exists():
        cluster.start()
        started = time.time()
        with LocalRegistry(source_store) as source:
            fill(source, MODES["quick"]["source"], target, MODES["quick"]["options"])
        out["fill_secs"] = time.time() - started
        cluster.stop()
    with tempfile.TemporaryDirectory(prefix="schedhub-served-model-") as tmp:
        shutil.copytree(source_store, Path(tmp) / "store")  # a refused record is complained about: a write
        with LocalRegistry(Path(tmp) / "store") as registry:
            canonical = target_text(target)
            if registry.cost_model(canonical, compiler_fingerprint(), FEATURES) is None:
                started = time.perf_counter()
                published = publish_cost_model(registry, canonical, cache=None, pushed_by="bench.studies.served_model")
                out["published_here"] = {**asdict(published), "secs": time.perf_counter() - started}
            served = registry.cost_model(canonical, compiler_fingerprint(), FEATURES)
            if served is None:
                raise RuntimeError("the registry's log trains no cost model")
            out["model"] = {"trials": served.trials, "trees": len(served.trees.trees), "nodes": served.trees.nodes, "pushed_by": served.pushed_by}
            for r in range(runs):
                rows = []
                for name, shape in NETWORKS:
                    rows.append(_network(registry, target, name, shape, Path(tmp) / f"run{r}-{name}", rounds))
                    print(json.dumps({"run": r, "network": name, "model_over_fit": rows[-1]["model_over_fit"], "compile_secs": rows[-1]["compile_secs"],
                                      "picked_differently": rows[-1]["picked_differently"]}), flush=True)  # fmt: skip
                out["runs"].append(rows)
    out["summary"] = _summary(out["runs"])
    return out


def _network(registry: LocalRegistry, target: Any, name: str, shape: dict[str, int], workdir: Path, rounds: int) -> dict[str, Any]:
    """One network compiled plainly, with the fit ranking, and with the served model (cold, then warm); timed side by side."""
    import tvm

    from schedhub import hooks

    mod, _, input_shape = models.export_with_weights(name, **shape)
    executables, compile_secs, picks, transfers = {}, {}, {}, {}
    executables["default"], compile_secs["default"] = compile_and_load(lambda: tvm.compile(mod, target))
    for label, cache in (("fit", "fit"), ("model", "model"), ("model warm", "model")):
        with model_hidden() if label == "fit" else contextlib.nullcontext():
            with hooks.use(registry, target, report_misses=False, cache=workdir / cache, rank_by_model=True) as session:
                executables[label], compile_secs[label] = compile_and_load(lambda: tvm.compile(mod, target))
        report = session.report
        picks[label] = {k.key: k.detail for k in report.kernels if k.outcome == "transfer"}
        transfers[label] = {"transfers": report.transfers, "hits": report.hits, "misses": report.misses, "ranked_by": report.ranked_by}
    if picks["model"] != picks["model warm"]:
        raise RuntimeError(f"{name}: the warm compile served other transfers than the cold one")
    del executables["model warm"]  # the same kernels as "model"
    timing, errors = time_side_by_side(executables, network_input(input_shape), rounds)
    check_agreement(name, errors)
    ms = {label: t["median"] for label, t in timing.items()}
    differ = sum(picks["fit"].get(key) != detail for key, detail in picks["model"].items())
    return {"network": name, "shape": shape, "timing": timing, "compile_secs": compile_secs, "reports": transfers, "max_rel_error": errors,
            "model_over_fit": ms["model"] / ms["fit"], "fit_over_default": ms["fit"] / ms["default"], "picked_differently": differ}  # fmt: skip


def _summary(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per network: medians over runs of the model's latency over the fit ranking's, and of each compile's seconds over the plain compile's."""
    found: dict[str, dict[str, list[float]]] = {}
    for row in (row for rows in runs for row in rows):
        net = found.setdefault(row["network"], {})
        net.setdefault("model_over_fit", []).append(row["model_over_fit"])
        net.setdefault("picked_differently", []).append(row["picked_differently"])
        for label, secs in row["compile_secs"].items():
            net.setdefault(f"compile_s {label}", []).append(secs)
    return {net: {k: statistics.median(v) for k, v in c.items()} | {"model_over_fit_runs": c["model_over_fit"]} for net, c in found.items()}


def main() -> None:
    store_study_main(__doc__, run)


if __name__ == "__main__":
    main()
