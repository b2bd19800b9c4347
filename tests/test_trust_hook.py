"""The reliability suite, hook side: what a record may cost a compile, whose records a compile
takes, and the MetaSchedule database contract (read-your-writes, one environment per store)."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.s_tir import meta_schedule as ms

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks import RegistryDatabase, RegistryFallbackWarning, ScheduleLimits, ScheduleTooCostly, use, workload_identity
from schedhub.hooks.metaschedule.costmodel import Kernels
from schedhub.hooks.metaschedule.guard import check_scheduled, check_trace_size, loop_iterations, loop_name_chars, nested_statements, unrolled_code
from schedhub.hooks.kernels.identity import workload_module
from schedhub.hooks.serving.session import MAX_REFUSED_NAMED, HookSession
from schedhub.registry import CallerBounds, InvalidRecord, LocalRegistry, Principal, Record, RegistryClient, ServerThread, check_object_graphs
from schedhub.hooks.metaschedule.msdb import replay_schedule, replay_within, trace_text

from .conftest import make_record, store_unchecked

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})


class MatMul(nn.Module):
    def __init__(self) -> None:
        self.w = nn.Parameter((512, 512), "float32")

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.matmul(x, self.w)


@pytest.fixture(scope="module")
def model() -> dict:
    mod, _ = MatMul().export_tvm({"forward": {"x": nn.spec.Tensor((128, 512), "float32")}})
    from schedhub.tuner.networks import models

    (kernel,) = models.kernels(mod, CPU, NO_REWRITES)
    return {"mod": mod, "identity": kernel.identity, "kernel": workload_module(kernel.identity.workload)}


def schedule_record(model: dict, build: str, secs: float) -> Record:
    """A record of the matmul kernel whose trace ``build`` names: default, split, bomb, lanes bomb or names bomb."""
    if build == "names bomb":  # a 2.6 KB trace: its replay took 2.3 s and 1.3 GiB (twice the splits and fuses: past 8 GiB)
        return Record(model["identity"], split_again(25), [secs])
    sch = tvm.s_tir.Schedule(model["kernel"])
    block = sch.get_sblock("matmul")
    loops = sch.get_loops(block)
    if build == "split":
        sch.split(loops[1], [None, 16])
    elif build == "bomb":  # the review's 180-byte trace: unroll every loop of the matmul
        for loop in loops:
            sch.unroll(loop)
    elif build == "lanes bomb":  # 4096 unrolled copies of a 64-lane store: 8192 statements, within the old statement bound
        i, j, k = loops
        i0, i1 = sch.split(i, [None, 8])
        j0, j1 = sch.split(j, [None, 64])
        sch.reorder(i0, j0, i1, k, j1)
        sch.vectorize(j1)
        sch.unroll(i1)
        sch.unroll(k)
    elif build == "runs bomb":  # four runs of 4,096 statements, each within the run's bound: 12 s to build a 4x64x128 matmul
        i, j, k = loops
        i0, i1 = sch.split(i, [None, 4])
        j0, j1 = sch.split(j, [None, 32])
        k0, k1 = sch.split(k, [None, 64])
        sch.reorder(i0, i1, j0, k0, j1, k1)
        for loop in (i1, j1, k1):
            sch.unroll(loop)
    return Record(model["identity"], trace_text(sch.trace), [secs])


def split_again(times: int, fuse_back: bool = True, parts: int = 2) -> str:
    """A trace of the matmul that splits its first loop in ``parts`` and fuses them back, ``times`` times (each fused
    loop is named after all its parts: the name grows ``parts``-fold), or with ``fuse_back=False`` splits the inner
    part again each time."""
    insts: list = [["GetSBlock", [], ["matmul", "main"], ["b0"]], ["GetLoops", ["b0"], [], ["l1", "l2", "l3"]]]
    loop, names = "l1", iter(f"l{n}" for n in itertools.count(4))
    for _ in range(times):
        split = [next(names) for _ in range(parts)]
        factors = [2] if fuse_back and parts == 2 else [1] * (parts - 1)
        insts.append(["Split", [loop, *factors, "None"], [True, False], split])
        if fuse_back:
            insts.append(["Fuse", split, [1], [fused := next(names)]])
        loop = fused if fuse_back else split[-1]
    return json.dumps([insts, []])


def compile_secs(mod: tvm.IRModule, registry: object) -> tuple[float, HookSession]:
    start = time.perf_counter()
    with use(registry, CPU) as session:  # type: ignore[arg-type]
        tvm.compile(mod, CPU)
    return time.perf_counter() - start, session


def test_metaschedules_own_wide_vector_passes_and_many_unrolled_copies_of_one_are_refused() -> None:
    """MetaSchedule vectorized a convolution's input copy, fused at its compute location, over 17 x 5 = 85 lanes (its
    max_vectorize_extent of 64 bounds a block's own loops only). The guard refused that real record for its lanes; one
    such vector costs LLVM little (0.2 s to build). Unrolled copies of wide vectors cost it far more than their lanes
    (85 lanes unrolled 128 times: 23.9 s; 32 times: 1.06 s), and those are what is bounded."""
    data = json.loads((Path(__file__).parent / "data" / "metaschedule_85_lanes.json").read_text())
    sch = replay_within(workload_module(data["identity"]["workload"]), json.dumps(data["trace"]), ScheduleLimits())
    assert "T.vectorized(T.int64(85))" in sch.mod.script()

    def copy(copies: int) -> tvm.IRModule:
        a = te.placeholder((copies, 17, 6), name="A")
        scheduled = tvm.s_tir.Schedule(te.create_prim_func([a, te.compute((copies, 17, 5), lambda c, i, j: a[c, i, j] * 2.0, name="B")]))
        c, i, j = scheduled.get_loops(scheduled.get_sblock("B"))
        scheduled.vectorize(scheduled.fuse(i, j))
        scheduled.annotate(c, "pragma_auto_unroll_max_step", copies)
        scheduled.annotate(c, "pragma_unroll_explicit", 1)
        return scheduled.mod

    check_scheduled(copy(32), ScheduleLimits())
    with pytest.raises(ScheduleTooCostly, match="lane-statements in vectors of over 64 lanes"):
        check_scheduled(copy(128), ScheduleLimits())


def test_a_whole_unroll_of_a_small_matmul_is_refused_and_metaschedules_own_unrolling_passes() -> None:
    """A 160-byte trace that unrolled a matmul at batch 3 whole handed LLVM 49,152 one-lane statements in one run, within
    the lane bound, and a compile took 68 s instead of 0.47 s: statements without a loop are bounded too."""
    def matmul(m: int, n: int, k: int) -> tvm.s_tir.Schedule:
        a, b = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
        r = te.reduce_axis((0, k), name="k")
        return tvm.s_tir.Schedule(te.create_prim_func([a, b, te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")]))

    bomb = matmul(3, 64, 128)  # 24,576 multiply-adds, each with its init: 49,152 statements
    for loop in bomb.get_loops(bomb.get_sblock("matmul")):
        bomb.unroll(loop)
    code = unrolled_code(bomb.mod["main"].body)
    assert code.longest_statements >= 49_152 and code.longest_run <= ScheduleLimits().max_straight_line
    with pytest.raises(ScheduleTooCostly, match="statements without a loop between them"):
        check_scheduled(bomb.mod, ScheduleLimits())
    own = matmul(128, 512, 512)  # what MetaSchedule's CPU rules do: tiles, a 64-lane vector, 512 unroll steps
    i, j, k = own.get_loops(own.get_sblock("matmul"))
    i0, i1 = own.split(i, [None, 8])
    j0, j1 = own.split(j, [None, 64])
    k0, k1 = own.split(k, [None, 8])
    own.reorder(i0, j0, k0, i1, k1, j1)
    own.vectorize(j1)
    own.annotate(i0, "pragma_auto_unroll_max_step", 512)
    own.annotate(i0, "pragma_unroll_explicit", 1)
    check_scheduled(own.mod, ScheduleLimits())


@pytest.mark.parametrize("build", ["bomb", "lanes bomb", "names bomb", "runs bomb"])
def test_a_compile_bomb_is_refused_and_reported_and_costs_no_more_than_a_fallback(tmp_path: Path, model: dict, build: str) -> None:
    """The lanes bomb passed the bounds that counted statements without their lanes: its kernel took LLVM 65 s. The names
    bomb passed every bound after a replay that cost seconds and GiBs."""
    empty, bombed = tmp_path / "empty", tmp_path / "bombed"
    bomb = schedule_record(model, build, 1e-9)
    with LocalRegistry(bombed) as reg:
        reg.put(bomb)
    fallback, attacked = [], []
    for _ in range(3):  # interleaved: the same machine state for both
        fallback.append(compile_secs(model["mod"], empty)[0])
        secs, session = compile_secs(model["mod"], bombed)
        attacked.append(secs)
        assert [k.outcome for k in session.report.kernels] == ["fallback"]
        assert "ScheduleTooCostly" in session.report.problems[0]
    with LocalRegistry(bombed) as reg:
        (entry,) = reg.get(bomb.key)
        assert entry.served.complaints == 1  # reported once per complainant, verification queued
        assert sorted(j["task"] for j in reg.jobs()) == ["tune", "verify"]
    # the review saw 44.36 s against 0.22 s; the bound is 1.5x (plus slack for a noisy shared machine)
    assert statistics.median(attacked) <= 1.5 * statistics.median(fallback) + 0.25, (attacked, fallback)


def test_what_costs_llvm_or_the_first_call_across_the_kernel_is_refused() -> None:
    """The fourth hostile review's forms, each within the bounds of one run: runs of unrolled code whose sum LLVM pays
    for (12 s to build against 0.1), a nest 65 loops deep, a reduction split so its first call runs 2^40 iterations,
    a trace that adds 100 stages. MetaSchedule's own kind of schedule passes."""
    def matmul() -> tvm.s_tir.Schedule:
        a, b = te.placeholder((4, 64), name="A"), te.placeholder((64, 128), name="B")
        r = te.reduce_axis((0, 64), name="k")
        return tvm.s_tir.Schedule(te.create_prim_func([a, b, te.compute((4, 128), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")]))

    unscheduled, limits = matmul().mod, ScheduleLimits()
    runs = matmul()
    i, j, k = runs.get_loops(runs.get_sblock("matmul"))
    j0, j1 = runs.split(j, [None, 32])
    runs.reorder(i, j0, j1, k)
    for loop in (i, j1, k):
        runs.unroll(loop)
    code = unrolled_code(runs.mod["main"].body)
    assert code.longest_statements <= limits.max_straight_statements and code.statements == 16_384
    with pytest.raises(ScheduleTooCostly, match="16384 statements in all"):
        check_scheduled(runs.mod, limits, unscheduled)
    deep = matmul()
    loop = deep.get_loops(deep.get_sblock("matmul"))[2]
    for _ in range(62):
        loop = deep.split(loop, [None, 1])[0]
    with pytest.raises(ScheduleTooCostly, match="nested 65 deep"):
        check_scheduled(deep.mod, limits, unscheduled)
    long_call = matmul()
    long_call.split(long_call.get_loops(long_call.get_sblock("matmul"))[2], [4096, 4096, 64])
    assert loop_iterations(long_call.mod["main"].body) == 2 * 4 * 128 * 4096 * 4096 * 64  # each with the block's init
    with pytest.raises(ScheduleTooCostly, match="statements run a call"):
        check_scheduled(long_call.mod, limits, unscheduled)
    stages = matmul()
    for _ in range(100):
        stages.cache_read(stages.get_sblock("matmul"), 0, "global")
    with pytest.raises(ScheduleTooCostly, match="adds 100 stages"):
        check_trace_size(trace_text(stages.trace), limits)
    own = matmul()  # tiles, a 32-lane vector, MetaSchedule's 512 unroll steps, a cache write
    i, j, k = own.get_loops(own.get_sblock("matmul"))
    j0, j1 = own.split(j, [None, 32])
    own.reorder(i, j0, k, j1)
    own.vectorize(j1)
    own.annotate(i, "pragma_auto_unroll_max_step", 512)
    own.cache_write(own.get_sblock("matmul"), 0, "global")
    check_trace_size(trace_text(own.trace), limits)
    check_scheduled(own.mod, limits, unscheduled)


def lane_statements_after_tvms_unrolling(mod: tvm.IRModule) -> int:
    """Stores (each once per vector lane) and evaluations in the kernel as TVM's own build has it right after its
    ``UnrollLoop`` pass (the build stopped there)."""
    seen: list[tvm.IRModule] = []

    class Enough(Exception):
        pass

    @tvm.instrument.pass_instrument
    class AfterUnrolling:
        def run_after_pass(self, lowered: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
            if info.name.endswith("UnrollLoop"):
                seen.append(lowered)
                raise Enough

    with tvm.transform.PassContext(instruments=[AfterUnrolling()]), pytest.raises(Exception):
        tvm.tirx.build(mod, target=CPU)
    (lowered,) = seen
    count, stack = 0, [lowered["main"].body]
    while stack:
        node = stack.pop()
        if isinstance(node, tirx.BufferStore):
            count += tvm.DataType(str(node.value.ty.dtype)).lanes
        elif isinstance(node, tirx.Evaluate):
            count += 1
        elif node is not None:
            stack.extend(nested_statements(node) or [])
    return count


def scaled_rows(rows: int, lanes: int, unroll: str, steps: int = 0) -> tvm.IRModule:
    """``B = A * 2 + 1`` over ``rows`` × ``lanes``, the lanes vectorized, the rows unrolled: ``unroll`` names how
    (``explicit``: the loop's kind; ``pragma``: MetaSchedule's ``pragma_auto_unroll_max_step`` of ``steps``)."""
    a = te.placeholder((rows, lanes), name="A")
    b = te.compute((rows, lanes), lambda r, c: a[r, c] * 2.0 + 1.0, name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    row, lane = sch.get_loops(sch.get_sblock("B"))
    sch.vectorize(lane)
    if unroll == "explicit":
        sch.unroll(row)
    else:
        sch.annotate(row, "pragma_auto_unroll_max_step", steps)
        sch.annotate(row, "pragma_unroll_explicit", 1)
    return sch.mod


def test_the_guard_counts_the_code_tvms_unrolling_hands_llvm_and_bounds_it(model: dict) -> None:
    """LLVM's time grows with the statements it gets once unrolled, each vector lane counted, and faster where they
    run without a loop: 4096 copies of a 64-lane store took it 44 s, 8192 took 195 s (a bound that counted statements
    alone let both through). MetaSchedule's own most, 512 auto-unrolled steps of 64 lanes, passes."""
    lanes_bomb = tvm.s_tir.Schedule(model["kernel"])
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(json.loads(schedule_record(model, "lanes bomb", 1.0).trace), lanes_bomb)
    cases = {
        "MetaSchedule's most": (scaled_rows(512, 64, "pragma", 512), 512 * 64),
        "a pragma past its steps": (scaled_rows(1024, 16, "pragma", 512), 16),  # 1024 rows x 1 store > 512 steps: a loop
        "a pragma of 4096 steps": (scaled_rows(4096, 64, "pragma", 4096), 4096 * 64),
        "explicit": (scaled_rows(2048, 64, "explicit"), 2048 * 64),
        "the lanes bomb": (lanes_bomb.mod, 2 * 8 * 512 * 64),  # and the reduction's init beside every copy
    }
    for name, (mod, expected) in cases.items():
        assert unrolled_code(mod["main"].body).total == lane_statements_after_tvms_unrolling(mod) == expected, name
    check_scheduled(cases["MetaSchedule's most"][0], ScheduleLimits())
    check_scheduled(cases["a pragma past its steps"][0], ScheduleLimits())
    for name in ("a pragma of 4096 steps", "explicit", "the lanes bomb"):
        with pytest.raises(ScheduleTooCostly, match="lane-statements"):
            check_scheduled(cases[name][0], ScheduleLimits())


def test_a_trace_whose_replay_grows_faster_than_it_is_refused_before_it_is_replayed() -> None:
    """Splitting a loop in k and fusing the parts back multiplies the loop's name by k each time (in two, 25 times: 2.3 s
    and 1.3 GiB; in 64, 5 times: a 6 KB trace past 6 GiB); a chain of splits nests loops, and replaying 2000 of them took
    55 s; every stage a trace adds makes the next instruction cost more. MetaSchedule's own traces split at most 8 times,
    hold at most 74 instructions on a CPU, and make loop names of at most 46,000 characters as counted (CUDA samples)."""
    cuda_samples = json.loads((Path(__file__).parent / "data" / "cuda_matmul_trace.json").read_text())["trace"]
    for legit in (split_again(15), split_again(256, fuse_back=False), json.dumps(cuda_samples)):
        check_trace_size(legit, ScheduleLimits())
    assert loop_name_chars(json.loads(split_again(3, parts=64))[0]) > 64**3  # a name 64 times longer after each fuse
    for bomb in (split_again(16), split_again(5, parts=64)):
        with pytest.raises(ScheduleTooCostly, match="loop names"):
            check_trace_size(bomb, ScheduleLimits())
    with pytest.raises(ScheduleTooCostly, match="splits 514 loops"):
        check_trace_size(split_again(257, fuse_back=False), ScheduleLimits())
    with pytest.raises(ScheduleTooCostly, match="splits 8000 loops"):  # one Split in 8,000 crashed the replay (a segmentation fault)
        check_trace_size(split_again(1, fuse_back=False, parts=8000), ScheduleLimits())
    with pytest.raises(ScheduleTooCostly, match="1025 instructions"):  # 1024 cache reads of one buffer replayed in 3.7 s
        check_trace_size(json.dumps([[["GetSBlock", [], ["matmul", "main"], ["b0"]]] * 1025, []]), ScheduleLimits())


def test_a_kernel_nested_deeper_than_tvms_build_survives_is_refused_before_it_is_built() -> None:
    """TVM's build crashed (a segmentation fault) on loops nested 4,000 deep, which a trace can make within its other
    bounds (a loop given unit loops one instruction at a time); MetaSchedule's own nest at most 21 deep on a CPU."""
    a = te.placeholder((64,), name="A")
    func = te.create_prim_func([a, te.compute((64,), lambda i: a[i] + 1.0, name="B")])
    depth = ScheduleLimits().max_loop_depth
    for units, refused in ((depth - 1, False), (depth, True)):
        sch = tvm.s_tir.Schedule(func)
        for _ in range(units):
            sch.add_unit_loop(sch.get_sblock("B"))
        check_trace_size(trace_text(sch.trace), ScheduleLimits())  # the trace alone is within its bounds
        if refused:
            with pytest.raises(ScheduleTooCostly, match=f"nested {depth + 1} deep"):
                check_scheduled(sch.mod, ScheduleLimits())
        else:
            check_scheduled(sch.mod, ScheduleLimits())


def test_a_kernel_whose_own_buffers_dwarf_its_data_is_refused_before_it_is_built() -> None:
    """A 2 KB trace padded a cache of 1,024 integers to 2^30: its kernel allocated 4 GiB and ran 5.9 s a call, within every
    other bound; rows aligned far apart did as much (storage_align). MetaSchedule's own allocate at most 1.47 times their
    arguments on a CPU (a padded convolution's input copy), twice in CUDA tensor-core samples (their rows aligned)."""
    a = te.placeholder((1024,), "int32", name="A")
    func = te.create_prim_func([a, te.compute((1024,), lambda i: a[i] + 1, name="B")])
    for padded_to, refused in ((1 << 12, False), (1 << 25, True)):  # 16 KiB, 128 MiB
        sch = tvm.s_tir.Schedule(func)
        cache = sch.cache_read(sch.get_sblock("B"), 0, "global")
        sch.transform_layout(cache, ("write", 0), lambda i: (i // padded_to, i % padded_to), pad_value=0)
        if refused:
            with pytest.raises(ScheduleTooCostly, match="134,217,728 bytes of its own"):
                replay_within(tvm.IRModule({"main": func}), trace_text(sch.trace), ScheduleLimits())
        else:
            replay_within(tvm.IRModule({"main": func}), trace_text(sch.trace), ScheduleLimits())
    # A 132-byte trace aligned a cache's rows to 2^28 elements: its 16 rows indexed past 32 bits, and the kernel computed NaN.
    b = te.placeholder((16, 64), name="B")
    func = te.create_prim_func([b, te.compute((16, 64), lambda i, j: b[i, j] + 1.0, name="C")])
    for factor, refused in ((64, False), (1 << 28, True)):
        sch = tvm.s_tir.Schedule(func)
        sch.storage_align(sch.cache_read(sch.get_sblock("C"), 0, "global"), 0, axis=0, factor=factor, offset=1)
        if refused:
            with pytest.raises(ScheduleTooCostly, match="17,179,869,248 bytes of its own"):
                replay_within(tvm.IRModule({"main": func}), trace_text(sch.trace), ScheduleLimits())
        else:
            replay_within(tvm.IRModule({"main": func}), trace_text(sch.trace), ScheduleLimits())


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    tokens = {"w": Principal("tuner", "worker"), "a": Principal("alice"), "r": Principal("reader", "read")}
    with ServerThread(tmp_path / "srv", tokens=tokens, sync=False) as srv:
        yield srv


def test_a_compile_over_the_registrys_miss_rate_compiles_on_and_says_its_misses_went_unreported(tmp_path: Path, model: dict) -> None:
    with ServerThread(tmp_path / "srv", tokens={"r": Principal("reader", "read")}, sync=False, bounds=CallerBounds(misses_per_minute=0)) as srv:
        with RegistryClient(srv.url, token="r") as reader, pytest.warns(RegistryFallbackWarning, match="could not report 1 misses"):
            with use(reader, CPU) as session:
                tvm.compile(model["mod"], CPU)
        assert [k.outcome for k in session.report.kernels] == ["miss"] and session.report.misses_reported == 0
        assert [p for p in session.report.problems if "misses not reported" in p and "reported misses a minute" in p]


def test_a_compile_takes_verified_records_unless_told_otherwise(server: ServerThread, model: dict) -> None:
    verified, claim = schedule_record(model, "default", 2e-3), schedule_record(model, "split", 1e-10)
    with RegistryClient(server.url, token="a") as alice, RegistryClient(server.url, token="r") as reader:
        alice.put(claim)
        outcomes = {}
        for trust in ("verified", "any", ["alice"], ["bob"]):
            with use(reader, CPU, trust=trust) as session:
                tvm.compile(model["mod"], CPU)
            (kernel,) = session.report.kernels
            outcomes[str(trust)] = (kernel.outcome, "ruled" if kernel.detail.startswith("ruled:") else kernel.detail)  # a miss: the CPU rules' schedule
        assert outcomes == {"verified": ("miss", "ruled"), "any": ("hit", claim.trace_id), "['alice']": ("hit", claim.trace_id), "['bob']": ("miss", "ruled")}
        with RegistryClient(server.url, token="w") as tuner:
            tuner.put(verified)
        with use(reader, CPU, trust="any") as session:
            tvm.compile(model["mod"], CPU)
        assert session.report.kernels[0].detail == verified.trace_id  # verified first, whatever the claim says


def test_an_object_graph_in_a_trace_is_loaded_by_tvm_only_when_it_is_a_small_index_map_of_earlier_nodes(server: ServerThread) -> None:
    """TransformLayout carries an IndexMap as tvm-ffi's JSON graph, which TVM loads unchecked: an 806-byte trace whose
    graph named a node from itself crashed the replaying process (a segmentation fault), as did a chain of 5,000
    additions. The registry refuses such a trace at push and on every read; the guard before any replay."""
    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda i, j: a[i, j] + 1.0, name="B")
    func = te.create_prim_func([a, b])
    sch = tvm.s_tir.Schedule(func)
    sch.transform_layout(sch.get_sblock("B"), ("write", 0), lambda i, j: (i // 16, j, i % 16))
    legit = trace_text(sch.trace)

    def graph_changed(change: Callable[[dict], None]) -> str:
        trace = json.loads(legit)
        graph = json.loads(trace[0][1][1][1])
        change(graph)
        trace[0][1][1][1] = json.dumps(graph)
        return json.dumps(trace)

    def chain(graph: dict, length: int) -> None:  # a map whose last index is the legit one's plus zero, `length` times
        nodes = graph["nodes"]
        index_map = nodes[graph["root_index"]]
        final = nodes[index_map["data"]["final_indices"]]["data"]
        nodes.append({"type": "int", "data": 0})
        nodes.append({"type": "ir.IntImm", "data": {"span": 0, "ty": 1, "value": len(nodes) - 1}})
        zero, last = len(nodes) - 1, final[-1]
        for _ in range(length):
            nodes.append({"type": "prim.Add", "data": {"span": 0, "ty": 1, "a": last, "b": zero}})
            last = len(nodes) - 1
        nodes.append({"type": "ffi.Array", "data": [*final[:-1], last]})
        nodes.append({"type": "tirx.IndexMap", "data": {**index_map["data"], "final_indices": len(nodes) - 1}})
        graph["root_index"] = len(nodes) - 1

    hostile = {
        "names itself": graph_changed(lambda graph: graph["nodes"].append({"type": "prim.Add", "data": {"span": 0, "ty": 1, "a": len(graph["nodes"]), "b": 3}})),
        "names a later node": graph_changed(lambda graph: graph["nodes"][3]["data"].update(name=len(graph["nodes"]) - 1)),
        "a chain 100 deep": graph_changed(lambda graph: chain(graph, 100)),
        "another object": graph_changed(lambda graph: graph["nodes"].__setitem__(0, {"type": "ir.GlobalVar", "data": {}})),
        "an integer written as a float": graph_changed(lambda graph: next(n for n in graph["nodes"] if n["type"] == "ir.IntImm")["data"].update(value=4.0)),  # only a float's value is inline
    }
    shallow = graph_changed(lambda graph: chain(graph, 20))
    a60 = te.placeholder((60, 64), name="A")
    func60 = te.create_prim_func([a60, te.compute((60, 64), lambda i, j: a60[i, j] + 1.0, name="B")])
    sch = tvm.s_tir.Schedule(func60)
    sch.transform_layout(sch.get_sblock("B"), ("write", 0), lambda i, j: (i // 16, j, i % 16), pad_value=0.0)  # 60 rows padded to 64
    padded = trace_text(sch.trace)
    for text in (legit, shallow, padded):
        check_object_graphs(json.loads(text))
        check_trace_size(text, ScheduleLimits())
    replay_schedule(tvm.IRModule({"main": func}), json.loads(shallow))  # what the checks let through, TVM loads
    replay_schedule(tvm.IRModule({"main": func60}), json.loads(padded))
    with RegistryClient(server.url, token="a") as alice:
        identity = workload_identity(func, CPU, "B")
        for name, text in hostile.items():
            with pytest.raises(ValueError, match="object graph"):
                check_trace_size(text, ScheduleLimits())
            with pytest.raises(InvalidRecord, match="object graph"):
                alice.put(Record(identity, text, [1e-3]))
            assert alice.get(identity.key) == [], name


@pytest.mark.parametrize("link", [True, False])
def test_a_record_whose_kernel_does_not_build_falls_back_and_the_compile_goes_on(tmp_path: Path, model: dict, link: bool) -> None:
    """One allowed annotation (``software_pipeline_stage`` without its order) replays within every bound, but TVM cannot
    build the kernel: the user's compile failed with it ("Order of the software pipeline is not defined"). The kernel's
    object, compiled on its own, fails first, or without the object cache its lowering alone: the kernel goes back to
    its unscheduled form, the record is refused and complained about, and the next compile on this machine refuses it
    from the kernel cache."""
    sch = tvm.s_tir.Schedule(model["kernel"])
    sch.annotate(sch.get_loops(sch.get_sblock("matmul"))[0], "software_pipeline_stage", [0, 0, 0])
    broken = Record(model["identity"], trace_text(sch.trace), [1e-6])
    x = np.random.default_rng(5).standard_normal((128, 512)).astype("float32")
    w = np.random.default_rng(6).standard_normal((512, 512)).astype("float32")
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put(broken)
        for again in (False, True):
            with use(reg, CPU, cache=tmp_path / "cache", link=link, rules=False) as session:  # the default, not the rules' schedule
                ex = tvm.compile(model["mod"], CPU)
            (kernel,) = session.report.kernels
            assert kernel.outcome == "fallback" and (again or kernel.detail == broken.trace_id)
            assert [p for p in session.report.problems if "does not build" in p and "software pipeline" in p]
            assert session.report.objects_compiled == 0 and session.report.linked == 0
        (entry,) = reg.get(broken.key)
        assert entry.served.complaints == 1  # one complainant, its verification queued
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    out = vm["forward"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-3)


def test_a_kernel_whose_build_runs_past_its_budget_is_given_up_and_the_compile_goes_on(tmp_path: Path, model: dict) -> None:
    """Whatever a record's bounds let through, a served kernel's machine code that takes longer than ``max_build_secs``
    to build is given up on (its build runs on where nothing waits for it): the kernel keeps its default schedule, the
    record is refused and complained about, and the next compile on this machine refuses it without building it."""
    record = schedule_record(model, "split", 1e-6)
    x = np.random.default_rng(5).standard_normal((128, 512)).astype("float32")
    w = np.random.default_rng(6).standard_normal((512, 512)).astype("float32")
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put(record)
        with use(reg, CPU, cache=tmp_path / "roomy") as session:  # the same record, a budget it keeps: a hit
            tvm.compile(model["mod"], CPU)
        assert [k.outcome for k in session.report.kernels] == ["hit"] and session.report.linked == 1
        for again in (False, True):
            with use(reg, CPU, cache=tmp_path / "cache", limits=ScheduleLimits(max_build_secs=0.0), rules=False) as session:
                ex = tvm.compile(model["mod"], CPU)
            (kernel,) = session.report.kernels
            assert kernel.outcome == "fallback", session.report.summary()
            assert [p for p in session.report.problems if "does not build: TooSlow" in p and "over 0 s" in p], session.report.problems
            assert session.report.linked == 0
        (entry,) = reg.get(record.key)
        assert entry.served.complaints == 1
    out = tvm.relax.VirtualMachine(ex, tvm.cpu())["forward"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-3)


def test_a_stored_record_that_a_newer_check_refuses_costs_a_compile_only_itself_and_is_taken_out(tmp_path: Path, model: dict) -> None:
    """A record stored before one of today's checks existed, ranked first: the compile serves the kernel's next record,
    says what it left out, and complains, on which the registry takes the record out of service by its own check. Such
    a record once failed the whole lookup, every kernel of the compile falling back."""
    good, doomed = schedule_record(model, "split", 2e-3), Record(model["identity"], split_again(1), [1e-3])
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put_many([good, doomed])
        store_unchecked(tmp_path / "store", doomed)
        with use(reg, CPU) as session:
            tvm.compile(model["mod"], CPU)
        (kernel,) = session.report.kernels
        assert (kernel.outcome, kernel.detail) == ("hit", good.trace_id)
        assert [p for p in session.report.problems if "left out" in p and doomed.trace_id in p and "object graph" in p]
        assert [q["trace_id"] for q in reg.quarantined()] == [doomed.trace_id] and reg.lookup([good.key], refused=(left := [])) and not left


def test_a_registry_full_of_refused_records_costs_a_compile_a_bounded_number_of_complaints(tmp_path: Path) -> None:
    """Each record a lookup leaves out is named and complained about, up to MAX_REFUSED_NAMED a session; the rest are
    counted in one line, so a registry (or a hostile server) answering thousands of them cannot cost a compile thousands
    of requests."""
    records = [make_record(w, 1e-3) for w in range(MAX_REFUSED_NAMED + 4)]
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put_many(records)
        for record in records:
            store_unchecked(tmp_path / "store", record)
        session = HookSession(reg)
        session.prefetch([r.identity for r in records])
        named = [p for p in session.report.problems if "left out:" in p]
        assert len(named) == MAX_REFUSED_NAMED and session.report.problems[-1].startswith("4 more records left out")
        assert len(reg.quarantined()) == MAX_REFUSED_NAMED  # one complaint each, each quarantined on the registry's check


def test_the_database_reads_its_own_writes(server: ServerThread, model: dict) -> None:
    kernel = model["kernel"]
    with RegistryClient(server.url, token="a") as alice:  # a pusher: what it commits is an unverified claim
        session = HookSession(alice)
        db = RegistryDatabase(session)
        assert db.query_tuning_record(kernel, CPU, "matmul") is None  # a miss, now cached
        workload = db.commit_workload(kernel)
        sch = tvm.s_tir.Schedule(kernel)
        sch.split(sch.get_loops(sch.get_sblock("matmul"))[1], [None, 8])
        args = ms.arg_info.ArgInfo.from_prim_func(kernel["main"])
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [1e-4], CPU, args))
        with CPU:
            found = db.query_tuning_record(kernel, CPU, "matmul")
            top = db.get_top_k(workload, 4)
        assert found is not None and len(top) == 1
        assert trace_text(found.trace) == trace_text(top[0].trace)
        assert alice.get(workload_identity(kernel, CPU).key)[0].served.pushed_by == "alice"  # and it reached the registry


def test_what_metaschedules_own_users_and_the_cost_model_read_is_replayed_within_the_bounds(tmp_path: Path, model: dict) -> None:
    """get_top_k and get_all_tuning_records (MetaSchedule's own users of the database) and the cost model's features replay
    records too: the names bomb cost each of them 2.3 s and 1.3 GiB and came back as a record like any other."""
    kept, bomb = schedule_record(model, "split", 2e-3), schedule_record(model, "names bomb", 1e-9)
    with LocalRegistry(tmp_path / "store") as reg:
        reg.put(kept)
        reg.put(bomb)
        db = RegistryDatabase(HookSession(reg, trust="any"))
        workload = db.commit_workload(model["kernel"])
        with CPU:
            assert [tuning.trace.insts[-1].kind.name for tuning in db.get_top_k(workload, 4)] == ["Split"]
        assert len(db.get_all_tuning_records()) == 1
    kernels = Kernels()
    assert kernels.features(model["identity"], bomb.trace) is None and kernels.features(model["identity"], kept.trace) is not None


def test_many_handles_on_one_store_in_one_process(tmp_path: Path, model: dict) -> None:
    record = schedule_record(model, "default", 1e-3)
    with LocalRegistry(tmp_path) as reg:
        reg.put(record)
    with use(tmp_path, CPU) as outer, use(tmp_path, CPU) as inner:  # the review: "environment already open"
        tvm.compile(model["mod"], CPU)
    assert inner.report.hits == 1 and not outer.report.kernels


class DynamicBatch(nn.Module):
    def __init__(self) -> None:
        self.fc = nn.Linear(64, 32)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.relu(self.fc(x))


def test_a_dynamic_shape_model_compiles_and_only_its_static_kernels_are_queued(tmp_path: Path) -> None:
    mod, _ = DynamicBatch().export_tvm({"forward": {"x": nn.spec.Tensor(("n", 64), "float32")}})
    with LocalRegistry(tmp_path) as reg:
        with use(reg, CPU) as session:
            tvm.compile(mod, CPU)  # it raised in ArgInfo before: a hook must never break a compile
        assert session.report.misses == 2 and session.report.misses_reported == 1
        assert [j["op"] for j in reg.jobs()] == ["transpose"]  # the weight's transpose is static; the batched matmul is not


def test_a_workload_that_would_run_code_is_refused_before_tvm_parses_it(tmp_path: Path) -> None:
    """TVMScript's parser evaluates Python: the hook and the tuner parse workloads only through
    ``workload_module``, which refuses one that is not plain TVMScript data, so nothing runs."""
    from schedhub.registry import InvalidRecord

    canary = tmp_path / "ran"
    hostile = f"@T.prim_func\ndef main(arg0: T.Buffer((4,), 'float32')):\n    T.evaluate(__import__('os').system('touch {canary}'))\n"
    with pytest.raises(InvalidRecord, match="not a plain TVMScript PrimFunc"):
        workload_module(hostile)
    assert not canary.exists()
