"""Why a network runs slower than its kernels alone, and whether tuning with the cache flushed closes the gap.

    python -m bench.studies.cache_flush --store DIR [--network resnet18 --image 224] [--prepack] [--conv winograd]
                                        [--kernels 4] [--trials 64] [--rounds 5]

1. The network compiles through the hook from ``--store`` (a registry that tuned it) and runs with every VM call timed
   by an instrument: each kernel's time inside the network against its time alone (its best record's, which the
   tuner timed as MetaSchedule does: the same arguments again and again, so its weights stay in cache).
2. The ``--kernels`` kernels that lose most inside the network are searched again, ``--trials`` each, warm-started
   from the store's records, twice with the same seed: timed as before (``plain``), and with every argument but the
   first flushed from the CPU's caches before each run (``flushed``: MetaSchedule's ``cache_flush_cpu_non_first_arg``,
   Ansor's ``enable_cpu_cache_flush``), as a network's kernel finds its weights. A kernel's first argument is its
   input, which the kernel before it has just written.
3. Three registries hold the store's best record of every kernel: as they are (``store``), and with each searched
   kernel's record replaced by its ``plain`` or ``flushed`` search's best. The network compiled from each is timed side
   by side with PyTorch's (its own process), and profiled again call by call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from schedhub.hooks.rewrites import Rewrites
from schedhub.registry import LocalRegistry, Registry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.dispatch import start_tuning
from schedhub.tuner.workloads.search import TuneOptions, TuneResult
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import TORCH_TWINS, check_agreement, network_input, time_side_by_side
from ..report import REPO, environment
from ..stats import ratio
from ..torch_export import import_twin

OPTIONS = TuneOptions(trials=64, trials_per_iter=16, population=128, genetic_iters=2, publish=3, synthesize=0, seeds=0)
PROFILE_RUNS = 9


def flushed(options: TuneOptions) -> TuneOptions:
    """``options`` with every candidate and the final re-timing run on flushed caches."""
    return replace(options, timing={**options.timing, "flush_cache": True}, final_timing={**options.final_timing, "flush_cache": True})


def compiled(mod: Any, target: Any, store: Path, rewrites: Rewrites) -> Any:
    """The network built through the hook from ``store``, every kernel a hit."""
    import tvm

    from schedhub.hooks import use

    with use(store, target, layout=rewrites.layout, math=rewrites.math, prepack=rewrites.prepack, conv=rewrites.conv, report_misses=False) as session:
        ex = tvm.compile(mod, target)
    if session.report.misses or session.report.transfers:
        raise RuntimeError(f"{store}: {session.report.summary()}")
    return ex


def profile_calls(ex: Any, x: np.ndarray, func: str = "main") -> dict[str, float]:
    """Median ms per forward pass of each function the VM calls (a kernel called twice: both calls), over
    :data:`PROFILE_RUNS` passes timed by an instrument around every call. Kernel names lose the hook's
    ``_prepacked`` suffix."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    arg = tvm.runtime.tensor(x)
    for _ in range(3):
        vm[func](arg)
    started: dict[str, float] = {}
    current: dict[str, float] = defaultdict(float)

    def instrument(_func: Any, name: str, before: bool, _ret: Any, *_args: Any) -> int:
        if before:
            started[name] = time.perf_counter()
        else:
            current[name] += time.perf_counter() - started.pop(name)
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    runs = []
    for _ in range(PROFILE_RUNS):
        current.clear()
        vm[func](arg)
        runs.append(dict(current))
    return {name.removesuffix("_prepacked"): statistics.median(r.get(name, 0.0) for r in runs) * 1e3 for name in runs[0]}


def best_records(registry: Registry, keys: list[str]) -> dict[str, Any]:
    """Each key's best record."""
    return {key: records[0] for key, records in registry.lookup(keys).items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.cache_flush", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a registry that tuned the network with these rewrites")
    parser.add_argument("--network", default="resnet18")
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--prepack", action="store_true")
    parser.add_argument("--conv", default="direct")
    parser.add_argument("--kernels", type=int, default=4, help="search again the kernels that lose most inside the network")
    parser.add_argument("--trials", type=int, default=OPTIONS.trials)
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds of the compiled networks")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "cache-flush.json")
    args = parser.parse_args()
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    rewrites = Rewrites(prepack=args.prepack, conv=args.conv)
    shape = {"batch": 1, "image": args.image}
    _, weights, input_shape = models.export_with_weights(args.network, **shape)
    x = network_input(input_shape)
    result: dict[str, Any] = {"command": "python -m bench.studies.cache_flush " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
                              "environment": environment()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="schedhub-flush-") as tmp:
        mod = import_twin(args.network, weights, shape, Path(tmp))
        kernels = models.kernels(mod, target, rewrites)
        by_name = {k.name: k for k in kernels}
        stores = {name: Path(tmp) / name for name in ("store", "plain", "flushed")}
        with LocalRegistry(args.store) as source:
            best = best_records(source, [k.identity.key for k in kernels])
            with LocalRegistry(stores["store"]) as reg:
                reg.put_many(list(best.values()))
            inside = profile_calls(compiled(mod, target, stores["store"], rewrites), x)
            alone = {k.name: best[k.identity.key].mean_secs * 1e3 * k.calls for k in kernels}
            excess = sorted((name for name in alone if name in inside), key=lambda n: alone[n] - inside[n])
            chosen = [by_name[name] for name in excess[: args.kernels]]
            searched_keys = {k.identity.key for k in chosen}
            for arm in ("plain", "flushed"):  # the searched kernels' records are the arm's search's only: the store's
                with LocalRegistry(stores[arm]) as reg:  # would win on a time taken another way
                    reg.put_many([record for key, record in best.items() if key not in searched_keys])
            result["before"] = {"inside_ms": inside, "alone_ms": alone, "searched": [k.name for k in chosen]}
            print(json.dumps({n: [round(inside[n], 3), round(alone[n], 3)] for n in excess}), flush=True)
            searched: dict[str, dict[str, Any]] = defaultdict(dict)
            cluster.start()
            try:
                for kernel in chosen:
                    for arm, options in (("plain", replace(OPTIONS, trials=args.trials)), ("flushed", flushed(replace(OPTIONS, trials=args.trials)))):
                        found = TuneResult.from_dict(cluster.result(start_tuning(source, kernel.identity, options, f"{arm} {kernel.name}")))
                        with LocalRegistry(stores[arm]) as reg:
                            reg.put_many(found.records)
                        searched[kernel.name][arm] = {"best_ms": (found.best_secs or found.untuned_secs) * 1e3, "trials": found.trials}
                        print(kernel.name, arm, json.dumps(searched[kernel.name][arm]), flush=True)
            finally:
                cluster.stop()
        executables = {name: compiled(mod, target, store, rewrites) for name, store in stores.items()}
        result["after"] = {name: profile_calls(ex, x) for name, ex in executables.items()}
        with TorchProcess(cwd=REPO) as torch_proc:
            twin = torch_proc.load_network(args.network, weights, x, factory=TORCH_TWINS, **shape)
            timing, errors = time_side_by_side(executables, x, args.rounds, twin, torch_proc.time_network, func="main")
    check_agreement(args.network, errors)
    result["searched"] = searched
    result["timing_ms"] = timing
    result["vs_store"] = {name: ratio(timing["store"], timing[name], paired=True) for name in ("plain", "flushed")}
    result["vs_pytorch"] = {name: ratio(timing["pytorch"], timing[name], paired=True) for name in executables}
    print(json.dumps({k: result[k] for k in ("searched", "vs_store", "vs_pytorch")}, indent=1, default=str))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
