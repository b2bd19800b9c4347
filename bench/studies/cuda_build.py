"""What a CUDA candidate's build costs a tuning round: TVM's lowering to CUDA C, then NVRTC in-process as TVM calls it
(``nvrtc-tvm``), NVRTC as the tuner calls it (``nvrtc``: CCCL's headers precompiled once per process,
``tuner.execution.cuda_build``) and, where installed, nvcc (a subprocess, a fatbin, as TVM's ``nvcc`` mode), on the same candidates.
No GPU needed: all compile for ``--arch``.

    python -m bench.studies.cuda_build [--kernels 2] [--candidates 8] [--arch sm_90] [--compilers nvrtc-tvm,nvrtc,nvcc]

The candidates are MetaSchedule design-space samples of the BERT layer's (seq 128) heaviest matmuls for a CUDA target,
as the tuner's builds get them; each is lowered by TVM to CUDA C here and compiled by every compiler, one at a time
(the machine's cores are otherwise idle), the order turned each candidate. Each candidate's PTX from both NVRTC calls
is compared: the same lines (``ptx_lines_equal``) and the same kernel entries. nvcc needs
``pip install -e '.[cuda-nvcc]'``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.tuner.execution import cuda_build
from schedhub.tuner.networks import models
from schedhub.tuner.networks.network import heaviest_first

from ..report import REPO, environment


def candidate_sources(arch: str, kernels: int, candidates: int) -> list[tuple[str, str, float]]:
    """(kernel op, CUDA C, seconds TVM took to lower it to that C) of ``candidates`` design-space samples of each of the
    BERT layer's ``kernels`` heaviest matmuls."""
    import tvm

    from schedhub.hooks.kernels.identity import workload_module
    from schedhub.hooks.metaschedule.msdb import normalize_mod
    from schedhub.hooks.metaschedule.synthesis import design_space_samples

    target = tvm.target.Target({"kind": "cuda", "arch": arch, "max_threads_per_block": 1024, "max_num_threads": 1024, "thread_warp_size": 32,
                                "max_shared_memory_per_block": 49152, "registers_per_block": 65536})  # an H100/H200's limits, as from_device gives them
    mod = models.export_with_weights("bert_layer", batch=1, seq=128)[0]
    found = heaviest_first(k for k in models.kernels(mod, target, NO_REWRITES) if "matmul" in k.identity.op)
    out: list[tuple[str, str, float]] = []
    used = 0
    for kernel in found:  # the heaviest first; a kernel none of whose draws completes (the fused GELU's, here) is passed over
        samples = design_space_samples(normalize_mod(workload_module(kernel.identity.workload)), target, 8 * candidates)[:candidates]
        for sch in samples:
            try:
                started = time.perf_counter()
                built = tvm.tirx.build(sch.mod, target=target)
                out.append((kernel.identity.op, built.imports[0].inspect_source(""), time.perf_counter() - started))
            except Exception:  # noqa: BLE001 (a sample TVM cannot lower is not a candidate a round would build either)
                continue
        used += bool(samples)
        if used == kernels:
            break
    return out


def nvcc_path() -> Path:
    import nvidia

    return next(Path(p) for root in nvidia.__path__ for p in Path(root).glob("*/bin/nvcc"))


def time_nvcc(source: str, arch: str, workdir: Path) -> float:
    """Seconds for nvcc to compile ``source`` to a fatbin, as TVM's nvcc mode runs it (a subprocess on a file)."""
    src, out = workdir / "kernel.cu", workdir / "kernel.fatbin"
    src.write_text(source)
    started = time.perf_counter()
    done = subprocess.run([str(nvcc_path()), "--fatbin", "-O3", f"-arch={arch}", "-I", str(cuda_build.toolkit_root() / "include" / "cccl"),
                           "-o", str(out), str(src)], capture_output=True, text=True)  # fmt: skip
    secs = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return secs


def time_nvrtc(source: str, arch: str, as_tvm: bool) -> tuple[float, str]:
    """Seconds for NVRTC to compile ``source`` to a cubin, as TVM calls it or as the tuner does; and its PTX."""
    started = time.perf_counter()
    cuda_build.compile_source(source, arch, precompiled=not as_tvm)
    secs = time.perf_counter() - started
    return secs, cuda_build.compile_source(source, arch, target_format="ptx", precompiled=not as_tvm).decode()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.cuda_build", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--compilers", default="nvrtc-tvm,nvrtc", help="of nvrtc-tvm, nvrtc, nvcc")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "cuda-build.json")
    args = parser.parse_args()
    compilers = args.compilers.split(",")
    if unknown := set(compilers) - {"nvrtc-tvm", "nvrtc", "nvcc"}:
        parser.error(f"unknown compilers {sorted(unknown)}: of nvrtc-tvm, nvrtc, nvcc")
    sources = candidate_sources(args.arch, args.kernels, args.candidates)
    for as_tvm in (True, False):  # NVRTC loaded, the tuner's precompiled headers made, as in a warm worker
        time_nvrtc(sources[0][1], args.arch, as_tvm)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="schedhub-cuda-build-") as tmp:
        for i, (op, source, lower_secs) in enumerate(sources):
            order = compilers[i % len(compilers):] + compilers[: i % len(compilers)]
            secs: dict[str, float] = {}
            ptx: dict[str, str] = {}
            for c in order:
                if c == "nvcc":
                    secs[c] = time_nvcc(source, args.arch, Path(tmp))
                else:
                    secs[c], ptx[c] = time_nvrtc(source, args.arch, as_tvm=c == "nvrtc-tvm")
            row: dict[str, Any] = {"op": op, "source_chars": len(source), "lower_secs": lower_secs, **{f"{c}_secs": s for c, s in secs.items()}}
            if len(ptx) == 2:
                row["ptx_lines_equal"] = sorted(ptx["nvrtc"].splitlines()) == sorted(ptx["nvrtc-tvm"].splitlines())
                row["kernel_entries_equal"] = cuda_build.kernel_entries(ptx["nvrtc"]) == cuda_build.kernel_entries(ptx["nvrtc-tvm"])
            rows.append(row)
            print(f"{op:<28} TVM lowering {lower_secs:.2f} s  " + "  ".join(f"{c} {secs[c]:.2f} s" for c in compilers), flush=True)
    summary: dict[str, Any] = {"candidates": len(rows), "lower_median_secs": statistics.median(r["lower_secs"] for r in rows),
                               **{f"{c}_median_secs": statistics.median(r[f"{c}_secs"] for r in rows) for c in compilers},
                               **{f"{c}_total_secs": sum(r[f"{c}_secs"] for r in rows) for c in compilers}}  # fmt: skip
    if "nvrtc-tvm" in compilers and "nvrtc" in compilers:
        summary["nvrtc_speedup_median"] = statistics.median(r["nvrtc-tvm_secs"] / r["nvrtc_secs"] for r in rows)
        summary["ptx_lines_equal"] = sum(r["ptx_lines_equal"] for r in rows)
        summary["kernel_entries_equal"] = sum(r["kernel_entries_equal"] for r in rows)
    print(json.dumps(summary, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": f"python -m bench.studies.cuda_build --kernels {args.kernels} --candidates {args.candidates} --arch {args.arch} "
                                               f"--compilers {args.compilers}",
                                    "summary": summary, "rows": rows, "environment": environment()}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
