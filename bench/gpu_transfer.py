"""GPU transfer benchmark: what a compile on a GPU gets for shapes the registry never tuned.

    python -m bench.gpu_transfer [--trials N] [--source-batch B] [--held-out B,B] [--tune B,B] [--source-store DIR] [--out FILE]

On a GPU the default every schedule must beat is DLight's (TVM's GPU default), not an unscheduled
kernel, so a transfer that replays and verifies can still make a network slower. This measures it:

1. The registry is filled by tuning the gpu mode's MLP (features 1024, hidden 4096) at the source
   batch on this GPU (``schedhub.tuner`` on a local Ray cluster, the gpu mode's budget).
2. Held-out batches, never tuned: each compiles with plain ``tvm.compile`` (DLight), inside
   ``hooks.use(registry)`` (transfers where a neighbour replays, DLight for the rest), and inside
   ``hooks.use(registry, measure=60)`` ("measured": every candidate and DLight's schedule timed on
   this GPU, the fastest served, DLight where no candidate beats it); with each transfer's twin postprocessed
   here at the kernel's own shape among the candidates (the default) and without ("measured_recorded":
   ``repostprocess=False``, each record's postprocessing replayed as recorded).
3. The kernels of the batches named by ``--tune`` are tuned at the same budget (warm-started from
   the registry, as a worker does with the misses), and those networks compile again: every kernel
   must hit ("tuned").
4. Ray stops; DLight, transferred, measured, tuned and the PyTorch twin (its own process, TF32 off) are
   timed side by side on the GPU in interleaved rounds, and every output is checked against DLight's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.compare.torch_process import TorchProcess

from .models import MODES as MODEL_MODES
from .models import TORCH_TWINS, check_agreement, network_input, time_side_by_side
from .report import environment
from .stats import ratio
from .torch_export import RELAX
from .transfer import HeldOut, _compile_all_hits, _held_out, compile_and_load, filled_store, hooked_compile, tune_kernels
from .tuner import require_device

REPO = Path(__file__).resolve().parent.parent
NETWORK = "mlp"
SHAPE = {"features": 1024, "hidden": 4096}  # the gpu mode's MLP (bench.models)
MEASURE_SECS = 60.0  # the measured compile's budget: enough for every candidate of the MLP's kernels


def run(source_batch: int, held_out: list[int], tune: list[int], trials: int | None = None, rounds: int = 7,
        say: Callable[[str], None] = print, device: str = "cuda", shape: dict[str, int] = SHAPE,
        save: Callable[[dict[str, Any]], None] = lambda _: None, source_store: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The GPU transfer table: the MLP (``shape``) tuned at ``source_batch``, compiled at each ``held_out`` batch; the ``tune``
    batches tuned too. ``device="cpu"`` only checks the bench itself (its default is then TVM's unscheduled kernel, not DLight).
    ``save`` gets the table so far after each row is timed (a lease that ends mid-run keeps those); ``source_store``
    keeps the filled registry for the next run (which then skips the fill: a lease can split the work into calls)."""
    import tvm

    options = MODEL_MODES["gpu"]["options"]
    if trials:
        options = replace(options, trials=trials, trials_per_iter=min(options.trials_per_iter, trials))
    target = tvm_env.device_target(device)
    tvm_env.prepare()
    cluster.start()
    out: dict[str, Any] = {"recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": environment()["commit"],
                           "device_name": str(tvm.cuda(0).device_name) if device == "cuda" else device, "network": NETWORK, "shape": shape, "source_batch": source_batch,
                           "options": asdict(options), "rounds": rounds, "rows": []}  # fmt: skip
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-bench-gpu-transfer-")))
        out["fill_secs"] = filled_store(root / "store", source_store, {NETWORK: {"batch": source_batch, **shape}}, target, options)
        registry = stack.enter_context(LocalRegistry(root / "store"))
        say(f"registry filled at batch {source_batch}: {len(registry.summaries())} keys" + (f" in {out['fill_secs']:.0f} s" if out["fill_secs"] else f" (copied from {source_store})"))

        compiled = []
        for batch in held_out:
            held = _held_out(NETWORK, {"batch": batch, **shape}, RELAX, target, root)
            executables, secs, reports = {}, {}, {}
            executables["dlight"], secs["dlight"] = compile_and_load(lambda: tvm.compile(held.mod, target), device)
            executables["transferred"], secs["transferred"], reports["transferred"] = hooked_compile(held, registry, target, root / f"cache-{batch}", device)
            executables["measured"], secs["measured"], reports["measured"] = hooked_compile(held, registry, target, root / f"measured-{batch}", device,
                                                                                             measure=MEASURE_SECS)  # fmt: skip
            executables["measured_recorded"], secs["measured_recorded"], reports["measured_recorded"] = hooked_compile(
                held, registry, target, root / f"measured-recorded-{batch}", device, measure=MEASURE_SECS, repostprocess=False)  # no twins
            say(f"{held.label}: {reports['transferred'].summary()}; compile {secs['dlight']:.2f} s plain, {secs['transferred']:.2f} s hooked, "
                f"{secs['measured']:.2f} s measuring ({reports['measured'].summary()})")
            compiled.append((held, executables, secs, reports))
        for held, executables, secs, _ in compiled:
            if held.shape["batch"] in tune:
                started = time.time()
                tune_kernels(registry, held.kernels, options, retune=True)
                secs["tuning"] = time.time() - started
                executables["tuned"], _ = _compile_all_hits(held, registry, target, root / f"hits-{held.shape['batch']}", device)
                say(f"{held.label}: tuned in {secs['tuning']:.0f} s")
        cluster.stop()  # nothing of Ray beside the timings

        torch_proc = stack.enter_context(TorchProcess(cwd=REPO, device=device))  # PyTorch never shares a process with TVM
        for held, executables, secs, reports in compiled:
            row = _row(held, executables, secs, reports, rounds, torch_proc, device)
            out["rows"].append(row)
            save(out)
            say(f"{held.label}: " + ", ".join(f"{k} {v['median']:.3f} ms" for k, v in row["timing"].items()))
    return out


def _row(held: HeldOut, executables: dict[str, Any], secs: dict[str, float], reports: dict[str, Any], rounds: int, torch_proc: TorchProcess,
         device: str) -> dict[str, Any]:  # fmt: skip
    x = network_input(held.input_shape)
    pytorch = torch_proc.load_network(held.name, held.weights, x, factory=TORCH_TWINS, **held.shape)
    timing, errors = time_side_by_side(executables, x, rounds, pytorch, torch_proc.time_network, held.func, device)
    check_agreement(held.label, errors)
    report = reports["transferred"]
    outcomes = {name: {k.op: f"{k.outcome} {k.detail}".strip() for k in r.kernels} for name, r in reports.items()}
    row = {"label": held.label, "batch": held.shape["batch"], "kernels": len(report.kernels), "transfers": report.transfers,
           "measured_transfers": reports["measured"].transfers, "outcomes": outcomes["transferred"], "measured_outcomes": outcomes["measured"],
           "measured_secs": {k.op: k.measured for k in reports["measured"].kernels}, "compile_secs": secs,
           "timing": timing, "max_rel_error": errors,
           "dlight_vs_transferred": ratio(timing["dlight"], timing["transferred"], paired=True),  # > 1: the transfer is faster than DLight
           "dlight_vs_measured": ratio(timing["dlight"], timing["measured"], paired=True),
           "recorded_vs_measured": ratio(timing["measured_recorded"], timing["measured"], paired=True),  # > 1: the twins made it faster
           "measured_recorded_outcomes": outcomes["measured_recorded"],
           "pytorch_vs_transferred": ratio(timing["pytorch"], timing["transferred"], paired=True)}  # fmt: skip
    if "tuned" in timing:
        row["transferred_vs_tuned"] = ratio(timing["transferred"], timing["tuned"], paired=True)
        row["dlight_vs_tuned"] = ratio(timing["dlight"], timing["tuned"], paired=True)
    return row


def _batches(text: str) -> list[int]:
    return [int(b) for b in text.split(",") if b.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, help="tuning trials per kernel (default: the gpu mode's)")
    parser.add_argument("--source-batch", type=int, default=64, help="the batch the registry is filled at")
    parser.add_argument("--held-out", type=_batches, default=[16, 256], help="batches compiled without being tuned (comma-separated)")
    parser.add_argument("--tune", type=_batches, default=[256], help="held-out batches also tuned, for the tuned column")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--source-store", type=Path, help="keep the filled registry here and reuse it on the next run")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu" / "gpu_transfer.json", help="where the report reads it (bench gpu writes the same)")
    args = parser.parse_args()
    require_device(parser.prog, "cuda")
    command = " ".join(["python -m bench.gpu_transfer", *([f"--trials {args.trials}"] if args.trials else []), f"--source-batch {args.source_batch}",
                        f"--held-out {','.join(map(str, args.held_out))}", f"--tune {','.join(map(str, args.tune)) or repr('')}"])  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(table: dict[str, Any]) -> None:
        args.out.write_text(json.dumps({**table, "command": command}, indent=1))

    save(run(args.source_batch, args.held_out, args.tune, args.trials, args.rounds, save=save, source_store=args.source_store))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
