"""Opt-in local measurement of transfer candidates (``use(..., measure=SECONDS)``).

Each candidate's scheduled kernel is built, run on random inputs and checked against the kernel
with TVM's default schedule, then timed; the fastest that agrees is served. Only where the kernels
run on this machine: an ``llvm`` target for this CPU (its ``-mcpu`` absent or this host's).
Results are kept in the per-machine cache, so a kernel's candidates are measured once a machine.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

#: Short timings: enough to rank candidates whose latencies differ by tens of percent.
TIMING = {"number": 3, "repeat": 3, "min_repeat_ms": 5}
RTOL = 1e-3


@dataclass(frozen=True)
class Timing:
    secs: float | None  # median seconds per call; None: not served (error says why)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"secs": self.secs, "error": self.error}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Timing | None:
        secs, error = obj.get("secs"), obj.get("error")
        if isinstance(secs, (int, float)) and secs > 0 and error is None:
            return cls(float(secs))
        if secs is None and isinstance(error, str):
            return cls(None, error)
        return None


def host_cpu() -> str:
    return str(tvm.target.codegen.llvm_get_system_cpu())


def runs_here(target: tvm.target.Target) -> bool:
    """Whether kernels built for ``target`` run on this machine's CPU."""
    if target.kind.name != "llvm":
        return False
    mcpu = target.attrs.get("mcpu")
    return not mcpu or str(mcpu) == host_cpu()


def random_inputs(args_info: list[Any], seed: int = 0) -> list[np.ndarray]:
    """Arrays for MetaSchedule ArgInfo JSON (``["TENSOR", dtype, shape]``); integers are zeros (valid indices)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for info in args_info:
        if not (isinstance(info, list) and len(info) == 3 and info[0] == "TENSOR"):
            raise ValueError(f"cannot measure an argument {info!r}")
        _, dtype, shape = info
        kind = np.dtype(dtype).kind
        arrays.append(rng.uniform(-1, 1, shape).astype(dtype) if kind == "f" else np.zeros(shape, dtype))
    return arrays


def build(scheduled: tvm.IRModule, target: tvm.target.Target) -> Any:
    """A kernel compiled for this machine: ``tirx.build`` emits LLVM IR, and the machine code is generated
    when a function is first looked up (as much time again), so the entry function is looked up here."""
    lib = tvm.tirx.build(scheduled, target=target)
    lib["main"]
    return lib


def build_all(mods: list[tvm.IRModule], target: tvm.target.Target, workers: int) -> list[Any]:
    """:func:`build` of each module on up to ``workers`` threads (LLVM releases the GIL): the compiled
    module, or the exception its build raised."""

    def built(mod: tvm.IRModule) -> Any:
        try:
            return build(mod, target)
        except Exception as exc:  # a candidate that does not build is a result
            return exc

    if workers <= 1 or len(mods) <= 1:
        return [built(m) for m in mods]
    with ThreadPoolExecutor(max_workers=min(workers, len(mods)), thread_name_prefix="schedhub-measure") as pool:
        return list(pool.map(built, mods))


class KernelBench:
    """One kernel's measurement: the default schedule's outputs once, then each candidate (compiled by
    :func:`build_all`, beside the default) checked against them and timed, one at a time."""

    def __init__(self, default: Any, args_info: list[Any], target: tvm.target.Target) -> None:
        """``default``: the kernel with the target's default schedule as :func:`build_all` gave it (an
        exception it raised is raised here)."""
        if isinstance(default, Exception):
            raise default
        self.target = target
        self.dev = tvm.cpu(0)
        self.inputs = random_inputs(args_info)
        self.expected = self._run(default)

    def _run(self, lib: Any) -> list[np.ndarray]:
        tensors = [tvm.runtime.tensor(a, self.dev) for a in self.inputs]
        lib["main"](*tensors)
        return [t.numpy() for t in tensors]

    def time(self, built: Any) -> Timing:
        """A candidate's outputs checked against the default schedule's, then its time (``built``: what
        :func:`build_all` gave for it). Run it with nothing else working on the CPU."""
        if isinstance(built, Exception):
            return Timing(None, f"{built.__class__.__name__}: {str(built)[:500]}")
        try:
            for i, (want, got) in enumerate(zip(self.expected, self._run(built))):
                scale = max(1.0, float(np.abs(want).max(initial=0.0))) if want.dtype.kind == "f" else 0.0
                if not np.allclose(got, want, rtol=RTOL, atol=RTOL * scale, equal_nan=True):
                    return Timing(None, f"argument {i} differs from TVM's default schedule")
            tensors = [tvm.runtime.tensor(a, self.dev) for a in self.inputs]
            evaluator = built.time_evaluator("main", self.dev, **TIMING)
            return Timing(statistics.median(evaluator(*tensors).results))
        except Exception as exc:  # a candidate that does not run is a result
            return Timing(None, f"{exc.__class__.__name__}: {str(exc)[:500]}")


class Budget:
    """Seconds of measurement left in one compile."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.deadline
