"""Records picked by their time inside the network: does the kernel that wins alone also win in the network?

    python -m bench.studies.network_pick --store NAME=DIR --store NAME=DIR --into DIR [--network resnet18 --image 224]
                                         [--prepack] [--conv winograd] [--math fast] [--profiles 3] [--out FILE]

The network is compiled from each registry and run with every VM call timed (``bench.studies.cache_flush``'s
instrument, the median of ``--profiles`` profiles of 9 passes each). For each kernel, the best record of the registry
whose kernel ran faster inside the network goes into a new registry (``--into``), which ``bench.studies.registries``
then times against the others. Recorded: each kernel's time inside the network and alone (its record's) per
registry, and which registry each kernel was taken from.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.networks import models
from schedhub.tuner.execution import tvm_env

from ..models import build_network, network_input
from ..report import REPO, environment
from .cache_flush import best_records, compiled, profile_calls
from .registries import add_network_options, named_store, network_of


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.network_pick", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=named_store, action="append", required=True, help="NAME=DIR, a registry that tuned the network (repeat)")
    parser.add_argument("--into", type=Path, required=True, help="a new folder: the registry of the records picked")
    add_network_options(parser)
    parser.add_argument("--profiles", type=int, default=3, help="profiles per registry (the median is kept)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "network-pick.json")
    args = parser.parse_args()
    stores = dict(args.store)
    if args.into.exists() and any(args.into.iterdir()):
        parser.error(f"{args.into} is not empty")
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    network, rewrites, said = network_of(args)
    inside: dict[str, dict[str, float]] = {}
    alone: dict[str, dict[str, float]] = {}
    best: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="schedhub-pick-") as tmp:
        mod, func, _, input_shape = build_network(network, Path(tmp))
        x = network_input(input_shape)
        kernels = models.kernels(mod, target, rewrites)
        for name, folder in stores.items():
            with LocalRegistry(folder, readonly=True) as reg:
                best[name] = best_records(reg, [k.identity.key for k in kernels])
            ex = compiled(mod, target, folder, rewrites)
            profiles = [profile_calls(ex, x, func) for _ in range(args.profiles)]
            inside[name] = {k.name: statistics.median(p.get(k.name, 0.0) for p in profiles) for k in kernels}
            alone[name] = {k.name: best[name][k.identity.key].mean_secs * 1e3 * k.calls for k in kernels}
    picked = {k.name: min(stores, key=lambda n, k=k: inside[n][k.name]) for k in kernels}  # type: ignore[misc]
    args.into.mkdir(parents=True, exist_ok=True)
    with LocalRegistry(args.into) as reg:
        reg.put_many([best[picked[k.name]][k.identity.key] for k in kernels])
    result = {
        "command": "python -m bench.studies.network_pick " + " ".join(f"--store {n}={f}" for n, f in stores.items()) + f" --into {args.into} {said} --profiles {args.profiles}",
        "environment": environment(),
        "kernels": {k.name: {"calls": k.calls, "picked": picked[k.name], "inside_ms": {n: inside[n][k.name] for n in stores},
                             "alone_ms": {n: alone[n][k.name] for n in stores}} for k in kernels},  # fmt: skip
        "sums_ms": {n: {"inside": sum(inside[n].values()), "alone": sum(alone[n].values())} for n in stores},
    }
    print(json.dumps(result["sums_ms"], indent=1), json.dumps({n: list(picked.values()).count(n) for n in stores}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
