"""Transfer: a missed key gets the nearest record of its structure, replayed and checked on its own kernel."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import tvm  # the test extra installs it: a missing TVM must fail, not skip
from tvm import relax
from tvm.relax.frontend import nn

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks import target_text
from schedhub.hooks.kernels.identity import plain_json, workload_module
from schedhub.hooks.metaschedule.msdb import normalize_mod, postprocessors
from schedhub.hooks.metaschedule.ranking import REPOSTPROCESSED
from schedhub.hooks.kernels import measure
from schedhub.hooks.serving import session as hook_session, transfers as hook_transfers
from schedhub.hooks.kernels.measure import host_cpu
from schedhub.registry import (
    SCHEMA_VERSION, Candidate, CostModelEntry, Identity, InvalidRecord, LocalRegistry, Probe, Record, RegistryClient,
    canonical_target, packb, record_key, structure_key, unpackb,
)  # fmt: skip
from schedhub.tuner.networks.models import kernels

from .hand_tuner import FACTORS, tune
from .networks import use_transfers as use
from .test_hooks import MLP, Uneven, mlp_reference, run

TARGET = canonical_target({"kind": "llvm", "mcpu": "znver5", "num-cores": 2, "keys": ["cpu"]})
OTHER_TARGET = canonical_target({"kind": "llvm", "mcpu": "skylake", "num-cores": 2, "keys": ["cpu"]})
CPU = tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})


def record(rows: int, *, fingerprint: str = "tvm=0.27;build-a", target: str = TARGET, args: int = 1, secs: float = 1e-3) -> Record:
    """A valid record whose workload has ``args`` arguments of ``rows``×64 (``args`` decides the structure)."""
    params = ", ".join(f"arg{i}: T.Buffer(({rows}, 64), 'float32')" for i in range(args))
    text = f"@T.prim_func\ndef main({params}): pass\n"
    trace = [[["GetSBlock", [], ["compute", "main"], ["b0"]]], []]
    return Record.from_obj({
        "key": record_key(fingerprint, target, text), "schema": SCHEMA_VERSION, "fingerprint": fingerprint, "target": target,
        "workload": text, "op": f"op{args}", "args_info": [["TENSOR", "float32", [rows, 64]]] * args,
        "trace": json.dumps(trace), "run_secs": [secs], "provenance": {},
    })  # fmt: skip


def relations(found: dict[str, list[Candidate]], key: str) -> list[tuple[str, int]]:
    return [(c.relation, c.record.identity.args_info[0][2][0]) for c in found.get(key, [])]


# -- the registry: index, ranking, bounds (no TVM) --------------------------------------------------


def test_neighbours_come_nearest_first_and_never_of_another_structure(local: LocalRegistry, client: RegistryClient) -> None:
    wanted = record(32)  # the key a compile misses: never stored
    stored = [
        record(32, fingerprint="tvm=0.26;build-old"),  # the same workload under another compiler
        record(30), record(256), record(8),  # the same structure at other shapes
        record(32, target=OTHER_TARGET),  # another CPU
        record(32, args=2),  # another structure: never offered
    ]
    local.put_many(stored)
    client.put_many(stored)
    for registry in (local, client):
        found, near = registry.lookup_with_candidates([wanted.identity, stored[1].identity], per_key=8)
        assert list(found) == [stored[1].key] and list(near) == [wanted.key]  # candidates only for a key without records
        assert relations(near, wanted.key) == [("compiler", 32), ("shape", 30), ("shape", 8), ("shape", 256), ("target", 32)]
        assert all(c.record.identity.structure == wanted.identity.structure for c in near[wanted.key])
        assert registry.lookup_with_candidates([wanted.identity], per_key=2)[1][wanted.key][1].relation == "shape"
    assert structure_key(TARGET, stored[-1].identity.workload) != wanted.identity.structure


def test_keys_asked_exactly_beside_others_get_their_records_and_no_candidates(local: LocalRegistry, client: RegistryClient) -> None:
    """One request asks one set of keys with candidates and another for their records alone (an auto compile's options)."""
    probed, exact, held = record(32), record(16), record(64, args=2)
    stored = [record(30), record(256), held]
    local.put_many(stored)
    client.put_many(stored)
    for registry in (local, client):
        found, near = registry.lookup_with_candidates([probed.identity], per_key=8, exact_only=[exact.identity, held.identity])
        assert list(found) == [held.key] and list(near) == [probed.key], registry
        assert relations(near, probed.key) == [("shape", 30), ("shape", 256)]


def test_keys_that_keep_the_default_schedule_are_not_offered(local: LocalRegistry, client: RegistryClient) -> None:
    """Their records are served on their own keys, but as candidates they would take a slot and transfer nothing."""
    wanted, default, tuned, far = record(32), record(30), record(256), record(512)
    default = Record.from_obj(default.to_dict() | {"trace": json.dumps([[], []])})  # nothing beat TVM's default at 30 rows
    for registry in (local, client):
        registry.put_many([default, tuned, far])
        assert registry.lookup([default.key])[default.key][0].trace == default.trace
        assert relations(registry.lookup_with_candidates([wanted.identity], per_key=2)[1], wanted.key) == [("shape", 256), ("shape", 512)]


def test_a_key_that_leaves_service_leaves_the_index(local: LocalRegistry) -> None:
    only = record(64)
    local.put(only)
    assert relations(local.lookup_with_candidates([record(32).identity])[1], record(32).key) == [("shape", 64)]
    assert local.quarantine(only.key, only.trace_id, "admin")
    assert local.lookup_with_candidates([record(32).identity])[1] == {}


def test_a_store_written_before_the_index_is_indexed_when_opened(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put_many([record(128), record(16)])
    env = lmdb.open(str(tmp_path), max_dbs=16)  # make it look like a store of the previous layout
    records_db, meta, index = (env.open_db(n) for n in (b"records", b"meta", b"by_struct"))
    with env.begin(write=True) as txn:
        txn.drop(index, delete=False)
        txn.delete(b"index:by_struct", db=meta)
        for key, raw in list(txn.cursor(db=records_db)):
            value = unpackb(raw)
            for name in ("st", "wid", "dims"):
                value.pop(name)
            txn.put(key, packb(value), db=records_db)
    env.close()
    with LocalRegistry(tmp_path, sync=False) as reg:
        assert relations(reg.lookup_with_candidates([record(32).identity])[1], record(32).key) == [("shape", 16), ("shape", 128)]


@pytest.mark.parametrize(
    "change",
    [
        {"structure": "not-a-sha"},
        {"dims": [[1] * 17]},
        {"dims": [[-1]]},
        {"dims": "32x64"},
        {"target": "x" * 5000},
        {"key": None},
    ],
)
def test_malformed_probes_are_refused_with_a_clear_error(client: RegistryClient, change: dict) -> None:
    probe = Probe.of(record(32).identity).to_dict() | change
    with pytest.raises(InvalidRecord, match="probe"):
        client._call("POST", "/v1/lookup", {"keys": [record(32).key], "probes": [probe], "candidates": 4})
    with pytest.raises(InvalidRecord, match="candidates"):
        client._call("POST", "/v1/lookup", {"keys": [record(32).key], "candidates": 9})


def test_a_symbolic_size_finds_the_neighbours_nearest_in_its_static_dimensions(local: LocalRegistry, client: RegistryClient) -> None:
    """A dynamic batch (the printer's ``n = TypeVar("n")``) abstracts as a static size does, so the same op at
    static shapes is its neighbour; the distance counts only its static dimensions (the symbolic one as 0)."""

    def sized(rows: str, cols: int, declared: str = "") -> tuple[str, list[Any]]:
        text = f'{declared}@T.prim_func\ndef main(arg0: T.Buffer(({rows}, T.int64({cols})), "float32")): pass\n'
        return text, [["TENSOR", "float32", [int(rows[8:-1]), cols]]] if rows.startswith("T.int64") else [["DYNAMIC", "", []]]

    def identity(rows: str, cols: int, declared: str = "") -> Identity:  # as the hook makes it (no record has a symbolic size)
        text, args_info = sized(rows, cols, declared)
        return Identity(record_key("tvm=0.27;build-a", TARGET, text), SCHEMA_VERSION, "tvm=0.27;build-a", TARGET, text, "op1", args_info)

    def made(rows: str, cols: int) -> Record:
        text, args_info = sized(rows, cols)
        return Record.from_obj({
            "key": record_key("tvm=0.27;build-a", TARGET, text), "schema": SCHEMA_VERSION, "fingerprint": "tvm=0.27;build-a",
            "target": TARGET, "workload": text, "op": "op1", "args_info": args_info,
            "trace": json.dumps([[["GetSBlock", [], ["compute", "main"], ["b0"]]], []]), "run_secs": [1e-3], "provenance": {},
        })  # fmt: skip

    wider, far, near = made("T.int64(8)", 128), made("T.int64(4096)", 64), made("T.int64(2)", 64)
    dynamic = identity("n", 64, declared='n = TypeVar("n")\n')
    assert dynamic.structure == near.identity.structure and Probe.of(dynamic).dims == [[0, 64]]
    for registry in (local, client):  # the probe crosses HTTP as it is
        registry.put_many([wider, far, near])
        near_first = registry.lookup_with_candidates([dynamic], per_key=3)[1][dynamic.key]
        assert [c.record.key for c in near_first][2] == wider.key  # 1 log2 unit off in its static dimension
        assert {c.record.key for c in near_first[:2]} == {far.key, near.key} and [c.distance for c in near_first] == [0.0, 0.0, 1.0]
    undeclared = identity("m", 64)  # a name the printer did not declare a size: another structure
    assert undeclared.structure != near.identity.structure


# -- the hook: real TVM builds ----------------------------------------------------------------------


def export(batch: int) -> tvm.IRModule:
    mod, _ = MLP().export_tvm({"forward": {"x": nn.spec.Tensor((batch, 64), "float32")}})
    return mod


PARAMS = [np.random.default_rng(0).standard_normal(s).astype("float32") * 0.1 for s in ((128, 64), (128,), (10, 128), (10,))]


def forward(ex: relax.VMExecutable, x: np.ndarray) -> np.ndarray:
    return run(ex, x, PARAMS)


def reference(x: np.ndarray) -> np.ndarray:
    return mlp_reference(x, PARAMS)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> LocalRegistry:
    """A registry holding hand-tuned records of the MLP at batch 4 only."""
    reg = LocalRegistry(tmp_path_factory.mktemp("transfer"), sync=False)
    reg.put_many([tune(k.identity) for k in kernels(export(4), CPU, NO_REWRITES)])
    return reg


def test_a_held_out_shape_is_served_by_transfer_with_correct_output_and_queued(registry: LocalRegistry) -> None:
    held_out = kernels(export(16), CPU, NO_REWRITES)
    with use(registry, CPU) as session:
        ex = tvm.compile(export(16), CPU)
    with use(registry, CPU, link=False):  # the kernels stay in the module (linked, they are objects)
        lowered = relax.get_pipeline("schedhub")(export(16))
    report = session.reports[0]
    transferred = {k.key for k in report.kernels if k.outcome == "transfer"}
    # the weight transposes are the same kernels at batch 16: hits; every batch-dependent kernel transfers
    assert report.hits + report.transfers == len(held_out) and report.misses == 0 and report.transfers == 2
    assert all(k.detail.startswith("shape:") for k in report.kernels if k.outcome == "transfer")
    assert {j["key"] for j in registry.jobs("pending")} == transferred  # the exact schedules are still to tune
    x = np.random.default_rng(1).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)
    scheduled = [f for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(scheduled) == len(held_out) and all(f.attrs.get("tirx.is_scheduled") for f in scheduled)  # the transferred traces were applied
    with use(registry, CPU, transfer=False) as session:
        tvm.compile(export(16), CPU)
    assert session.report.transfers == 0 and session.report.misses == 2


def test_a_kernel_of_symbolic_batch_is_served_a_transfer_that_runs_right_at_any_batch(tmp_path: Path, registry: LocalRegistry) -> None:
    """A model exported with a dynamic batch: its batch-dependent kernels find the batch-4 records as neighbours,
    replay them with the batch loop outermost, and compute right at batches the tilings do not divide. Nothing is
    queued (MetaSchedule tunes static shapes only); without transfers they keep TVM's default schedules."""
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put_many([r for s in registry.summaries() for r in registry.get(s.key)])
        with use(reg, CPU) as session:
            ex = tvm.compile(export("n"), CPU)
        report = session.reports[0]
        assert report.transfers == 2 and report.misses == 0 and report.hits == 2  # the weight transposes: exact hits
        assert all(k.detail.startswith("shape:") for k in report.kernels if k.outcome == "transfer")
        assert reg.jobs("pending") == [] and any("not reported" in p for p in report.problems)
        with use(reg, CPU, transfer=False) as plain:
            tvm.compile(export("n"), CPU)
        assert plain.report.transfers == 0 and plain.report.misses == 2
    for batch in (1, 3, 16):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype("float32")
        np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def postprocessed_record(batch: int, row_tiles: list[int], cache_write: bool = False) -> Record:
    """A MetaSchedule-style record of the MLP's first kernel at ``batch``: its rows tiled by a sampled perfect tiling
    (``row_tiles``, the decision), columns by [8, 16] (the result written through a cache block: ``cache_write``),
    then postprocessing that finds the root's children."""
    kernel = next(k for k in kernels(export(batch), CPU, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu")
    sch = tvm.s_tir.Schedule(workload_module(kernel.identity.workload))
    rows, cols, red = sch.get_loops(sch.get_sblock("matmul"))
    r0, r1, r2 = sch.split(rows, sch.sample_perfect_tile(rows, n=3, decision=row_tiles))
    c0, c1 = sch.split(cols, sch.sample_perfect_tile(cols, n=2, decision=[8, 16]))
    sch.reorder(r0, c0, r1, red, r2, c1)
    if cache_write:
        sch.cache_write(sch.get_sblock("matmul"), 0, "global")
    sch.enter_postproc()
    matmul, *_ = sch.get_child_blocks(sch.get_sblock("root"))
    sch.parallel(sch.get_loops(matmul)[0])
    sch.vectorize(c1)
    return Record(kernel.identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "test"})


@pytest.mark.parametrize("row_tiles, cache_write, branches", [
    ([2, 2, 4], False, ["padded0", "padded1"]), ([1, 1, 16], False, ["padded0"]), ([1, 1, 1], False, []), ([2, 2, 4], True, []),
])  # fmt: skip
def test_a_symbolic_batch_keeps_the_recorded_row_tiles_padded_where_the_batch_fills_them(tmp_path: Path, row_tiles: list[int], cache_write: bool, branches: list[str]) -> None:
    """TVM re-derives a tiling of a symbolic loop as [n, 1, 1] (one row a task); the hook pads the matmul's rows to the
    recorded inner tiles instead and replays the trace with them (its postprocessing given the padding copy): all of
    them where the batch fills them ([2, 4]: 8 rows), without the outermost where it fills half of the rest ([1, 4]:
    from 2 rows), the re-derivation below. Right at every batch, on each side of each switch and off the tiles. A
    tiling that was all ones has nothing to keep; a trace whose blocks padding renames (its cache block writes the
    padded buffer) is served as TVM re-derives it."""
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(postprocessed_record(16, row_tiles, cache_write))
        with use(reg, CPU, link=False):
            lowered = relax.get_pipeline("schedhub")(export("n"))
        with use(reg, CPU) as session:
            ex = tvm.compile(export("n"), CPU)
    assert {k.op: k.outcome for k in session.report.kernels}["fused_matmul_add_relu"] == "transfer"
    kernel = next(f for gv, f in lowered.functions_items() if gv.name_hint == "fused_matmul_add_relu")
    assert re.findall(r'T\.sblock\("(padded\d)"\)', kernel.script()) == branches
    for batch in (1, 3, 4, 5, 8, 13, 40):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype("float32")
        np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch, padded", [(13, True), (5, False), (20, False), (40, False)])
def test_a_static_batch_the_recorded_row_tiles_do_not_divide_is_padded_to_them(tmp_path: Path, batch: int, padded: bool) -> None:
    """Rows tiled [2, 2, 4] at batch 16: at 13 TVM would re-derive the inner tiles ([1, 13, 1]); the hook pads the rows
    to 16 and keeps them. At 5, padding to [1, 4] would add 60% more rows: TVM's re-derivation stays (a static
    loop is padded by at most half). At 20 the tiling without the outermost inner tile, [1, 4], divides: TVM's own re-derivation
    stays (a refit that needs no padding lost to it, ARCHITECTURE §8); at 40 the recorded tiles divide."""
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(postprocessed_record(16, [2, 2, 4]))
        with use(reg, CPU, link=False):
            lowered = relax.get_pipeline("schedhub")(export(batch))
        with use(reg, CPU) as session:
            ex = tvm.compile(export(batch), CPU)
    assert {k.op: k.outcome for k in session.report.kernels}["fused_matmul_add_relu"] == "transfer"
    kernel = next(f for gv, f in lowered.functions_items() if gv.name_hint == "fused_matmul_add_relu")
    assert ("_pad = T.sblock_alloc_buffer" in kernel.script()) == padded
    x = np.random.default_rng(batch).standard_normal((batch, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)
    with LocalRegistry(tmp_path, sync=False) as reg, use(reg, CPU, link=False, pad=False):  # the user's way out
        unpadded = relax.get_pipeline("schedhub")(export(batch))
    assert "_pad = T.sblock_alloc_buffer" not in next(f for gv, f in unpadded.functions_items() if gv.name_hint == "fused_matmul_add_relu").script()


class Scores(nn.Module):
    """Attention scores: both sides of the product the sequence."""

    def forward(self, q: nn.Tensor, k: nn.Tensor) -> nn.Tensor:
        return nn.op.matmul(q, nn.op.permute_dims(k))


def scores(seq: int | str) -> tvm.IRModule:
    mod, _ = Scores().export_tvm({"forward": {"q": nn.spec.Tensor((seq, 64), "float32"), "k": nn.spec.Tensor((seq, 64), "float32")}})
    return mod


def test_a_kernel_padded_on_two_symbolic_loops_unrolls_less(tmp_path: Path) -> None:
    """Both loops of the attention scores are the sequence: the padded buffers' strides are symbolic in every statement
    the recorded unrolling (512 steps) emits, and lowering them cost seconds. The padded levels keep 64 steps; TVM's
    re-derivation keeps the record's. Right at every size."""
    kernel = next(k for k in kernels(scores(16), CPU, NO_REWRITES) if k.identity.op == "matmul")
    sch = tvm.s_tir.Schedule(workload_module(kernel.identity.workload))
    rows, cols, red = sch.get_loops(sch.get_sblock("matmul"))
    r0, r1, r2 = sch.split(rows, sch.sample_perfect_tile(rows, n=3, decision=[2, 2, 4]))
    c0, c1, c2 = sch.split(cols, sch.sample_perfect_tile(cols, n=3, decision=[2, 2, 4]))
    sch.reorder(r0, c0, r1, c1, red, r2, c2)
    sch.enter_postproc()
    outer = sch.fuse(r0, c0)
    sch.parallel(outer)
    sch.annotate(outer, "pragma_auto_unroll_max_step", 512)
    trace = json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":"))
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(Record(kernel.identity, trace, [1e-5], {"tuner": "test"}))
        with use(reg, CPU, link=False):
            lowered = relax.get_pipeline("schedhub")(scores("n"))
        with use(reg, CPU) as session:
            ex = tvm.compile(scores("n"), CPU)
    assert {k.op: k.outcome for k in session.report.kernels}["matmul"] == "transfer"
    text = next(f for gv, f in lowered.functions_items() if gv.name_hint == "matmul").script()
    branches = re.findall(r'T\.sblock\("(padded\d|rederived)"\)', text)
    assert branches[-1] == "rederived" and len(branches) >= 2
    assert re.findall(r'"pragma_auto_unroll_max_step": (\d+)', text) == ["64"] * (len(branches) - 1) + ["512"]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for seq in (1, 3, 8, 13, 40):
        q, k = (np.random.default_rng(seq + i).standard_normal((seq, 64)).astype("float32") for i in range(2))
        np.testing.assert_allclose(vm["forward"](tvm.runtime.tensor(q), tvm.runtime.tensor(k)).numpy(), q @ k.T, rtol=1e-4, atol=1e-4)


def test_a_transfer_that_would_vectorize_a_symbolic_loop_is_not_served(tmp_path: Path) -> None:
    """LLVM's vectorizer needs a constant extent. A record that vectorizes the batch loop at batch 4 replays on a
    dynamic batch, but the kernel would fail TVM's lowering, and with it the user's compile: the hook drops it (the
    kernel keeps the default) and serves it where the batch is static."""
    kernel = next(k for k in kernels(export(4), CPU, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu")
    sch = tvm.s_tir.Schedule(workload_module(kernel.identity.workload))
    rows, cols = sch.get_loops(sch.get_sblock("compute"))
    sch.reorder(cols, rows)
    sch.vectorize(rows)
    vectorized = Record(kernel.identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "test"})
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(vectorized)
        with use(reg, CPU) as session:
            ex = tvm.compile(export("n"), CPU)
        with use(reg, CPU) as static:
            tvm.compile(export(8), CPU)
    assert {k.op: k.outcome for k in session.report.kernels}["fused_matmul_add_relu"] == "miss"
    assert {k.op: k.outcome for k in static.report.kernels}["fused_matmul_add_relu"] == "transfer"
    x = np.random.default_rng(5).standard_normal((3, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_transfer_whose_vectorized_loop_grows_past_the_lanes_bound_is_not_served(tmp_path: Path) -> None:
    """A record that fuses the batch loop with 16 columns and vectorizes them (64 lanes at batch 4) would vectorize
    1,280 lanes at batch 80, past the bound of 1,024 (unrolled copies of far fewer cost LLVM most: a ResNet-18 transfer
    of 121 lanes unrolled 128 times took 84 s). The hook drops it without complaint (the kernel keeps the default) and
    serves it at batch 4."""
    kernel = next(k for k in kernels(export(4), CPU, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu")
    sch = tvm.s_tir.Schedule(workload_module(kernel.identity.workload))
    rows, cols = sch.get_loops(sch.get_sblock("compute"))
    outer, inner = sch.split(cols, [None, 16])
    sch.reorder(outer, rows, inner)
    sch.vectorize(sch.fuse(rows, inner))
    record = Record(kernel.identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "test"})
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(record)
        with use(reg, CPU) as grown:
            ex = tvm.compile(export(80), CPU)
        with use(reg, CPU) as home:
            tvm.compile(export(4), CPU)
    said = [p for p in grown.report.problems if "misses queued for" not in p]  # that znver1 is not this CPU is said, nothing else
    assert {k.op: k.outcome for k in grown.report.kernels}["fused_matmul_add_relu"] == "miss" and said == [], said
    assert {k.op: k.outcome for k in home.report.kernels}["fused_matmul_add_relu"] == "hit"
    x = np.random.default_rng(5).standard_normal((80, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_default_schedule_record_is_never_transferred(tmp_path: Path, registry: LocalRegistry) -> None:
    """A record with an empty trace says only "nothing beat TVM's default at that shape": transferred, it is the
    default schedule under another name (seen serving a 52 ms kernel where the next candidate took 13 ms)."""
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put_many([r for s in registry.summaries() for r in registry.get(s.key)])
        defaults = [k for k in kernels(export(8), CPU, NO_REWRITES) if "matmul" in k.identity.op]  # nearer to batch 16 than the batch-4 records
        for k in defaults:
            reg.put(default_schedule_record(k.identity))
        with use(reg, CPU, link=False) as session:
            ex = tvm.compile(export(16), CPU)
        transfers = [k for k in session.report.kernels if k.outcome == "transfer"]
        batch_4 = {r.trace_id for s in registry.summaries() for r in registry.get(s.key)}
        assert len(transfers) == 2 and all(k.detail.split(":")[1] in batch_4 for k in transfers)
        with use(reg, CPU, link=False) as session:
            tvm.compile(export(8), CPU)  # the default records' own keys: hits that keep the default schedule
        hits, kept = session.report.hits, len(defaults)
        assert session.report.default_hits == kept and 0 < kept <= hits
        assert f"{hits} hits ({kept} of them keep the default schedule: nothing beat it)" in session.report.summary()
    x = np.random.default_rng(7).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def default_schedule_record(identity: Identity) -> Record:
    """What the tuner publishes when no candidate beat TVM's default schedule: an empty trace."""
    sch = tvm.s_tir.Schedule(workload_module(identity.workload))
    trace = json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":"))
    return Record(identity, trace, [1e-4], {"tuner": "test", "default_schedule": True})


def test_a_transfer_is_replaced_by_the_exact_record_once_it_exists(tmp_path: Path, registry: LocalRegistry) -> None:
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put_many([r for s in registry.summaries() for r in registry.get(s.key)])
        with use(reg, CPU) as session:
            tvm.compile(export(16), CPU)
        assert session.report.transfers == 2
        exact = [tune(k.identity) for k in kernels(export(16), CPU, NO_REWRITES) if k.identity.key in {j["key"] for j in reg.jobs("pending")}]
        reg.put_many(exact)  # what the worker pushes after tuning the queued miss
        with use(reg, CPU) as session:
            ex = tvm.compile(export(16), CPU)
        assert session.report.transfers == 0 and session.report.hits == len(session.report.kernels)
        assert {k.detail for k in session.report.kernels} >= {r.trace_id for r in exact}
        assert reg.jobs("pending") == []
    x = np.random.default_rng(2).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_record_of_another_compiler_build_is_served_as_a_transfer(tmp_path: Path, registry: LocalRegistry) -> None:
    """A TVM upgrade changes every key; the old build's records of the same workloads transfer."""
    with LocalRegistry(tmp_path, sync=False) as reg:
        for summary in registry.summaries():
            for rec in registry.get(summary.key):
                ident = rec.identity
                old = "tvm=0.26.0;tvm-ffi=0.1.9;libtvm=0123456789abcdef"
                moved = rec.to_dict() | {"fingerprint": old, "key": record_key(old, ident.target, ident.workload)}
                reg.put(Record.from_obj(moved))
        with use(reg, CPU) as session:
            ex = tvm.compile(export(4), CPU)
    report = session.report
    assert report.hits == 0 and report.transfers == len(report.kernels) == 4
    assert all(k.detail.startswith("compiler:") for k in report.kernels)
    x = np.random.default_rng(3).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


class ForeignCandidates(LocalRegistry):
    """A registry that answers every miss with a record of another workload (a hostile or broken server)."""

    def __init__(self, root: Path, foreign: Record) -> None:
        super().__init__(root, sync=False)
        self.foreign = foreign

    def lookup_with_candidates(self, identities: list[Identity], top: int | None = None, per_key: int = 4, refused=None, trust="any", exact_only=()):  # type: ignore[no-untyped-def]
        found = self.lookup([i.key for i in [*identities, *exact_only]], top, refused)
        near = {i.key: [Candidate(self.foreign, "shape", 0.0)] for i in identities if i.key not in found}
        return found, near


def test_a_candidate_of_another_structure_is_never_served(tmp_path: Path, registry: LocalRegistry) -> None:
    transpose = next(r for s in registry.summaries() for r in registry.get(s.key) if r.identity.op.startswith("transpose"))
    matmul = next(k.identity for k in kernels(export(16), CPU, NO_REWRITES) if "matmul" in k.identity.op)
    impostor = dataclasses.replace(transpose, identity=matmul)  # a transpose's trace claiming a matmul's structure
    for foreign in (transpose, impostor):
        with ForeignCandidates(tmp_path / foreign.trace_id / str(id(foreign)), foreign) as reg:
            with use(reg, CPU) as session:
                ex = tvm.compile(export(16), CPU)
        outcomes = {k.op: k.outcome for k in session.report.kernels}
        assert [o for op, o in outcomes.items() if "matmul" in op] == ["miss", "miss"]  # neither the foreign trace nor the impostor
        assert session.report.misses_reported == 4
    x = np.random.default_rng(4).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_the_probe_carries_what_the_hook_computed(registry: LocalRegistry) -> None:
    ident = kernels(export(16), CPU, NO_REWRITES)[0].identity
    probe = Probe.of(ident)
    assert probe.target == target_text(CPU) == ident.target and probe.dims == [a[2] for a in ident.args_info]
    assert Probe.from_obj(probe.to_dict()) == probe


def test_measured_transfers_serve_the_fastest_candidate_that_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt-in: every applicable candidate is built (side by side), checked against the default schedule and
    timed here (alone); once a machine."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})  # measured only for this machine's CPU
    builds, timings = [], []

    def recorded(into: list, fn: Callable) -> Callable:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                into.append((start, time.perf_counter(), threading.current_thread().name))
        return run

    monkeypatch.setattr(measure, "build", recorded(builds, measure.build))
    monkeypatch.setattr(measure.KernelBench, "time", recorded(timings, measure.KernelBench.time))
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        ours = [tune(k.identity) for k in kernels(export(4), host, NO_REWRITES)]
        reg.put_many(ours)
        for k in kernels(export(64), host, NO_REWRITES):  # a second neighbour, with another schedule, for every batch-dependent kernel
            reg.put(next(r for r in (split_record(k.identity, f) for f in FACTORS) if r.trace not in {o.trace for o in ours}))
        with use(reg, host, cache=tmp_path / "cache", measure=60, repostprocess=False) as session:  # the records' own candidates only
            ex = tvm.compile(export(16), host)
        assert len(builds) == 6 and len(timings) == 4  # per kernel: the default and two candidates built, the candidates timed
        assert not any(b0 < t1 and t0 < b1 for t0, t1, _ in timings for b0, b1, _ in builds)  # nothing compiles while a kernel is timed
        if session.build_workers > 1:
            assert len({name for *_, name in builds}) > 1 and any(a0 < b1 and b0 < a1 for a0, a1, _ in builds for b0, b1, _ in builds if (a0, a1) != (b0, b1))
        transfers = [k for k in session.report.kernels if k.outcome == "transfer"]
        assert len(transfers) == 2 and all(len(k.measured) == 2 and all(k.measured.values()) for k in transfers)
        for k in transfers:  # the fastest measured is the one served
            assert k.detail.split(":")[1] == min(k.measured, key=lambda t: k.measured[t])
        with use(reg, host, cache=tmp_path / "cache", measure=60, repostprocess=False) as again:
            tvm.compile(export(16), host)
        assert [k.measured for k in again.report.kernels] == [k.measured for k in session.report.kernels]  # from the cache
        assert again.cache.misses == 0
    x = np.random.default_rng(6).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_measured_compile_keeps_a_contending_default_that_beats_every_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the target's default schedule contends (DLight's on a GPU: forced here on this CPU), a kernel whose
    every timed candidate is slower keeps it: reported as a miss that says why, queued, and timed once a machine."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        slow = slow_record(next(k.identity for k in kernels(export(4), host, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu"))
        reg.put(slow)
        with use(reg, host, cache=tmp_path / "plain", measure=60) as plain:  # a CPU's unscheduled kernel does not contend
            tvm.compile(export(16), host)
        assert [k.outcome for k in plain.report.kernels if k.op == slow.identity.op] == ["transfer"]
        monkeypatch.setattr(hook_session, "default_contends", lambda target: True)  # transfers served where they can be timed
        monkeypatch.setattr(hook_transfers, "default_contends", lambda target: True)  # and timed against the default
        with use(reg, host, cache=tmp_path / "cache", measure=60, repostprocess=False) as session:  # the record alone against the default
            ex = tvm.compile(export(16), host)
        kept = [k for k in session.report.kernels if k.op == slow.identity.op]
        assert [k.outcome for k in kept] == ["miss"], [(k.outcome, k.detail, k.measured) for k in kept]
        assert re.fullmatch(r"default:[0-9.]+ us, faster than the 1 candidates timed", kept[0].detail) and list(kept[0].measured) == [slow.trace_id]
        assert "1 misses kept the default schedule" in session.report.summary() and session.report.misses_reported == 4
        with use(reg, host, cache=tmp_path / "cache", measure=60, repostprocess=False) as again:
            tvm.compile(export(16), host)
        assert [k.detail for k in again.report.kernels] == [k.detail for k in session.report.kernels] and again.cache.misses == 0
    x = np.random.default_rng(7).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_measured_compile_whose_default_cannot_be_scheduled_serves_the_ranking_and_completes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default schedule is the measurement's reference (and on a GPU, DLight's, a pass that can fail on a kernel):
    where it cannot be made, nothing is timed and the kernel gets what the ranking picks, never a twin made to be
    measured; the compile completes and computes right."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    op = "fused_matmul_add_relu"
    record = parallel_record(next(k.identity for k in kernels(export(4), host, NO_REWRITES) if k.identity.op == op), 8, 16)  # it has a twin here

    def failing(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
        raise RuntimeError("no default schedule for this kernel")

    monkeypatch.setattr(hook_transfers, "default_schedule", failing)
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put(record)
        with use(reg, host, cache=tmp_path / "cache", measure=60) as session:
            ex = tvm.compile(export(16), host)
    assert [(k.outcome, k.detail, k.measured) for k in session.report.kernels if k.op == op] == [("transfer", f"shape:{record.trace_id}:{op}", {})]
    x = np.random.default_rng(12).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def parallel_record(identity: Identity, parallel: int, vectorize: int) -> Record:
    """A record whose trace asks MetaSchedule's CPU postprocessing for at most ``parallel`` parallel jobs and
    ``vectorize`` lanes (as its ``ParallelizeVectorizeUnroll`` rule does), postprocessed at its own shape: which loops
    are fused into the parallel one and vectorized is decided for that shape's extents."""
    sch = tvm.s_tir.Schedule(workload_module(identity.workload))
    root = sch.get_sblock("root")
    sch.annotate(root, "meta_schedule.parallel", parallel)
    sch.annotate(root, "meta_schedule.vectorize", vectorize)
    sch.enter_postproc()
    assert all(p.apply(sch) for p in postprocessors(CPU))
    return Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-5], {"tuner": "parallel_record"})


def test_a_measured_compile_also_times_a_transfer_postprocessed_again_at_the_kernels_shape(tmp_path: Path) -> None:
    """A record postprocessed at batch 4 (8 parallel jobs, 16 lanes) splits its loops otherwise at batch 16 when the
    postprocessors run again there: a measured compile times both, serves the faster, and says which. Never served
    unmeasured: ``repostprocess=False``, or no measuring, serves the record alone (nothing to choose: not timed)."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    op = "fused_matmul_add_relu"
    record = parallel_record(next(k.identity for k in kernels(export(4), host, NO_REWRITES) if k.identity.op == op), 8, 16)
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put(record)
        with use(reg, host, cache=tmp_path / "cache", measure=60) as session:
            ex = tvm.compile(export(16), host)
        served = next(k for k in session.report.kernels if k.op == op)
        assert served.outcome == "transfer" and len(served.measured) == 2 and all(served.measured.values()), served
        relation, trace_id, source_op = served.detail.split(":")
        assert trace_id == min(served.measured, key=lambda t: served.measured[t]) and source_op == op
        assert relation == (REPOSTPROCESSED if trace_id != record.trace_id else "shape")
        for options in ({"repostprocess": False}, {"measure": 0.0}):
            with use(reg, host, cache=tmp_path / "other", **options) as alone:
                tvm.compile(export(16), host)
            assert [(k.detail, k.measured) for k in alone.report.kernels if k.op == op] == [(f"shape:{record.trace_id}:{op}", {})]
    x = np.random.default_rng(11).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_measured_compile_refuses_a_candidate_whose_outputs_differ_from_the_default_schedules(tmp_path: Path) -> None:
    """A schedule that changes the kernel's results (its intermediate stored as float16) fails a measured compile's check
    of its outputs against the default schedule's. No record reaches a compile with it any more: the registry refuses the
    unsafe primitive on every read, so the record is left out, complained about and quarantined, and the kernel gets the
    candidate that agrees, although the ranking had put the other first (far faster for its work at home)."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    identity = next(k.identity for k in kernels(export(4), host, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu")
    kernel = normalize_mod(workload_module(identity.workload))
    sch = tvm.s_tir.Schedule(kernel)
    sch.unsafe_set_dtype(sch.get_sblock("matmul"), 0, "float16")
    default, halved = measure.build_all([kernel, sch.mod], host, 2)
    bench = measure.KernelBench(default, identity.args_info, host)
    assert bench.time(halved).secs is None and "differs from TVM's default schedule" in bench.time(halved).error
    assert (bench.time(default).secs or 0) > 0
    wrong = Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-9], {"tuner": "hostile"})
    right = split_record(next(k.identity for k in kernels(export(8), host, NO_REWRITES) if k.identity.op == identity.op), 4)  # another neighbour
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put_many([wrong, right])  # stored as a registry without today's checks would have kept it
        with use(reg, host, cache=tmp_path / "cache", measure=60, repostprocess=False) as session:  # the two records alone
            ex = tvm.compile(export(16), host)
        served = next(k for k in session.report.kernels if k.op == identity.op)
        assert served.outcome == "transfer" and served.detail == f"shape:{right.trace_id}:{identity.op}"
        assert wrong.trace_id not in served.measured, served.measured
        assert [p for p in session.report.problems if wrong.trace_id in p and "UnsafeSetDType" in p]
        assert [q["trace_id"] for q in reg.quarantined()] == [wrong.trace_id]
    x = np.random.default_rng(10).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def slow_record(identity: Identity) -> Record:
    """A record whose schedule factors a matmul's reduction out into a buffer of partial products (``rfactor``):
    the MLP's 16x64x128 matmul then ran about 12x slower than the unscheduled kernel, on 1 thread or 2."""
    base = workload_module(identity.workload)
    sch = tvm.s_tir.Schedule(base)
    *_, reduction = sch.get_loops(sch.get_sblock("matmul"))
    sch.rfactor(reduction, 0)
    return Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "slow_record"})


def split_record(identity: Identity, factor: int) -> Record:
    """A record whose schedule splits the kernel's first block's innermost loop by ``factor``."""
    base = workload_module(identity.workload)
    sch = tvm.s_tir.Schedule(base)
    block = next(n for n in re.findall(r'T\.sblock\("([^"]+)"\)', base.script()) if n != "root")
    sch.split(sch.get_loops(sch.get_sblock(block))[-1], factors=[None, factor])
    return Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "split_record"})


def tiled_record(identity: Identity, loop: int, decision: list[int], secs: float = 1e-4) -> Record:
    """A record whose schedule tiles loop ``loop`` of the kernel's first block by a sampled ``decision``
    (a ``SamplePerfectTile``: TVM re-derives it where the loop's extent is no longer its product)."""
    base = workload_module(identity.workload)
    sch = tvm.s_tir.Schedule(base)
    block = next(n for n in re.findall(r'T\.sblock\("([^"]+)"\)', base.script()) if n != "root")
    loops = sch.get_loops(sch.get_sblock(block))
    sch.split(loops[loop], factors=sch.sample_perfect_tile(loops[loop], n=2, decision=decision))
    return Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [secs], {"tuner": "tiled_record"})


def test_candidates_that_schedule_the_kernel_alike_are_built_and_timed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of batch 64 and 32 tile the batch loop [2, 32] and [2, 16]; at batch 16 TVM re-derives both to [1, 16]:
    one kernel. A measured compile builds and times it once, and both candidates carry that one timing."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    builds: list[Any] = []
    real_build = measure.build
    monkeypatch.setattr(measure, "build", lambda *args: builds.append(args) or real_build(*args))
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        sources = {batch: next(k.identity for k in kernels(export(batch), host, NO_REWRITES) if k.identity.op == "fused_matmul_add_relu") for batch in (64, 32)}
        alike = [tiled_record(sources[64], 0, [2, 32]), tiled_record(sources[32], 0, [2, 16])]
        reg.put_many(alike)
        with use(reg, host, cache=tmp_path / "cache", measure=60, repostprocess=False) as session:
            tvm.compile(export(16), host)
    served = next(k for k in session.report.kernels if k.op == "fused_matmul_add_relu")
    assert served.outcome == "transfer" and set(served.measured) == {r.trace_id for r in alike}
    first, second = served.measured.values()
    assert first is not None and first == second  # one timing, not two that happen to agree to the last bit
    assert len(builds) == 2  # the default schedule and the one kernel


def test_without_measuring_the_candidate_whose_tiles_still_fit_is_served_before_a_nearer_one(tmp_path: Path) -> None:
    """Batch 8 is nearer to 16 than batch 64, but its record tiles the batch loop (re-derived at 16);
    the record from batch 64 tiles a loop whose extent does not change, so it replays as tuned."""
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        retiled = {k.name: tiled_record(k.identity, 0, [2, 4]) for k in kernels(export(8), CPU, NO_REWRITES) if "matmul" in k.name}
        kept = {}
        for k in kernels(export(64), CPU, NO_REWRITES):
            if "matmul" in k.name:
                extent = k.identity.args_info[-1][2][1]  # the output's columns: the same at every batch
                kept[k.name] = tiled_record(k.identity, 1, [extent // 2, 2])
        reg.put_many([*retiled.values(), *kept.values()])
        with use(reg, CPU, cache=tmp_path / "cache") as session:
            ex = tvm.compile(export(16), CPU)
        transfers = {k.op: k.detail.split(":")[1] for k in session.report.kernels if k.outcome == "transfer"}
        assert transfers == {name: r.trace_id for name, r in kept.items()}
        found = reg.lookup_with_candidates([k.identity for k in kernels(export(16), CPU, NO_REWRITES) if "matmul" in k.name], per_key=4)[1]
        assert all(cs[0].record.trace_id == retiled[cs[0].record.identity.op].trace_id for cs in found.values())  # nearest first: batch 8
        with use(reg, CPU, cache=tmp_path / "cache") as again:  # the replays come from this machine's cache: same pick
            tvm.compile(export(16), CPU)
        assert {k.op: k.detail.split(":")[1] for k in again.report.kernels if k.outcome == "transfer"} == transfers
    x = np.random.default_rng(7).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_cost_model_the_registry_serves_decides_between_transfers_that_fit_alike_when_its_pusher_is_trusted(tmp_path: Path) -> None:
    """Batch 8's and batch 64's records both tile the output's columns (their extent is the same at 16: no tile
    re-derived). The fit ranking serves batch 64's: as fast per call at home for 8x the work. Ranked by it (by
    default too: each kernel's own layer was tuned at two batches), a served model that predicts batch 8's to run faster on these kernels serves those instead, with correct
    output; a model pushed as a claim is used only by a session that trusts its pusher."""
    from schedhub.hooks.metaschedule.costmodel import FEATURES, CostModel, features, flops
    from schedhub.hooks.kernels.identity import compiler_fingerprint
    from schedhub.hooks.metaschedule.msdb import replayed

    def columns(k: Any, parts: int) -> Record:
        extent = k.identity.args_info[-1][2][1]
        return tiled_record(k.identity, 1, [extent // parts, parts])

    small = {k.name: columns(k, 4) for k in kernels(export(8), CPU, NO_REWRITES) if "matmul" in k.name}
    large = {k.name: columns(k, 2) for k in kernels(export(64), CPU, NO_REWRITES) if "matmul" in k.name}
    held_out = [k for k in kernels(export(16), CPU, NO_REWRITES) if "matmul" in k.name]
    rows, labels = [], []
    for k in held_out:
        normalized = normalize_mod(workload_module(k.identity.workload)["main"])
        for record, speed in ((small[k.name], 8.0), (large[k.name], 2.0)):  # log₂ GFLOPS: batch 8's schedule 64× faster here
            rows.append(features(replayed(normalized, record.trace), CPU, flops(normalized)))
            labels.append(speed)
    model = CostModel.fit(rows * 4, labels * 4)
    assert model.predict(rows) == pytest.approx(labels, abs=0.5)
    served: dict[tuple[bool, str], dict[str, str]] = {}
    for verified in (True, False):
        with LocalRegistry(tmp_path / f"store-{verified}", sync=False) as reg:
            reg.put_many([*small.values(), *large.values()])
            reg.push_cost_model(CostModelEntry(held_out[0].identity.target, compiler_fingerprint(), FEATURES, len(rows), model.trees), "w", verified=verified)
            for trust in ("verified", ["w"]):
                with use(reg, CPU, cache=tmp_path / "cache", trust=trust, rank_by_model=True) as session:
                    ex = tvm.compile(export(16), CPU)
                picks = served[verified, str(trust)] = {k.op: k.detail.split(":")[1] for k in session.report.kernels if k.outcome == "transfer"}
                assert ("cost model" in session.report.summary()) == (picks != {n: r.trace_id for n, r in large.items()})
                x = np.random.default_rng(8).standard_normal((16, 64)).astype("float32")
                np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)
    by_model, by_fit = {n: r.trace_id for n, r in small.items()}, {n: r.trace_id for n, r in large.items()}
    assert served == {(True, "verified"): by_model, (True, "['w']"): by_model, (False, "verified"): by_fit, (False, "['w']"): by_model}
    with LocalRegistry(tmp_path / "store-True", sync=False) as reg, use(reg, CPU, cache=tmp_path / "cache", rank_by_model=False) as session:
        tvm.compile(export(16), CPU)  # turned off: the fit ranking
    assert {k.op: k.detail.split(":")[1] for k in session.report.kernels if k.outcome == "transfer"} == by_fit and not session.report.ranked_by
    with LocalRegistry(tmp_path / "store-True", sync=False) as reg, use(reg, CPU, cache=tmp_path / "cache") as session:
        tvm.compile(export(16), CPU)  # by default where it decides: each kernel's own layer was tuned at two shapes (batch 8 and 64)
    assert {k.op: k.detail.split(":")[1] for k in session.report.kernels if k.outcome == "transfer"} == by_model
    assert session.report.model_ranked == len(held_out) and f"{len(held_out)} kernels' transfers ranked by" in session.report.summary()


def test_a_served_model_decides_where_the_kernels_own_layer_was_tuned_at_two_shapes() -> None:
    """``rank_by_model=None`` (the default): a candidate is the kernel's own layer when its weights are the kernel's (what else
    differs is shaped as the output: a residual); the model ranks only where the contenders hold that layer at
    two shapes other than the kernel's."""
    from schedhub.hooks.metaschedule.ranking import model_decides, same_layer

    def conv(batch: int, image: int, channels: int = 64, inputs: int = 64, stride: int = 2) -> list[Any]:
        out = [batch, channels, image // stride, image // stride]
        return [["TENSOR", "float32", [batch, inputs, image, image]], ["TENSOR", "float32", [channels, inputs, 3, 3]],
                ["TENSOR", "float32", [1, channels, 1, 1]], ["TENSOR", "float32", out], ["TENSOR", "float32", out]]  # bias, residual  # fmt: skip

    kernel = conv(2, 96)
    assert same_layer(kernel, conv(1, 64)) and same_layer(kernel, conv(4, 128))
    assert not same_layer(kernel, conv(1, 64, channels=128))  # another layer: other weights, other bias
    assert not same_layer(kernel, conv(2, 96, inputs=32))  # another layer with the same bias: other weights
    assert not same_layer(kernel, conv(1, 64, stride=1))  # another layer with the same weights' shape: another stride
    assert not same_layer(kernel, conv(2, 96)[:3] + conv(2, 96)[4:])  # another argument count: another structure
    assert model_decides(kernel, [conv(1, 64), conv(1, 128)])  # its own layer at two shapes
    assert not model_decides(kernel, [conv(1, 64), conv(1, 64, inputs=32), conv(1, 128, inputs=32)])  # at one: other layers do not count
    assert not model_decides(kernel, [conv(1, 64), conv(1, 32, stride=1)])
    assert not model_decides(kernel, [conv(1, 64), conv(2, 96)])  # the kernel's own shape (another compiler or CPU) is not a second one
    assert not model_decides(kernel, [conv(1, 64), conv(1, 64)])
    hostile = [[["TENSOR", "float32", [10**400, 0]], ["TENSOR", "float32", [3]], ["TENSOR", "float32", [1, 0]]], [["TENSOR"]], [None, 1, "x"]]
    assert not any(same_layer(kernel, h) or same_layer(h, kernel) for h in hostile) and not model_decides(kernel, hostile)


def test_a_tiling_that_was_all_ones_where_it_was_tuned_ranks_after_one_that_decided(tmp_path: Path) -> None:
    """A record tuned at batch 1 tiled its batch loop all ones, which decided nothing (a matmul at batch 1 is a
    matrix-vector schedule). At batch 16, where another candidate re-derives as many tiles, that one is served,
    although the batch-1 record is far faster for its work at home."""
    from schedhub.hooks.metaschedule.msdb import replay
    from schedhub.hooks.metaschedule.ranking import Retiling

    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        blind = {k.name: tiled_record(k.identity, 0, [1, 1], secs=1e-7) for k in kernels(export(1), CPU, NO_REWRITES) if "matmul" in k.name}
        decided = {k.name: tiled_record(k.identity, 0, [8, 8]) for k in kernels(export(64), CPU, NO_REWRITES) if "matmul" in k.name}
        reg.put_many([*blind.values(), *decided.values()])
        with use(reg, CPU) as session:
            ex = tvm.compile(export(16), CPU)
    assert {k.op: k.detail for k in session.report.kernels if "matmul" in k.op} == {name: f"shape:{r.trace_id}:{name}" for name, r in decided.items()}
    at16 = {k.name: normalize_mod(workload_module(k.identity.workload)["main"]) for k in kernels(export(16), CPU, NO_REWRITES)}
    assert all(replay(at16[name], r.trace)[1] == Retiling(1, 1) for name, r in blind.items())
    assert all(replay(at16[name], r.trace)[1] == Retiling(1, 0) for name, r in decided.items())
    x = np.random.default_rng(8).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_compile_whose_measurement_budget_ran_out_serves_what_the_ranking_picks(tmp_path: Path) -> None:
    """Kernels reached after the budget are served as without measuring: every candidate replayed and ranked.
    Before, the replays stopped at the first candidate that applied (the nearest), which served the kernels
    after a small budget worse than no budget at all."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})  # measured only for this machine's CPU
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put_many([tiled_record(k.identity, 0, [2, 4]) for k in kernels(export(8), host, NO_REWRITES) if "matmul" in k.name])  # nearest, retiled at 16
        kept = {k.name: tiled_record(k.identity, 1, [k.identity.args_info[-1][2][1] // 2, 2]) for k in kernels(export(64), host, NO_REWRITES) if "matmul" in k.name}
        reg.put_many(list(kept.values()))
        served = {}
        for budget in (0, 1e-9):
            with use(reg, host, cache=tmp_path / f"cache-{budget}", measure=budget) as session:
                tvm.compile(export(16), host)
            served[budget] = {k.op: (k.outcome, k.detail, k.measured) for k in session.report.kernels if "matmul" in k.op}
    assert served[1e-9] == served[0] == {name: ("transfer", f"shape:{r.trace_id}:{name}", {}) for name, r in kept.items()}  # its tiles still fit


def test_the_ranking_puts_the_same_workload_first_then_fitting_tiles_then_speed_then_the_registry_order() -> None:
    from schedhub.hooks.metaschedule.ranking import Retiling, model_rank_key, rank_key

    fits, one, one_blind, two = Retiling(0, 0), Retiling(1, 0), Retiling(1, 1), Retiling(2, 0)
    ranked = sorted([rank_key("shape", fits, 5.0, 3), rank_key("shape", one, 90.0, 0), rank_key("compiler", two, 1.0, 4), rank_key("shape", fits, 9.0, 2),
                     rank_key("target", fits, 9.0, 1), rank_key("shape", one_blind, 900.0, 5)])  # fmt: skip
    assert ranked == [rank_key("compiler", two, 1.0, 4), rank_key("target", fits, 9.0, 1), rank_key("shape", fits, 9.0, 2), rank_key("shape", fits, 5.0, 3),
                      rank_key("shape", one, 90.0, 0), rank_key("shape", one_blind, 900.0, 5)]  # fmt: skip
    # with a served model, its predicted speed here (log₂ GFLOPS) takes the place of the speed at home, after the tiles
    by_model = sorted([model_rank_key("shape", one, 9.0, 0), model_rank_key("shape", fits, 2.0, 1), model_rank_key("synthesized", fits, 20.0, 2), model_rank_key("shape", fits, 3.0, 3),
                       model_rank_key("shape", one_blind, 9.5, 4)])  # fmt: skip
    assert by_model == [model_rank_key("shape", fits, 3.0, 3), model_rank_key("shape", fits, 2.0, 1), model_rank_key("shape", one, 9.0, 0),
                        model_rank_key("shape", one_blind, 9.5, 4), model_rank_key("synthesized", fits, 20.0, 2)]  # fmt: skip


def test_the_work_the_ranking_reads_from_a_workload_text_is_tvms_flop_estimate() -> None:
    """The hook ranks candidates by speed for their work without TVM parsing their workloads (~180 ms each)."""
    from schedhub.hooks.metaschedule.ranking import work
    from schedhub.tuner.networks import models
    from schedhub.hooks.metaschedule.costmodel import flops

    resnet, _, _ = models.export("resnet18", batch=1, image=32)
    found = [k for k in [*kernels(export(16), CPU, NO_REWRITES), *kernels(resnet, CPU, NO_REWRITES)] if flops(workload_module(k.identity.workload)) > 1]
    assert len(found) > 10 and any("conv2d" in k.name for k in found)
    for k in found:
        assert work(k.identity.workload) == flops(workload_module(k.identity.workload)), k.name
    assert work("not python") == 1.0


def test_the_effort_of_a_kernel_counts_the_elements_it_writes_beside_its_arithmetic() -> None:
    """What orders the misses a compile reports: a transpose has no arithmetic but writes every element."""
    from schedhub.hooks.metaschedule.ranking import effort, work

    mlp = kernels(export(16), CPU, NO_REWRITES)
    transpose = next(k for k in mlp if k.name == "transpose")  # the first layer's weight: 128 × 64
    assert work(transpose.identity.workload) == 1.0 and effort(transpose.identity.workload) == 128 * 64
    matmul = next(k for k in mlp if k.name == "fused_matmul_add_relu")  # 16 × 64 @ 64 × 128, then the bias and the ReLU
    assert work(matmul.identity.workload) == 16 * 128 * 64 * 2 + 16 * 128 * 2  # a multiply-add per step, an add and a max per element
    assert effort(matmul.identity.workload) == 16 * 128 * 64 * 3 + 16 * 128 * 4  # and a store each


def uneven(batch: int) -> tvm.IRModule:
    return Uneven().export_tvm({"forward": {"x": nn.spec.Tensor((batch, 64), "float32")}})[0]


def layer(k: Any) -> str | None:
    """Which of :class:`Uneven`'s layers a kernel (``tuner.networks.models.kernels``) is, by its matmul's weight operand."""
    names = {(64, 256): "wide", (64, 64): "block", (256, 24): "head"}
    return names.get(tuple(k.identity.args_info[1][2])) if "matmul" in k.name else None


def test_a_transferred_miss_is_queued_by_the_time_its_transfer_is_expected_to_take(tmp_path: Path) -> None:
    """A miss served by a transfer costs the module what that schedule takes (its record's speed applied to
    this kernel's work), not what TVM's default would: the wide layer's neighbour, 1000× as fast as a default
    schedule is assumed to be, serves the wide and the block layers (one structure: matmul, bias, activation),
    so the head, left to the default schedule, is queued first."""
    from schedhub.hooks.metaschedule.ranking import work

    wide_at_8 = next(k.identity for k in kernels(uneven(8), CPU, NO_REWRITES) if layer(k) == "wide")
    record = split_record(wide_at_8, 4)
    fast = dataclasses.replace(record, run_secs=[work(wide_at_8.workload) / 1e12])  # 1000× the default's assumed 1e9 a second
    layers = {k.identity.key: layer(k) for k in kernels(uneven(4), CPU, NO_REWRITES)}
    with LocalRegistry(tmp_path / "store", sync=False) as store:
        store.put_many([fast])
        with use(store, CPU, cache=tmp_path / "cache") as session:
            tvm.compile(uneven(4), CPU)
        assert {layers[k.key]: k.outcome for k in session.report.kernels if layers.get(k.key)} == {"wide": "transfer", "block": "transfer", "head": "miss"}
        leased = [layers[lease.job["key"]] for lease in store.lease("w", max_jobs=10, lease_secs=60)]
    assert [name for name in leased if name] == ["head", "wide", "block"]  # wide 133k of work, block 3 × 33k, at the neighbour's speed; all at the default's: wide, block, head


def test_a_compile_that_measures_spends_its_budget_on_the_costliest_kernels_first(tmp_path: Path) -> None:
    """A measurement budget runs out kernel by kernel, so a compile that measures serves its misses in the
    order of what each is expected to cost the module (call sites × its work at its candidates' home speed),
    not in the module's order: the head's neighbours are slow, the block is called three times."""
    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})  # measured only for this machine's CPU
    home_secs = {"head": 1e-3, "block": 1e-4, "wide": 1e-5}  # expected at batch 4: head 0.5 ms, block 3 × 0.05, wide 0.005
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        for batch, factor in ((8, FACTORS[0]), (16, FACTORS[1])):  # two neighbours a layer, each with its own schedule
            reg.put_many([dataclasses.replace(split_record(k.identity, factor), run_secs=[home_secs[layer(k)]]) for k in kernels(uneven(batch), host, NO_REWRITES) if layer(k)])
        layers = {k.identity.key: layer(k) for k in kernels(uneven(4), host, NO_REWRITES) if layer(k)}
        served = {}
        for budget in (0, 60):
            with use(reg, host, cache=tmp_path / f"cache-{budget}", measure=budget, repostprocess=False) as session:  # two candidates a kernel
                tvm.compile(uneven(4), host)
            served[budget] = [k for k in session.report.kernels if k.key in layers]
    assert [layers[k.key] for k in served[60]] == ["head", "block", "wide"] != [layers[k.key] for k in served[0]]
    assert all(k.outcome == "transfer" and len(k.measured) == 2 for k in served[60]) and not any(k.measured for k in served[0])
