"""Does a cold search find faster schedules when its cost model ranks candidates after its first batch?

    python -m bench.studies.model_warmup [--network resnet18 --image 224] [--prepack] [--kernels 2] [--trials 64] [--seeds 0,1]

MetaSchedule's XGBoost model scores candidates at random until it has measured 100 of its own
(``tuner.workloads.search.COLD_WARMUP``): every search of up to 100 trials, as the tuner's are, picks the candidates it measures
from the evolutionary search at random. For each of the network's ``--kernels`` heaviest kernels (calls × FLOPs) and
each seed, the kernel is searched twice with the same options, no warm start and no synthesized seeds: ``random`` (the
model's warm-up at 100) and ``ranked`` (``TuneOptions.model_warmup`` at one batch, ``trials_per_iter``: the model
trained on the first batch ranks every later one). Recorded: each search's curve (best so far after each measured
candidate), its best (the tuner's side-by-side re-timing), and how many trials the ranked search
needed to reach the random one's best.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import Rewrites
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.dispatch import submit_tuning
from schedhub.tuner.networks.network import heaviest_first
from schedhub.tuner.workloads.search import TuneResult

from ..report import REPO, environment
from .warmmodel import OPTIONS, trials_to_reach


def searched(result: TuneResult) -> dict[str, Any]:
    """A search's curve, its best (re-timed beside the default schedule) in µs, and its seconds."""
    return {"curve": [[n, secs] for n, secs in result.curve], "best_us": (result.best_secs or float("nan")) * 1e6, "search_secs": result.search_secs}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.model_warmup", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet18")
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--prepack", action="store_true", help="the kernels with their weights prepacked (hooks.use(..., prepack=True))")
    parser.add_argument("--kernels", type=int, default=2)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "model-warmup.json")
    args = parser.parse_args()
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    wanted = models.kernels(models.export_with_weights(args.network, batch=1, image=args.image)[0], target, Rewrites(prepack=args.prepack))
    options = replace(OPTIONS, trials=args.trials, publish=3)
    searches = {"random": options, "ranked": replace(options, model_warmup=options.trials_per_iter)}
    rows: list[dict[str, Any]] = []
    cluster.start()
    try:
        for kernel in heaviest_first(wanted)[: args.kernels]:
            for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
                order = list(searches) if i % 2 == 0 else list(searches)[::-1]
                runs = {name: searched(TuneResult.from_dict(cluster.result(submit_tuning(kernel.identity, replace(searches[name], seed=seed), [], [],
                                                                                            f"{name} {kernel.identity.op}"))))
                        for name in order}  # fmt: skip
                random_best = min(secs for _, secs in runs["random"]["curve"])
                row = {"kernel": kernel.identity.op, "seed": seed, **{f"{name}_{k}": v for name, run in runs.items() for k, v in run.items() if k != "curve"},
                       "ranked_trials_to_random_best": trials_to_reach([(n, s) for n, s in runs["ranked"]["curve"]], random_best),
                       "random_trials_to_own_best": trials_to_reach([(n, s) for n, s in runs["random"]["curve"]], random_best),
                       "curves": {name: run["curve"] for name, run in runs.items()}}  # fmt: skip
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "curves"}), flush=True)
    finally:
        cluster.stop()
    command = f"python -m bench.studies.model_warmup --network {args.network} --image {args.image}{' --prepack' if args.prepack else ''} " \
              f"--kernels {args.kernels} --trials {args.trials} --seeds {args.seeds}"  # fmt: skip
    result = {"command": command, "options": options.__dict__, "rows": rows, "environment": environment()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
