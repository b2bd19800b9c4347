"""CUDA candidates compiled with NVRTC in-process, from the CUDA toolkit's PyPI wheels where the machine has no toolkit.

TVM 0.27 compiles a CUDA module through its ``tvm_callback_cuda_compile``: NVRTC by default (``cuda-bindings``), which
finds CUDA's headers under ``CUDA_PATH`` or beside ``nvcc`` only, and the CCCL headers (``cuda/std/cstdint``, which
every generated kernel includes) only in a system toolkit's ``targets/<triple>/include/cccl``. The PyPI wheels (``pip
install 'schedhub[cuda-nvrtc]'``: NVRTC, the runtime's and CRT's headers, CCCL) put them under ``nvidia/cu13/include``
and ``include/cccl``. :func:`install` registers a callback that compiles with NVRTC and those headers, so a GPU node
needs no toolkit and no ``nvcc`` subprocess per candidate; it keeps TVM's own callback where NVRTC is missing.

:func:`compile_source` needs no GPU: a CPU machine compiles the CUDA C that TVM keeps there to a cubin.

Most of a small kernel's NVRTC compile is CCCL's headers (``cuda/std/limits``, ``type_traits``: 0.8 s of a matmul
candidate's 1.0 s on a 2-core EPYC). NVRTC parses them once per process here: they are pre-included and kept as an
automatic precompiled header (:data:`PRELUDE`), so each later candidate pays about 0.3 s for them. The kernels' PTX is
the same lines as TVM's own compile gives (only the order of CCCL's unused constants differs); a source that does not
compile so is compiled as TVM would. The header is 218 MB a process, in a folder of its own under the temporary
directory; ``SCHEDHUB_NVRTC_PCH=0`` turns it off.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import itertools
import logging
import os
import re
import shutil
import tempfile
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


#: The CCCL headers every kernel TVM 0.27 generates includes under NVRTC: its NVRTC preamble's ``cstdint`` and ``limits``,
#: its CUDA codegen's ``type_traits``. :func:`prelude_options` parses them once per process.
PRELUDE = ("cuda/std/cstdint", "cuda/std/type_traits", "cuda/std/limits")


_prelude_failures = itertools.count(1)  # numbers this process's compiles that the prelude failed and TVM's own call did not


#: ``SCHEDHUB_NVRTC_PCH=0`` compiles every candidate as TVM does: a process's precompiled header is 218 MB on disk
#: (CCCL's parsed state; NVRTC's heap holds as much), which a node short of memory or ``/tmp`` may not spare.
PCH_ENV = "SCHEDHUB_NVRTC_PCH"
_PCH_PREFIX = "schedhub-nvrtc-pch-"


@functools.lru_cache(maxsize=1)
def _precompiled_dir() -> str:
    """This process's own folder for NVRTC's precompiled header, named by its pid: removed when the process exits, and
    by the next process to make one if it was killed (:func:`_sweep_dead`). Two processes never write one file."""
    _sweep_dead(Path(tempfile.gettempdir()))
    path = tempfile.mkdtemp(prefix=f"{_PCH_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _sweep_dead(parent: Path) -> None:
    """Remove this user's precompiled-header folders of processes that no longer run (a killed Ray worker leaves
    218 MB). Another user's folder, or a link, is left alone."""
    for folder in parent.glob(f"{_PCH_PREFIX}*-*"):
        pid = folder.name[len(_PCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not folder.is_symlink() and folder.is_dir() and folder.stat().st_uid == os.getuid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def prelude_options() -> list[str]:
    """NVRTC options that pre-include :data:`PRELUDE` and keep it as an automatic precompiled header for this process:
    the first compile creates it, later ones load it instead of parsing the headers again. None with
    ``SCHEDHUB_NVRTC_PCH=0`` (:data:`PCH_ENV`)."""
    if os.environ.get(PCH_ENV, "1") == "0":
        return []
    return [f"--pre-include={header}" for header in PRELUDE] + ["-pch", f"-pch-dir={_precompiled_dir()}"]


def compile_source(source: str, arch: str, compiler: str = "nvrtc", target_format: str | None = None, precompiled: bool = True) -> bytes:
    """``source`` (CUDA C, as TVM generates it) compiled for ``arch`` ("sm_90"): a cubin with NVRTC (its headers
    parsed once per process, :func:`prelude_options`, unless ``precompiled`` is False: as TVM calls NVRTC), a fatbin
    with nvcc; ``target_format="ptx"`` for PTX.
    Sets ``CUDA_PATH`` for this process to :func:`toolkit_root` when it is unset (TVM reads the headers' place from it)."""
    from tvm.support.nvcc import compile_cuda

    root = toolkit_root()
    if root is not None:
        os.environ.setdefault("CUDA_PATH", str(root))  # where TVM's compile_cuda looks for the headers
    fmt = target_format or ("cubin" if compiler == "nvrtc" else "fatbin")

    def compiled(options: list[str]) -> bytes:
        return bytes(compile_cuda(source, target_format=fmt, arch=arch, options=options or None, compiler=compiler))

    prelude_error: RuntimeError | None = None
    try:
        if compiler == "nvrtc" and precompiled and (prelude := prelude_options()):
            try:
                return compiled(include_options(root) + prelude)
            except RuntimeError as exc:  # compiled as TVM compiles it below: a source that compiles so is not lost to the prelude
                prelude_error = exc
        cubin = compiled(include_options(root))
    except (RuntimeError, ImportError) as exc:
        raise CudaCompileError(f"{compiler} could not compile a CUDA kernel for {arch}: {str(exc).strip()[-1500:]}") from exc
    if prelude_error is not None:
        level = logging.WARNING if next(_prelude_failures) == 1 else logging.DEBUG  # once a process: an NVRTC without PCH fails every one
        log.log(level, "NVRTC compiled a kernel as TVM does, not with its headers precompiled: %s", str(prelude_error).strip()[-300:])
    return cubin


def kernel_entries(ptx: str) -> list[str]:
    """The kernels (``.entry`` functions) of a PTX text, sorted: two compiles that give the same are the same kernels."""
    return sorted(re.findall(r"\.visible \.entry .*?\n}\n", ptx, re.S))


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
