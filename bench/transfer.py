"""Transfer benchmark: what a compile gets for workloads the registry never tuned.

    python -m bench.transfer [--quick] [--out bench/results/<mode>/transfer.json]

1. The registry is filled by tuning the shipped networks at their bench shapes, batch 1
   (``schedhub.tuner`` on a local Ray cluster, the mode's budget).
2. Held-out networks, never tuned: the same networks at other batch sizes, image sizes and sequence
   lengths, and ResNet-18 imported through ``torch.export`` and TVM's PyTorch frontend (weights
   bound as constants; exported in a process of its own, ``bench.torch_export``). Each compiles with
   plain ``tvm.compile`` (TVM's default schedules) and inside ``hooks.use(registry)``, where
   kernels without a record get a transfer, ranked by ``hooks.metaschedule.ranking``: with an empty kernel cache, then again
   with this machine's cache (medians of 3, interleaved); then once with measured transfers
   (``measure=``: every applicable candidate timed here, the fastest served), which also tells
   how often the hook's ranking (and each alternative ranking) picked the fastest candidate; then
   with synthesis (``synthesize=``: design-space samples of each missed kernel ranked by the cost
   model trained on the registry's measurement log, the best few timed beside the candidates), once
   in a cache shared by the held-out networks (the model is trained in the first) and once again
   with that cache (what a later compile on this machine costs).
3. Then the held-out kernels are tuned as a worker tunes a queue of misses: first a *first pass* over
   every kernel (``TuneOptions.first_pass``: the registry's transfers and the log model's synthesized
   seeds measured side by side, the best pushed, no search), after which the network compiles with
   every kernel a hit ("first pass"); then each kernel's search at the same budget (warm-started from
   the registry, the first pass's schedule included) and the network compiles again: every kernel must
   hit ("tuned"). For a few kernels a cold search (no warm start) at the same budget gives the trials the
   warm search needed to match it.
4. Ray stops; default, transferred (the hook's ranking), measured-transfer, synthesized, first-pass and tuned forward passes and
   the PyTorch twin (in its own process) are timed side by side in interleaved rounds, and every
   output is checked against the default's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks.metaschedule.ranking import Retiling, model_rank_key, rank_key
from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.workloads import dispatch
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.search import TuneOptions, TuneResult
from schedhub.tuner.compare.torch_process import TorchProcess

from .models import MODES as MODEL_MODES
from .models import TORCH_TWINS, check_agreement, network_input, time_side_by_side
from .report import environment
from .stats import ratio, summary
from .torch_export import RELAX, TORCH_EXPORT, import_twin

if TYPE_CHECKING:
    from schedhub.hooks.metaschedule.costmodel import CostModel

REPO = Path(__file__).resolve().parent.parent
RANKED_BY = ("the fewest tile sizes re-derived on the kernel, then the most GFLOPS on its own workload, or the served cost model's "
             "prediction where the kernel's own layer was tuned at two shapes (hooks.metaschedule.ranking)")

MODES: dict[str, dict[str, Any]] = {
    "quick": {
        "source": {"resnet18": {"image": 64}, "mobilenetv2": {"image": 64}, "bert_layer": {"seq": 32}, "mlp": {}},
        "held_out": [
            ("resnet18", {"batch": 2, "image": 96}, RELAX),
            ("mobilenetv2", {"batch": 2, "image": 96}, RELAX),
            ("bert_layer", {"batch": 2, "seq": 64}, RELAX),
            ("mlp", {"batch": 16}, RELAX),
            ("resnet18", {"batch": 1, "image": 112}, TORCH_EXPORT),
        ],
        "options": MODEL_MODES["quick"]["options"],
        "cold_kernels": 4,
        "rounds": 5,
        "measure_secs": 120,
        "synthesize": 64,
        "synthesis_secs": 600,
    },
    "smoke": {  # a minute or two: checks the benchmark itself (tests/test_bench.py-sized), no figures
        "source": {"mlp": {}},
        "held_out": [("mlp", {"batch": 16}, RELAX)],
        "options": MODEL_MODES["quick"]["options"],
        "cold_kernels": 1,
        "rounds": 2,
        "measure_secs": 30,
        "synthesize": 16,
        "synthesis_secs": 60,
    },
    "full": {
        "source": {"resnet18": {"image": 224}, "mobilenetv2": {"image": 224}, "bert_layer": {"seq": 128}, "mlp": {}},
        "held_out": [
            ("resnet18", {"batch": 4, "image": 160}, RELAX),
            ("mobilenetv2", {"batch": 4, "image": 160}, RELAX),
            ("bert_layer", {"batch": 4, "seq": 256}, RELAX),
            ("mlp", {"batch": 64}, RELAX),
            ("resnet18", {"batch": 1, "image": 224}, TORCH_EXPORT),
        ],
        "options": MODEL_MODES["full"]["options"],
        "cold_kernels": 6,
        "rounds": 5,
        "measure_secs": 300,
        "synthesize": 64,
        "synthesis_secs": 1200,
    },
}

#: The quick mode's held-out convolution networks, as the studies beside this bench take them: ResNet-18
#: and MobileNet-V2 at batch 2, 96 px (Relax frontend).
QUICK_CONVNETS = [(name, shape) for name, shape, _ in MODES["quick"]["held_out"][:2]]
#: A network those studies compile (or tune a kernel of) only to train the cost model before anything is timed.
MODEL_WARM_UP = ("mlp", {"batch": 5})


@dataclass
class HeldOut:
    name: str
    shape: dict[str, int]
    frontend: str
    mod: Any
    func: str
    weights: dict[str, np.ndarray]
    input_shape: tuple[int, ...]
    kernels: list[models.Kernel]

    @property
    def label(self) -> str:
        dims = " ".join(f"{k}={v}" for k, v in self.shape.items())
        return f"{self.name} {dims}" + (f" ({self.frontend})" if self.frontend != RELAX else "")


def run(mode: str, say: Callable[[str], None] = print, source_store: Path | None = None) -> dict[str, Any]:
    """The transfer table for ``mode``. ``source_store``: a folder that keeps the filled registry between
    runs (filled there when empty, copied from there otherwise), so a rerun skips step 1."""
    import tvm

    from schedhub.hooks.metaschedule.synthesis import TIMED

    config = MODES[mode]
    options: TuneOptions = config["options"]
    target = tvm.target.Target(tvm_env.host_target())
    tvm_env.prepare()
    cluster.start()
    out: dict[str, Any] = {"mode": mode, "target": tvm_env.host_target(), "options": asdict(options), "source": config["source"], "synthesize": config["synthesize"], "timed": TIMED,
                           "rows": [], "warm_vs_cold": [], "ranked_by": RANKED_BY}
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-bench-transfer-"))) / "store"
        out["fill_secs"] = filled_store(root, source_store, config["source"], target, options)
        registry = stack.enter_context(LocalRegistry(root))
        out["source_keys"] = len(registry.summaries())
        say(f"registry filled: {out['source_keys']} keys" + (f" in {out['fill_secs']:.0f} s" if out["fill_secs"] else f" (copied from {source_store})"))

        model, out["cost_model"] = cost_model(registry)
        synthesis_cache = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-synthesis-")))
        compiled = []
        for name, shape, frontend in config["held_out"]:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-export-")))
            held = _held_out(name, shape, frontend, target, workdir)
            executables, compile_secs, reports = _compile_transferred(held, registry, target, workdir, config["measure_secs"])
            executables["synthesized"], synthesis_secs, reports["synthesized"] = _compile_synthesized(held, registry, target, synthesis_cache, config)
            compile_secs |= synthesis_secs
            c = {k: v["median"] for k, v in compile_secs.items()}
            say(f"{held.label}: {reports['transferred'].summary()}; compile {c['default']:.2f} s plain, {c['transferred_cold']:.2f} s hooked "
                f"(empty kernel cache), {c['transferred']:.2f} s (warm), {c['measured_cold']:.2f} s measuring; "
                f"{reports['synthesized'].summary()}: {c['synthesized_cold']:.2f} s synthesizing, {c['synthesized']:.2f} s again")  # fmt: skip
            compiled.append((held, executables, compile_secs, reports, _candidates(registry, held, model)))  # before the held-out kernels are tuned

        # What a worker does with the misses: a first pass over every kernel (measured transfers and synthesized
        # seeds, the best pushed), the compile that follows (all hits), then each kernel's search.
        for held, executables, compile_secs, *_ in compiled:
            started = time.time()
            tune_kernels(registry, held.kernels, options.first_pass())
            compile_secs["first_pass_tuning"] = summary([time.time() - started])
            executables["first_pass"], _ = _compile_all_hits(held, registry, target, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-first-"))))
        tuned: dict[str, TuneResult] = {}
        for held, _executables, compile_secs, *_ in compiled:
            started = time.time()
            tuned.update(tune_kernels(registry, [k for k in held.kernels if k.identity.key not in tuned], options, retune=True))
            compile_secs["search_tuning"] = summary([time.time() - started])
        out["warm_vs_cold"] = _warm_vs_cold(tuned, options, config["cold_kernels"], say)
        cluster.stop()  # nothing of Ray shares the cores with the timings

        torch_proc = stack.enter_context(TorchProcess(cwd=REPO))
        for held, executables, compile_secs, reports, candidates in compiled:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-hits-")))
            executables["tuned"], hit_secs = _compile_hits(held, registry, target, workdir)
            row = _row(held, executables, compile_secs | hit_secs, reports, candidates, config["rounds"], torch_proc)
            out["rows"].append(row)
            t = row["timing"]
            say(f"{held.label}: default {t['default']['median']:.2f} ms, transferred {t['transferred']['median']:.2f} ms, "
                f"measured {t['measured']['median']:.2f} ms, synthesized {t['synthesized']['median']:.2f} ms, first pass {t['first_pass']['median']:.2f} ms, tuned {t['tuned']['median']:.2f} ms, "
                f"PyTorch {t['pytorch']['median']:.2f} ms")  # fmt: skip
    return out


def filled_store(root: Path, source_store: Path | None, source: dict[str, dict[str, int]], target: Any, options: TuneOptions) -> float | None:
    """A registry at ``root`` filled with ``source`` (:func:`fill`): by tuning, or copied from ``source_store`` where an
    earlier run filled it (the store is filled there first when empty). Returns the seconds tuning took (None: reused)."""
    started, secs = time.time(), None
    if source_store is None or not (source_store / "data.mdb").exists():
        with LocalRegistry(source_store or root) as registry:
            fill(registry, source, target, options)
        secs = time.time() - started
    if source_store is not None:
        shutil.copytree(source_store, root)
    return secs


@contextlib.contextmanager
def quick_registry(source_store: Path, workdir: Path, target: Any, out: dict[str, Any]) -> Iterator[LocalRegistry]:
    """A study's registry: a copy under ``workdir`` of ``source_store``, filled first as the quick mode fills its
    source when empty (on a Ray cluster started for it; the seconds in ``out["fill_secs"]``). A copy, because a
    refused record is complained about, a write."""
    if not (source_store / "data.mdb").exists():
        cluster.start()
    out["fill_secs"] = filled_store(workdir / "store", source_store, MODES["quick"]["source"], target, MODES["quick"]["options"])
    cluster.stop()
    with LocalRegistry(workdir / "store") as registry:
        yield registry


def fill(registry: LocalRegistry, source: dict[str, dict[str, int]], target: Any, options: TuneOptions) -> None:
    """Tune every kernel of the ``source`` networks (name → shape, at batch 1 unless it names one) for ``target`` into ``registry``."""
    for name, shape in source.items():
        mod, _, _ = models.export(name, **{"batch": 1, **shape})
        tune_kernels(registry, models.kernels(mod, target, NO_REWRITES), options)


def tune_kernels(registry: LocalRegistry, kernels: list[models.Kernel], options: TuneOptions, retune: bool = False) -> dict[str, TuneResult]:
    done = dispatch.tune_many(registry, [k.identity for k in kernels], options, concurrency=1, retune=retune, pushed_by="bench.transfer")
    if done.failed:
        raise RuntimeError(f"tuning failed for {len(done.failed)} kernels: {done.failed}")
    return {r.identity.key: r for r in done.tuned}


def _held_out(name: str, shape: dict[str, int], frontend: str, target: Any, workdir: Path) -> HeldOut:
    mod, weights, input_shape = models.export_with_weights(name, **shape)
    func = "forward"
    if frontend == TORCH_EXPORT:  # the PyTorch twin with the same weights, imported the way a user imports a model
        mod, func = import_twin(name, weights, shape, workdir), "main"
    return HeldOut(name, shape, frontend, mod, func, weights, input_shape, models.kernels(mod, target, NO_REWRITES))


def _compile_transferred(held: HeldOut, registry: LocalRegistry, target: Any, workdir: Path, measure_secs: float,
                         repeats: int = 3) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Plain and hooked compiles, interleaved; each round's hooked compile first with an empty kernel
    cache (cold: every identity computed, every trace replayed), then again (warm: this machine's
    cache). Then one compile with measured transfers (``measure_secs``, an empty cache).
    Returns the executables, compile seconds and reports by configuration."""
    import tvm

    secs: dict[str, list[float]] = {"default": [], "transferred_cold": [], "transferred": []}
    executables: dict[str, Any] = {}
    reports: dict[str, Any] = {}
    for r in range(repeats):
        executables["default"], seconds = compile_and_load(lambda: tvm.compile(held.mod, target))
        secs["default"].append(seconds)
        for config in ("transferred_cold", "transferred"):
            executables["transferred"], seconds, report = hooked_compile(held, registry, target, workdir / f"cache-{r}")
            secs[config].append(seconds)
            reports.setdefault(config, report)
    executables["measured"], seconds, reports["measured"] = hooked_compile(held, registry, target, workdir / "cache-measured", measure=measure_secs)
    secs["measured_cold"] = [seconds]
    return executables, {k: summary(v) for k, v in secs.items()}, reports


def _compile_synthesized(held: HeldOut, registry: LocalRegistry, target: Any, cache: Path, config: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """A compile with synthesis (``cache`` shared by the held-out networks, as on one machine), then again with
    that cache. Returns the executable, both compiles' seconds and the first compile's report."""
    secs: dict[str, list[float]] = {}
    report = None
    for name in ("synthesized_cold", "synthesized"):
        executable, seconds, compiled = hooked_compile(held, registry, target, cache, measure=config["synthesis_secs"], synthesize=config["synthesize"])
        secs[name] = [seconds]
        report = report or compiled
    return executable, {k: summary(v) for k, v in secs.items()}, report


def _candidates(registry: LocalRegistry, held: HeldOut, model: CostModel | None = None) -> dict[str, dict[str, Any]]:
    """By kernel key and trace id (``key:tid``): how each candidate the hook is offered for a held-out kernel
    relates to it (``order``: its place in the registry's answer, nearest first), how fast it ran on its own
    workload (GFLOPS: TVM's FLOP estimate over its recorded seconds; ``source_speed``: the hook's measure of the
    same, ``hooks.metaschedule.ranking.work`` over those seconds), how many of its tile sizes TVM re-derived
    replayed on the held-out kernel (``retiled``; ``blind``: of those, tilings that were all ones at home) and, with
    ``model``, the speed the cost model predicts for it there."""
    from schedhub.hooks.metaschedule import costmodel
    from schedhub.hooks.kernels.identity import target_from_text, workload_module
    from schedhub.hooks.metaschedule.msdb import normalize_mod, replay
    from schedhub.hooks.metaschedule.ranking import speed, work
    from schedhub.hooks.serving.session import DEFAULT_CANDIDATES

    _, near = registry.lookup_with_candidates([k.identity for k in held.kernels], per_key=DEFAULT_CANDIDATES)
    by_key = {k.identity.key: k.identity for k in held.kernels}
    flops: dict[str, float] = {}
    out = {}
    for key, candidates in near.items():
        kernel = normalize_mod(workload_module(by_key[key].workload)["main"])
        for order, c in enumerate(candidates):
            source = c.record.identity
            if source.key not in flops:
                flops[source.key] = costmodel.flops(workload_module(source.workload))
            row = out[f"{key}:{c.record.trace_id}"] = {"relation": c.relation, "distance": c.distance, "order": order, "source_op": source.op,
                                                       "source_us": c.record.mean_secs * 1e6, "source_gflops": flops[source.key] / c.record.mean_secs / 1e9,
                                                       "source_speed": speed(work(source.workload), c.record.mean_secs)}  # fmt: skip
            with contextlib.suppress(Exception):  # does not replay here: the hook drops it too
                scheduled, retiling = replay(kernel, c.record.trace)
                row["retiled"], row["blind"] = retiling
                if model is not None:
                    vector = costmodel.features(scheduled, target_from_text(by_key[key].target), costmodel.flops(kernel))
                    row["predicted_log2_gflops"] = model.predict([vector])[0]
    return out


def cost_model(registry: LocalRegistry) -> tuple[CostModel, dict[str, Any]]:
    """xgboost over per-store features, trained on the registry's measurement log (every trial its tuners
    measured, verified pushers only) or, for a registry without one, on every record it serves; and which,
    how many samples it took and how long."""
    from schedhub.hooks.metaschedule import costmodel

    started = time.perf_counter()
    data, source = list(costmodel.log_samples(registry.iter_trial_logs(verified_only=True))), "measurement log"
    if len(data) < 2:
        served = registry.lookup([s.key for s in registry.summaries()])
        data, source = list(costmodel.samples(r for records in served.values() for r in records)), "records"
    model = costmodel.CostModel.train(data)
    return model, {"samples": len(data), "source": source, "train_secs": time.perf_counter() - started}


def _retiling(candidate: dict[str, Any]) -> Retiling:
    """A recorded candidate's :class:`~schedhub.hooks.metaschedule.ranking.Retiling` (runs recorded before ``blind`` was: none)."""
    return Retiling(candidate["retiled"], candidate.get("blind", 0))


#: Rankings compared with the hook's pick on the same measurements: a sort key over a candidate's attributes
#: (a candidate without the attribute ranks last).
ALTERNATIVE_RANKINGS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "fit": lambda c: rank_key(c["relation"], _retiling(c), c["source_speed"], c["order"]) if "retiled" in c else (math.inf,),  # the hook's without a served model
    "nearest_first": lambda c: c.get("order", math.inf),  # the registry's order: compiler, then shape distance, then target
    "source_gflops": lambda c: -c["source_gflops"],  # the fastest schedule on its own workload, for its work
    "source_secs": lambda c: c["source_us"],  # the fastest on its own workload, whatever its size
    "xgboost": lambda c: -c.get("predicted_log2_gflops", -math.inf),  # the cost model's fastest, replayed on this kernel
    # the hook's with a served model: the fit ranking with the model's prediction here in place of the speed at home
    "fit_then_model": lambda c: model_rank_key(c["relation"], _retiling(c), c.get("predicted_log2_gflops", -math.inf), c["order"]) if "retiled" in c else (math.inf,),
}


def compile_and_load(build: Callable[[], Any], device: str = "cpu") -> tuple[Any, float]:
    """The executable and the seconds until it can run on ``device``: the compile and the first load (a VM on
    it), where TVM's LLVM JIT emits the machine code of a plain build and cached objects are linked."""
    import tvm
    from tvm import relax

    start = time.perf_counter()
    executable = build()
    relax.VirtualMachine(executable, tvm.device(device))
    return executable, time.perf_counter() - start


def hooked_compile(held: HeldOut, registry: LocalRegistry, target: Any, cache: Path, device: str = "cpu", **options: Any) -> tuple[Any, float, Any]:
    """One compile of ``held`` inside ``hooks.use`` (``cache``: its kernel cache; ``options``: more of ``use``'s):
    the executable, the seconds until it can run on ``device`` (:func:`compile_and_load`) and the compile's report."""
    import tvm

    from schedhub import hooks

    with hooks.use(registry, target, report_misses=False, cache=cache, **options) as session:
        executable, secs = compile_and_load(lambda: tvm.compile(held.mod, target), device)
    return executable, secs, session.report


def _compile_all_hits(held: HeldOut, registry: LocalRegistry, target: Any, cache: Path, device: str = "cpu") -> tuple[Any, float]:
    """One hooked compile in which every kernel must hit: the executable and its seconds (:func:`hooked_compile`)."""
    executable, secs, report = hooked_compile(held, registry, target, cache, device)
    if report.hits != len(report.kernels):
        raise RuntimeError(f"{held.label}: {report.hits} of {len(report.kernels)} kernels hit")
    return executable, secs


def _compile_hits(held: HeldOut, registry: LocalRegistry, target: Any, workdir: Path, repeats: int = 3) -> tuple[Any, dict[str, Any]]:
    """Once every kernel is tuned: plain against hooked compiles (all hits), interleaved; the hooked
    one first with an empty kernel cache, then with this machine's (identities, schedules, objects)."""
    import tvm

    secs: dict[str, list[float]] = {"default_beside_hits": [], "hits_cold": [], "hits": []}
    executable = None
    for r in range(repeats):
        secs["default_beside_hits"].append(compile_and_load(lambda: tvm.compile(held.mod, target))[1])
        for config in ("hits_cold", "hits"):
            executable, seconds = _compile_all_hits(held, registry, target, workdir / f"hits-{r}")
            secs[config].append(seconds)
    return executable, {k: summary(v) for k, v in secs.items()}


def _ranking(served: Any, measured: Any, candidates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """How the hook's pick (``served``: the report of a compile without measurement), and each of
    :data:`ALTERNATIVE_RANKINGS`' picks, compare with the fastest candidate measured here, kernel by kernel
    (kernels whose candidates were all measured and at least two distinct schedules applied)."""
    picked = {k.key: k.detail.split(":")[1] for k in served.kernels if k.outcome == "transfer"}
    rows = []
    for k in measured.kernels:
        times = {t: s for t, s in k.measured.items() if s is not None}
        if k.key in picked and picked[k.key] in times and len(times) >= 2:
            best = min(times.values())
            row = {"op": k.op, "key": k.key, "candidates": len(k.measured), "refused": sum(s is None for s in k.measured.values()),
                   "served_us": times[picked[k.key]] * 1e6, "best_us": best * 1e6, "served_vs_best": times[picked[k.key]] / best,
                   "measured": [{"tid": t, "us": s * 1e6, **candidates.get(f"{k.key}:{t}", {})} for t, s in times.items()]}  # fmt: skip
            rows.append(alternative_picks(row, candidates))
    return ranking_summary(rows)


def alternative_picks(row: dict[str, Any], candidates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``row`` (one kernel's measured candidates) with what each alternative ranking would have served (``<name>_us``)."""
    times = {m["tid"]: m["us"] for m in row["measured"]}
    known = [t for t in times if f"{row['key']}:{t}" in candidates]
    for name, sort_key in ALTERNATIVE_RANKINGS.items():
        if known:
            row[f"{name}_us"] = times[min(known, key=lambda t: sort_key(candidates[f"{row['key']}:{t}"]))]
    return row


def ranking_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    alternatives = {name: _picks([r for r in rows if f"{name}_us" in r], name) for name in ALTERNATIVE_RANKINGS}
    return {"kernels": rows, **_picks(rows, "served"), "alternatives": alternatives}


def _picks(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Over ``rows``: how often ranking ``name`` picked the fastest candidate, and its picks' time against the fastest."""
    ratios = [r[f"{name}_us"] / r["best_us"] for r in rows]
    return {"compared": len(rows), f"{name}_is_best": sum(r <= 1.0 for r in ratios), f"{name}_vs_best": summary(ratios) if ratios else None,
            f"time_{name}_vs_best": (sum(r[f"{name}_us"] for r in rows) / sum(r["best_us"] for r in rows)) if rows else None}  # fmt: skip


def _warm_vs_cold(tuned: dict[str, TuneResult], options: TuneOptions, count: int, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """For the ``count`` slowest warm-started kernels: a cold search at the same budget, and the trials
    the warm search needed to reach the cold search's final best (None: it never did)."""
    picked = sorted((r for r in tuned.values() if r.warm_started), key=lambda r: -r.untuned_secs)[:count]
    rows = []
    for warm in picked:
        ref = cluster.submit("tune", identity=warm.identity.to_dict(), warm_traces=[], options=asdict(replace(options, warm_start=0, synthesize=0)), label="cold")
        cold = TuneResult.from_dict(cluster.result(ref))
        target_secs = cold.curve[-1][1]
        reached = next((n for n, best in warm.curve if best <= target_secs), None)
        rows.append({"op": warm.identity.op, "key": warm.identity.key, "warm_started": warm.warm_started, "trials": options.trials,
                     "cold_best_us": target_secs * 1e6, "warm_best_us": warm.curve[-1][1] * 1e6, "warm_first_us": warm.curve[0][1] * 1e6,
                     "warm_trials_to_match_cold": reached})  # fmt: skip
        say(f"warm vs cold {warm.identity.op}: cold best {target_secs * 1e6:.1f} µs; warm reached it after {reached} of {len(warm.curve)} measured")
    return rows


def _row(held: HeldOut, executables: dict[str, Any], compile_secs: dict[str, Any], reports: dict[str, Any],
         candidates: dict[str, dict[str, Any]], rounds: int,
         torch_proc: TorchProcess) -> dict[str, Any]:  # fmt: skip
    x = network_input(held.input_shape)
    pytorch = torch_proc.load_network(held.name, held.weights, x, factory=TORCH_TWINS, **held.shape)
    order = ("default", "transferred", "measured", "synthesized", "first_pass", "tuned")
    timing, errors = time_side_by_side({k: executables[k] for k in order}, x, rounds, pytorch, torch_proc.time_network, held.func)
    check_agreement(held.label, errors)
    report = reports["transferred"]
    added = {k: summary([t - d for t, d in zip(compile_secs[k]["samples"], compile_secs["default"]["samples"])]) for k in ("transferred_cold", "transferred")}
    hits_vs_plain = {k: ratio(compile_secs[k], compile_secs["default_beside_hits"], paired=True) for k in ("hits_cold", "hits")}
    return {
        "network": held.name, "shape": held.shape, "frontend": held.frontend, "label": held.label, "kernels": len(report.kernels),
        "hits": report.hits, "transfers": report.transfers, "misses": report.misses, "fallbacks": report.fallbacks,
        "transfer_share": report.transfers / max(1, len(report.kernels)),
        "synthesized_kernels": reports["synthesized"].synthesized, "synthesis_transfers": reports["synthesized"].transfers,
        "synthesis_misses": reports["synthesized"].misses,
        "relations": _relations(report), "compile_secs": compile_secs, "compile_added_secs": added["transferred"],
        "compile_added_cold_secs": added["transferred_cold"], "hit_compile_vs_plain": hits_vs_plain["hits"],
        "hit_compile_cold_vs_plain": hits_vs_plain["hits_cold"], "ranking": _ranking(report, reports["measured"], candidates),
        "timing": timing, "max_rel_error": errors,
        "transferred_vs_tuned": ratio(timing["transferred"], timing["tuned"], paired=True),  # latency ratio: ≤ 1.43 is ≥ 70% of tuned speed
        "measured_vs_tuned": ratio(timing["measured"], timing["tuned"], paired=True),
        "synthesized_vs_tuned": ratio(timing["synthesized"], timing["tuned"], paired=True),
        "first_pass_vs_tuned": ratio(timing["first_pass"], timing["tuned"], paired=True),
        "default_vs_first_pass": ratio(timing["default"], timing["first_pass"], paired=True),
        "default_vs_synthesized": ratio(timing["default"], timing["synthesized"], paired=True),
        "synthesis_compile_added_secs": {k: compile_secs[k]["median"] - compile_secs["default"]["median"] for k in ("synthesized_cold", "synthesized")},
        "default_vs_transferred": ratio(timing["default"], timing["transferred"], paired=True),  # speedup of the transfer over TVM's default
        "pytorch_vs_transferred": ratio(timing["pytorch"], timing["transferred"], paired=True),
    }  # fmt: skip


def _relations(report: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for k in report.kernels:
        if k.outcome == "transfer":
            relation = k.detail.split(":", 1)[0]
            counts[relation] = counts.get(relation, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and budgets")
    parser.add_argument("--smoke", action="store_true", help="one small network: checks the benchmark runs, measures nothing worth recording")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    parser.add_argument("--source-store", type=Path, help="keep the filled registry here and reuse it on the next run")
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    started, env = time.time(), environment()  # the commit the run starts on: the code it measures
    results = run(mode, source_store=args.source_store)
    results["wall_secs"] = time.time() - started
    results["command"] = "python -m bench.transfer" + {"smoke": " --smoke", "quick": " --quick", "full": ""}[mode]
    results["started"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
    results.update(env)
    results["medians"] = {r["label"]: {k: statistics.median(v["samples"]) for k, v in r["timing"].items()} for r in results["rows"]}
    out = args.out or REPO / "bench" / "results" / mode / "transfer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
