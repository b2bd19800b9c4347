"""What a compile gets when the registry's records choose its rewrites (``use(..., layout="auto", prepack="auto")``,
``hooks.serving.choice``, the defaults) against the given layout with unpacked weights, from one registry that holds the network
tuned both ways.

    python -m bench.studies.auto_rewrites --store DIR [--network resnet18] [--compiles 3] [--rounds 5]

The network is the full mode's network at batch 1 (ResNet-18 and MobileNet-V2 at 224 px imported through
``torch.export``, the BERT layer at sequence 128, the MLP). It is compiled for this CPU from a copy of ``--store`` (say the ``--keep-store`` of two
``bench.models`` runs, one with no rewrite and one ``--seed-store``-ed from it with ``--layout NHWC --prepack``):
in the given layout unpacked (``"given"``: what a compile that named nothing took before ``"auto"`` was the default),
with ``"auto"``, and with the rewrites ``"auto"`` chose named; ``--compiles`` times each, in
turn, from one kernel cache warmed by a first compile of each (what a compile costs a user after the first). The
executables and PyTorch eager (a process of its own, started before TVM's pools) are then timed in ``--rounds``
interleaved rounds on the same input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import tvm_env
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import TORCH_TWINS, build_network, check_agreement, network_input, networks_of, time_side_by_side
from ..report import REPO, environment
from ..stats import ratio

#: How each compile is asked for: ``use(...)``'s rewrite arguments ("named" is filled in with what "auto" chose).
ASKED: dict[str, dict[str, Any]] = {"given": {"layout": "given", "prepack": False}, "auto": {}}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.auto_rewrites", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a registry holding the network's records (copied, not changed)")
    parser.add_argument("--network", default="resnet18", choices=["resnet18", "mobilenetv2", "bert_layer", "mlp"])
    parser.add_argument("--compiles", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import tvm

    from schedhub import hooks

    network = networks_of("full", [args.network], 1)[0]
    result: dict[str, Any] = {"command": f"python -m bench.studies.auto_rewrites --store DIR --network {args.network} --compiles {args.compiles} --rounds {args.rounds}",
                              "network": network.label(), "environment": environment()}  # fmt: skip
    with TorchProcess(cwd=REPO) as torch_proc, tempfile.TemporaryDirectory(prefix="schedhub-auto-") as tmp:
        tvm_env.prepare()
        target = tvm.target.Target(tvm_env.host_target())
        result["target"] = str(target)
        mod, func, weights, input_shape = build_network(network, Path(tmp))
        shutil.copytree(args.store, Path(tmp) / "store")
        registry = LocalRegistry(Path(tmp) / "store")
        asked = dict(ASKED)
        executables: dict[str, Any] = {}
        compile_secs: dict[str, list[float]] = {}

        chosen: dict[str, Any] = {}  # the rewrites each compile took

        def compile_as(name: str) -> Any:
            started = time.perf_counter()
            with hooks.use(registry, target, report_misses=False, cache=Path(tmp) / "cache", **asked[name]) as session:
                ex = tvm.compile(mod, target)
            compile_secs.setdefault(name, []).append(time.perf_counter() - started)
            chosen[name] = session.rewrites
            report = session.report
            result.setdefault("reports", {})[name] = {"summary": report.summary(), "hits": report.hits, "kernels": len(report.kernels),
                                                      "rewrites": report.rewrites, "weighed": report.rewrite_options}  # fmt: skip
            print(f"{name}: {report.summary()}", flush=True)
            return ex

        executables["given"], executables["auto"] = compile_as("given"), compile_as("auto")
        asked["named"] = {"layout": chosen["auto"].layout, "prepack": chosen["auto"].prepack}
        executables["named"] = compile_as("named")
        compile_secs = {}  # the first compiles warmed the cache: time the later ones
        for _ in range(args.compiles):
            for name in asked:
                compile_as(name)
        result["compile_secs"] = {name: {"median": statistics.median(v), "samples": v} for name, v in compile_secs.items()}
        result["asked"] = asked
        registry.close()
        x = network_input(input_shape)
        pytorch = torch_proc.load_network(network.name, weights, x, factory=TORCH_TWINS, batch=network.batch, **network.shape)
        timing, errors = time_side_by_side(executables, x, args.rounds, pytorch, torch_proc.time_network, func)
        check_agreement(network.label(), errors)
    result["timing"], result["max_rel_error"] = timing, errors
    result["vs_pytorch"] = {name: ratio(timing["pytorch"], timing[name], paired=True) for name in executables}
    result["compile_auto_vs_given"] = result["compile_secs"]["auto"]["median"] / result["compile_secs"]["given"]["median"]
    print(json.dumps({"vs_pytorch": result["vs_pytorch"], "compile_secs": {k: v["median"] for k, v in result["compile_secs"].items()}}, indent=1, default=str))
    out = args.out or REPO / "bench" / "results" / "studies" / f"auto-rewrites-{args.network}-{tvm_env.host_target()['mcpu']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
