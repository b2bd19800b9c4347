"""CUDA candidates compiled with NVRTC in-process, headers from PyPI (tuner/execution/cuda_build.py): no GPU needed, only the
test extra's ``cuda-nvrtc`` wheels. The CUDA C is what TVM generates here for a network's kernels (DLight's schedules)."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

from schedhub.tuner.execution import cuda_build

from schedhub.tuner.networks import models

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
ELF = b"\x7fELF"  # a cubin is an ELF image


@pytest.fixture(scope="module")
def source() -> str:
    """The CUDA C of the MLP's kernels, scheduled by DLight, as TVM keeps it on a machine without a GPU."""
    mod, _, _ = models.export("mlp", batch=4, features=32, hidden=64)
    return tvm.compile(mod, CUDA).mod.imports[0].imports[0].inspect_source("")


@pytest.fixture(autouse=True)
def nvrtc_wheels() -> None:
    if not cuda_build.nvrtc_available() or cuda_build.toolkit_root() is None:
        pytest.fail("NVRTC or CUDA's headers are not installed: pip install -e '.[test]' (its cuda-nvrtc wheels)")


def test_generated_kernels_compile_to_a_cubin_with_nvrtc(source: str) -> None:
    assert "__global__" in source and "cuda/std" in source  # TVM's kernels include CCCL's headers, which TVM's own search misses in the wheels
    cubin = cuda_build.compile_source(source, "sm_90")
    assert cubin[:4] == ELF and len(cubin) > 1000


def test_installed_callback_is_what_tvm_compiles_cuda_modules_with(source: str) -> None:
    """After :func:`install`, TVM's ``tvm_callback_cuda_compile`` (what a GPU node's TVM calls for each CUDA module)
    compiles for the current target's arch with NVRTC and the wheels' headers."""
    original = tvm.get_global_func("tvm_callback_cuda_compile")
    try:
        assert cuda_build.install()
        with tvm.target.Target({"kind": "cuda", "arch": "sm_80"}):
            cubin = bytes(tvm.get_global_func("tvm_callback_cuda_compile")(source))
        assert cubin[:4] == ELF
    finally:
        import tvm_ffi

        tvm_ffi.register_global_func("tvm_callback_cuda_compile", original, override=True)


def test_a_chosen_compiler_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    assert not cuda_build.install()


def test_a_source_that_does_not_compile_says_why() -> None:
    with pytest.raises(cuda_build.CudaCompileError, match="nvrtc could not compile a CUDA kernel for sm_90"):
        cuda_build.compile_source('extern "C" __global__ void k() { undefined_thing(); }', "sm_90")


def test_headers_parsed_once_give_the_ptx_tvm_compiles(source: str) -> None:
    """The prelude is kept as a precompiled header of this process, and the kernels it compiles are TVM's own: the same
    PTX lines (CCCL's unused constants may be declared in another order), every kernel's text the same."""
    ours = cuda_build.compile_source(source, "sm_90", target_format="ptx").decode()
    as_tvm = cuda_build.compile_source(source, "sm_90", target_format="ptx", precompiled=False).decode()
    assert any(f.endswith(".pch") for f in os.listdir(cuda_build._precompiled_dir()))  # the headers were precompiled for the next kernel
    assert cuda_build.kernel_entries(ours) == cuda_build.kernel_entries(as_tvm) and len(cuda_build.kernel_entries(ours)) >= 3
    assert sorted(ours.splitlines()) == sorted(as_tvm.splitlines())


def test_a_source_the_prelude_breaks_is_compiled_as_tvm_does(source: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cuda_build, "PRELUDE", ("schedhub/no_such_header.h",))
    monkeypatch.setattr(cuda_build, "_prelude_failures", itertools.count(1))
    with caplog.at_level(logging.WARNING, logger="schedhub.tuner"):
        cubins = [cuda_build.compile_source(source, "sm_90") for _ in range(2)]
    assert all(cubin[:4] == ELF for cubin in cubins)
    assert caplog.text.count("not with its headers precompiled") == 1 and "no_such_header" in caplog.text  # said once a process


def test_the_precompiled_header_leaves_with_its_process(tmp_path: Path) -> None:
    script = tmp_path / "compile.py"
    script.write_text("from schedhub.tuner.execution import cuda_build\n"
                      "cuda_build.compile_source('extern \"C\" __global__ void k(float* a) { a[threadIdx.x] += 1.0f; }', 'sm_90')\n"
                      "print(cuda_build._precompiled_dir())\n")  # fmt: skip
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder.name.startswith("schedhub-nvrtc-pch-") and not folder.exists()


def test_a_killed_process_precompiled_header_is_swept_by_the_next(tmp_path: Path) -> None:
    """A Ray worker killed mid-round leaves its 218 MB header behind: the next process to make one removes it."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = tmp_path / f"schedhub-nvrtc-pch-{ended.stdout.strip()}-abc"
    living = tmp_path / f"schedhub-nvrtc-pch-{os.getpid()}-xyz"
    other = tmp_path / "schedhub-nvrtc-pch-notapid-x"
    for folder in (dead, living, other):
        folder.mkdir()
        (folder / "tvm_kernels_0.pch").write_bytes(b"pch")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "precious").write_text("mine")
    link = tmp_path / f"schedhub-nvrtc-pch-{ended.stdout.strip()}-link"
    link.symlink_to(kept, target_is_directory=True)  # planted in a shared /tmp: the sweep follows no link
    cuda_build._sweep_dead(tmp_path)
    assert not dead.exists() and living.exists() and other.exists()
    assert (kept / "precious").read_text() == "mine" and link.is_symlink()


def test_precompiled_headers_can_be_turned_off(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cuda_build.PCH_ENV, "0")
    assert cuda_build.prelude_options() == []
    assert cuda_build.compile_source(source, "sm_90")[:4] == ELF
