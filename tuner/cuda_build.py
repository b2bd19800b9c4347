"""CUDA candidates compiled with NVRTC in-process, from the CUDA toolkit's PyPI wheels where the machine has no toolkit.

TVM 0.27 compiles a CUDA module through its ``tvm_callback_cuda_compile``: NVRTC by default (``cuda-bindings``), which
finds CUDA's headers under ``CUDA_PATH`` or beside ``nvcc`` only, and the CCCL headers (``cuda/std/cstdint``, which
every generated kernel includes) only in a system toolkit's ``targets/<triple>/include/cccl``. The PyPI wheels (``pip
install 'schedhub[cuda-nvrtc]'``: NVRTC, the runtime's and CRT's headers, CCCL) put them under ``nvidia/cu13/include``
and ``include/cccl``. :func:`install` registers a callback that compiles with NVRTC and those headers, so a GPU node
needs no toolkit and no ``nvcc`` subprocess per candidate; it keeps TVM's own callback where NVRTC is missing.

:func:`compile_source` needs no GPU: a CPU machine compiles the CUDA C that TVM keeps there to a cubin.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("schedhub.tuner")

#: The CUDA major version whose PyPI wheels schedhub knows the layout of (``nvidia/cu13``).
PYPI_ROOT = "cu13"


class CudaCompileError(RuntimeError):
    """NVRTC or nvcc could not compile a CUDA source, or no CUDA headers were found; the message says which."""


@functools.lru_cache(maxsize=1)
def toolkit_root() -> Path | None:
    """Where CUDA's headers are: ``$CUDA_PATH`` if set, else the PyPI wheels' ``nvidia/cu13`` (when they hold
    ``include/cuda_runtime.h``), else None (TVM looks beside ``nvcc`` and in ``/usr/local/cuda``)."""
    if os.environ.get("CUDA_PATH"):
        return Path(os.environ["CUDA_PATH"])
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        root = Path(base) / PYPI_ROOT
        if (root / "include" / "cuda_runtime.h").is_file():
            return root
    return None


def nvrtc_available() -> bool:
    """Whether NVRTC can be called in this process (``cuda-bindings`` and its NVRTC library)."""
    return importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None


def include_options(root: Path | None) -> list[str]:
    """The ``-I`` options a PyPI layout needs beyond TVM's: its CCCL headers, which TVM looks for only where a system toolkit keeps them."""
    cccl = root / "include" / "cccl" if root is not None else None
    return [f"-I{cccl}"] if cccl is not None and cccl.is_dir() else []


def compile_source(source: str, arch: str, compiler: str = "nvrtc") -> bytes:
    """``source`` (CUDA C, as TVM generates it) compiled for ``arch`` ("sm_90"): a cubin with NVRTC, a fatbin with nvcc.
    Sets ``CUDA_PATH`` for this process to :func:`toolkit_root` when it is unset (TVM reads the headers' place from it)."""
    from tvm.support.nvcc import compile_cuda

    root = toolkit_root()
    if root is not None:
        os.environ.setdefault("CUDA_PATH", str(root))  # where TVM's compile_cuda looks for the headers
    try:
        return bytes(compile_cuda(source, target_format="cubin" if compiler == "nvrtc" else "fatbin", arch=arch, options=include_options(root) or None,
                                  compiler=compiler))  # fmt: skip
    except (RuntimeError, ImportError) as exc:
        raise CudaCompileError(f"{compiler} could not compile a CUDA kernel for {arch}: {str(exc).strip()[-1500:]}") from exc


def arch_of(target: Any) -> str:
    """The ``sm_XX`` a CUDA target compiles for (its ``arch``), or the current GPU's when the target names none."""
    arch = str(target.attrs.get("arch", "")) if target is not None else ""
    if arch:
        return arch
    import tvm

    major, minor = str(tvm.cuda(0).compute_version).split(".")
    return f"sm_{major}{minor}"


def _compile_for_current_target(code: str) -> bytes:
    import tvm

    return compile_source(code, arch_of(tvm.target.Target.current(allow_none=True)))


def install() -> bool:
    """Make TVM compile CUDA modules in this process with :func:`compile_source` (NVRTC, headers found as above).
    Returns whether it did: not where NVRTC is missing or the user chose a compiler (``TVM_CUDA_COMPILE_MODE``)."""
    if os.environ.get("TVM_CUDA_COMPILE_MODE") or not nvrtc_available():
        return False
    import tvm_ffi

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", _compile_for_current_target, override=True)
    return True
