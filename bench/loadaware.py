"""Tuning jobs sharing one device: N at once against one at a time, on the same kernels, seeds and budget.

    python -m bench loadaware [--device cuda] [--jobs 4] [--kernels 4] [--trials 16] [--runs 1]
    python -m bench.loadaware ...  --out FILE

The kernels are the BERT layer's heaviest matmuls (seq 128 on a GPU, 32 on a CPU: minutes, not hours, on 2 cores).
Each run tunes them twice into fresh registries with ``dispatch.tune_many``: one job at a time and ``--jobs`` at once
(the order alternates between runs), cold (no registry traces, no synthesized seeds), the same seed and options.
Recorded per mode: wall time, trials/s, each search's seconds by phase (search, build, measure, cost model), and
the search threads each job ran. Then, with nothing else running, every kernel's best record of each mode is timed
again side by side with the target's default (DLight on a GPU, TVM's default schedule on a CPU), in one measurement
task: each mode's best *alone*, which is what the quality comparison reads, and beside it the time the job itself
published (``seen``), which under load may be off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner import cluster, dispatch, models, tvm_env
from schedhub.tuner.network import workload_flops
from schedhub.tuner.kernels import FINAL_TIMING
from schedhub.tuner.search import Timeline, TuneOptions, TuneResult, default_name, side_by_side

from .report import REPO, environment
from .tuner import require_device

#: Cold searches of MetaSchedule's default shape, cut for minutes: no registry, no seeds, the same seed everywhere.
OPTIONS = TuneOptions(trials=16, trials_per_iter=16, population=128, genetic_iters=2, warm_start=0, synthesize=0, seeds=0, publish=1)
#: The BERT layer's sequence length per device: seq 128 is the issue's GPU case; on a 2-core CPU seq 32 fits minutes.
SEQ = {"cuda": 128, "cpu": 32}


def matmul_kernels(device: str, count: int) -> list[Any]:
    """The BERT layer's ``count`` costliest matmul kernels (FLOPs × calls) on ``device``'s target, as identities."""
    target = tvm_env.device_target(device)
    mod = models.export_with_weights("bert_layer", batch=1, seq=SEQ[device])[0]
    kernels = [k for k in models.kernels(mod, target) if "matmul" in k.identity.op]
    kernels.sort(key=lambda k: workload_flops(k.identity) * k.calls, reverse=True)
    return [k.identity for k in kernels[:count]]


def tune_mode(identities: list[Any], options: TuneOptions, jobs: int) -> dict[str, Any]:
    """Tune every kernel with ``jobs`` at once into a fresh registry: wall time, trials/s, phases and each kernel's result."""
    with tempfile.TemporaryDirectory(prefix="schedhub-loadaware-") as tmp, LocalRegistry(Path(tmp) / "store", sync=False) as reg:
        started = time.time()
        done = dispatch.tune_many(reg, identities, options, concurrency=jobs, retune=True, pushed_by="bench.loadaware", publish=False)
        wall = time.time() - started
    if done.failed:
        raise RuntimeError(f"tuning failed with {jobs} jobs at once: {done.failed}")
    results: dict[str, TuneResult] = {r.identity.key: r for r in done.tuned}
    trials = sum(r.trials for r in results.values())
    phases = {p: sum(r.phases.get(p, 0.0) for r in results.values()) for p in ("search", "build", "measure", "cost model", "rest")}
    return {"jobs": jobs, "wall_secs": wall, "trials": trials, "trials_per_sec": trials / wall, "phase_secs": phases,
            "search_threads": sorted({str(r.records[0].provenance.get("search_threads")) for r in results.values()}),
            "results": results}  # fmt: skip


def retime_alone(identity: Any, modes: dict[str, dict[str, Any]], timing: dict[str, Any]) -> dict[str, Any]:
    """Each mode's best record of ``identity`` and the target's default, timed side by side with nothing else running."""
    from schedhub.hooks.identity import workload_module
    from schedhub.hooks.msdb import replay_schedule

    mod = workload_module(identity.workload)
    best = {name: mode["results"][identity.key].records[0] for name, mode in modes.items()}
    scheduled = [replay_schedule(mod, json.loads(record.trace)).mod for record in best.values()]
    timed = side_by_side(identity, mod, scheduled, timing, Timeline("retime"))
    default_secs = statistics.fmean(timed[0]["run_secs"])
    row: dict[str, Any] = {"op": identity.op, "key": identity.key, "default_us": default_secs * 1e6, "modes": {}}
    for (name, record), answer in zip(best.items(), timed[1:]):
        alone = statistics.fmean(answer["run_secs"]) if answer["run_secs"] else None
        row["modes"][name] = {"alone_us": alone * 1e6 if alone else None, "seen_us": record.mean_secs * 1e6,
                              "default_schedule": bool(record.provenance.get("default_schedule")),
                              "vs_default": default_secs / alone if alone else None}  # fmt: skip
    return row


def run(device: str, jobs: int, count: int, options: TuneOptions, runs: int) -> dict[str, Any]:
    from schedhub.hooks.identity import target_text

    identities = matmul_kernels(device, count)
    out: dict[str, Any] = {"device": device, "default": default_name(target_text(tvm_env.device_target(device))), "jobs": jobs, "seq": SEQ[device],
                           "kernels": [i.op for i in identities], "options": asdict(options), "runs": []}  # fmt: skip
    cluster.start()
    try:
        for n in range(runs):
            order = [1, jobs] if n % 2 == 0 else [jobs, 1]
            modes = {f"{j} at once": tune_mode(identities, options, j) for j in order}
            kernels = [retime_alone(i, modes, FINAL_TIMING) for i in identities]
            out["runs"].append({"order": order, "modes": {k: {f: v for f, v in m.items() if f != "results"} for k, m in modes.items()}, "kernels": kernels})
            for name, mode in modes.items():
                print(f"run {n + 1}: {name}: {mode['wall_secs']:.0f} s, {mode['trials_per_sec']:.2f} trials/s, threads {mode['search_threads']}, "
                      f"phases {', '.join(f'{p} {s:.0f} s' for p, s in mode['phase_secs'].items())}", flush=True)
            for k in kernels:
                print(f"  {k['op']:<28} default {k['default_us']:9.1f} µs  " + "  ".join(
                    f"{name}: {m['alone_us'] or float('nan'):9.1f} µs alone (seen {m['seen_us']:9.1f})" for name, m in k["modes"].items()), flush=True)
    finally:
        cluster.stop()
    out["summary"] = summarize(out["runs"], jobs)
    return out


def summarize(runs: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    """Medians over runs: how much sooner N jobs finish, trials/s of each mode, and how far each kernel's best alone is
    from the serial run's (N jobs' best / one job's best: over 1 is worse), the worst kernel and the Σ of the bests."""
    serial, shared = "1 at once", f"{jobs} at once"
    sooner = [r["modes"][serial]["wall_secs"] / r["modes"][shared]["wall_secs"] for r in runs]
    quality = [k["modes"][shared]["alone_us"] / k["modes"][serial]["alone_us"] for r in runs for k in r["kernels"]
               if k["modes"][shared]["alone_us"] and k["modes"][serial]["alone_us"]]  # fmt: skip
    sums = {mode: statistics.median(sum(k["modes"][mode]["alone_us"] or 0 for k in r["kernels"]) for r in runs) for mode in (serial, shared)}
    return {"sooner": statistics.median(sooner), "trials_per_sec": {mode: statistics.median(r["modes"][mode]["trials_per_sec"] for r in runs) for mode in (serial, shared)},
            "best_vs_serial_median": statistics.median(quality) if quality else None, "best_vs_serial_worst": max(quality, default=None),
            "sum_of_bests_us": sums}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadaware", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--jobs", type=int, default=4, help="jobs at once in the shared mode")
    parser.add_argument("--kernels", type=int, default=4)
    parser.add_argument("--trials", type=int, default=OPTIONS.trials)
    parser.add_argument("--runs", type=int, default=1, help="runs of both modes, alternating which goes first")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_device(parser.prog, args.device)
    if args.jobs < 2 or args.kernels < 1 or args.trials < 1 or args.runs < 1:
        parser.error("--jobs takes 2 or more; --kernels, --trials and --runs 1 or more")
    tvm_env.prepare()
    options = replace(OPTIONS, trials=args.trials, trials_per_iter=min(OPTIONS.trials_per_iter, args.trials))
    result = run(args.device, args.jobs, args.kernels, options, args.runs)
    result.update(command=f"python -m bench loadaware --device {args.device} --jobs {args.jobs} --kernels {args.kernels} --trials {args.trials} --runs {args.runs}",
                  environment=environment())  # fmt: skip
    print(json.dumps(result["summary"], indent=1))
    out = args.out or REPO / "bench" / "results" / ("gpu" if args.device == "cuda" else "full") / "loadaware.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
