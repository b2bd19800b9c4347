"""Whether MetaSchedule tunes ResNet's 3×3 convolutions faster as Winograd's F(4×4, 3×3) (``hooks.rewrites.winograd``) than as
direct convolutions on this CPU: each of ResNet-18@224's four 3×3 stride-1 shapes, as a layer (convolution + bias +
ReLU, weights bound and prepacked, as ``bench.models --prepack`` compiles the network), searched both ways with the same
trials, options and seed, from a cold start; PyTorch's convolution (oneDNN, its own process) beside them.

    python -m bench.studies.winograd [--trials 64] [--shapes 56x64,28x128,14x256,7x512] [--tiles 4,2]

Recorded per shape and algorithm (direct, and F(m×m, 3×3) for each m of ``--tiles``: ``winograd4``, ``winograd2``):
untuned and best time (the tuner's side-by-side re-measurement), warm and on flushed caches (what the registry ranks
by, and what a layer whose weights come from memory pays in a network), the direct convolution's GFLOPS at the warm
time (the same work either way), the search's wall time; per shape, PyTorch's time. The practical peak (a 2048² sgemm
in PyTorch) is timed after the cluster stops, with PyTorch's convolutions.

Every shape is computed by each Winograd tile here, those with fewer output tiles than a compile's
``hooks.rewrites.winograd.MIN_TILES`` too (ResNet's 7×7 stage): the study is what that threshold and ``TILES`` rest on.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedhub.tuner.execution import cluster, tvm_env

from schedhub.tuner.networks import models
from schedhub.hooks.rewrites import Rewrites
from schedhub.hooks.rewrites import winograd
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import practical_peak
from ..report import REPO, environment
from .layout import OPTIONS, cold_search


def layer(size: int, channels: int) -> Any:
    """A 3×3 stride-1 convolution (padding 1) of ``channels`` to ``channels`` on ``size``², with bias and ReLU, weights bound."""
    import numpy as np
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = relax.const((rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype("float32"))
            bias = relax.const(rng.standard_normal((1, channels, 1, 1)).astype("float32"))
            conv = bb.emit(relax.op.nn.conv2d(x, weight, padding=1))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.add(conv, bias))))
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.winograd", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--shapes", default="56x64,28x128,14x256,7x512", help="SIZExCHANNELS,... (ResNet-18@224's 3×3 stride-1 convolutions)")
    parser.add_argument("--tiles", default="4", help="the m of each F(m×m, 3×3) to compare with the direct convolution")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "winograd.json")
    args = parser.parse_args()
    import tvm

    tvm_env.prepare()
    winograd.MIN_TILES = 1  # this process's extraction only: every shape by Winograd (module docstring)
    target = tvm.target.Target(tvm_env.host_target())
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    algorithms = [("direct", None)] + [(f"winograd{m}", int(m)) for m in args.tiles.split(",")]
    options = replace(OPTIONS, trials=args.trials, trials_per_iter=min(OPTIONS.trials_per_iter, args.trials))
    result: dict[str, Any] = {"command": f"python -m bench.studies.winograd --trials {args.trials} --shapes {args.shapes} --tiles {args.tiles}",
                              "options": options.__dict__, "layers": [], "environment": environment()}  # fmt: skip
    cluster.start()
    try:
        for i, (size, channels) in enumerate(shapes):
            flops = 2.0 * size * size * channels * channels * 9
            row: dict[str, Any] = {"size": size, "channels": channels, "gflop": flops / 1e9}
            for name, tile in algorithms if i % 2 == 0 else algorithms[::-1]:
                if tile:
                    winograd.TILES = (tile,)  # this process's extraction only
                kernel = next(k for k in models.kernels(layer(size, channels), target, Rewrites(prepack=True, conv="winograd" if tile else "direct")) if "conv2d" in k.name)
                row[name] = {**cold_search(kernel.identity, options, f"{name}:{size}x{channels}", flops), "args_info": kernel.identity.args_info}
            for name, _ in algorithms[1:]:
                row[f"{name}_speedup"] = row["direct"]["best_us"] / row[name]["best_us"]
                row[f"{name}_flushed_speedup"] = row["direct"]["best_flushed_us"] / row[name]["best_flushed_us"]
            result["layers"].append(row)
    finally:
        cluster.stop()
    with TorchProcess(cwd=REPO) as torch_proc:
        for row in result["layers"]:
            secs = torch_proc.time_kernel(row["direct"]["op"], row["direct"]["args_info"], repeat=5, min_secs=0.2)
            row["pytorch_us"] = None if secs is None else secs * 1e6
        result["peak_gflops"] = practical_peak(torch_proc)
    print(json.dumps({"peak_gflops": result["peak_gflops"], "layers": [{k: v for k, v in r.items() if not isinstance(v, dict)}
                                                                         | {c: (r[c]["best_us"], r[c]["best_flushed_us"]) for c, _ in algorithms} for r in result["layers"]]}, indent=1))  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
