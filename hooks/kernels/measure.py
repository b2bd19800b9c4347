"""Opt-in local measurement of transfer candidates (``use(..., measure=SECONDS)``).

Each candidate's scheduled kernel is built, run on random inputs and checked against the kernel
with the target's default schedule, then timed; the fastest that agrees is served. On a GPU the
default is DLight's schedule, a real contender: it is timed too, and where it is faster than every
candidate the kernel keeps it. Only where the kernels run on this machine: an ``llvm`` target for
this CPU (its ``-mcpu`` absent or this host's), or a ``cuda`` target for this machine's first GPU.
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
import tvm_ffi

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


def gpu_archs() -> list[str]:
    """The architectures this machine's first CUDA GPU runs code built for (compute 9.0: ``sm_90`` and its
    arch-specific ``sm_90a``); none without a GPU or without TVM's CUDA runtime (which then builds source only)."""
    if not tvm.runtime.enabled("cuda"):
        return []
    dev = tvm.cuda(0)
    if not dev.exist:
        return []
    arch = "sm_" + str(dev.compute_version).replace(".", "")
    return [arch, arch + "a"]


def runs_here(target: tvm.target.Target) -> bool:
    """Whether kernels built for ``target`` run on this machine: its CPU, or its first CUDA GPU."""
    if target.kind.name == "llvm":
        mcpu = target.attrs.get("mcpu")
        return not mcpu or str(mcpu) == host_cpu()
    if target.kind.name == "cuda":
        archs = gpu_archs()
        arch = target.attrs.get("arch")
        return bool(archs) and (not arch or str(arch) in archs)
    return False


def device_of(target: tvm.target.Target) -> Any:
    """The device kernels of ``target`` run on here (:func:`runs_here`)."""
    return tvm.cpu(0) if target.kind.name == "llvm" else tvm.cuda(0)


def machine(target: tvm.target.Target) -> str:
    """What a timing here is kept under: this CPU's name, or this GPU's."""
    return host_cpu() if target.kind.name == "llvm" else f"{tvm.cuda(0).device_name} {gpu_archs()[0]}"


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
    """A kernel compiled for this machine: ``tirx.build`` emits LLVM IR (and, for a GPU, its device code),
    and the machine code is generated when a function is first looked up (as much time again), so the
    entry function is looked up here."""
    lib = tvm.tirx.build(scheduled, target=target)
    lib["main"]
    return lib


def build_all(mods: list[tvm.IRModule], target: tvm.target.Target, workers: int) -> list[Any]:
    """:func:`build` of each module on up to ``workers`` threads (LLVM releases the GIL; GPU builds, which
    call the CUDA compiler back through Python, one at a time): the compiled module, or the exception its build raised."""
    if target.kind.name != "llvm":
        workers = 1

    def built(mod: tvm.IRModule) -> Any:
        try:
            return build(mod, target)
        except Exception as exc:  # a candidate that does not build is a result
            return exc

    if workers <= 1 or len(mods) <= 1:
        return [built(m) for m in mods]
    with ThreadPoolExecutor(max_workers=min(workers, len(mods)), thread_name_prefix="schedhub-measure") as pool:
        return list(pool.map(built, mods))


def first_equal(funcs: list[Any]) -> list[int]:
    """For each of ``funcs`` (scheduled PrimFuncs or modules), the index of the first structurally equal one (its own
    where none comes before): candidates that schedule a kernel the same way are built and timed once. Records that
    differ only in tiles TVM re-derived at the new shape do (on a quick fill's convnets at a new shape, 11-16% of the
    transfer candidates)."""
    seen: dict[int, list[int]] = {}
    out = []
    for i, func in enumerate(funcs):
        same = seen.setdefault(tvm_ffi.structural_hash(func), [])
        out.append(next((j for j in same if tvm_ffi.structural_equal(funcs[j], func)), i))
        if out[-1] == i:
            same.append(i)
    return out


class KernelBench:
    """One kernel's measurement: the default schedule's outputs once, then each candidate (compiled by
    :func:`build_all`, beside the default) checked against them and timed, one at a time."""

    def __init__(self, default: Any, args_info: list[Any], target: tvm.target.Target) -> None:
        """``default``: the kernel with the target's default schedule as :func:`build_all` gave it (an
        exception it raised is raised here)."""
        if isinstance(default, Exception):
            raise default
        self.target = target
        self.dev = device_of(target)
        self.inputs = random_inputs(args_info)
        self.default = default
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
            return Timing(self._secs(built))
        except Exception as exc:  # a candidate that does not run is a result
            return Timing(None, f"{exc.__class__.__name__}: {str(exc)[:500]}")

    def time_default(self) -> float:
        """The default schedule's seconds per call (raises if it does not run)."""
        return self._secs(self.default)

    def _secs(self, built: Any) -> float:
        tensors = [tvm.runtime.tensor(a, self.dev) for a in self.inputs]
        evaluator = built.time_evaluator("main", self.dev, **TIMING)
        return statistics.median(evaluator(*tensors).results)


class Budget:
    """Seconds of measurement left in one compile."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.deadline
