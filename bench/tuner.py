"""Tuner benchmark: schedhub's Ray tuner vs plain ``ms.tune_tir``, and what tuning buys.

    python -m bench.tuner [--quick] [--trials 64] [--runs 1] [--out bench/results/full/tuner.json]
    python -m bench.tuner --device cuda [--trials 64] [--workloads NAME,...]   # on a GPU: bench/results/gpu/tuner.json

Workloads are kernels of the shipped models, at their real shapes: ResNet-18's 3×3 convolution on
56×56×64 (``fused_conv2d2_add1_relu1``) and BERT-base's attention output projection, 128×768×768
plus bias and residual (``fused_matmul3_add1_add2``).

Per workload and run, with the same trial budget, candidates per round, seed and
one search thread (so both search the same first-round candidates):

- **ray**: :func:`schedhub.tuner.workloads.search.tune_workload` on a local Ray cluster (2 CPUs): builds as
  parallel tasks, measurements holding the device resource;
- **plain**: ``ms.tune_tir`` with MetaSchedule's LocalBuilder/LocalRunner (the builder given the
  schedhub's build function: the stock one times out on every candidate here) and the same timing.

Search throughput is trials / wall seconds of the search; MetaSchedule's profiler splits each search's
seconds by phase (``tuner.workloads.search.tuning_phases``: search, build, measure, cost model, rest), so a
difference in throughput shows where it arises. Then the best schedule of each, the
target's default (the unscheduled kernel on a CPU, DLight's schedule on a GPU) and, on a CPU,
numpy (``numpy.matmul`` / im2col + GEMM) are timed side by side in one process with longer
repeated timing, outputs checked against the unscheduled kernel built for the CPU.

On a GPU (``--device cuda``) the target is the GPU's own and the Ray cluster has all the
machine's CPUs for parallel builds (the point of Ray there: keep the GPU busy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks.metaschedule.msdb import scheduled, trace_text, tuning_target
from schedhub.tuner.compare import baselines
from schedhub.tuner.execution import cluster, kernels, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.search import (
    TuneOptions, TuneResult, best_so_far, default_schedule, mean_secs, profiled_tune_tir, reference_build, replay, search_settings,
)  # fmt: skip

from .stats import summary

TARGET = {"kind": "llvm", "mcpu": "znver1", "num-cores": 2}
QUICK_SEARCH = {"population": 128, "genetic_iters": 2}  # a quarter of MetaSchedule's search per round: the quick run's budget
WORKLOADS = [("resnet18", {}, "fused_conv2d2_add1_relu1"), ("bert_layer", {}, "fused_matmul3_add1_add2")]
TINY_ARGS = [["TENSOR", "float32", [8]], ["TENSOR", "float32", [8]]]  # :func:`_tiny_mod_json`'s arguments


def flops(args_info: list[Any], op: str) -> float:
    """Multiply-adds ×2 of a matmul or conv2d kernel from its argument shapes; a Winograd convolution's are the direct
    convolution's it replaces (``baselines.direct_equivalent``: it does about 4× fewer, so its GFLOPS are effective ones)."""
    op, args_info = baselines.direct_equivalent(op, args_info)
    shapes = [a[2] for a in args_info]
    out = shapes[-1]
    if "conv2d" in op:
        _, cg, kh, kw = shapes[1]
        n, o, oh, ow = out
        return 2.0 * n * o * oh * ow * cg * kh * kw
    k = shapes[0][-1]
    size = 1
    for d in out:
        size *= d
    return 2.0 * size * k


def require_device(prog: str, device: str) -> None:
    """Stop a benchmark at once, saying why, when this machine has no ``device``."""
    try:
        tvm_env.device_target(device)
    except tvm_env.NoDevice as exc:
        raise SystemExit(f"{prog} --device {device}: {exc}") from None


def find_kernel(model: str, shape: dict[str, int], name: str, target: Any = TARGET) -> Any:
    mod = models.export_with_weights(model, **shape)[0]
    for k in models.kernels(mod, target, NO_REWRITES):
        if k.name == name:
            return k.identity
    raise LookupError(f"{model} has no kernel {name}")


def tune_ray(identity: Any, options: TuneOptions) -> tuple[float, str, list, dict[str, float], dict[str, Any]]:
    """Seconds of search, the best trace, the best-so-far curve, the search's seconds by phase, and what its Ray
    tasks did (:func:`task_summary`)."""
    result = TuneResult.from_dict(cluster.result(cluster.submit("tune", identity=identity.to_dict(), warm_traces=[], options=options.__dict__, label="ray")))
    return result.search_secs, result.records[0].trace, result.curve, result.phases, {"tasks": task_summary(result.events)}


def task_summary(events: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """By kind ("build", "measure"): the search's Ray tasks, the candidates they handled, their seconds inside
    the task summed (from the function's start: a new worker's start and imports come before it; measurements
    run one at a time, so the profiler's measure phase less theirs is Ray's scheduling, worker starts and
    transfers) and the worker processes that ran them."""
    search = [e for e in events if e.get("stage") == "search"]
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({e["kind"] for e in search}):
        mine = [e for e in search if e["kind"] == kind]
        workers = sorted({_worker(e) for e in mine})
        out[kind] = {"tasks": len(mine), "candidates": sum(e["count"] for e in mine), "secs": sum(e["end"] - e["start"] for e in mine),
                     "workers": len(workers), "worker_ids": workers}  # fmt: skip
    return out


def _worker(event: dict[str, Any]) -> str:
    """The worker process a task ran in (a task's event or result): ``host:pid``."""
    return f"{event['host']}:{event['pid']}"


def tune_plain(identity: Any, options: TuneOptions) -> tuple[float, str, list, dict[str, float], dict[str, Any]]:
    """As :func:`tune_ray`, with MetaSchedule's own builder and runner in this process (no Ray tasks)."""
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.kernels.identity import target_from_text, workload_module

    mod = workload_module(identity.workload)
    target = tuning_target(target_from_text(identity.target))
    timing = options.timing
    # Both pools start (2 s each: worker processes importing TVM) before the clock, as Ray's workers do.
    runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(number=timing["number"], repeat=timing["repeat"], min_repeat_ms=timing["min_repeat_ms"]))
    builder = ms.builder.LocalBuilder(f_build=tvm_env.build_kernel)
    with tempfile.TemporaryDirectory() as work_dir:
        t0 = time.time()
        db, phases = profiled_tune_tir(mod, target, work_dir, builder=builder, runner=runner, database="memory", **search_settings(options))
        secs = time.time() - t0
        records = [r for r in db.get_all_tuning_records() if mean_secs(r) < 1e9]  # 1e10 marks a failed run
        return secs, trace_text(min(records, key=mean_secs).trace), best_so_far([mean_secs(r) for r in records]), phases, {}


def side_by_side(identity: Any, traces: dict[str, str], rounds: int) -> dict[str, dict[str, float]]:
    """The target's default ("untuned": unscheduled on a CPU, DLight's on a GPU), each tuned schedule and
    (on a CPU) numpy, timed in this process; medians over ``rounds``."""
    from schedhub.hooks.kernels.identity import target_from_text, workload_module

    mod = workload_module(identity.workload)
    target = target_from_text(identity.target)
    on_cpu = target.kind.name == "llvm"
    modules = {"untuned": default_schedule(mod, target), **{name: scheduled(mod, replay(mod, text)) for name, text in traces.items()}}
    built = {n: tvm_env.library_bytes(tvm_env.build_kernel(m, target)) for n, m in modules.items()}
    host = reference_build(mod, identity.target)
    reference = tvm_env.library_bytes(tvm_env.build_kernel(host[0], target_from_text(host[1]))) if host else built["untuned"]
    names = list(built)
    samples: dict[str, list[float]] = {n: [] for n in names}
    samples["numpy"] = []
    fn = baselines.numpy_kernel(identity.op, identity.args_info) if on_cpu else None
    for _ in range(rounds):
        answer = kernels.measure([built[n] for n in names], identity.args_info, kernels.FINAL_TIMING, reference=reference, target_text=identity.target)
        for n, res in zip(names, answer["results"]):
            if not res["run_secs"]:
                raise RuntimeError(f"{n}: {res['error']}")
            samples[n].append(statistics.median(res["run_secs"]))
        if fn is not None:
            samples["numpy"].append(statistics.median(baselines.time_callable(fn, 5, 0.1)))
    work = flops(identity.args_info, identity.op)
    out = {}
    for n, secs in samples.items():
        if secs:
            s = summary([x * 1e3 for x in secs])
            out[n] = {**s, "gflops": work / (s["median"] * 1e-3) / 1e9}
    return out


def run(trials: int, runs: int, rounds: int, trials_per_iter: int = 16, search: dict[str, int] | None = None, device: str = "cpu",
        only: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """``search``: evolutionary search settings for both tuners (population, genetic_iters); MetaSchedule's defaults if None.
    ``device``: ``"cpu"`` (a fixed 2-core CPU target) or ``"cuda"`` (this machine's GPU); ``only``: these workloads' kernel names."""
    workloads = [w for w in WORKLOADS if not only or w[2] in only]
    if not workloads:
        raise ValueError(f"no workload is named {only}; there are {[w[2] for w in WORKLOADS]}")
    import tvm

    from schedhub.hooks.kernels.identity import target_text

    search = search or {}
    tvm_env.prepare()
    target = json.loads(target_text(TARGET if device == "cpu" else tvm_env.device_target(device)))
    cpus = cluster.start(num_cpus=2 if device == "cpu" else None)["resources"].get("CPU", 1)
    text = target_text(target)
    warm = warm_workers(text, int(cpus))
    # One search thread: the seed fixes the first round's candidates, the same for both tuners.
    base = TuneOptions(trials=trials, trials_per_iter=trials_per_iter, publish=1, search_threads=1, **search)
    out: dict[str, Any] = {"target": target, "device": device, "device_name": str(tvm.cuda(0).device_name) if device == "cuda" else target.get("mcpu"),
                           "cpus": os.cpu_count() or 1, "trials": trials, "trials_per_iter": trials_per_iter, "runs": runs, "workloads": {},
                           "search": {"population": base.population, "genetic_iters": base.genetic_iters, "threads": base.search_threads},
                           "warmed_measure_worker": warm}  # fmt: skip
    for model, shape, name in workloads:
        ident = find_kernel(model, shape, name, target)
        entry: dict[str, Any] = {"op": ident.op, "args_info": ident.args_info, "model": model, "flops": flops(ident.args_info, ident.op), "runs": []}
        for run_i in range(runs):
            options = replace(base, seed=run_i)
            row: dict[str, Any] = {"seed": run_i}
            traces = {}
            for label, fn in (("ray", tune_ray), ("plain", tune_plain)) if run_i % 2 == 0 else (("plain", tune_plain), ("ray", tune_ray)):
                secs, trace, curve, phases, extra = fn(ident, options)
                traces[label] = trace
                row[label] = {"search_secs": secs, "trials_per_sec": trials / secs, "curve_ms": [(i, m * 1e3) for i, m in curve], "phases": phases, **extra}
                print(f"{name} seed {run_i} {label}: {trials} trials in {secs:.1f} s ({trials / secs:.2f}/s), tuner's best {curve[-1][1] * 1e3:.3f} ms"
                      + "".join(f"; {k} tasks {t['tasks']} ({t['candidates']} candidates, {t['workers']} workers{', the warmed one among them' if warm in t['worker_ids'] else ''}) "
                              f"{t['secs']:.1f} s inside" for k, t in extra.get("tasks", {}).items())
                      + "; phases " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()), flush=True)  # fmt: skip
            row["timed"] = side_by_side(ident, traces, rounds)
            entry["runs"].append(row)
            print("  side by side: " + ", ".join(f"{k} {v['median']:.3f} ms ({v['gflops']:.1f} GFLOPS)" for k, v in row["timed"].items()), flush=True)
        out["workloads"][name] = entry
    return out


def warm_workers(text: str, cpus: int) -> str:
    """Start Ray's workers (TVM import, intrinsics) before any clock runs, as the plain tuner's pools start before its:
    one for the tuning task and one per CPU for its builds, and one that has timed a kernel on the device of the target
    ``text`` (on a GPU: a CUDA context). Returns that measuring worker (``host:pid``).

    The warm-up builds hold no CPU, so they run at once, each in a worker of its own (one warm worker left the first job's
    builds waiting for a second to import TVM: ~4 s of a 14 s search). On an H100, 6.6 s of Ray's 11.3 s measure phase was
    outside its tasks with only builds warmed."""
    tiny = _tiny_mod_json(text)
    warmed = [cluster.result(ref) for ref in [cluster.submit("build", placed={"num_cpus": 0}, mod_json=tiny, target_text=text) for _ in range(cpus + 1)]]
    timed = cluster.result(cluster.submit("measure", placed=cluster.placement("measure", text), artifacts=[warmed[0]["artifact"]], args_info=TINY_ARGS,
                                          timing={"number": 1, "repeat": 1, "min_repeat_ms": 1, "flush_cache": False}, target_text=text))  # fmt: skip
    return _worker(timed)


def _tiny_mod_json(text: str) -> str:
    """An 8-element add in the target's default schedule (on a GPU DLight's, bound to threads: unbound, its loop runs on the
    host over device memory, and the measuring worker crashed)."""
    import tvm
    from tvm import te

    from schedhub.hooks.kernels.identity import target_from_text

    a = te.placeholder((8,), name="a")
    mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((8,), lambda i: a[i] + 1.0)])})
    return tvm.ir.save_json(default_schedule(mod, target_from_text(text)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 trials, search population 128 × 2 genetic rounds, 3 timing rounds")
    parser.add_argument("--trials", type=int)
    parser.add_argument("--runs", type=int, default=1, help="tuning runs per workload and tuner (seeds 0..runs-1)")
    parser.add_argument("--rounds", type=int, help="side-by-side timing rounds (default 5)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: this machine's GPU (results under gpu/)")
    parser.add_argument("--workloads", help="comma-separated kernel names (default: all): " + ", ".join(w[2] for w in WORKLOADS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    require_device(parser.prog, args.device)
    trials, rounds = args.trials or (16 if args.quick else 64), args.rounds or (3 if args.quick else 5)
    mode = "gpu" if args.device == "cuda" else "quick" if args.quick else "full"
    out = args.out or Path(__file__).parent / "results" / mode / "tuner.json"
    only = args.workloads.split(",") if args.workloads else None
    result = run(trials, args.runs, rounds, search=QUICK_SEARCH if args.quick else None, device=args.device, only=only)
    result["command"] = (f"python -m bench.tuner{' --quick' if args.quick else ''}{' --device cuda' if args.device == 'cuda' else ''} "
                         f"--trials {trials} --runs {args.runs} --rounds {rounds}" + (f" --workloads {args.workloads}" if only else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
