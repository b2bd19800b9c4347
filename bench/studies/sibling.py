"""A CPU model new to the registry: what synthesis serves with a cost model borrowed from another CPU's log.

The registry is filled by tuning the quick transfer bench's ResNet-18 and MobileNet-V2 (batch 1, 64 px)
for a sibling target, ``{"kind": "llvm", "mcpu": "x86-64-v3"}`` by default: another CPU model to the
registry, whose code this machine still runs (so the fill measures here). The held-out networks (batch 2,
96 px) are then compiled for this machine's CPU, which has no log and no record of its own:

- ``transfers``: ``measure=`` only, the sibling's records replayed, checked and timed here (all that
  such a compile could get before a model was borrowed);
- ``borrowed``: ``measure=`` and ``synthesize=64``, the model trained on the sibling's log;
- ``own`` (``--own``): a second registry filled the same way for this CPU itself, with synthesis;
- ``small-own`` and ``topped-up`` (``--small-own``): the sibling's registry plus a small log of this CPU's
  own (its tuners' first work: the quick BERT layer, matmuls only): synthesis with the model of that small
  log alone (``LogModel.top_up = False``: what a compile did once its own log held the 32 trials a model
  needs), and with the small log topped up with the sibling's (the default).

Each is timed side by side with the default schedules and PyTorch (in its own process). Not part of
``bench all``; the figures are in docs/ARCHITECTURE.md §8.

    python -m bench.studies.sibling [--sibling '{"kind": "llvm", "mcpu": "x86-64-v3"}'] [--own] [--small-own] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any


from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import MODES as MODEL_MODES
from ..models import TORCH_TWINS, network_input, time_side_by_side
from ..stats import ratio
from ..transfer import MODES as TRANSFER_MODES
from ..transfer import QUICK_CONVNETS, REPO, compile_and_load, fill

SOURCE = {name: TRANSFER_MODES["quick"]["source"][name] for name in ("resnet18", "mobilenetv2")}
MEASURE_SECS = 600
SYNTHESIZE = TRANSFER_MODES["quick"]["synthesize"]
SMALL_OWN = {"bert_layer": TRANSFER_MODES["quick"]["source"]["bert_layer"]}  # a CPU's first tuning: a transformer's matmuls


def fill_store(root: Path, target: dict[str, Any], source: dict[str, dict[str, int]] = SOURCE) -> int:
    """Tune the ``source`` networks for ``target`` into a registry at ``root``; returns its key count."""
    with LocalRegistry(root) as registry:
        fill(registry, source, target, MODEL_MODES["quick"]["options"])
        return len(registry.summaries())


def compile_with(root: Path, mod: Any, target: Any, cache: Path, top_up: bool = True, **options: Any) -> tuple[Any, dict[str, Any]]:
    """``mod`` compiled through the hook on the registry at ``root``: the executable and what the compile did."""
    import tvm

    from schedhub import hooks

    with LocalRegistry(root) as registry, hooks.use(registry, target, report_misses=False, cache=cache, **options) as session:
        session.log_model.top_up = top_up
        executable, secs = compile_and_load(lambda: tvm.compile(mod, target))
    return executable, {"compile_secs": secs, "report": session.report.summary(), "borrowed": dict(session.log_model.borrowed),
                        "trained_on": dict(session.log_model.trained_on)}  # fmt: skip


def run(sibling: dict[str, Any], own: bool, small_own: bool, rounds: int) -> dict[str, Any]:
    import tvm

    tvm_env.prepare()
    host = tvm_env.host_target()
    target = tvm.target.Target(host)
    out: dict[str, Any] = {"host": host, "sibling": sibling, "rounds": rounds, "rows": []}
    with contextlib.ExitStack() as stack:
        temp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-bench-sibling-")))
        stores = {"sibling": temp / "sibling", **({"own": temp / "own"} if own else {})}
        cluster.start()
        for label, store in stores.items():
            out[f"{label}_keys"] = fill_store(store, sibling if label == "sibling" else host)
            print(f"registry of {label}: {out[f'{label}_keys']} keys", flush=True)
        synthesis = {"measure": MEASURE_SECS, "synthesize": SYNTHESIZE}
        configs = {"transfers": ("sibling", {"measure": MEASURE_SECS}), "borrowed": ("sibling", synthesis)}
        if own:
            configs["own"] = ("own", synthesis)
        if small_own:
            stores["small"] = temp / "small"
            shutil.copytree(stores["sibling"], stores["small"])  # the sibling's records and log, closed
            out["small_keys"] = fill_store(stores["small"], host, SMALL_OWN)
            print(f"registry of sibling plus a small own log: {out['small_keys']} keys", flush=True)
            configs["small-own"] = ("small", {**synthesis, "top_up": False})
            configs["topped-up"] = ("small", synthesis)
        cluster.stop()  # nothing of Ray shares the cores with the compiles' timings
        torch_proc = stack.enter_context(TorchProcess(cwd=REPO))
        for name, shape in QUICK_CONVNETS:
            mod, weights, input_shape = models.export_with_weights(name, **shape)
            executables = {"default": compile_and_load(lambda: tvm.compile(mod, target))[0]}
            compiles = {}
            for label, (store, options) in configs.items():
                executables[label], compiles[label] = compile_with(stores[store], mod, target, temp / f"cache-{label}", **options)
                print(f"{name} {label}: {compiles[label]['compile_secs']:.1f} s, {compiles[label]['report']}", flush=True)
            x = network_input(input_shape)
            pytorch = torch_proc.load_network(name, weights, x, factory=TORCH_TWINS, **shape)
            timing, errors = time_side_by_side(executables, x, rounds, pytorch, torch_proc.time_network)
            row = {"network": name, "shape": shape, "timing": timing, "max_rel_error": errors, "compiles": compiles,
                   "borrowed_vs_transfers": ratio(timing["borrowed"], timing["transfers"], paired=True)}  # fmt: skip
            if own:
                row["borrowed_vs_own"] = ratio(timing["borrowed"], timing["own"], paired=True)
            if small_own:
                row["small_own_vs_borrowed"] = ratio(timing["small-own"], timing["borrowed"], paired=True)
                row["topped_up_vs_borrowed"] = ratio(timing["topped-up"], timing["borrowed"], paired=True)
                row["topped_up_vs_small_own"] = ratio(timing["topped-up"], timing["small-own"], paired=True)
            out["rows"].append(row)
            ratios = {k: v["median"] for k, v in row.items() if k.endswith(("_vs_transfers", "_vs_own", "_vs_borrowed", "_vs_small_own"))}
            print(f"{name}: " + ", ".join(f"{k} {v['median']:.2f} ms" for k, v in timing.items()) + "; " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sibling", default='{"kind": "llvm", "mcpu": "x86-64-v3"}', help="the other CPU's target, a JSON object this machine runs code for")
    parser.add_argument("--own", action="store_true", help="also fill a registry for this CPU and compile from its own log")
    parser.add_argument("--small-own", action="store_true", help="also add a small log of this CPU's own and compile with its model alone, and topped up with the sibling's")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sibling = json.loads(args.sibling)
    sibling.setdefault("num-cores", tvm_env.host_target()["num-cores"])
    out = run(sibling, args.own, args.small_own, args.rounds)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
