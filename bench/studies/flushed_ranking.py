"""Would timing on flushed caches rank a kernel's records as the network does?

    python -m bench.studies.flushed_ranking --pick FILE --store NAME=DIR --store NAME=DIR [--kernels 6] [--out FILE]

``--pick`` is a ``bench.studies.network_pick`` result: each kernel's time inside the network with each registry's best
record. For the ``--kernels`` kernels whose registries' records differ most inside the network, each registry's best
record is timed again side by side on one Ray node, warm (the tuner's timing: the same arguments again and again) and
on flushed caches (every argument but the first flushed before each run, ``timing["flush_cache"]``). Recorded per
kernel: the three orders (inside, warm, flushed) and whether each measure picks the record the network picks.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.execution.kernels import FINAL_TIMING

from ..loadaware import timed_alone
from ..models import build_network
from ..report import REPO, environment
from .cache_flush import best_records
from .registries import add_network_options, named_store, network_of


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.flushed_ranking", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pick", type=Path, required=True, help="a bench.studies.network_pick result")
    parser.add_argument("--store", type=named_store, action="append", required=True, help="NAME=DIR, the registries that result names")
    parser.add_argument("--kernels", type=int, default=6)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "flushed-ranking.json")
    args = parser.parse_args()
    stores = dict(args.store)
    pick = json.loads(args.pick.read_text())
    picked_with = argparse.ArgumentParser(add_help=False)  # the network options the pick was run with, read as it read them
    add_network_options(picked_with)
    network, rewrites, _ = network_of(picked_with.parse_known_args(pick["command"].split())[0])
    spread = {name: max(k["inside_ms"].values()) / min(k["inside_ms"].values()) for name, k in pick["kernels"].items() if min(k["inside_ms"].values()) > 0}
    chosen = sorted(spread, key=lambda n: -spread[n])[: args.kernels]
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    with tempfile.TemporaryDirectory() as tmp:
        mod = build_network(network, Path(tmp))[0]
    kernels = {k.name: k for k in models.kernels(mod, target, rewrites) if k.name in chosen}
    rows: list[dict[str, Any]] = []
    cluster.start()
    try:
        for name in chosen:
            identity = kernels[name].identity
            records = {}
            for store, folder in stores.items():
                with LocalRegistry(folder, readonly=True) as reg:
                    records[store] = best_records(reg, [identity.key])[identity.key]
            names = list(records)
            traces = [records[n].trace for n in names]
            _, warm = timed_alone(identity, traces, dict(FINAL_TIMING), f"warm {name}")
            _, flushed = timed_alone(identity, traces, {**FINAL_TIMING, "flush_cache": True}, f"flushed {name}")
            inside = {n: pick["kernels"][name]["inside_ms"][n] / kernels[name].calls for n in names}
            row = {"kernel": name, "inside_ms": inside, "warm_ms": {n: (s or 0) * 1e3 for n, s in zip(names, warm, strict=True)},
                   "flushed_ms": {n: (s or 0) * 1e3 for n, s in zip(names, flushed, strict=True)}}  # fmt: skip
            best_inside = min(names, key=lambda n: inside[n])
            row["warm_picks_the_networks"] = min(names, key=lambda n: row["warm_ms"][n]) == best_inside
            row["flushed_picks_the_networks"] = min(names, key=lambda n: row["flushed_ms"][n]) == best_inside
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        cluster.stop()
    result = {"command": f"python -m bench.studies.flushed_ranking --pick {args.pick} " + " ".join(f"--store {n}={f}" for n, f in stores.items())
              + f" --kernels {args.kernels}", "environment": environment(), "rows": rows,
              "warm_agrees": sum(r["warm_picks_the_networks"] for r in rows), "flushed_agrees": sum(r["flushed_picks_the_networks"] for r in rows)}  # fmt: skip
    print(json.dumps({k: result[k] for k in ("warm_agrees", "flushed_agrees")}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
