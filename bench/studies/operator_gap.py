"""Where the time goes against oneDNN: a tuned network's heaviest kernels beside the same operator run by PyTorch.

    python -m bench.studies.operator_gap --store DIR --torch bench.networks:resnet50 [--input 1,3,224,224] [--timed network|records]
                                         [--top 12] [--ort] [--out FILE]

The network (a PyTorch model a user brings, imported as ``schedhub tune`` imports it) is split into the kernels a
compile with the defaults looks up (``models.kernels``). Each kernel's time is what it takes inside the network
(``--timed network``, the default): the network compiled through the hook from ``--store`` as a user's compile gets it
(the store's records; the CPU rules' schedules for what it lacks, so an empty store times the rules) and run with every
kernel call timed by an instrument, the median of :data:`NETWORK_PASSES` passes; a convolution's calls are joined with
its kernel by their shapes (:func:`call_key`). ``--timed records``: the store's verified mean of each kernel it holds
a record of instead (the tuner's re-measurement: the kernel alone, called again and again, so its weights stay in the
caches; ResNet-50's 7×7 convolutions ran 2× slower inside the network than so). The heaviest ``--top`` (calls × time) that are a convolution or a matmul with an
add/multiply/ReLU epilogue are then timed as PyTorch runs the same operator at the same shapes
(``torch.nn.functional.conv2d`` or ``torch.matmul``: oneDNN on CPUs), in a process of its own that never imported
TVM, on the target's threads, NCHW as its users run it. Both as GFLOPS (the kernel's floating-point operations,
MetaSchedule's count), with the share of the network's estimate each kernel holds: where a faster library kernel
would pay off most.

``--ort``: also ONNX Runtime's own time for the same convolutions, from its profiler (:mod:`.ort_profile`, in a
process of its own): each kernel joined with the ORT nodes of the same shapes (input and output channels, kernel size,
groups, input and output size), every convolution of the network, with both totals.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from schedhub.tuner.compare import baselines
from schedhub.tuner.compare.torch_process import TorchProcess
from schedhub.tuner.execution import tvm_env
from schedhub.tuner.networks import models

from ..report import REPO, environment
from ..torch_export import export_factory


def kernel_rows(mod: Any, target: Any, store: Path) -> list[dict[str, Any]]:
    """Every kernel of ``mod`` the store holds a verified record of: op, calls, the record's verified seconds, FLOPs."""
    from schedhub.hooks.kernels.identity import workload_module
    from schedhub.hooks.metaschedule.costmodel import flops
    from schedhub.registry import LocalRegistry

    rows = []
    with LocalRegistry(store, readonly=True) as reg:
        for k in models.kernels(mod, target):
            entries = reg.lookup_entries([k.identity.key]).get(k.identity.key, [])
            verified = [status["vmean"] for _, status in entries if status.get("vby") and status.get("vmean")]
            if not verified:
                continue
            rows.append({"op": k.identity.op, "calls": k.calls, "key": k.identity.key, "args_info": k.identity.args_info,
                         "secs": min(verified), "flops": flops(workload_module(k.identity.workload))})  # fmt: skip
    return rows


NETWORK_PASSES = 25  # instrumented forward passes a kernel's time inside the network is the median of


def network_rows(mod: Any, target: Any, store: Path, layout: str, input_shape: list[int]) -> list[dict[str, Any]]:
    """Every convolution kernel of ``mod`` with its median seconds per call inside the network compiled through the
    hook from ``store`` (its records, the rules' schedules for the rest; with the defaults where ``layout`` is NHWC, as
    given otherwise), joined with its calls by :func:`call_key`."""
    import tvm
    from tvm import relax

    from schedhub import hooks
    from schedhub.hooks.kernels.identity import workload_module
    from schedhub.hooks.metaschedule.costmodel import flops

    from ..models import network_input
    from .cache_flush import profile_calls
    from .gap import kernel_calls

    with tempfile.TemporaryDirectory() as cache:
        with hooks.use(store, target, cache=cache, report_misses=False, **({} if layout == "NHWC" else {"layout": "given", "prepack": False})):
            ex = tvm.compile(mod, target)
    x = network_input(input_shape)
    calls = kernel_calls(relax.VirtualMachine(ex, tvm.cpu()), tvm.runtime.tensor(x), "main")
    names_by_key: dict[tuple[int, ...], set[str]] = {}
    count: dict[str, int] = {}
    for call in calls:
        count[call.name] = count.get(call.name, 0) + 1
        if len(call.arrays) >= 3:
            names_by_key.setdefault(call_key([list(a.shape) for a in call.arrays], layout), set()).add(call.name)
    passes = [profile_calls(ex, x) for _ in range(max(1, NETWORK_PASSES // 9))]  # each the median of 9
    per_call = {name: statistics.median(p.get(name, 0.0) for p in passes) / 1e3 / n for name, n in count.items()}
    rows = []
    for k in models.kernels(mod, target):
        names = names_by_key.get(call_key([a[2] for a in k.identity.args_info], layout), set()) if k.identity.op.startswith("fused_conv2d") else set()
        if not names:
            continue
        rows.append({"op": k.identity.op, "calls": k.calls, "key": k.identity.key, "args_info": k.identity.args_info,
                     "secs": statistics.median(per_call[n] for n in names), "flops": flops(workload_module(k.identity.workload))})  # fmt: skip
    return rows


def call_key(shapes: list[list[int]], layout: str) -> tuple[int, ...]:
    """What a convolution's kernel and its calls share whatever the weights' packing: input and output channels and
    heights (NHWC or NCHW as ``layout`` says), and the weights' element count. ``shapes``: the data's first, the
    weights' second, the output's last."""
    x, w, out = shapes[0], shapes[1], shapes[-1]
    if len(x) != 4 or len(out) != 4:
        return ()
    channels, height = (3, 1) if layout == "NHWC" else (1, 2)
    return (x[channels], out[channels], x[height], out[height], int(np.prod(w)))


def conv_signature(args_info: list[Any]) -> tuple[int, ...]:
    """A convolution's shape in NCHW terms (input and output channels, kernel height, weight's input channels (groups),
    input and output height), from its NCHW data and OIHW weights' shapes."""
    x, w, out = args_info[0][2], args_info[1][2], args_info[-1][2]
    return (x[1], w[0], w[2], w[1], x[2], out[2])


def ort_conv_times(profile: dict[str, Any]) -> dict[tuple[int, ...], float]:
    """Median microseconds of ONNX Runtime's convolution nodes of each shape (:mod:`.ort_profile`)."""
    found: dict[tuple[int, ...], list[float]] = {}
    for node in profile["nodes"]:
        if node["op"] in ("Conv", "FusedConv") and len(node["inputs"]) >= 2:
            x, w, out = node["inputs"][0], node["inputs"][1], node["outputs"][0]
            found.setdefault((x[1], w[0], w[2], w[1], x[2], out[2]), []).append(node["median_us"])
    return {sig: statistics.median(times) for sig, times in found.items()}


def ort_rows(rows: list[dict[str, Any]], layout: str, profile: dict[str, Any]) -> dict[str, Any]:
    """Every convolution kernel of ``rows`` beside ONNX Runtime's node of the same shape, and both totals."""
    times = ort_conv_times(profile)
    joined = []
    for r in rows:
        if not r["op"].startswith("fused_conv2d"):
            continue
        sig = conv_signature(baselines.in_nchw(r["op"], r["args_info"], layout))
        ort_us = times.get(sig)
        joined.append({"op": r["op"], "calls": r["calls"], "shape": list(sig), "secs": r["secs"], "flops": r["flops"], "ort_us": ort_us,
                       "gflops": r["flops"] / r["secs"] / 1e9, "ort_gflops": r["flops"] / ort_us / 1e3 if ort_us else None})  # fmt: skip
    both = [j for j in joined if j["ort_us"]]
    return {"wall_ms": profile["wall_ms"], "convs": sorted(joined, key=lambda j: -j["calls"] * j["secs"]),
            "schedhub_conv_ms": sum(j["calls"] * j["secs"] for j in both) * 1e3, "ort_conv_ms": sum(j["calls"] * j["ort_us"] for j in both) / 1e3,
            "unmatched": [j["op"] for j in joined if not j["ort_us"]]}  # fmt: skip


def main() -> None:
    import tvm

    parser = argparse.ArgumentParser(prog="python -m bench.studies.operator_gap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="a store tuned for the network (schedhub tune -r DIR)")
    parser.add_argument("--torch", required=True, help="the PyTorch model's factory, pkg.mod:function (e.g. bench.networks:resnet50)")
    parser.add_argument("--input", help="the input shape, e.g. 1,3,224,224 (default: bench.network_inputs.INPUTS)")
    parser.add_argument("--layout", default="NHWC", choices=["NHWC", "given"], help="the layout the store's convolutions were tuned in")
    parser.add_argument("--timed", default="network", choices=["network", "records"], help="each kernel's time inside the network, or its record's alone")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--ort", action="store_true", help="also ONNX Runtime's profiled time of every convolution (bench.studies.ort_profile)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from ..network_inputs import INPUTS

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    threads = int(target.attrs["num-cores"])
    input_shape = [int(d) for d in args.input.split(",")] if args.input else INPUTS[args.torch.rpartition(":")[2]]
    with tempfile.TemporaryDirectory() as tmp:
        mod, _, _ = export_factory(args.torch, input_shape, Path(tmp))
    layout = "NHWC" if args.layout == "NHWC" else "NCHW"
    rows = network_rows(mod, target, args.store, layout, input_shape) if args.timed == "network" else kernel_rows(mod, target, args.store)
    estimate = sum(r["calls"] * r["secs"] for r in rows)
    heaviest = [r for r in sorted(rows, key=lambda r: -r["calls"] * r["secs"]) if baselines.supported(r["op"], r["args_info"])][: args.top]
    with TorchProcess(cwd=REPO) as torch_proc:
        torch_proc.load_module(args.torch, [input_shape], threads)  # its threads set as for the network
        baselines.spin_down()
        for r in heaviest:
            r["torch_secs"] = torch_proc.time_kernel(r["op"], baselines.in_nchw(r["op"], r["args_info"], args.layout), repeat=5, min_secs=0.2)
    for r in heaviest:
        r["share"] = r["calls"] * r["secs"] / estimate
        r["gflops"] = r["flops"] / r["secs"] / 1e9
        r["torch_gflops"] = r["flops"] / r["torch_secs"] / 1e9 if r.get("torch_secs") else None
        print(f"{r['op']:<40} ×{r['calls']}  {r['share']:6.1%}  schedhub {r['secs'] * 1e3:8.3f} ms {r['gflops']:6.1f} GFLOPS   "
              f"oneDNN {((r.get('torch_secs') or 0) * 1e3):8.3f} ms {(r['torch_gflops'] or 0):6.1f} GFLOPS", flush=True)
    ort = None
    if args.ort:  # after the PyTorch process ended, alone on the cores
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "ort.json"
            subprocess.run([sys.executable, "-m", "bench.studies.ort_profile", "--torch", args.torch, "--input", ",".join(map(str, input_shape)),
                            "--threads", str(threads), "--out", str(out)], cwd=REPO, check=True, timeout=1800)  # fmt: skip
            ort = ort_rows(rows, args.layout, json.loads(out.read_text()))
        for j in ort["convs"]:
            print(f"{j['op']:<40} ×{j['calls']}  {str(j['shape']):<28} schedhub {j['gflops']:6.1f} GFLOPS  ONNX Runtime {(j['ort_gflops'] or 0):6.1f}")
        print(f"convolutions: schedhub {ort['schedhub_conv_ms']:.2f} ms, ONNX Runtime {ort['ort_conv_ms']:.2f} ms (its whole run {ort['wall_ms']:.2f} ms)")
    result = {"command": "python -m bench.studies.operator_gap " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v and k != "out"),
              "network": args.torch, "input": input_shape, "cpu": str(target.attrs.get("mcpu", "")), "kernels": len(rows),
              "estimate_secs": estimate, "heaviest": [{k: v for k, v in r.items() if k != "args_info"} | {"shapes": [a[2] for a in r["args_info"]]} for r in heaviest],
              "onnxruntime": ort,
              "environment": environment()}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
