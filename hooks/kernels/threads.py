"""The threads TVM's CPU runtime will run kernels on, against the cores a target was tuned for.

A record tuned for ``num-cores: 2`` assumes two threads; TVM's thread pool starts with
``TVM_NUM_THREADS``, else ``OMP_NUM_THREADS``, else *half* the hardware threads on x86-64 (it assumes
hyper-threading), so on a 2-vCPU machine every kernel ran on one thread, silently (ResNet-18, batch 2,
96 px: 33.5 ms against 17.8 with both threads). The hook says so once per block and target.
"""

from __future__ import annotations

import os
import platform
import re
import warnings
from collections.abc import Mapping
from typing import Any

import tvm

from .measure import host_cpu, runs_here


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container or ``taskset`` narrows), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class IdleCoresWarning(UserWarning):
    """Kernels compiled for N cores will run on fewer threads in this process."""


def runtime_threads(env: Mapping[str, str] | None = None, hardware_threads: int | None = None, machine: str | None = None) -> int:
    """The size TVM's CPU thread pool starts with in a process with this environment.

    TVM's ``threading_backend::MaxConcurrency``, read without starting the pool (starting it would fix its
    size before the user's program sets the variable): the first of ``TVM_NUM_THREADS``, ``OMP_NUM_THREADS``
    read as C's ``atoi`` reads it, else the hardware threads, halved on x86-64; at least 1 and at most the
    hardware threads.
    """
    env = os.environ if env is None else env
    hardware = hardware_threads if hardware_threads is not None else os.cpu_count() or 1
    value = env.get("TVM_NUM_THREADS", env.get("OMP_NUM_THREADS"))
    if value is not None:
        match = re.match(r"\s*([+-]?\d+)", value)
        count = int(match.group(1)) if match else 0
    else:
        count = hardware // 2 if (machine or platform.machine()).lower() in ("x86_64", "amd64") else hardware
    return max(min(count, hardware), 1)  # the pool has no more workers than the machine has threads


def idle_cores(target: tvm.target.Target) -> str | None:
    """Why kernels built for ``target`` here will leave cores idle, or None when they will not (or run elsewhere)."""
    if not runs_here(target):
        return None
    cores = int(target.attrs.get("num-cores", 0) or 0)
    wanted, threads = min(cores, usable_cpus()), runtime_threads()
    if threads >= wanted:
        return None
    return (f"the target was tuned for num-cores={cores}, but TVM will run its kernels on {threads} thread(s) in this process: "
            f"set TVM_NUM_THREADS={wanted} before the first kernel runs (TVM's default is half the hardware threads on x86-64)")  # fmt: skip


def warn_idle_cores(target: tvm.target.Target) -> str | None:
    """Warn (IdleCoresWarning) when ``target``'s cores would go unused here; the message, or None."""
    message = idle_cores(target)
    if message is not None:
        warnings.warn(f"schedhub: {message}", IdleCoresWarning, stacklevel=3)
    return message


def host_target(cores: int | None = None) -> dict[str, Any]:
    """This machine's CPU as a target dict, its cores as ``num-cores`` (``mcpu: native`` silently means generic
    x86-64, and a target naming another CPU strands every miss on workers that cannot time it)."""
    return {"kind": "llvm", "mcpu": host_cpu(), "num-cores": int(cores or usable_cpus())}


class UnknownCPU(ValueError):
    """A CPU target whose ``mcpu`` LLVM does not know: LLVM would print its own complaint and build for a generic CPU."""


def check_cpu(target: tvm.target.Target | Mapping[str, Any] | str) -> None:
    """Raise :class:`UnknownCPU` (one line) where ``target`` is an llvm target naming a CPU LLVM does not know for its triple."""
    spec = target.export() if isinstance(target, tvm.target.Target) else target
    if not isinstance(spec, Mapping) or spec.get("kind") != "llvm" or not spec.get("mcpu"):
        return
    mcpu, triple = str(spec["mcpu"]), str(spec.get("mtriple") or tvm.target.codegen.llvm_get_system_triple())
    if mcpu != "native" and not tvm.target.codegen.llvm_is_valid_cpu(mcpu, triple):
        raise UnknownCPU(f"LLVM knows no CPU {mcpu!r} for {triple}: name one it knows (this machine's is {host_cpu()!r}: "
                         "schedhub.hooks.host_target() gives it)")  # fmt: skip


def stranded_cpu(target_text: str) -> str | None:
    """The CPU a miss of canonical target ``target_text`` waits for where it is an llvm target for another CPU model than
    this machine's (a worker times only its own), else None."""
    import json

    try:
        spec = json.loads(target_text)
    except ValueError:
        return None
    mcpu = spec.get("mcpu") if isinstance(spec, dict) and spec.get("kind") == "llvm" else None
    return str(mcpu) if mcpu and mcpu not in ("native", host_cpu()) else None
