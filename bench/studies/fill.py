"""Tune into a registry the kernels a network's compile would miss there, compiled with Winograd's tile sizes as given:
one registry then holds two ways of compiling the network, which ``bench.studies.registries --tiles`` times side by side.

    python -m bench.studies.fill --store DIR --network resnet18 --image 224 --prepack --conv winograd --tiles 4 --trials 128

Each missing kernel is tuned as ``bench.models`` tunes a network's (its full mode's options), in rounds of
``--round-trials`` warm-started from the registry, until it has had ``--trials``; every round is pushed at once. With
``--tiles 4`` on a registry tuned with the hook's (4, 2), the kernels tuned are ResNet-18's 7×7 stage's direct
convolutions: give them the trials the F(2×2) kernels had, and the comparison is at equal budgets.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.dispatch import push_result, start_tuning
from schedhub.tuner.workloads.search import TuneResult

from ..models import MODES, build_network
from ..report import REPO, environment
from .registries import add_network_options, host_network, tile_sizes


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.fill", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="the registry (an LMDB folder) to tune the missing kernels into")
    add_network_options(parser)
    parser.add_argument("--tiles", type=tile_sizes, help="M[,M]: Winograd's tile sizes for this compile")
    parser.add_argument("--trials", type=int, default=128, help="trials per missing kernel")
    parser.add_argument("--round-trials", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "fill.json")
    args = parser.parse_args()
    from schedhub.hooks.rewrites import winograd

    target, network, rewrites, said = host_network(args)
    if args.tiles:
        winograd.TILES = args.tiles  # this process's extraction only
    with tempfile.TemporaryDirectory(prefix="schedhub-fill-") as tmp:
        mod = build_network(network, Path(tmp))[0]
    with LocalRegistry(args.store) as registry:
        missing = [k for k in models.kernels(mod, target, rewrites) if not registry.get(k.identity.key)]
        options = replace(MODES["full"]["options"], trials=args.round_trials, trials_per_iter=args.round_trials)
        rows: list[dict[str, Any]] = []
        cluster.start()
        try:
            for kernel in missing:
                started, spent, best = time.time(), 0, None
                while spent < args.trials:
                    result = TuneResult.from_dict(cluster.result(start_tuning(registry, kernel.identity, options, f"fill {kernel.name}")))
                    push_result(registry, result)
                    best = result.ranked_times()[0]
                    if not result.trials:  # nothing left to measure: stop rather than ask again
                        break
                    spent += result.trials
                rows.append({"kernel": kernel.name, "key": kernel.identity.key, "calls": kernel.calls, "trials": spent, "minutes": (time.time() - started) / 60,
                             "best_ranked_us": best * 1e6 if best else None})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
        finally:
            cluster.stop()
    tiles = f" --tiles {','.join(map(str, args.tiles))}" if args.tiles else ""
    recorded = {"command": f"python -m bench.studies.fill --store DIR {said}{tiles} --trials {args.trials} --round-trials {args.round_trials}",
              "kernels": rows, "environment": environment()}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(recorded, indent=1, default=str))


if __name__ == "__main__":
    main()
