"""TVM set-up for tuning processes, and the build → artifact bytes → load path used across Ray.

Two facts shape this module:

- MetaSchedule's ``TuneContext`` and its stock build function import TVM's tensor intrinsics, which
  takes 35–120 s done the ordinary way: :func:`prepare` imports them once the cheap way
  (:mod:`schedhub.hooks.kernels.intrinsics`), so later imports are free.
- Built kernels cross process (and node) boundaries as the bytes of a shared library; modules go
  as TVM's JSON serialisation. Nothing is pickled.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from typing import Any


def prepare() -> None:
    """Make this process ready to tune (search, replay schedules): :func:`prepare_kernels`, and TVM's tensor
    intrinsics loaded the fast way (once)."""
    from schedhub.hooks.kernels.intrinsics import load_tensor_intrinsics  # imports TVM: not when this module is

    prepare_kernels()
    load_tensor_intrinsics()


@functools.lru_cache(maxsize=1)
def prepare_kernels() -> None:
    """Make this process ready to build and run scheduled kernels (a build or measurement task): TVM's CPU threads
    sized, and on a GPU node CUDA compiled by NVRTC in-process. Not the tensor intrinsics (2 s of a worker's start):
    only scheduling looks them up, and a scheduled module has its tensorized body in place."""
    run_kernels_on_usable_cpus()
    if compiles_cuda():  # a GPU node: CUDA candidates compiled by NVRTC in-process, headers from PyPI where no toolkit is
        from .cuda_build import install

        install()


def import_tvm_without_torch() -> None:
    """Import TVM in a process that never handles a PyTorch tensor (a tuning task's) without importing PyTorch.

    ``tvm_ffi`` imports ``torch`` whenever it is installed, for its tensor exchange with PyTorch: in a tuning worker
    that is most of TVM's import (2.85 s against 0.85 s on a 2-core AMD EPYC), paid again by every Ray worker a node
    starts. Here ``import torch`` fails while TVM is imported, which ``tvm_ffi`` takes as "not installed"; afterwards
    PyTorch imports as usual. Nothing is done where TVM or PyTorch is imported already.
    """
    if "tvm" in sys.modules or "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # Python's own way to make an import fail
    try:
        import tvm  # noqa: F401
    finally:
        if sys.modules.get("torch", ...) is None:
            del sys.modules["torch"]


def run_kernels_on_usable_cpus() -> None:
    """Size TVM's CPU thread pool to this process's CPUs unless the user chose (``TVM_NUM_THREADS``):
    TVM's own default is half the hardware threads. Only before the first kernel runs does it count."""
    from schedhub.hooks.kernels.threads import usable_cpus

    os.environ.setdefault("TVM_NUM_THREADS", str(usable_cpus()))


def build_kernel(mod: Any, target: Any, _params: Any = None) -> Any:
    """MetaSchedule's default build without its tensor-intrinsic import: a runtime Module.

    Same signature as MetaSchedule's ``default_build``, so ``LocalBuilder(f_build=build_kernel)`` works too.
    """
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    built = tvm.tirx.build(mod, target=target)
    if "gpu" in target.keys and not built.imports:
        raise UnboundGpuKernel(
            f"no loop of this {target.kind.name} kernel is bound to a GPU thread: TVM built it as host code over device memory, which "
            "crashes the process that runs it (an unscheduled kernel: a GPU's default is DLight's schedule)"
        )
    return built


class UnboundGpuKernel(ValueError):
    """A kernel for a GPU target with no loop bound to a thread: it would run on the host and read device memory."""


def packed_args_info(mod: Any) -> list[Any] | None:
    """The arguments (ArgInfo JSON) ``mod``'s kernel takes once its weights' layout rewrite is removed
    (:func:`build_kernel`), where that differs from its own: None for a kernel whose schedule rewrites no weights."""
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.kernels.identity import plain_json

    def args(remove_preproc: bool) -> list[Any]:
        return [plain_json(a.as_json()) for a in ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=remove_preproc)]

    packed = args(True)
    return packed if packed != args(False) else None


def library_bytes(rt_mod: Any) -> bytes:
    """A runtime Module as shared-library bytes (linked by the system compiler)."""
    with tempfile.TemporaryDirectory(prefix="schedhub-build-") as tmp:
        path = os.path.join(tmp, "kernel.so")
        rt_mod.export_library(path)
        with open(path, "rb") as f:
            return f.read()


def load_library(data: bytes, directory: str) -> Any:
    """Load shared-library bytes as a runtime Module (the file is written under ``directory``)."""
    import tvm

    fd, path = tempfile.mkstemp(suffix=".so", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return tvm.runtime.load_module(path)


def host_target(cores: int | None = None) -> dict[str, Any]:
    """This machine's CPU as a target dict (``mcpu: native`` silently means generic x86-64)."""
    from schedhub.hooks.kernels.threads import host_target as hooks_host_target

    return hooks_host_target(cores)


def compiles_cuda() -> bool:
    """Whether this process's TVM builds CUDA kernels to code a GPU loads (it has the CUDA runtime;
    without it a CUDA build keeps CUDA C source only)."""
    import tvm

    return bool(tvm.runtime.enabled("cuda"))


class NoDevice(RuntimeError):
    """The machine has no device of the kind asked for."""


def device_target(device: str) -> Any:
    """The target of this machine's ``"cpu"`` (:func:`host_target`) or first ``"cuda"`` GPU (its own
    description: arch and limits, ``Target.from_device``)."""
    import tvm

    if device == "cpu":
        return tvm.target.Target(host_target())
    if device != "cuda":
        raise ValueError(f"devices are 'cpu' and 'cuda', not {device!r}")
    if not (compiles_cuda() and tvm.cuda(0).exist):
        raise NoDevice("no CUDA device here (this TVM sees none): run this on a machine with an NVIDIA GPU")
    return tvm.target.Target.from_device(tvm.cuda(0))
