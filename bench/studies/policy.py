"""Where a network's tuning trials go: the gradient policy against even budgets at the same total trials.

    python -m bench.studies.policy [--network resnet18 --image 64 --batch 1] [--per-kernel 12] [--round-trials 8]

Each policy tunes the network into a registry of its own (``tuner.networks.network.tune_network``: rounds of
``--round-trials``, warm-started from that registry), with the same options, seed and total trials (``--per-kernel``
times the kernels). Recorded per round: the kernel, the trials spent, the network's estimate (Σ calls × best). Then
the network is compiled through the hook from each registry and timed side by side with its untuned build and its
PyTorch twin (in a process of its own, after TVM's pool has gone idle): the latency each policy's trials bought.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.networks.allocation import POLICIES, Goal
from schedhub.tuner.networks.network import tune_network
from schedhub.tuner.workloads.search import TuneOptions
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import TORCH_TWINS, check_agreement, network_input, time_side_by_side
from ..report import REPO, environment
from ..stats import ratio

OPTIONS = TuneOptions(trials=8, trials_per_iter=8, population=64, genetic_iters=1, publish=2, final_timing={"number": 3, "repeat": 3, "min_repeat_ms": 20})


def compiled(mod: Any, target: Any, store: Path | None) -> tuple[Any, str]:
    """The network built plain (``store`` None) or through the hook from ``store``; and the hook's summary."""
    import tvm

    from schedhub.hooks import use

    if store is None:
        return tvm.compile(mod, target), ""
    with use(store, target, report_misses=False, transfer=False) as session:
        return tvm.compile(mod, target), session.report.summary()


def tune_each(stores: dict[str, Path], kernels: list[Any], budget: int, round_trials: int, result: dict[str, Any]) -> None:
    """Each policy tunes the network into its own registry (``stores``), the same options, seed and budget."""
    cluster.start()
    try:
        for name, store in stores.items():
            started = time.time()
            with LocalRegistry(store) as reg:
                state = tune_network(reg, [(k.identity, k.calls) for k in kernels], replace(OPTIONS, seed=0), POLICIES[name],
                                     Goal(max_trials=budget), round_trials=round_trials,
                                     on_round=lambda r: print(f"{name} round {r.number}: {r.kernel.op} {r.trials_spent} trials, "
                                                              f"network {(r.network_secs or 0) * 1e3:.3f} ms", flush=True))  # fmt: skip
            result["policies"][name] = {
                "wall_secs": time.time() - started, "trials": state.trials, "estimate_ms": (state.network_secs or 0) * 1e3,
                "rounds": [{"kernel": r.kernel.op, "calls": r.kernel.calls, "trials": r.trials_spent, "elapsed_secs": r.elapsed_secs,
                            "estimate_ms": (r.network_secs or 0) * 1e3} for r in state.rounds],
                "per_kernel_trials": {k.op: k.trials for k in state.kernels},
            }  # fmt: skip
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.policy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet18")
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--per-kernel", type=int, default=12, help="the total budget: this many trials times the kernels")
    parser.add_argument("--round-trials", type=int, default=8)
    parser.add_argument("--policies", default="gradient,even")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds of the compiled networks")
    parser.add_argument("--keep", type=Path, help="keep each policy's registry in DIR/<policy> (default: a temporary folder)")
    parser.add_argument("--retime", action="store_true", help="with --keep: time the networks the kept registries serve, tuning nothing")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "policy.json")
    args = parser.parse_args()
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    shape = {"image": args.image} if args.network in ("resnet18", "mobilenetv2") else {}
    mod, weights, input_shape = models.export_with_weights(args.network, batch=args.batch, **shape)
    kernels = models.kernels(mod, target, NO_REWRITES)
    budget = args.per_kernel * len(kernels)
    result: dict[str, Any] = {"command": "python -m bench.studies.policy " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
                              "network": args.network, "shape": {"batch": args.batch, **shape}, "kernels": len(kernels), "budget_trials": budget,
                              "round_trials": args.round_trials, "policies": {}, "environment": environment()}  # fmt: skip
    if args.retime and not args.keep:
        raise SystemExit("--retime times the registries --keep names")
    with tempfile.TemporaryDirectory(prefix="schedhub-policy-") as tmp:
        stores: dict[str, Path] = {name: (args.keep or Path(tmp)) / name for name in args.policies.split(",")}
        if args.retime:
            previous = json.loads(args.out.read_text())
            result["policies"] = previous["policies"]
        else:
            tune_each(stores, kernels, budget, args.round_trials, result)
        executables, summaries = {}, {}
        for name, store in {"untuned": None, **stores}.items():
            executables[name], summaries[name] = compiled(mod, target, store)
        x = network_input(input_shape)
        with TorchProcess(cwd=REPO) as torch_proc:
            twin = torch_proc.load_network(args.network, weights, x, factory=TORCH_TWINS, batch=args.batch, **shape)
            timing, errors = time_side_by_side(executables, x, args.rounds, twin, torch_proc.time_network)
    check_agreement(args.network, errors)
    result["timing_ms"] = timing
    result["hook"] = summaries
    result["vs_even"] = {name: ratio(timing["even"], timing[name], paired=True) for name in stores if name != "even" and "even" in stores}
    result["vs_pytorch"] = {name: ratio(timing["pytorch"], timing[name], paired=True) for name in executables}
    print(json.dumps({k: result[k] for k in ("timing_ms", "vs_even", "vs_pytorch")}, indent=1, default=str))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
