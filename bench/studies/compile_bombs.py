"""What the fourth hostile review's compile bombs cost a compile now, each served as a worker-verified record.

    python -m bench.studies.compile_bombs [--rounds 3] [--out FILE]

A 64 -> 128 matmul at batch 4 (a Relax network of one kernel) compiled inside ``use(...)`` from a registry holding one
record of its kernel, in a fresh kernel cache each time, against the same compile from an empty registry, interleaved;
per form: the median compile time over the rounds, its ratio to the default's, and what the compile reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tvm
from tvm.relax.frontend import nn

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks import use
from schedhub.hooks.kernels.identity import workload_module
from schedhub.hooks.metaschedule.msdb import trace_text
from schedhub.registry import LocalRegistry, Record
from schedhub.tuner.networks import models

from ..report import environment

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})


class MatMul(nn.Module):
    def __init__(self) -> None:
        self.w = nn.Parameter((64, 128), "float32")

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.matmul(x, self.w)


def _runs(sch: tvm.s_tir.Schedule) -> None:  # i unrolled around a kept j loop, each copy unrolling 32 j by 64 k
    i, j, k = sch.get_loops(sch.get_sblock("matmul"))
    j0, j1 = sch.split(j, [None, 32])
    sch.reorder(i, j0, j1, k)
    for loop in (i, j1, k):
        sch.unroll(loop)


def _deep(sch: tvm.s_tir.Schedule) -> None:  # a nest 250 loops deep
    loop = sch.get_loops(sch.get_sblock("matmul"))[2]
    for _ in range(247):
        loop = sch.split(loop, [None, 1])[0]


def _long_call(sch: tvm.s_tir.Schedule) -> None:  # k split [4096, 4096, 64]: 2^41 predicated statements a call
    sch.split(sch.get_loops(sch.get_sblock("matmul"))[2], [4096, 4096, 64])


def _stages(sch: tvm.s_tir.Schedule) -> None:  # 1,000 cache reads of one buffer
    for _ in range(1000):
        sch.cache_read(sch.get_sblock("matmul"), 0, "global")


def _split63(sch: tvm.s_tir.Schedule) -> None:  # j split by 63 (padded), vectorized, k unrolled
    i, j, k = sch.get_loops(sch.get_sblock("matmul"))
    j0, j1 = sch.split(j, [None, 63])
    sch.reorder(i, j0, k, j1)
    sch.vectorize(j1)
    sch.unroll(k)


FORMS: dict[str, Callable[[tvm.s_tir.Schedule], None]] = {"runs": _runs, "deep nest": _deep, "long call": _long_call,
                                                          "1000 cache reads": _stages, "split by 63": _split63}  # fmt: skip


def compile_once(store: Path, mod: tvm.IRModule) -> tuple[float, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        with use(store, CPU, cache=cache, report_misses=False, layout="given", prepack=False) as session:
            tvm.compile(mod, CPU)
        secs = time.perf_counter() - start
    (kernel,) = session.report.kernels
    return secs, {"outcome": kernel.outcome, "problems": [p[:300] for p in session.report.problems if "refused" in p]}


def measure(rounds: int) -> dict[str, Any]:
    mod, _ = MatMul().export_tvm({"forward": {"x": nn.spec.Tensor((4, 64), "float32")}})
    (kernel,) = models.kernels(mod, CPU, NO_REWRITES)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores = {"default": Path(tmp) / "empty"}
        LocalRegistry(stores["default"]).close()
        for name, form in FORMS.items():
            sch = tvm.s_tir.Schedule(workload_module(kernel.identity.workload))
            form(sch)
            stores[name] = Path(tmp) / name.replace(" ", "-")
            with LocalRegistry(stores[name]) as reg:  # a local put is a trusted (verified) record
                reg.put(Record(kernel.identity, trace_text(sch.trace), [1e-9]))
        times: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(rounds):
            for name, store in stores.items():
                secs, rows[name] = compile_once(store, mod)
                times[name].append(secs)
    default = statistics.median(times["default"])
    for name in stores:
        rows[name] = {"compile_secs": statistics.median(times[name]), "all_secs": times[name], "over_default": statistics.median(times[name]) / default, **rows[name]}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {"environment": environment(), "forms": measure(args.rounds)}
    for name, row in result["forms"].items():
        print(f"{name:18s} {row['compile_secs']:7.3f} s  {row['over_default']:5.2f}x  {row['outcome']}  {(row['problems'] or [''])[0][:120]}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
