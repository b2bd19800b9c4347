"""Would timing candidates built at a lower LLVM opt level pick the same schedules, for less compile?

Synthesis (``use(..., measure=, synthesize=)``) spends most of a first compile in LLVM building the
candidates it times. This draws ``--samples`` design-space schedules of every kernel of a network,
builds and times each at every ``--levels`` opt level (the ``opt-level`` target attribute), and
reports, per level, the build seconds against level 3's and what its picks (each kernel's fastest at
that level) cost when built at level 3, against level 3's own picks. Not part of ``bench all``: the
answer (docs/ARCHITECTURE.md §8) is why ``hooks.kernels.measure`` builds at the target's own level.

    python -m bench.studies.optlevel [--network resnet18] [--shape '{"batch": 2, "image": 96}'] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def measure(network: str, shape: dict[str, int], levels: list[int], samples: int) -> list[dict[str, Any]]:
    """Per kernel: build seconds and run seconds of each sample at each level (None: it did not build, or its
    outputs differ from the default schedule's)."""
    import tvm
    from tvm import tirx
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.kernels.errors import TVM_ERRORS
    from schedhub.hooks.kernels.measure import KernelBench, build
    from schedhub.hooks.metaschedule.msdb import normalize_mod
    from schedhub.hooks.pipeline import fusion_passes
    from schedhub.hooks.metaschedule.synthesis import design_space_samples
    from schedhub.tuner.networks import models
    from schedhub.tuner.execution import tvm_env

    tvm_env.prepare()
    base = tvm_env.host_target()
    targets = {level: tvm.target.Target(dict(base, **{"opt-level": level})) for level in levels}
    mod, _, _ = models.export(network, **shape)
    with tvm.target.Target(base):
        fused = fusion_passes()(mod)
    rows = []
    for gv, func in fused.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        normalized = normalize_mod(func)
        drawn = design_space_samples(normalized, tvm.target.Target(base), samples)
        if len(drawn) < 2:
            continue
        args_info = [a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(func)]
        row: dict[str, Any] = {"kernel": gv.name_hint, "build_secs": {}, "secs": {}}
        for level, target in targets.items():
            bench = KernelBench(build(normalized, target), args_info, target)  # outputs each sample must agree with
            builds, runs = [], []
            for sch in drawn:
                started = time.perf_counter()
                try:
                    lib = build(sch.mod, target)
                except TVM_ERRORS:
                    builds.append(None)
                    runs.append(None)
                    continue
                builds.append(time.perf_counter() - started)
                runs.append(bench.time(lib).secs)
            row["build_secs"][str(level)], row["secs"][str(level)] = builds, runs
        rows.append(row)
        print(f"{gv.name_hint}: " + ", ".join(f"level {lv} built in {sum(b for b in row['build_secs'][str(lv)] if b):.1f} s" for lv in levels), flush=True)
    return rows


def summarize(rows: list[dict[str, Any]], level: str) -> dict[str, float]:
    """``level``'s build seconds over level 3's, and its picks' level-3 time over level 3's picks' (summed over
    kernels), with the median rank correlation of the two levels' times per kernel."""
    from scipy.stats import spearmanr

    builds = [0.0, 0.0]
    picks = [0.0, 0.0]
    correlations = []
    for row in rows:
        at3, at_level = row["secs"]["3"], row["secs"][level]
        ok = [i for i in range(len(at3)) if at3[i] and at_level[i]]
        if len(ok) < 2:
            continue
        picks[0] += at3[min(ok, key=lambda i: at_level[i])]
        picks[1] += min(at3[i] for i in ok)
        builds[0] += sum(row["build_secs"][level][i] for i in ok)
        builds[1] += sum(row["build_secs"]["3"][i] for i in ok)
        correlations.append(float(spearmanr([at3[i] for i in ok], [at_level[i] for i in ok])[0]))
    return {"build_ratio": builds[0] / builds[1], "picks_ratio": picks[0] / picks[1], "median_rank_correlation": float(np.median(correlations))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--network", default="resnet18")
    parser.add_argument("--shape", default='{"batch": 2, "image": 96}', help="the network's shape, a JSON object")
    parser.add_argument("--levels", default="3,1,0", help="LLVM opt levels, 3 included")
    parser.add_argument("--samples", type=int, default=8, help="design-space samples a kernel")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if 3 not in levels:
        parser.error("--levels must include 3, the level the others are judged against")
    rows = measure(args.network, json.loads(args.shape), levels, args.samples)
    summary = {str(level): summarize(rows, str(level)) for level in levels if level != 3}
    for level, s in summary.items():
        print(f"opt-level {level}: builds {s['build_ratio']:.2f}x level 3's; its picks {s['picks_ratio']:.2f}x level 3's picks; "
              f"median rank correlation {s['median_rank_correlation']:.2f}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"network": args.network, "shape": json.loads(args.shape), "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
