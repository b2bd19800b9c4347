"""The tuner and the worker for CUDA targets, on a machine without a GPU.

What a CPU machine can show: where CUDA builds and measurements are placed, that DLight's
schedule is the default a CUDA record must beat (it builds where the unscheduled kernel does
not), that MetaSchedule searches a CUDA target as users write it, and that a worker leases only
the jobs its cluster can time, asking the GPU itself rather than trusting a declared one.
Timings on a GPU: ``python -m bench gpu`` on a lent machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tvm

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks.kernels.identity import target_text, workload_module
from schedhub.hooks.kernels.measure import host_cpu
from schedhub.hooks.metaschedule.msdb import tuning_target
from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, kernels, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.search import TuneOptions, default_schedule
from schedhub.tuner.worker import Worker

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
CUDA_TEXT = target_text(CUDA)


@pytest.fixture(scope="module")
def matmul() -> tvm.IRModule:
    mod, _, _ = models.export("mlp", batch=4, features=32, hidden=64)
    kernel = next(k for k in models.kernels(mod, CUDA, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu")
    return workload_module(kernel.identity.workload)


def test_cuda_builds_go_to_cuda_compilers_and_measurements_hold_one_gpu() -> None:
    assert cluster.placement("build", CUDA_TEXT) == {"num_cpus": 1, "resources": {cluster.CUDA_BUILD_RESOURCE: pytest.approx(0.001)}}
    measure = cluster.placement("measure", CUDA_TEXT)
    assert measure["num_gpus"] == 1 and cluster.MEASURE_RESOURCE not in measure.get("resources", {})  # a GPU, not the CPU's timing slot
    with pytest.raises(cluster.UnsupportedKind, match="not 'rocm'"):
        cluster.placement("measure", target_text({"kind": "rocm"}))


@pytest.mark.skipif(tvm_env.compiles_cuda(), reason="this machine's TVM compiles CUDA")
def test_a_cuda_build_on_a_node_without_the_cuda_runtime_fails_clearly(matmul: tvm.IRModule) -> None:
    """TVM without the CUDA runtime 'builds' a CUDA kernel to source no GPU loads: not an artifact."""
    built = kernels.build(tvm.ir.save_json(default_schedule(matmul, CUDA)), CUDA_TEXT)
    assert built["artifact"] is None and "cannot compile CUDA" in built["error"]


def test_dlight_is_the_default_a_cuda_record_must_beat(matmul: tvm.IRModule) -> None:
    baseline = default_schedule(matmul, CUDA)
    assert "threadIdx.x" in baseline.script() and "threadIdx" not in matmul.script()
    assert "__global__" in tvm.tirx.build(baseline, target=CUDA).imports[0].inspect_source("")  # a CUDA kernel (source here)
    assert not tvm.tirx.build(matmul, target=CUDA).imports  # unscheduled: no device code at all, host loops over GPU memory
    cpu = tvm.target.Target({"kind": "llvm"})
    assert default_schedule(matmul, cpu) is matmul  # on a CPU the unscheduled kernel is the default


def test_a_cuda_kernel_bound_to_no_thread_is_refused_at_build_not_run_as_host_code(matmul: tvm.IRModule) -> None:
    """Unscheduled, TVM builds it as host loops over device memory: on a GPU its measurement worker died (SIGSEGV)."""
    with pytest.raises(tvm_env.UnboundGpuKernel, match="bound to a GPU thread"):
        tvm_env.build_kernel(matmul, CUDA)
    assert tvm_env.build_kernel(default_schedule(matmul, CUDA), CUDA).imports  # DLight's: device code
    assert tvm_env.build_kernel(matmul, tvm.target.Target({"kind": "llvm"})) is not None  # on a CPU the bare kernel is the default


def test_metaschedule_searches_a_cuda_target_as_users_write_it(matmul: tvm.IRModule) -> None:
    from tvm.s_tir import meta_schedule as ms

    def design_spaces(target: tvm.target.Target) -> list:
        context = ms.TuneContext(mod=matmul, target=target, space_generator="post-order-apply", search_strategy="evolutionary", num_threads=1)
        return context.generate_design_space()

    with pytest.raises(Exception, match="max_threads_per_block"):
        design_spaces(CUDA)
    spaces = design_spaces(tuning_target(CUDA))
    assert spaces and all("threadIdx.x" in s.mod.script() for s in spaces)
    assert tuning_target(CUDA).attrs["max_shared_memory_per_block"] == 48 * 1024
    assert str(tuning_target(CUDA).attrs["arch"]) == "sm_90"


def test_a_cuda_candidates_trace_applied_again_finds_the_searchs_build(matmul: tvm.IRModule) -> None:
    """Publishing takes the search's builds by module structure (``backends.BuiltKernels``): a CUDA candidate that
    MetaSchedule sampled and postprocessed (as its evolutionary search's first population is), its trace applied again
    as publishing applies it, is the module the builder was given, so a GPU round does not compile its best candidates
    twice (1-10 s each)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.metaschedule.msdb import scheduled
    from schedhub.tuner.execution.backends import BuiltKernels

    context = ms.TuneContext(mod=matmul, target=tuning_target(CUDA), space_generator="post-order-apply",
                             search_strategy=ms.search_strategy.ReplayTrace(), task_name="matmul", num_threads=1)  # fmt: skip
    context.pre_tuning(max_trials=16, num_trials_per_iter=16, design_spaces=context.generate_design_space(), database=ms.database.MemoryDatabase(),
                       cost_model=ms.cost_model.RandomModel())  # fmt: skip
    candidates = context.generate_measure_candidates()
    kept = BuiltKernels()
    for i, candidate in enumerate(candidates):
        kept.add(candidate.sch.mod, str(i).encode())
    found = [kept.get(scheduled(matmul, c.sch.trace)) for c in candidates]
    assert len(candidates) > 4 and None not in found
    # a random sample may hold one module twice (seen in CI): either build is that module's
    for candidate, artifact in zip(candidates, found, strict=True):
        assert tvm_ffi.structural_equal(candidates[int(artifact)].sch.mod, candidate.sch.mod)


@pytest.fixture
def declared_gpu_cluster() -> Iterator[dict]:
    """A local Ray cluster that declares a GPU and a CUDA compiler this machine does not have."""
    info = cluster.start(num_cpus=2, num_gpus=1, resources={cluster.CUDA_BUILD_RESOURCE: 2})
    yield info
    cluster.stop()


@pytest.fixture
def cpu_cluster() -> Iterator[dict]:
    info = cluster.start(num_cpus=2)
    yield info
    cluster.stop()


@pytest.mark.skipif(tvm.cuda(0).exist, reason="this machine has a GPU")
def test_a_worker_asks_the_gpu_and_leaves_cuda_jobs_it_cannot_time(declared_gpu_cluster: dict, tmp_path: Path) -> None:
    mod, _, _ = models.export("mlp", batch=4, features=32, hidden=64)
    identity = models.kernels(mod, CUDA, NO_REWRITES)[0].identity
    with LocalRegistry(tmp_path / "reg", sync=False) as reg:
        reg.report_misses([identity])
        worker = Worker(reg, TuneOptions(trials=4, trials_per_iter=4), name="cpu-only", poll_secs=0.1)
        assert worker.devices == [("llvm", host_cpu())]  # the declared GPU answered the probe: no usable device
        stats = worker.run(until_idle=True)
        job = reg.job(identity.key)
    assert stats.done == stats.failed == 0
    assert job["state"] == "pending" and job["attempts"] == 0  # left for a worker with a GPU of its architecture


@pytest.mark.skipif(tvm.cuda(0).exist, reason="this machine has a GPU")
def test_tuning_a_cuda_kernel_where_no_gpu_can_time_it_fails_at_once(cpu_cluster: dict) -> None:
    """Ray would wait forever for a GPU node that does not exist; the tuning job says so instead."""
    mod, _, _ = models.export("mlp", batch=4, features=32, hidden=64)
    identity = models.kernels(mod, CUDA, NO_REWRITES)[0].identity
    ref = cluster.submit("tune", identity=identity.to_dict(), warm_traces=[], options=TuneOptions(trials=4).__dict__, label="")
    with pytest.raises(Exception, match="none offers"):
        cluster.result(ref, timeout=120)


@pytest.mark.skipif(tvm.cuda(0).exist, reason="this machine has a GPU")
def test_the_demo_on_cuda_without_a_gpu_stops_at_once_and_says_why() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "schedhub.cli.main", "demo", "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device here" in done.stderr
    assert "ray" not in done.stdout.lower()  # before any cluster started


def test_a_gpu_node_keeps_a_core_for_each_gpus_measurements() -> None:
    from schedhub.tuner.execution.cores import cores_for, reserved_cores

    sixteen = tuple(range(16))
    assert reserved_cores(sixteen, 2) == (15, 14) and reserved_cores((0, 1), 4) == (1,) and reserved_cores((3,), 1) == ()
    assert cores_for(1, sixteen, 2) == (14,) and cores_for(None, sixteen, 2) == tuple(range(14))
    assert cores_for(None, sixteen, 0) == sixteen and cores_for(5, sixteen, 2) == sixteen  # nothing kept, or a GPU past the reservation


def _affinities_after_confining(measures_on_gpu: bool) -> list[list[int]]:
    """In a Ray worker: :func:`cores.confine`, then the cores of every thread of the process, one started before it."""
    import os
    import threading

    from schedhub.tuner.execution import cores

    started, stop = threading.Event(), threading.Event()
    threading.Thread(target=lambda: (started.set(), stop.wait()), daemon=True).start()
    started.wait()
    try:
        cores.confine(measures_on_gpu)
        return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})
    finally:
        stop.set()


def test_on_a_gpu_node_a_measurement_runs_alone_on_its_core_and_every_other_task_beside_it(declared_gpu_cluster: dict) -> None:
    import ray

    measuring = ray.remote(num_cpus=1, num_gpus=1, max_retries=0)(_affinities_after_confining)
    other = ray.remote(num_cpus=1, max_retries=0)(_affinities_after_confining)
    assert ray.get(measuring.remote(True)) == [(1,)]
    assert ray.get(other.remote(False)) == [(0,)]
    shared = {"runtime_env": {"env_vars": {"SCHEDHUB_MEASURE_CORE": "shared"}}}
    assert ray.get(measuring.options(**shared).remote(True)) == [(0, 1)]  # the reservation off: nothing narrowed
