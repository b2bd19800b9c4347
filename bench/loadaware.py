"""Tuning jobs sharing one device: N at once against one at a time, on the same kernels, seeds and budget.

    python -m bench loadaware [--device cuda] [--jobs 4]
    python -m bench.loadaware [--device cuda] [--jobs 4] [--kernels 4] [--trials 16] [--runs 1] [--shared-core]
    python -m bench.loadaware ...  --out FILE

The kernels are the BERT layer's heaviest matmuls (seq 128 on a GPU, 32 on a CPU: minutes, not hours, on 2 cores).
Each run tunes them twice into fresh registries with ``dispatch.tune_many``: one job at a time and ``--jobs`` at once
(the order alternates between runs), cold (no registry traces, no synthesized seeds), the same seed and options.
Each mode starts with no reference remembered (``tuner.execution.remembered``: a later mode would otherwise skip the calls an
earlier one made). Recorded per mode: wall time, trials/s, each search's seconds by phase (search, build, measure, cost model), and
the search threads each job ran. Then, with nothing else running, every kernel's best record of each mode is timed
again side by side with the target's default (DLight on a GPU, TVM's default schedule on a CPU), in one measurement
task: each mode's best *alone*, which is what the quality comparison reads, and beside it the time the job itself
published (``seen``), which under load may be off.

Where the loss comes from: per kernel and mode, :data:`SAMPLED` of the search's own candidates (its fastest and an
even spread) are timed again alone with the search's timing, and ``seen / alone`` says how far the search's view of
them was off (one job at a time is the control). On a GPU node every GPU's measurement runs alone on a core of its
own (``tuner.execution.cores``); ``--shared-core`` adds the N-job mode with that reservation off, as it was before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.registry import LocalRegistry, keeps_default_schedule
from schedhub.tuner.execution import cluster, cores, remembered, tvm_env
from schedhub.tuner.workloads import dispatch
from schedhub.tuner.networks import models
from schedhub.tuner.networks.network import heaviest_first
from schedhub.tuner.execution.kernels import FINAL_TIMING
from schedhub.tuner.workloads.search import Timeline, TuneOptions, TuneResult, default_name, default_schedule, side_by_side

from .report import REPO, environment
from .tuner import require_device, warm_workers

#: Cold searches of MetaSchedule's default shape, cut for minutes: no registry, no seeds, the same seed everywhere.
OPTIONS = TuneOptions(trials=16, trials_per_iter=16, population=128, genetic_iters=2, warm_start=0, synthesize=0, seeds=0, publish=1)
#: The BERT layer's sequence length per device: seq 128 is the issue's GPU case; on a 2-core CPU seq 32 fits minutes.
SEQ = {"cuda": 128, "cpu": 32}
#: Candidates of each search timed again alone, per kernel and mode.
SAMPLED = 4


def matmul_kernels(device: str, count: int) -> list[Any]:
    """The BERT layer's ``count`` costliest matmul kernels (FLOPs × calls) on ``device``'s target, as identities."""
    target = tvm_env.device_target(device)
    mod = models.export_with_weights("bert_layer", batch=1, seq=SEQ[device])[0]
    kernels = heaviest_first(k for k in models.kernels(mod, target, NO_REWRITES) if "matmul" in k.identity.op)
    return [k.identity for k in kernels[:count]]


def tune_mode(identities: list[Any], options: TuneOptions, jobs: int, reserved: bool = True) -> dict[str, Any]:
    """Tune every kernel with ``jobs`` at once into a fresh registry, on a cluster whose GPU measurements have cores of
    their own (``reserved``) or not: wall time, trials/s, phases and each kernel's result."""
    use_cluster(reserved, identities[0].target)
    remembered.forget_all()  # no mode finds the references an earlier one ran (one machine, one cache)
    with tempfile.TemporaryDirectory(prefix="schedhub-loadaware-") as tmp, LocalRegistry(Path(tmp) / "store", sync=False) as reg:
        started = time.time()
        done = dispatch.tune_many(reg, identities, options, concurrency=jobs, retune=True, pushed_by="bench.loadaware", publish=False)
        wall = time.time() - started
    if done.failed:
        raise RuntimeError(f"tuning failed with {jobs} jobs at once: {done.failed}")
    results: dict[str, TuneResult] = {r.identity.key: r for r in done.tuned}
    trials = sum(r.trials for r in results.values())
    phases = {p: sum(r.phases.get(p, 0.0) for r in results.values()) for p in ("search", "build", "measure", "cost model", "rest")}
    return {"jobs": jobs, "measure_core": "reserved" if reserved else cores.SHARED, "wall_secs": wall, "trials": trials,
            "trials_per_sec": trials / wall, "phase_secs": phases,
            "search_threads": sorted({str(r.records[0].provenance.get("search_threads")) for r in results.values()}),
            "results": results}  # fmt: skip


def use_cluster(reserved: bool, target: str) -> None:
    """A local cluster whose GPU nodes reserve a core per GPU's measurements, or not: restarted when that changes, and
    its workers started before any clock (``bench.tuner.warm_workers``: on a fresh cluster the first mode's searches
    were seen timing candidates 4-5x slow beside workers importing TVM, on 2 cores)."""
    import ray

    wanted = "" if reserved else cores.SHARED
    if ray.is_initialized() and os.environ.get(cores.SETTING, "") == wanted:
        return
    cluster.stop()
    os.environ[cores.SETTING] = wanted  # the cluster's workers inherit it
    cpus = cluster.start()["resources"].get("CPU", 1)
    warm_workers(target, int(cpus))


def sampled(measured: list[tuple[str, float]], count: int = SAMPLED) -> list[tuple[str, float]]:
    """``count`` of a search's measured candidates (trace text, mean seconds): the fastest, the slowest and an even spread between."""
    ranked = sorted(measured, key=lambda m: m[1])
    if len(ranked) <= count:
        return ranked
    return [ranked[round(i * (len(ranked) - 1) / (count - 1))] for i in range(count)]


def timed_alone(identity: Any, traces: list[str], timing: dict[str, Any], label: str) -> tuple[float, list[float | None]]:
    """The target's default schedule of ``identity`` and each trace replayed on it, timed side by side with nothing
    else running: the default's mean seconds and each trace's (None where it did not run). A trace that keeps the
    default schedule (``registry.keeps_default_schedule``) is the default (DLight's on a GPU), not the bare kernel."""
    from schedhub.hooks.kernels.identity import target_from_text, workload_module
    from schedhub.hooks.metaschedule.msdb import replay_schedule

    mod = workload_module(identity.workload)
    target = target_from_text(identity.target)
    scheduled = [default_schedule(mod, target) if keeps_default_schedule(text) else replay_schedule(mod, json.loads(text)).mod for text in traces]
    timed = side_by_side(identity, mod, scheduled, timing, Timeline(label))
    return statistics.fmean(timed[0]["run_secs"]), [statistics.fmean(a["run_secs"]) if a["run_secs"] else None for a in timed[1:]]


def retime_seen(identity: Any, modes: dict[str, dict[str, Any]], timing: dict[str, Any]) -> dict[str, list[float]]:
    """Per mode, ``seen / alone`` for :func:`sampled` candidates of its search: what the search measured over the same
    schedule timed now with the search's ``timing`` and nothing else running (over 1: the search saw it slower)."""
    picked = [(name, text, seen) for name, mode in modes.items() for text, seen in sampled(mode["results"][identity.key].measured)]
    _, alone = timed_alone(identity, [text for _, text, _ in picked], timing, "retime seen")
    ratios: dict[str, list[float]] = {name: [] for name in modes}
    for (name, _, seen), secs in zip(picked, alone):
        if secs:
            ratios[name].append(seen / secs)
    return ratios


def retime_alone(identity: Any, modes: dict[str, dict[str, Any]], timing: dict[str, Any]) -> dict[str, Any]:
    """Each mode's best record of ``identity`` and the target's default, timed side by side with nothing else running."""
    best = {name: mode["results"][identity.key].records[0] for name, mode in modes.items()}
    default_secs, alone = timed_alone(identity, [record.trace for record in best.values()], timing, "retime")
    row: dict[str, Any] = {"op": identity.op, "key": identity.key, "default_us": default_secs * 1e6, "modes": {}}
    for (name, record), secs in zip(best.items(), alone):
        row["modes"][name] = {"alone_us": secs * 1e6 if secs else None, "seen_us": record.mean_secs * 1e6,
                              "default_schedule": keeps_default_schedule(record.trace),
                              "vs_default": default_secs / secs if secs else None}  # fmt: skip
    return row


def run(device: str, jobs: int, count: int, options: TuneOptions, runs: int, shared_core: bool = False) -> dict[str, Any]:
    from schedhub.hooks.kernels.identity import target_text

    identities = matmul_kernels(device, count)
    out: dict[str, Any] = {"device": device, "default": default_name(target_text(tvm_env.device_target(device))), "jobs": jobs, "seq": SEQ[device],
                           "kernels": [i.op for i in identities], "options": asdict(options), "runs": []}  # fmt: skip
    plan = [(1, True), (jobs, True), *([(jobs, False)] if shared_core else [])]
    try:
        for n in range(runs):
            order = plan if n % 2 == 0 else plan[::-1]
            modes = {}
            for j, reserved in order:
                modes[mode_name(j, reserved)] = mode = tune_mode(identities, options, j, reserved)
                print(f"run {n + 1}: {mode_name(j, reserved)}: {mode['wall_secs']:.0f} s, {mode['trials_per_sec']:.2f} trials/s, "
                      f"threads {mode['search_threads']}, phases {', '.join(f'{p} {s:.0f} s' for p, s in mode['phase_secs'].items())}", flush=True)
            use_cluster(True, identities[0].target)
            kernels = [retime_alone(i, modes, FINAL_TIMING) for i in identities]
            for kernel, identity in zip(kernels, identities):
                for name, ratios in retime_seen(identity, modes, options.timing).items():
                    kernel["modes"][name]["seen_vs_alone"] = ratios
            out["runs"].append({"order": order, "modes": {k: {f: v for f, v in m.items() if f != "results"} for k, m in modes.items()}, "kernels": kernels})
            for k in kernels:
                print(f"  {k['op']:<28} default {k['default_us']:9.1f} µs  " + "  ".join(
                    f"{name}: {m['alone_us'] or float('nan'):9.1f} µs alone (seen {m['seen_us']:9.1f}; candidates seen/alone "
                    f"{', '.join(f'{r:.2f}' for r in m['seen_vs_alone'])})" for name, m in k["modes"].items()), flush=True)
    finally:
        cluster.stop()
    out["summary"] = summarize(out["runs"], jobs)
    return out


def mode_name(jobs: int, reserved: bool = True) -> str:
    return f"{jobs} at once" + ("" if reserved else ", measurement core shared")


def summarize(runs: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    """Medians over runs, per N-job mode against one job at a time: how much sooner it finished, trials/s, how far each
    kernel's best alone is from the serial run's (N jobs' best / one job's best: over 1 is worse), the worst kernel, the Σ
    of the bests; and per mode the median and worst ``seen / alone`` of the searches' sampled candidates."""
    serial = mode_name(1)
    names = list(runs[0]["modes"])
    out: dict[str, Any] = {"trials_per_sec": {m: statistics.median(r["modes"][m]["trials_per_sec"] for r in runs) for m in names},
                           "sum_of_bests_us": {m: statistics.median(sum(k["modes"][m]["alone_us"] or 0 for k in r["kernels"]) for r in runs) for m in names},
                           "seen_vs_alone": {}, "shared": {}}  # fmt: skip
    for m in names:
        seen = [x for r in runs for k in r["kernels"] for x in k["modes"][m].get("seen_vs_alone", [])]
        out["seen_vs_alone"][m] = {"median": statistics.median(seen), "worst": max(seen)} if seen else None
        if m == serial:
            continue
        quality = [k["modes"][m]["alone_us"] / k["modes"][serial]["alone_us"] for r in runs for k in r["kernels"]
                   if k["modes"][m]["alone_us"] and k["modes"][serial]["alone_us"]]  # fmt: skip
        out["shared"][m] = {"sooner": statistics.median(r["modes"][serial]["wall_secs"] / r["modes"][m]["wall_secs"] for r in runs),
                            "best_vs_serial_median": statistics.median(quality) if quality else None,
                            "best_vs_serial_worst": max(quality, default=None)}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadaware", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--jobs", type=int, default=4, help="jobs at once in the shared mode")
    parser.add_argument("--kernels", type=int, default=4)
    parser.add_argument("--trials", type=int, default=OPTIONS.trials)
    parser.add_argument("--runs", type=int, default=1, help="runs of both modes, alternating which goes first")
    parser.add_argument("--shared-core", action="store_true", help="also run N jobs with no core kept for the GPU's measurements (tuner.execution.cores)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_device(parser.prog, args.device)
    if args.jobs < 2 or args.kernels < 1 or args.trials < 1 or args.runs < 1:
        parser.error("--jobs takes 2 or more; --kernels, --trials and --runs 1 or more")
    tvm_env.prepare()
    options = replace(OPTIONS, trials=args.trials, trials_per_iter=min(OPTIONS.trials_per_iter, args.trials))
    result = run(args.device, args.jobs, args.kernels, options, args.runs, args.shared_core)
    result.update(command=f"python -m bench loadaware --device {args.device} --jobs {args.jobs} --kernels {args.kernels} --trials {args.trials} --runs {args.runs}"
                          + (" --shared-core" if args.shared_core else ""),
                  environment=environment())  # fmt: skip
    print(json.dumps(result["summary"], indent=1))
    out = args.out or REPO / "bench" / "results" / ("gpu" if args.device == "cuda" else "full") / "loadaware.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
