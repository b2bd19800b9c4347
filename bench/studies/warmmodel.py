"""Does a search whose cost model starts trained on the registry's log reach a cold search's best in fewer trials?

    python -m bench.studies.warmmodel [--network resnet18 --image 64] [--kernels 2] [--trials 64] [--seeds 0,1]
    python -m bench.studies.warmmodel --log-store DIR [--prepack] [--layout NHWC] [--conv winograd] --image 160 ...

For each of the network's ``--kernels`` heaviest kernels (calls x FLOPs) the registry's verified log is filled: the
same kernel at another image size is tuned first (``--neighbour-image``), or the log is a copy of a registry that
tuned the network before (``--log-store``: every logged workload of the kernel's structure, as a worker's model would
read them; with ``--prepack`` the kernels are extracted as that registry's ``--prepack`` runs tuned them). Then the
kernel itself is searched twice per seed with the same options, no warm-start traces and no synthesized seeds: cold
(MetaSchedule's model starts empty) and warm (``TuneOptions.warm_model``: the model starts trained on that log).
Recorded: each search's curve (best so far after each measured candidate) and how many trials the warm one needed to
reach the cold one's best.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import Rewrites
from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.dispatch import push_result, submit_tuning
from schedhub.tuner.workloads.logmodel import model_log
from schedhub.tuner.networks.network import heaviest_first
from schedhub.tuner.workloads.search import TuneOptions, TuneResult

from ..report import REPO, environment

OPTIONS = TuneOptions(trials=64, trials_per_iter=16, population=128, genetic_iters=2, publish=1, warm_start=0, synthesize=0, search_threads=1,
                      final_timing={"number": 3, "repeat": 3, "min_repeat_ms": 20})  # fmt: skip


def trials_to_reach(curve: list[tuple[int, float]], secs: float) -> int | None:
    """The first measured candidate at which ``curve``'s best is at or under ``secs`` (None: never)."""
    return next((n for n, best in curve if best <= secs), None)


def fill_from_neighbours(reg: LocalRegistry, args: argparse.Namespace, wanted: list[Any], target: Any, rewrites: Rewrites, options: TuneOptions) -> None:
    """Tune, at ``--neighbour-image``, the kernel of the same structure as each of the ``--kernels`` heaviest of
    ``wanted`` and push it: the registry's log then holds those trials."""
    neighbours = {k.identity.structure: k for k in models.kernels(models.export_with_weights(args.network, batch=1, image=args.neighbour_image)[0], target, rewrites)}
    for kernel in heaviest_first(k for k in wanted if k.identity.structure in neighbours)[: args.kernels]:
        neighbour = neighbours[kernel.identity.structure]
        push_result(reg, TuneResult.from_dict(cluster.result(submit_tuning(neighbour.identity, options, [], [], f"fill {neighbour.identity.op}"))))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.warmmodel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet18")
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--neighbour-image", type=int, default=96)
    parser.add_argument("--kernels", type=int, default=2)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--population", type=int, default=OPTIONS.population, help="the evolutionary search's population, both searches")
    parser.add_argument("--log-store", type=Path, help="train on a copy of this registry's log instead of tuning neighbours")
    parser.add_argument("--prepack", action="store_true", help="the kernels with their weights prepacked (hooks.use(..., prepack=True))")
    parser.add_argument("--layout", default="given", help="the convolutions' layout (hooks.use(..., layout=...)), as the log's runs tuned them")
    parser.add_argument("--conv", default="direct", help="the 3x3 convolutions' algorithm (hooks.use(..., conv=...)), as the log's runs tuned them")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "warm-model.json")
    args = parser.parse_args()
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    rewrites = Rewrites(prepack=args.prepack, layout=args.layout, conv=args.conv)
    wanted = models.kernels(models.export_with_weights(args.network, batch=1, image=args.image)[0], target, rewrites)
    options = replace(OPTIONS, trials=args.trials, population=args.population)
    rows: list[dict[str, Any]] = []
    cluster.start()
    try:
        with tempfile.TemporaryDirectory(prefix="schedhub-warm-") as tmp:
            store = Path(tmp) / "store"
            if args.log_store:
                shutil.copytree(args.log_store, store)
            with LocalRegistry(store) as reg:
                if not args.log_store:
                    fill_from_neighbours(reg, args, wanted, target, rewrites, options)
                logs = {k.identity.key: model_log(reg, k.identity) for k in wanted}
                heaviest = heaviest_first(k for k in wanted if logs[k.identity.key])[: args.kernels]
                for kernel in heaviest:
                    log = logs[kernel.identity.key]
                    for seed in (int(s) for s in args.seeds.split(",")):
                        runs = {}
                        for name, opts in (("cold", replace(options, seed=seed)), ("warm", replace(options, seed=seed, warm_model=True))):
                            result = TuneResult.from_dict(cluster.result(submit_tuning(kernel.identity, opts, [], [], f"{name} {kernel.identity.op}", log)))
                            runs[name] = [[n, secs] for n, secs in result.curve]
                        cold_best = runs["cold"][-1][1]
                        reached = trials_to_reach([(n, s) for n, s in runs["warm"]], cold_best)
                        row = {"kernel": kernel.identity.op, "seed": seed, "log_trials": sum(len(t) for _, t in log), "cold_best_us": cold_best * 1e6,
                               "warm_best_us": runs["warm"][-1][1] * 1e6, "cold_trials": runs["cold"][-1][0], "warm_trials_to_cold_best": reached,
                               "cold_trials_to_own_best": trials_to_reach([(n, s) for n, s in runs["cold"]], cold_best), "curves": runs}  # fmt: skip
                        rows.append(row)
                        print(json.dumps({k: v for k, v in row.items() if k != "curves"}), flush=True)
    finally:
        cluster.stop()
    result = {"command": "python -m bench.studies.warmmodel " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
              "options": options.__dict__, "rows": rows, "environment": environment()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
