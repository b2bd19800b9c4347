"""Measurement isolation: is a kernel timed alone while the tuner's driver works beside it?

    python -m bench.isolation [--quick] [--out bench/results/<mode>/isolation.json]

A measurement task holds every CPU its kernel runs threads on, so Ray starts nothing beside it. Work
the driver does outside Ray (drawing synthesized seeds: training, sampling, scoring) is not a Ray task;
since it is done inside ``cluster.holding_driver_cpu()``, it holds a CPU of its node too. One tuned
kernel (the tuner bench's ResNet-18 3×3 convolution, two threads, tuned as the model bench's quick mode tunes) is timed by a real measurement task on
a local 2-CPU Ray cluster, the three conditions interleaved in each round:

- **alone**;
- **beside driver work, not held**: a driver thread runs pure-Python work for as long as the measurement
  takes (what seeding did before it held a CPU);
- **beside driver work, held**: the same work, inside ``cluster.holding_driver_cpu()`` (what seeding does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedhub.tuner.execution import cluster, kernels, tvm_env
from schedhub.tuner.workloads.search import TuneResult

from .models import MODES as MODEL_MODES
from .stats import ratio, summary
from .tuner import TARGET, WORKLOADS, find_kernel

CONDITIONS = ("alone", "beside", "held")
HELD_WORK_SECS = 2.0  # the held work's length: the measurement waits for it


def _python_work(done: Callable[[], bool]) -> None:
    """Pure-Python work on one core until ``done()``."""
    while not done():
        sum(i * i for i in range(1000))


def _timed(artifact: bytes, identity: Any) -> float:
    """The kernel's median seconds per call, timed by a measurement task as the tuner publishes it."""
    answer = cluster.result(cluster.submit("measure", placed=cluster.placement("measure", identity.target), artifacts=[artifact],
                                           args_info=identity.args_info, timing=kernels.FINAL_TIMING, target_text=identity.target))  # fmt: skip
    result = answer["results"][0]
    if not result["run_secs"]:
        raise RuntimeError(result["error"])
    return statistics.median(result["run_secs"])


def _beside(artifact: bytes, identity: Any, held: bool) -> float:
    started, stop = threading.Event(), threading.Event()

    def work() -> None:
        if held:
            with cluster.holding_driver_cpu():
                started.set()
                end = time.perf_counter() + HELD_WORK_SECS
                _python_work(lambda: time.perf_counter() > end)
        else:
            started.set()
            _python_work(stop.is_set)

    thread = threading.Thread(target=work)
    thread.start()
    started.wait()
    try:
        return _timed(artifact, identity)
    finally:
        stop.set()
        thread.join()


def run(rounds: int) -> dict[str, Any]:
    import tvm

    from schedhub.hooks.kernels.identity import workload_module
    from schedhub.hooks.metaschedule.msdb import scheduled
    from schedhub.tuner.workloads.search import replay

    tvm_env.prepare()
    cluster.start(num_cpus=2)
    model, shape, name = WORKLOADS[0]
    identity = find_kernel(model, shape, name, TARGET)
    tuned = TuneResult.from_dict(cluster.result(cluster.submit("tune", identity=identity.to_dict(), warm_traces=[], options=MODEL_MODES["quick"]["options"].__dict__, label="isolation")))
    mod = workload_module(identity.workload)
    built = kernels.build(tvm.ir.save_json(scheduled(mod, replay(mod, tuned.records[0].trace))), identity.target)
    if built["artifact"] is None:
        raise RuntimeError(built["error"])
    samples: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    _timed(built["artifact"], identity)  # a measurement worker with TVM imported
    for _ in range(rounds):
        samples["alone"].append(_timed(built["artifact"], identity) * 1e3)
        samples["beside"].append(_beside(built["artifact"], identity, held=False) * 1e3)
        samples["held"].append(_beside(built["artifact"], identity, held=True) * 1e3)
    cluster.stop()
    ms = {c: summary(v) for c, v in samples.items()}
    return {"kernel": name, "target": TARGET, "rounds": rounds, "held_work_secs": HELD_WORK_SECS, "trace_parallel": "Parallel" in tuned.records[0].trace,
            "ms": ms, "over_alone": {c: ratio(ms[c], ms["alone"], paired=True) for c in ("beside", "held")}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds instead of 10")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    result = run(5 if args.quick else 10)
    result["command"] = "python -m bench.isolation" + (" --quick" if args.quick else "")
    out = args.out or Path(__file__).parent / "results" / mode / "isolation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}: " + ", ".join(f"{c} {result['ms'][c]['median']:.3f} ms" for c in CONDITIONS))


if __name__ == "__main__":
    main()
