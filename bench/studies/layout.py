"""Which convolution layout MetaSchedule tunes fastest on this CPU: the network's heaviest convolutions searched in the
layout the frontend gives (NCHW) and converted to NHWC (``hooks.rewrites.layouts``), the same trials, options and seed.

    python -m bench.studies.layout [--network resnet18 --image 224] [--kernels 3] [--trials 64] [--prepack] [--conv winograd]

The network is ResNet-18's (or MobileNet-V2's) PyTorch twin imported through ``torch.export``, as users import one.
Its kernels are extracted in each layout with the hook's passes; the ``--kernels`` costliest convolutions (FLOPs ×
calls) are tuned from a cold start (no registry traces, no synthesized seeds) on a local Ray cluster, the layouts
alternating which goes first. Recorded per kernel and layout: untuned and best time (the tuner's side-by-side
re-measurement), GFLOPS, the search's wall time. The practical peak (a 2048² sgemm in PyTorch, its own process) is
timed after the cluster stops. ``--prepack`` and ``--conv winograd`` extract the kernels with those rewrites too (in both
layouts); with Winograd the convolutions compared are those it leaves direct (the strided ones and the stem).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedhub.tuner.execution import cluster, tvm_env

from schedhub.tuner.networks import models
from schedhub.hooks.rewrites.layouts import LAYOUTS
from schedhub.hooks.rewrites import Rewrites
from schedhub.tuner.networks.network import workload_flops
from schedhub.tuner.workloads.search import TuneOptions, tune_workload
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import practical_peak
from ..report import REPO, environment
from ..torch_export import import_twin

#: The full mode's search (bench.models): rounds of 16 from a population of 128 × 2 genetic rounds; nothing warm.
OPTIONS = TuneOptions(trials=64, trials_per_iter=16, population=128, genetic_iters=2, warm_start=0, synthesize=0, seeds=0)


def heaviest_convolutions(kernels: list[models.Kernel], count: int) -> list[tuple[models.Kernel, float]]:
    """The ``count`` direct convolution kernels that cost the network most FLOPs (FLOPs × calls), with one call's FLOPs."""
    convs = [(k, workload_flops(k.identity)) for k in kernels if "conv2d" in k.identity.op and "winograd" not in k.identity.op]
    return sorted(convs, key=lambda kf: kf[1] * kf[0].calls, reverse=True)[:count]


def cold_search(identity: Any, options: TuneOptions, label: str, flops: float) -> dict[str, Any]:
    """One kernel searched from a cold start on the cluster this process is connected to, printed as one line: its
    untuned and best times (the tuner's side-by-side re-measurement), GFLOPS at ``flops``, wall seconds and trials."""
    started = time.time()
    tuned = tune_workload(identity, [], options, label)
    best = tuned.best_secs or float("nan")
    flushed = min((r.flushed_secs for r in tuned.records if r.flushed_secs), default=float("nan"))
    row = {"op": identity.op, "key": identity.key, "untuned_us": tuned.untuned_secs * 1e6, "best_us": best * 1e6, "gflops": flops / best / 1e9,
           "best_flushed_us": flushed * 1e6, "wall_secs": time.time() - started, "trials": tuned.trials}  # fmt: skip
    print(f"{label:<44} untuned {row['untuned_us']:9.1f} µs  best {row['best_us']:9.1f} µs (flushed {row['best_flushed_us']:9.1f})  "
          f"{row['gflops']:6.1f} GFLOPS  {row['wall_secs']:5.0f} s", flush=True)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.layout", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet18", choices=["resnet18", "mobilenetv2"])
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--kernels", type=int, default=3)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--prepack", action="store_true", help="weights prepacked (hooks.rewrites), in both layouts")
    parser.add_argument("--conv", default="direct", help="winograd: compare the convolutions Winograd leaves direct")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "layout.json")
    args = parser.parse_args()
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    _, weights, _ = models.export_with_weights(args.network, batch=1, image=args.image)
    with tempfile.TemporaryDirectory(prefix="schedhub-layout-") as tmp:
        mod = import_twin(args.network, weights, {"batch": 1, "image": args.image}, Path(tmp))
    rewrites = {layout: Rewrites(layout, prepack=args.prepack, conv=args.conv) for layout in LAYOUTS}
    chosen = {layout: heaviest_convolutions(models.kernels(mod, target, rewrites[layout]), args.kernels) for layout in LAYOUTS}
    options = replace(OPTIONS, trials=args.trials, trials_per_iter=min(OPTIONS.trials_per_iter, args.trials))
    said = f"--network {args.network} --image {args.image} --kernels {args.kernels} --trials {args.trials}" + "".join(f" {f}" for f in rewrites["given"].flags())
    result: dict[str, Any] = {"command": f"python -m bench.studies.layout {said}",
                              "network": args.network, "image": args.image, "frontend": "torch.export", "options": options.__dict__, "kernels": [],
                              "environment": environment()}  # fmt: skip
    cluster.start()
    try:
        for i in range(args.kernels):
            row: dict[str, Any] = {}
            for layout in LAYOUTS if i % 2 == 0 else LAYOUTS[::-1]:
                kernel, flops = chosen[layout][i]
                row[layout] = {**cold_search(kernel.identity, options, f"{layout}:{kernel.identity.op}", flops), "calls": kernel.calls, "gflop": flops / 1e9}
            row["nhwc_speedup"] = row["given"]["best_us"] / row["NHWC"]["best_us"]
            result["kernels"].append(row)
    finally:
        cluster.stop()
    with TorchProcess(cwd=REPO) as torch_proc:
        result["peak_gflops"] = practical_peak(torch_proc)
    print(json.dumps({"peak_gflops": result["peak_gflops"], "nhwc_speedup": [r["nhwc_speedup"] for r in result["kernels"]]}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
