"""ONNX Runtime's own time for each node of a PyTorch model (its profiler), in a process that never imports TVM.

    python -m bench.studies.ort_profile --torch bench.networks:resnet50 [--input 1,3,224,224] [--threads 2] [--runs 40] --out FILE

The model is exported and run as ``schedhub.tuner.compare.engines`` runs it (every graph optimization, sequential, the
given threads), with ``enable_profiling``: after 10 warm-up runs, ``--runs`` runs are profiled, and each node's median
kernel time is kept with its operator and its input and output shapes (what :mod:`.operator_gap` joins with a tuned
network's kernels). The wall time per run is kept too (profiling slows it a little).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

WARM_UP = 10


def profile(factory: str, input_shape: list[int], threads: int, runs: int, workdir: Path) -> dict[str, Any]:
    """The model's nodes, slowest first: op, input and output shapes, median microseconds over ``runs`` runs."""
    import onnxruntime as ort
    import torch

    from schedhub.tuner.compare.engines import exported, onnxruntime_options

    module, _, name = factory.partition(":")
    net = getattr(importlib.import_module(module), name)().eval()
    x = torch.randn(*input_shape)
    options = onnxruntime_options(threads)
    options.enable_profiling = True
    options.profile_file_prefix = str(workdir / "profile")
    session = ort.InferenceSession(str(exported(net, (x,), workdir)), options, providers=["CPUExecutionProvider"])
    feeds = {session.get_inputs()[0].name: x.numpy()}
    for _ in range(WARM_UP):
        session.run(None, feeds)
    start = time.perf_counter()
    for _ in range(runs):
        session.run(None, feeds)
    wall = (time.perf_counter() - start) / runs
    durations: dict[str, list[float]] = defaultdict(list)
    shapes: dict[str, tuple[str, list[Any], list[Any]]] = {}
    for event in json.loads(Path(session.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            node = event["name"].removesuffix("_kernel_time")
            durations[node].append(event["dur"])
            args = event.get("args", {})
            shapes[node] = (args.get("op_name", ""), args.get("input_type_shape", []), args.get("output_type_shape", []))
    nodes = [{"node": node, "op": shapes[node][0], "inputs": [list(s.values())[0] for s in shapes[node][1]],
              "outputs": [list(s.values())[0] for s in shapes[node][2]], "median_us": statistics.median(times[WARM_UP:])}
             for node, times in durations.items() if len(times) > WARM_UP]  # fmt: skip
    nodes.sort(key=lambda n: -n["median_us"])
    return {"network": factory, "input": input_shape, "threads": threads, "runs": runs, "wall_ms": wall * 1e3,
            "sum_node_ms": sum(n["median_us"] for n in nodes) / 1e3, "nodes": nodes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.ort_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", required=True, help="the PyTorch model's factory, pkg.mod:function")
    parser.add_argument("--input", help="the input shape, e.g. 1,3,224,224 (default: bench.network_inputs.INPUTS)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from ..network_inputs import INPUTS

    shape = [int(d) for d in args.input.split(",")] if args.input else INPUTS[args.torch.rpartition(":")[2]]
    with tempfile.TemporaryDirectory() as tmp:
        result = profile(args.torch, shape, args.threads, args.runs, Path(tmp))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wall {result['wall_ms']:.2f} ms, nodes {result['sum_node_ms']:.2f} ms in all, {len(result['nodes'])} nodes")


if __name__ == "__main__":
    main()
