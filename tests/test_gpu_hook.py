"""The compile hook on a CUDA target, without a GPU: TVM compiles CUDA targets to CUDA C source on
any machine, so the GPU route, its lookups, its misses and which schedule each kernel got (its
launch bounds in the source) are checked here. Timings on a real GPU: ``python -m bench gpu``."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import tvm
from tvm import relax

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks import RegistryFallbackWarning, use
from schedhub.hooks.metaschedule.guard import InconsistentLaunch, ScheduleLimits, Unlaunchable
from schedhub.hooks.kernels.identity import workload_module
from schedhub.hooks.kernels.measure import runs_here
from schedhub.hooks.pipeline import UnsupportedTarget
from schedhub.registry import LocalRegistry, Record
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.verify import verify_job
from schedhub.hooks.metaschedule.msdb import normalize_mod, postprocessed_here, replay_launchable, replay_within, repostprocessed, trace_text, tuning_record

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
LIMITS = ScheduleLimits()


@pytest.fixture(scope="module")
def mlp() -> dict:
    mod, _, _ = models.export("mlp", batch=4, features=32, hidden=64)
    return {"mod": mod, "kernels": {k.identity.op: k.identity for k in models.kernels(mod, CUDA, NO_REWRITES)}}


def launch_bounds(executable: relax.VMExecutable) -> dict[str, int]:
    """Each CUDA kernel's threads per block, read from the generated source."""
    source = executable.mod.imports[0].imports[0].inspect_source("")
    return {name: int(n) for n, name in re.findall(r"__launch_bounds__\((\d+)\) (\w+)_kernel\(", source)}


def threads_record(identity: object, threads: int, pipelined: bool = False) -> Record:
    """A CUDA schedule of an elementwise kernel: all loops fused, ``threads`` threads per block; ``pipelined``: its
    inner loop annotated as a software pipeline's stages without their order (allowed, but TVM cannot lower it)."""
    sch = tvm.s_tir.Schedule(workload_module(identity.workload))  # type: ignore[attr-defined]
    block = [b for b in re.findall(r'T\.sblock\("([^"]+)"\)', identity.workload) if b != "root"][0]  # type: ignore[attr-defined]
    fused = sch.fuse(*sch.get_loops(sch.get_sblock(block)))
    bx, tx, inner = sch.split(fused, [None, threads, 2])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if pipelined:
        sch.annotate(inner, "software_pipeline_stage", [0])
    return Record(identity, trace_text(sch.trace), [1e-6])  # type: ignore[arg-type]


def test_every_cuda_kernel_is_looked_up_and_misses_are_queued_for_cuda(tmp_path: Path, mlp: dict) -> None:
    with LocalRegistry(tmp_path) as reg:
        with use(reg, CUDA) as session:
            ex = tvm.compile(mlp["mod"], CUDA)  # unchanged user code: TVM takes its GPU default pipeline
        assert session.report.lookups == 1 and session.report.misses == len(mlp["kernels"]) == 6
        assert {j["key"] for j in reg.jobs()} == {i.key for i in mlp["kernels"].values()}
        assert {j["kind"] for j in reg.jobs()} == {"cuda"}
        assert all('"arch":"sm_90"' in reg.job(j["key"])["target"] for j in reg.jobs())
    assert launch_bounds(ex)["transpose"] == 1024  # DLight's schedule where the registry has none


def test_a_cuda_record_is_applied_and_dlight_schedules_the_rest(tmp_path: Path, mlp: dict) -> None:
    with LocalRegistry(tmp_path) as reg:
        reg.put(threads_record(mlp["kernels"]["transpose"], 64))
        for pipeline in ("default", "schedhub"):
            with use(reg, CUDA) as session:
                ex = tvm.compile(mlp["mod"], CUDA, relax_pipeline=pipeline)
            outcomes = {k.op: k.outcome for k in session.report.kernels}
            assert outcomes == {"transpose": "hit", "transpose1": "transfer", "transpose2": "transfer",
                                "fused_matmul1_add_relu": "miss", "fused_matmul2_add1": "miss", "fused_matmul_add_relu": "miss"}  # fmt: skip
            bounds = launch_bounds(ex)
            assert bounds["transpose"] == 64 and bounds["transpose1"] == 64  # the record's launch configuration, and transferred
            with use(reg, CUDA, transfer=False):
                assert launch_bounds(tvm.compile(mlp["mod"], CUDA, relax_pipeline=pipeline))["transpose1"] == 1024  # DLight's
            assert bounds["fused_matmul_add_relu"] == 128


def test_a_compile_that_measures_for_a_gpu_this_machine_lacks_times_nothing_and_serves_the_ranking(tmp_path: Path, mlp: dict) -> None:
    """``measure=`` times candidates (and, on a GPU, DLight's schedule beside them) only where the kernels run:
    here no GPU does, so the compile serves what the ranking picks, as without it."""
    assert not runs_here(CUDA)
    with LocalRegistry(tmp_path) as reg:
        reg.put(threads_record(mlp["kernels"]["transpose"], 64))
        with use(reg, CUDA, measure=5) as session:
            ex = tvm.compile(mlp["mod"], CUDA)
    transferred = {k.op: k for k in session.report.kernels}["transpose1"]
    assert transferred.outcome == "transfer" and transferred.measured == {} and launch_bounds(ex)["transpose1"] == 64


@pytest.fixture(scope="module")
def drawn() -> dict:
    """A CUDA record of the test MLP's fused_matmul_add_relu at batch 64 (features 32, hidden 64): a sample of
    MetaSchedule's design space, kept as data (drawing it needs TVM's tensor intrinsics, ~25 s; the file says how)."""
    data = json.loads((Path(__file__).parent / "data" / "cuda_matmul_trace.json").read_text())
    mod = models.export("mlp", batch=64, features=32, hidden=64)[0]
    return {"trace": json.dumps(data["trace"]), "identity": next(k.identity for k in models.kernels(mod, CUDA, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu")}


def thread_extents(mod: tvm.IRModule) -> set[int]:
    """The extents of a scheduled kernel's loops bound to threadIdx.x."""
    return {int(n) for n in re.findall(r'T\.thread_binding\((?:T\.int64\()?(\d+)\)?, thread="threadIdx\.x"\)', mod.script())}


def test_gpu_postprocessors_read_the_targets_limits_and_a_record_at_its_own_shape_gets_no_twin(drawn: dict) -> None:
    """Left uninitialized, ``VerifyGPUCode`` refuses every schedule: a CUDA record's sketch postprocessed again at
    its own shape (the target as users write it, without per-block limits) replays, and as the record did."""
    own = normalize_mod(workload_module(drawn["identity"].workload))
    assert thread_extents(replay_within(own, drawn["trace"], LIMITS).mod) == {128}
    again = repostprocessed(own, json.loads(drawn["trace"]), CUDA, LIMITS)
    assert again is not None and thread_extents(again.mod) == {128}
    assert postprocessed_here(own, drawn["trace"], CUDA, LIMITS) is None  # the same postprocessing


def test_a_cuda_transfer_whose_recorded_copies_would_launch_threads_inconsistently_is_postprocessed_here(tmp_path: Path, mlp: dict, drawn: dict) -> None:
    """Replayed as recorded at batch 4, the batch-64 record binds its matmul to 64 threads and its shared-memory
    copies to 128: TVM would launch 128 and the other 64 would compute wrong (seen on an H100: outputs off by 290x
    their scale). The guard refuses that launch; the hook serves the record postprocessed here (64 threads for
    both), and the report still names the transfer."""
    trace = drawn["trace"]
    moved = normalize_mod(workload_module(mlp["kernels"]["fused_matmul_add_relu"].workload))
    with pytest.raises(InconsistentLaunch, match=re.escape("threadIdx.x to loops of extents [64, 128]")):
        replay_within(moved, trace, LIMITS)
    assert thread_extents(replay_launchable(moved, trace, CUDA, LIMITS).mod) == {64}
    with LocalRegistry(tmp_path / "reg") as reg:
        reg.put(Record(drawn["identity"], trace, [1e-5]))
        with use(reg, CUDA, cache=tmp_path / "cache") as session:
            ex = tvm.compile(mlp["mod"], CUDA)
    served = {k.op: k for k in session.report.kernels}["fused_matmul_add_relu"]
    assert served.outcome == "transfer" and launch_bounds(ex)["fused_matmul_add_relu"] == 64


def test_a_cuda_record_past_the_blocks_thread_limit_is_never_served(tmp_path: Path, mlp: dict, drawn: dict) -> None:
    """2048 threads per block (CUDA's limit is 1024) would fail at launch on the GPU, not at compile: such a record is
    refused as a hit and as a transfer, and the kernels keep DLight's schedule. Pushed as a claim, it is quarantined
    by verification, as is a claim whose launch is inconsistent (the drawn record at batch 4)."""
    with LocalRegistry(tmp_path) as reg:
        reg.put(threads_record(mlp["kernels"]["transpose"], 2048))
        with use(reg, CUDA, cache=tmp_path / "cache") as session:
            ex = tvm.compile(mlp["mod"], CUDA)
    outcomes = {k.op: k.outcome for k in session.report.kernels}
    assert outcomes["transpose"] not in ("hit", "transfer") and outcomes["transpose1"] not in ("hit", "transfer")
    assert 2048 not in launch_bounds(ex).values()
    record = threads_record(mlp["kernels"]["transpose"], 2048)
    with pytest.raises(Unlaunchable):
        replay_launchable(normalize_mod(workload_module(record.identity.workload)), record.trace, CUDA, LIMITS)
    with pytest.raises(Unlaunchable):  # what MetaSchedule's own users get through RegistryDatabase, and a pull writes
        tuning_record(record, limits=LIMITS)
    assert tuning_record(threads_record(mlp["kernels"]["transpose"], 1024), limits=LIMITS) is not None
    inconsistent = Record(mlp["kernels"]["fused_matmul_add_relu"], drawn["trace"], [1e-5])
    for claim, reason in ((record, "Unlaunchable"), (inconsistent, "InconsistentLaunch")):  # pushed claims, verified
        verdict = verify_job({"identity": claim.identity.to_dict(), "trace": claim.trace})
        assert verdict["run_secs"] is None and reason in verdict["reason"]


@pytest.mark.parametrize("kind", ["opencl", "cuda"])
def test_a_gpu_record_whose_kernel_tvm_cannot_lower_leaves_it_to_the_default_and_the_compile_goes_on(tmp_path: Path, mlp: dict, kind: str) -> None:
    """No kernel is built alone for a GPU, so a record that replays within every bound but fails TVM's lowering failed
    the user's compile on OpenCL (whose code TVM also generates here). Each kernel scheduled and not built alone is
    lowered alone first: this one goes back to the default schedule, its record refused and complained about, and the
    next compile refuses it from the kernel cache. On CUDA, VerifyGPUCode lowers each kernel at replay and refused it
    as past the block's limits; the reason is now TVM's."""
    gpu = CUDA if kind == "cuda" else tvm.target.Target({"kind": kind})
    kernels = {k.identity.op: k.identity for k in models.kernels(mlp["mod"], gpu, NO_REWRITES)}
    broken, good = threads_record(kernels["transpose"], 64, pipelined=True), threads_record(kernels["transpose"], 64)
    with LocalRegistry(tmp_path / "reg") as reg:
        reg.put(broken)
        for _again in (False, True):
            with use(reg, gpu, cache=tmp_path / "cache") as session:
                tvm.compile(mlp["mod"], gpu)
            outcomes = {k.op: k.outcome for k in session.report.kernels}
            assert outcomes["transpose"] == "fallback" and outcomes["transpose1"] in ("fallback", "miss")  # refused once tried
            assert [p for p in session.report.problems if broken.trace_id in p and "software pipeline" in p]
        (entry,) = reg.get(broken.key)
        assert entry.served.complaints == 1
        reg.put(good)  # the same schedule without the annotation lowers, and is served
        with use(reg, gpu, cache=tmp_path / "cache") as session:
            tvm.compile(mlp["mod"], gpu)
        assert {k.op: k.outcome for k in session.report.kernels}["transpose"] == "hit"


def test_the_report_says_how_many_misses_kept_the_default_because_it_beat_every_candidate() -> None:
    from schedhub.hooks import CompileReport, KernelOutcome

    report = CompileReport([KernelOutcome("a", "k1", "miss", "default:12.0 us, faster than the 2 candidates timed", {"t1": 2e-5, "t2": None}),
                            KernelOutcome("b", "k2", "miss"), KernelOutcome("c", "k3", "transfer", "shape:t3:c")])  # fmt: skip
    assert report.misses == 2 and "1 misses kept the default schedule, faster than every candidate timed" in report.summary()
    assert "kept the default" not in CompileReport([KernelOutcome("b", "k2", "miss")]).summary()


def test_a_record_that_keeps_the_default_schedule_leaves_the_kernel_to_dlight(tmp_path: Path, mlp: dict) -> None:
    """What a tuner publishes when nothing beat the target's default (an empty trace) is a hit: the kernel is
    not queued again, and it gets the default, which on a GPU is DLight's (an unscheduled CUDA kernel does not build)."""
    with LocalRegistry(tmp_path) as reg:
        reg.put(Record(mlp["kernels"]["transpose"], "[[], []]", [1e-6], {"default_schedule": True}))
        with use(reg, CUDA) as session:
            ex = tvm.compile(mlp["mod"], CUDA)
        assert {k.op: k.outcome for k in session.report.kernels}["transpose"] == "hit"
        assert mlp["kernels"]["transpose"].key not in {j["key"] for j in reg.jobs()}
    assert launch_bounds(ex)["transpose"] == 1024  # DLight's


def test_a_cuda_record_never_applies_to_a_cpu_build_and_tvm_is_untouched_outside(tmp_path: Path, mlp: dict) -> None:
    cpu = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    with LocalRegistry(tmp_path) as reg:
        reg.put(threads_record(mlp["kernels"]["transpose"], 64))
        with use(reg, cpu) as session:
            tvm.compile(mlp["mod"], cpu)
        assert session.report.hits == 0
    assert launch_bounds(tvm.compile(mlp["mod"], CUDA))["transpose"] == 1024  # outside use(): TVM's own pipeline


def test_a_dead_registry_falls_back_to_dlight_once(mlp: dict) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with use("http://127.0.0.1:9", CUDA, timeout=0.5) as session:
            ex = tvm.compile(mlp["mod"], CUDA)
    assert sum(issubclass(w.category, RegistryFallbackWarning) for w in caught) == 1
    assert session.report.count("offline") == 6 and launch_bounds(ex)["transpose"] == 1024


def test_a_gpu_kind_without_a_route_is_a_clear_error(tmp_path: Path, mlp: dict) -> None:
    adreno = tvm.target.Target({"kind": "opencl", "device": "adreno"})
    with LocalRegistry(tmp_path) as reg, use(reg, adreno):
        with pytest.raises(UnsupportedTarget, match="does not support opencl"):
            tvm.compile(mlp["mod"], adreno)
        with pytest.raises(RuntimeError, match="does not support opencl"):  # raised inside TVM's pass: re-raised by its FFI
            tvm.compile(mlp["mod"], adreno, relax_pipeline="schedhub")


@pytest.mark.slow
def test_the_generated_cuda_source_compiles_for_sm_90(tmp_path: Path, mlp: dict) -> None:
    """Needs the cuda-nvcc extra (pip install -e '.[cuda-nvcc]'): nvcc from PyPI, no GPU."""
    import subprocess

    try:
        import nvidia
    except ImportError:
        nvidia = None
    nvcc = next((Path(p) for root in getattr(nvidia, "__path__", []) for p in Path(root).glob("*/bin/nvcc")), None)
    if nvcc is None:  # the nvidia namespace may hold other packages (NVRTC) without nvcc
        pytest.fail("nvcc is not installed: pip install -e '.[cuda-nvcc]'")
    with LocalRegistry(tmp_path / "reg") as reg:
        reg.put(threads_record(mlp["kernels"]["transpose"], 64))
        with use(reg, CUDA):
            ex = tvm.compile(mlp["mod"], CUDA)
    source = tmp_path / "kernels.cu"
    source.write_text(ex.mod.imports[0].imports[0].inspect_source(""))
    done = subprocess.run([str(nvcc), "-arch=sm_90", "--ptx", str(source), "-o", str(tmp_path / "kernels.ptx")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ".entry transpose_kernel" in (tmp_path / "kernels.ptx").read_text()


def test_a_kernel_of_symbolic_batch_keeps_dlights_schedule_on_a_gpu(tmp_path: Path) -> None:
    """A symbolic kernel's transfers cannot be timed against DLight's schedule, which handles symbolic sizes:
    on a GPU it keeps DLight's, where the same record transfers to a static batch."""
    from tvm.relax.frontend import nn

    class Shifted(nn.Module):
        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return nn.relu(x) + 1.0

    def export(batch: int | str) -> tvm.IRModule:
        return Shifted().export_tvm({"forward": {"x": nn.spec.Tensor((batch, 256), "float32")}})[0]

    (kernel,) = models.kernels(export(4), CUDA, NO_REWRITES)
    with LocalRegistry(tmp_path) as reg:
        reg.put(threads_record(kernel.identity, 64))
        with use(reg, CUDA) as static:
            static_bounds = launch_bounds(tvm.compile(export(8), CUDA))
        with use(reg, CUDA) as dynamic:
            dynamic_bounds = launch_bounds(tvm.compile(export("n"), CUDA))
    assert [k.outcome for k in static.report.kernels] == ["transfer"] and list(static_bounds.values()) == [64]
    assert [k.outcome for k in dynamic.report.kernels] == ["miss"] and list(dynamic_bounds.values()) != [64]  # DLight's
