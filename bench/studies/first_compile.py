"""An unseen network's first compile: TVM's default schedules against a sample of each kernel's own design space.

    python -m bench.studies.first_compile [--network resnet18] [--shape image=224] [--samples 1] [--rounds 5]
                                          [--layout NHWC --prepack] [--starter-store DIR] [--out FILE]

What the first-compile issue asks before building anything: with no record and no measurement, how far is the plain
default from PyTorch, and how much of that does the first schedule MetaSchedule's rules draw for each kernel (random
decisions, seeded, postprocessors applied: ``hooks.synthesis.design_space_samples``; with ``--samples N`` the first
of N that replays) recover, at what cost to the compile. Each kernel's sample is served as a record from a fresh
store through ``use(...)``, as a hit would be; PyTorch runs the network's twin in a process of its own, same threads,
same input; the three are timed side by side in interleaved rounds and their outputs checked. ``--starter-store``:
also the network compiled from a copy of a store tuned for other networks, every kernel a transfer where one
replays (the issue's starter records).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from schedhub.hooks.rewrites import Rewrites
from schedhub.tuner import models, tvm_env
from schedhub.tuner.torch_process import TorchProcess

from ..models import TORCH_TWINS, check_agreement, network_input, time_side_by_side
from ..report import REPO, environment


def sampled_records(kernels: list[models.Kernel], target: Any, samples: int) -> tuple[list[Any], float, int]:
    """A record per kernel of its design space's first sample (the kernels whose rules draw none keep the default),
    the seconds the sampling took, and how many kernels got one."""
    from schedhub.hooks.identity import workload_module
    from schedhub.hooks.msdb import normalize_mod, trace_text
    from schedhub.hooks.synthesis import design_space_samples
    from schedhub.registry import Record

    records, start = [], time.perf_counter()
    for kernel in kernels:
        drawn = design_space_samples(normalize_mod(workload_module(kernel.identity.workload)), target, samples)
        if drawn:
            records.append(Record(kernel.identity, trace_text(drawn[0].trace), [1.0], {"source": "bench.studies.first_compile"}))
    return records, time.perf_counter() - start, len(records)


def compiled(mod: Any, store: Path, target: Any, rewrites: Rewrites, transfer: bool = False) -> tuple[Any, float, str]:
    import tvm

    from schedhub import hooks

    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        with hooks.use(store, target, cache=cache, report_misses=False, transfer=transfer, layout=rewrites.layout, prepack=rewrites.prepack) as session:
            ex = tvm.compile(mod, target)
        return ex, time.perf_counter() - start, session.report.summary()


def main() -> None:
    import tvm

    from schedhub.registry import LocalRegistry

    parser = argparse.ArgumentParser(prog="python -m bench.studies.first_compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--network", default="resnet18", choices=models.model_names())
    parser.add_argument("--shape", action="append", default=[], help="a shape option, e.g. image=224 (repeatable)")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layout", default="given")
    parser.add_argument("--prepack", action="store_true")
    parser.add_argument("--starter-store", type=Path, help="a store tuned for other networks: the network compiled from a copy of it too")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shape = {k: int(v) for k, v in (s.split("=", 1) for s in args.shape)}
    rewrites = Rewrites(args.layout, prepack=args.prepack)
    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    mod, weights, input_shape = models.export_with_weights(args.network, **shape)
    x = network_input(input_shape)
    with TorchProcess(cwd=REPO) as torch_proc, tempfile.TemporaryDirectory() as tmp:
        pytorch = torch_proc.load_network(args.network, weights, x, factory=TORCH_TWINS, **shape)
        kernels = models.kernels(mod, target, rewrites)
        empty, sampled = Path(tmp) / "empty", Path(tmp) / "sampled"
        LocalRegistry(empty).close()
        records, sampling_secs, covered = sampled_records(kernels, target, args.samples)
        with LocalRegistry(sampled) as reg:
            for record in records:
                reg.put(record)
        default_ex, default_secs, default_report = compiled(mod, empty, target, rewrites)
        sampled_ex, sampled_secs, sampled_report = compiled(mod, sampled, target, rewrites)
        executables, secs, reports = {"default": default_ex, "sampled": sampled_ex}, {"default": default_secs, "sampled": sampled_secs}, {"default": default_report, "sampled": sampled_report}
        if args.starter_store is not None:
            shutil.copytree(args.starter_store, Path(tmp) / "starter")
            executables["starter"], secs["starter"], reports["starter"] = compiled(mod, Path(tmp) / "starter", target, rewrites, transfer=True)
        timing, errors = time_side_by_side(executables, x, args.rounds, pytorch, torch_proc.time_network)
    check_agreement(args.network, errors)
    result = {
        "command": "python -m bench.studies.first_compile " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v and k not in ("out", "shape"))
                   + "".join(f" --shape {s}" for s in args.shape),
        "network": args.network, "shape": shape, "rewrites": rewrites.describe() or "none", "kernels": len(kernels), "sampled_kernels": covered,
        "sampling_secs": sampling_secs, "compile_secs": secs, "reports": reports, "timing": timing, "max_rel_error": errors,
        "over_pytorch": {name: timing[name]["median"] / timing["pytorch"]["median"] for name in executables},
        "environment": environment(),
    }  # fmt: skip
    print(json.dumps({k: result[k] for k in ("network", "kernels", "sampled_kernels", "sampling_secs", "compile_secs", "over_pytorch")}, indent=1))
    print({k: round(v["median"], 3) for k, v in timing.items()})
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
