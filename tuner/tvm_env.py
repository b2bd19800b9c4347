"""TVM set-up for tuning processes, and the build → artifact bytes → load path used across Ray.

Two facts shape this module:

- Importing ``tvm.s_tir.tensor_intrin`` parses ~250 TVMScript functions, each calling
  ``inspect.stack()``, which on CPython 3.11 resolves a module per frame: 35–120 s. MetaSchedule's
  ``TuneContext`` and its stock build function import it. :func:`prepare` imports it once with a
  frame walk that skips that lookup (about 2 s), so later imports are free.
- Built kernels cross process (and node) boundaries as the bytes of a shared library; modules go
  as TVM's JSON serialisation. Nothing is pickled.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any


def _frames_without_module_lookup(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` with the current line as context but no per-frame module search."""
    out = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno)
        out.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return out


@contextlib.contextmanager
def _cheap_stack() -> Iterator[None]:
    original = inspect.stack
    inspect.stack = _frames_without_module_lookup  # type: ignore[assignment]
    try:
        yield
    finally:
        inspect.stack = original  # type: ignore[assignment]


@functools.lru_cache(maxsize=1)
def prepare() -> None:
    """Make this process ready to tune: load TVM's tensor intrinsics the fast way (once)."""
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    with _cheap_stack():
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers intrinsics; slow without the patch)


def build_kernel(mod: Any, target: Any, _params: Any = None) -> Any:
    """MetaSchedule's default build without its tensor-intrinsic import: a runtime Module.

    Same signature as MetaSchedule's ``default_build``, so ``LocalBuilder(f_build=build_kernel)`` works too.
    """
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


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
    import tvm

    return {"kind": "llvm", "mcpu": str(tvm.target.codegen.llvm_get_system_cpu()), "num-cores": int(cores or os.cpu_count() or 1)}


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
