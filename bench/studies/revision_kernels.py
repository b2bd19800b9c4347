"""Two revisions' first compile of a network side by side, kernel by kernel inside the network.

    python -m bench.studies.revision_kernels --torch bench.networks:resnet50 [--input 1,3,224,224] --base REV
                                             [--rev worktree] [--rounds 5] [--out FILE]

What a change to the CPU rules (or anything else a first compile runs) does to each kernel where it counts: inside the
network. Each revision's schedhub (:mod:`bench.revisions`) compiles the network in a process of its own from an empty
registry with ``use(...)``'s defaults (its misses get the rules' schedules) and exports it. One process that imports
no schedhub then loads both and runs them, on ``--threads`` TVM threads, in alternating rounds of :data:`PASSES` forward passes, every kernel call
timed by a VM instrument; the calls are paired by their place in the forward pass (both revisions lower the same
network to the same calls, or the study says they do not). Recorded: each call's median milliseconds under each
revision, the base's over the revision's (above 1: the revision is faster), and the sums.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..report import REPO, environment
from ..revisions import PACKAGES, check_imports_from, child_env, revision_source

PASSES = 5  # forward passes a round, per revision


def export_first_compile(factory: str, input_shape: list[int], out: Path) -> str:
    """The network compiled through this process's schedhub from an empty registry, exported to ``out``; the report."""
    import tvm

    from schedhub import hooks
    from schedhub.tuner.execution import tvm_env

    from ..torch_export import export_factory

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    with tempfile.TemporaryDirectory() as tmp:
        mod, _, _ = export_factory(factory, input_shape, Path(tmp))
        with hooks.use(Path(tmp) / "store", target, cache=Path(tmp) / "cache", report_misses=False) as session:
            ex = tvm.compile(mod, target)
        ex.export_library(str(out))
    return session.report.summary()


def kernel_times(vm: Any, x: Any) -> list[float]:
    """Seconds of each kernel call (not the VM's builtins) of one forward pass, in order."""
    times: list[float] = []
    started: dict[str, float] = {}

    def instrument(_func: Any, name: str, before: bool, _ret: Any, *_args: Any) -> int:
        if not name.startswith("vm.builtin"):
            if before:
                started[name] = time.perf_counter()
            else:
                times.append(time.perf_counter() - started.pop(name))
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    vm["main"](x)
    vm.set_instrument(None)
    return times


def paired(base: list[list[float]], rev: list[list[float]]) -> dict[str, Any]:
    """Each call's median ms under both revisions (lists of passes, seconds per call) and base over rev, with sums."""
    if not base or not rev or len({len(p) for p in base + rev}) != 1:
        raise ValueError(f"the two compiles make different kernel calls ({sorted({len(p) for p in base + rev})} a pass): they cannot be paired")
    calls = [{"base_ms": statistics.median(p[i] for p in base) * 1e3, "rev_ms": statistics.median(p[i] for p in rev) * 1e3} for i in range(len(base[0]))]
    for c in calls:
        c["base_over_rev"] = c["base_ms"] / c["rev_ms"] if c["rev_ms"] else None
    sums = {"base_ms": sum(c["base_ms"] for c in calls), "rev_ms": sum(c["rev_ms"] for c in calls)}
    return {"calls": calls, "sums": sums, "base_over_rev": sums["base_ms"] / sums["rev_ms"]}


def time_side_by_side(libraries: list[Path], input_shape: list[int], rounds: int) -> list[list[list[float]]]:
    """Every pass's kernel times of each library, in alternating rounds (this process imports no schedhub)."""
    import numpy as np
    import tvm
    from tvm import relax

    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(input_shape).astype("float32"))
    vms = [relax.VirtualMachine(tvm.runtime.load_module(str(p)), tvm.cpu()) for p in libraries]
    for vm in vms:
        for _ in range(3):
            vm["main"](x)
    passes: list[list[list[float]]] = [[] for _ in vms]
    for r in range(rounds):
        for i in range(len(vms)) if r % 2 == 0 else reversed(range(len(vms))):
            passes[i].extend(kernel_times(vms[i], x) for _ in range(PASSES))
    return passes


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.revision_kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", required=True, help="the PyTorch model's factory, pkg.mod:function")
    parser.add_argument("--input", help="the input shape, e.g. 1,3,224,224 (default: bench.network_inputs.INPUTS)")
    parser.add_argument("--base", required=True, help="the revision compared against (a commit)")
    parser.add_argument("--rev", default="worktree", help="the revision measured (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="the timing process's TVM threads (default: this process's cores)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--export", type=Path, help=argparse.SUPPRESS)  # the child's part: compile with this process's schedhub
    parser.add_argument("--time", type=Path, nargs=2, help=argparse.SUPPRESS)  # the timing process's part: the two libraries
    args = parser.parse_args()
    from ..network_inputs import INPUTS

    input_shape = [int(d) for d in args.input.split(",")] if args.input else INPUTS[args.torch.rpartition(":")[2]]
    if args.export:
        print(export_first_compile(args.torch, input_shape, args.export))
        return
    if args.time:
        print(json.dumps(time_side_by_side(list(args.time), input_shape, args.rounds)))
        return
    with tempfile.TemporaryDirectory(prefix="schedhub-revision-kernels-") as tmp:
        libraries, reports = [], {}
        for rev in (args.base, args.rev):
            shim = revision_source(rev, Path(tmp) / "shims", PACKAGES)
            check_imports_from(shim, PACKAGES)
            library = Path(tmp) / f"{rev}.so"
            run = subprocess.run([sys.executable, "-m", "bench.studies.revision_kernels", "--torch", args.torch, "--input", ",".join(map(str, input_shape)),
                                  "--base", args.base, "--export", str(library)], cwd=REPO, env=child_env(shim), capture_output=True, text=True, timeout=3600)  # fmt: skip
            if run.returncode:
                raise SystemExit(f"{rev}: the compile failed: {run.stderr[-2000:]}")
            reports[rev] = run.stdout.strip().splitlines()[-1]
            libraries.append(library)
        timed = subprocess.run([sys.executable, "-m", "bench.studies.revision_kernels", "--torch", args.torch, "--input", ",".join(map(str, input_shape)),
                                "--base", args.base, "--rounds", str(args.rounds), "--time", *map(str, libraries)],
                               cwd=REPO, env={**os.environ, "TVM_NUM_THREADS": str(args.threads)}, capture_output=True, text=True, timeout=3600, check=True)  # fmt: skip
    base, rev = json.loads(timed.stdout.strip().splitlines()[-1])
    result = paired(base, rev)
    for i, c in enumerate(result["calls"]):
        print(f"{i:4d}  {args.base} {c['base_ms']:8.3f} ms   {args.rev} {c['rev_ms']:8.3f} ms   {c['base_over_rev'] or 0:5.2f}×")
    print(f"sums: {args.base} {result['sums']['base_ms']:.2f} ms, {args.rev} {result['sums']['rev_ms']:.2f} ms ({result['base_over_rev']:.3f}×)")
    if args.out:
        command = f"python -m bench.studies.revision_kernels --torch {args.torch} --input {','.join(map(str, input_shape))} --base {args.base} --rev {args.rev} --rounds {args.rounds} --threads {args.threads}"
        args.out.write_text(json.dumps({"command": command, "network": args.torch, "input": input_shape, "base": args.base, "rev": args.rev,
                                        "reports": reports, **result, "environment": environment()}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
