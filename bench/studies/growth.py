"""Does a registry that tuned a structure at more shapes serve a new shape better?

The quick transfer bench fills its registry at one shape per network; a team's registry grows. This
study fills three registries the way ``bench.transfer --quick`` fills its source (the quick budget, pushed
as the tuner pushes; each kernel warm-started from what the registry already holds), for one family of
networks (``--family``):

- ``one shape``: the quick bench's source (batch 1; convnets: ResNet-18 and MobileNet-V2 at 64 px;
  transformers: the BERT layer at sequence 32 and the MLP);
- ``two shapes``: that one, then the same networks at a second shape (128 px; sequence 128 and the MLP at
  batch 64), warm-started from the first shape's records;
- ``tuned here``: the held-out shape itself (the quick bench's: batch 2 at 96 px; batch 2 at sequence 64
  and the MLP at batch 16) in an empty registry, tuned the way the sources were (no neighbours to start
  from; the log model seeds once it has trials). It is the bar a transfer is held to here; the quick
  bench's "tuned" (searched after a worker's first pass) is not in it.

Each held-out network is compiled plain (TVM's defaults), through the hook on each transfer registry
ranked (no measuring: by the cost model each fill publishes, as ``schedhub tune`` does, and with it hidden,
by the fit ranking) and with every candidate measured (the fastest candidate: what no ranking can beat),
and with every kernel a hit from ``tuned here``; the executables are timed side by side in interleaved
rounds. Per network and run: latencies, each over ``tuned here``, and how many served transfers came from
the second shape's records. ``--stores DIR`` keeps the three registries (filled when absent: ~22 min on 2
cores for the convnets). Not part of ``bench all``.

    python -m bench.studies.growth [--family convnets|transformers] [--stores DIR] [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any


from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models

from ..models import MODES as MODEL_MODES
from ..models import check_agreement, network_input, time_side_by_side
from .served_model import model_hidden
from ..transfer import QUICK_CONVNETS, compile_and_load, fill

ONE, TWO, TUNED = "one shape", "two shapes", "tuned here"
#: By family, the shapes (network → shape, batch 1 unless named) each registry is filled at: ``one shape``, what
#: ``two shapes`` adds to it, and ``tuned here``, the held-out shapes (the quick transfer bench's).
FAMILIES: dict[str, dict[str, dict[str, dict[str, int]]]] = {
    "convnets": {ONE: {name: {"image": 64} for name, _ in QUICK_CONVNETS}, TWO: {name: {"image": 128} for name, _ in QUICK_CONVNETS},
                 TUNED: dict(QUICK_CONVNETS)},
    "transformers": {ONE: {"bert_layer": {"seq": 32}, "mlp": {}}, TWO: {"bert_layer": {"seq": 128}, "mlp": {"batch": 64}},
                     TUNED: {"bert_layer": {"batch": 2, "seq": 64}, "mlp": {"batch": 16}}},
}  # fmt: skip
ALL = 600.0  # seconds: every candidate of every kernel measured
#: label → (registry, measurement budget, ``use(..., rank_by_model=)``). "ranked": by the registry's cost model (each
#: fill publishes it, as ``schedhub tune`` does); "fit": the fit ranking, the model hidden; "decides": the model only
#: where a kernel's competing candidates hold its own layer at two shapes (``hooks.metaschedule.ranking.model_decides``).
CONFIGS: dict[str, tuple[str, float, bool | None]] = {
    "ranked, " + ONE: (ONE, 0.0, True), "ranked, " + TWO: (TWO, 0.0, True), "fit, " + ONE: (ONE, 0.0, False), "fit, " + TWO: (TWO, 0.0, False),
    "decides, " + ONE: (ONE, 0.0, None), "decides, " + TWO: (TWO, 0.0, None),
    "fastest, " + ONE: (ONE, ALL, True), "fastest, " + TWO: (TWO, ALL, True), TUNED: (TUNED, 0.0, True)}  # fmt: skip


def fill_stores(root: Path, target: Any, shapes: dict[str, dict[str, dict[str, int]]]) -> None:
    """The three registries under ``root`` (``one``, ``two``, ``tuned``) at a family's ``shapes`` (:data:`FAMILIES`),
    each filled unless it exists; ``two`` starts as a copy of ``one``, so the two differ only by the second
    shape's records."""
    options = MODEL_MODES["quick"]["options"]
    missing = [store for store in (ONE, TWO, TUNED) if not (root / _folder(store)).exists()]
    if not missing:
        return
    cluster.start()
    try:
        for store in missing:
            building = root / (_folder(store) + ".filling")
            shutil.rmtree(building, ignore_errors=True)
            if store == TWO:
                shutil.copytree(root / _folder(ONE), building)
            with LocalRegistry(building) as registry:
                fill(registry, shapes[store], target, options)
            building.rename(root / _folder(store))
    finally:
        cluster.stop()  # nothing of Ray shares the cores with the timings


def run(stores: Path, runs: int, rounds: int, family: str = "convnets") -> dict[str, Any]:
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    shapes = FAMILIES[family]
    _claim(stores, family)
    fill_stores(stores, target, shapes)
    held_out = list(shapes[TUNED].items())
    out: dict[str, Any] = {"target": tvm_env.host_target(), "family": family, "fills": {ONE: shapes[ONE], TWO: shapes[TWO]}, "held_out": held_out,
                           "rounds": rounds, "runs": []}  # fmt: skip
    with LocalRegistry(stores / _folder(ONE), readonly=True) as one:
        first_shape = {r.trace_id for _, records in one.iter_served() for r in records}
    for r in range(runs):
        for name, shape in held_out:
            row = _network(stores, target, name, shape, first_shape, rounds)
            out["runs"].append({"run": r} | row)
            print(json.dumps({"run": r, "network": name, "over_tuned": row["over_tuned"], "from_second_shape": row["from_second_shape"]}), flush=True)
    out["summary"] = summarize(out["runs"])
    return out


def _network(stores: Path, target: Any, name: str, shape: dict[str, int], first_shape: set[str], rounds: int) -> dict[str, Any]:
    """One held-out network compiled plain and in every configuration (copies of the registries, empty kernel caches), timed side by side."""
    import tvm

    from schedhub import hooks

    mod, _, input_shape = models.export_with_weights(name, **shape)
    executables, compile_secs, served, ranked_by = {}, {}, {}, {}
    executables["default"], compile_secs["default"] = compile_and_load(lambda: tvm.compile(mod, target))
    with tempfile.TemporaryDirectory(prefix="schedhub-growth-") as tmp:
        for label, (store, measure, by_model) in CONFIGS.items():
            copy = Path(tmp) / label.replace(" ", "-").replace(",", "")
            shutil.copytree(stores / _folder(store), copy)  # a refused record is complained about: a write
            with LocalRegistry(copy) as registry, model_hidden() if by_model is False else contextlib.nullcontext():
                with hooks.use(registry, target, report_misses=False, cache=Path(tmp) / f"cache-{copy.name}", measure=measure, rank_by_model=by_model) as session:
                    executables[label], compile_secs[label] = compile_and_load(lambda: tvm.compile(mod, target))
            served[label] = [(k.op, k.outcome, k.detail) for k in session.report.kernels]
            ranked_by[label] = {"model": session.report.ranked_by, "kernels": session.report.model_ranked}
    timing, errors = time_side_by_side(executables, network_input(input_shape), rounds)
    check_agreement(name, errors)
    ms = {label: t["median"] for label, t in timing.items()}
    second = {label: sum(1 for _, outcome, detail in kernels if outcome == "transfer" and detail.split(":")[1] not in first_shape)
              for label, kernels in served.items() if TWO in label}  # fmt: skip
    return {"network": name, "shape": shape, "timing": timing, "compile_secs": compile_secs, "max_rel_error": errors,
            "over_tuned": {label: v / ms[TUNED] for label, v in ms.items()}, "from_second_shape": second, "ranked_by": ranked_by,
            "outcomes": {label: {o: sum(1 for _, outcome, _ in kernels if outcome == o) for o in {k[1] for k in kernels}} for label, kernels in served.items()}}  # fmt: skip


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per network and configuration: the median, min and max over runs of its latency over ``tuned here``,
    and of the two-shape registry's latency over the one-shape registry's (ranked and fastest)."""
    found: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        net = found.setdefault(row["network"], {})
        ratios = row["over_tuned"]
        for label, ratio in ratios.items():
            net.setdefault(label, []).append(ratio)
        for kind in ("ranked", "fit", "decides", "fastest"):
            if f"{kind}, {ONE}" in ratios:  # runs recorded before "decides" lack it
                net.setdefault(f"{kind}: two over one", []).append(ratios[f"{kind}, {TWO}"] / ratios[f"{kind}, {ONE}"])
        for store in (ONE, TWO):
            for kind in ("ranked", "decides"):
                if f"{kind}, {store}" in ratios:
                    net.setdefault(f"{kind} over fit, {store}", []).append(ratios[f"{kind}, {store}"] / ratios[f"fit, {store}"])
    return {net: {label: {"median": statistics.median(v), "min": min(v), "max": max(v)} for label, v in by.items()} for net, by in found.items()}


def _claim(stores: Path, family: str) -> None:
    """Mark ``stores`` as the registries of ``family``, or stop when they hold another family's (a folder
    filled before families existed holds the convnets)."""
    marker = stores / "family"
    held = marker.read_text().strip() if marker.exists() else ("convnets" if (stores / _folder(ONE)).exists() else family)
    if held != family:
        raise SystemExit(f"bench.studies.growth: {stores} holds the {held} registries, not the {family}: give each family a folder of its own")
    marker.write_text(family)


def _folder(store: str) -> str:
    return {ONE: "one", TWO: "two", TUNED: "tuned"}[store]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="convnets", help="the networks held out (default: convnets)")
    parser.add_argument("--stores", type=Path, help="keep the three registries here and reuse them on the next run (one folder per family)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="schedhub-growth-stores-") as tmp:
        stores = args.stores or Path(tmp)
        stores.mkdir(parents=True, exist_ok=True)
        result = run(stores, args.runs, args.rounds, args.family)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    for net, by in result["summary"].items():
        print(net, {label: round(s["median"], 3) for label, s in by.items()})


if __name__ == "__main__":
    main()
