"""An unseen network's first compile from an empty registry: TVM's defaults against the CPU rules' schedules.

    python -m bench.studies.first_compile (--torch PKG.MOD:FACTORY --input 1,3,224,224 | --network NAME [--shape image=224])
                                          [--rounds 5] [--starter-store DIR] [--engines onnxruntime,openvino,inductor] [--out FILE]

What a new user meets: the network compiled through ``use(...)`` with its defaults (layout and prepacking chosen for an
unknown network) from an empty registry, every kernel a miss: once with ``rules=False`` (TVM's unscheduled default, as
before :mod:`schedhub.hooks.metaschedule.rules`) and once as shipped (each miss gets the CPU rules' schedule, untimed), each on an
empty kernel cache, so the compile times are first compiles. ``--starter-store``: also from a copy of a store tuned
for other networks, every kernel it can serve a transfer (the issue's starter records), the rest ruled. ``--torch``: a
PyTorch model a user brings (``bench.networks``), imported by ``torch.export`` in a child process as ``schedhub tune``
imports it; ``--network``: a shipped Relax network with its PyTorch twin. PyTorch eager runs in a process of its own
(same threads, same input, outputs checked); with ``--torch``, ``--engines`` runs what a user would pick instead too, each
in a process of its own (``schedhub.tuner.compare.engines``; its output checked against eager PyTorch's there); everything is
timed side by side in interleaved rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from schedhub.tuner.networks import models

from schedhub.tuner.execution import tvm_env
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import TORCH_TWINS, check_agreement, network_input, time_side_by_side
from ..report import REPO, environment
from ..torch_export import export_factory


def compiled(mod: Any, store: Path, target: Any, rules: bool) -> tuple[Any, float, str]:
    """``mod`` compiled through the hook from ``store`` on an empty kernel cache: the executable, the seconds, the report."""
    import tvm

    from schedhub import hooks

    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        with hooks.use(store, target, cache=cache, report_misses=False, rules=rules) as session:
            ex = tvm.compile(mod, target)
        return ex, time.perf_counter() - start, session.report.summary()


def main() -> None:
    import tvm

    from schedhub.registry import LocalRegistry

    parser = argparse.ArgumentParser(prog="python -m bench.studies.first_compile", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--torch", help="a PyTorch model's factory, pkg.mod:function (e.g. bench.networks:resnet50)")
    source.add_argument("--network", choices=models.model_names(), help="a shipped Relax network")
    parser.add_argument("--input", help="with --torch: the input shape, e.g. 1,3,224,224 (default: bench.network_inputs.INPUTS)")
    parser.add_argument("--shape", action="append", default=[], help="with --network: a shape option, e.g. image=224 (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--starter-store", type=Path, help="a store tuned for other networks: the network compiled from a copy of it too")
    parser.add_argument("--starter-label", help="with --starter-store: what the store is, for the standing table (e.g. 'tuned 60 min'): a store "
                        "tuned for this very network makes its row a tuned row")  # fmt: skip
    parser.add_argument("--engines", default="", help="with --torch: engines timed beside it, comma-separated (onnxruntime, openvino, inductor)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    engines: dict[str, Any] = {}
    threads = int(target.attrs["num-cores"])
    engine_names = [e for e in args.engines.split(",") if e]
    if engine_names and not args.torch:
        parser.error("--engines needs --torch")
    if args.starter_label and not args.starter_store:
        parser.error("--starter-label goes with --starter-store")
    with TorchProcess(cwd=REPO) as torch_proc, tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if args.torch:
            from ..network_inputs import INPUTS

            input_shape = [int(d) for d in args.input.split(",")] if args.input else INPUTS[args.torch.rpartition(":")[2]]
            mod, x, pytorch = export_factory(args.torch, input_shape, Path(tmp))
            torch_proc.load_module(args.torch, [input_shape], threads)
            for name in engine_names:  # loaded (and its output checked against eager) before anything is timed
                proc = stack.enter_context(TorchProcess(cwd=REPO, engine=name))
                proc.load_module(args.torch, [input_shape], threads)
                engines[name] = (pytorch, proc.time_network)
            func, label, shape = "main", args.torch, {"input": input_shape}
        else:
            shape = {k: int(v) for k, v in (s.split("=", 1) for s in args.shape)}
            mod, weights, input_shape = models.export_with_weights(args.network, **shape)
            x = network_input(input_shape)
            pytorch = torch_proc.load_network(args.network, weights, x, factory=TORCH_TWINS, **shape)
            func, label = "forward", args.network
        empty = Path(tmp) / "empty"
        LocalRegistry(empty).close()
        executables, secs, reports = {}, {}, {}
        for name, rules in (("default", False), ("ruled", True)):
            executables[name], secs[name], reports[name] = compiled(mod, empty, target, rules)
        if args.starter_store is not None:
            shutil.copytree(args.starter_store, Path(tmp) / "starter")
            executables["starter"], secs["starter"], reports["starter"] = compiled(mod, Path(tmp) / "starter", target, True)
        timing, errors = time_side_by_side(executables, x, args.rounds, pytorch, torch_proc.time_network, func, engines=engines)
    check_agreement(label, errors)
    result = {
        "command": "python -m bench.studies.first_compile " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v and k not in ("out", "shape"))
                   + "".join(f" --shape {s}" for s in args.shape),
        "network": label, "shape": shape, "cpu": str(target.attrs.get("mcpu", "")), "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "starter_label": args.starter_label, "compile_secs": secs, "reports": reports, "timing": timing, "max_rel_error": errors,
        "over_pytorch": {name: timing[name]["median"] / timing["pytorch"]["median"] for name in executables},
        "over_fastest_engine": {name: timing[name]["median"] / min(timing[e]["median"] for e in ("pytorch", *engines)) for name in executables},
        "environment": environment(),
    }  # fmt: skip
    print(json.dumps({k: result[k] for k in ("network", "compile_secs", "over_pytorch")}, indent=1))
    print({k: round(v["median"], 3) for k, v in timing.items()})
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
