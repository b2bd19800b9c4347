"""Refitting a transferred trace's tile sizes to the kernel's extents (hooks/tiles.py), on real TVM replays."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import te

from schedhub.hooks.identity import plain_json, workload_identity
from schedhub.hooks.msdb import _applied, replay, replay_schedule, tuning_record
from schedhub.hooks.tiles import nearest_tiles
from schedhub.registry import Record

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 2})


@pytest.mark.parametrize(
    ("extent", "tuned", "max_innermost", "expected"),
    [
        (672, [1, 7, 8, 8], 64, [2, 6, 7, 8]),  # TVM re-derives [1, 1, 84, 8]: an 84-row register tile
        (1024, [1, 8, 4, 16], 64, [2, 8, 4, 16]),  # a doubled extent: the growth goes to the outermost loop
        (96, [2, 8, 4, 16], 64, [1, 2, 3, 16]),  # a smaller one: the vector width stays, the cache tile shrinks
        (49, [4, 1, 4, 1], 0, [7, 1, 7, 1]),
        (6, [1, 1, 1, 8], 2, [1, 1, 3, 2]),  # the innermost factor stays within the instruction's bound; the next takes the rest
        (7, [7], 0, [7]),
    ],
)
def test_nearest_tiles_keep_the_inner_tile_sizes(extent: int, tuned: list[int], max_innermost: int, expected: list[int]) -> None:
    fit = nearest_tiles(extent, tuned, max_innermost)
    assert fit == expected
    assert np.prod(fit) == extent


def test_nearest_tiles_refuse_what_they_cannot_factor() -> None:
    assert nearest_tiles(0, [1, 4]) is None
    assert nearest_tiles(1 << 40, [1, 4]) is None
    assert nearest_tiles(8, [0, 4]) is None


def matmul(rows: int) -> tvm.IRModule:
    a, b = te.placeholder((rows, 64), name="A"), te.placeholder((64, 32), name="B")
    r = te.reduce_axis((0, 64), name="k")
    c = te.compute((rows, 32), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def tiled(rows: int, decision: list[int]) -> list:
    """A trace tuned at ``rows`` rows: the row loop tiled by ``decision`` (a sampled tiling, as MetaSchedule records it)."""
    sch = tvm.s_tir.Schedule(matmul(rows))
    i, _, _ = sch.get_loops(sch.get_sblock("matmul"))
    factors = sch.sample_perfect_tile(i, n=len(decision), max_innermost_factor=64, decision=decision)
    sch.split(i, factors=factors)
    return plain_json(sch.trace.as_json())


def tile_decision(trace: tvm.s_tir.schedule.Trace) -> list[int]:
    [decision] = [[int(x) for x in d] for inst, d in trace.decisions.items() if inst.kind.name == "SamplePerfectTile"]
    return decision


def run(mod: tvm.IRModule, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lib = tvm.tirx.build(mod, target=CPU)
    out = tvm.runtime.tensor(np.zeros((a.shape[0], b.shape[1]), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy()


def test_a_trace_replayed_at_other_extents_gets_the_nearest_tiling_and_the_same_output() -> None:
    recorded = tiled(448, [1, 7, 8, 8])
    held_out = matmul(672)
    assert tile_decision(_applied(held_out, recorded).trace) == [1, 1, 84, 8]  # what TVM alone re-derives
    sch = replay_schedule(held_out, recorded)
    assert tile_decision(sch.trace) == [2, 6, 7, 8]
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (672, 64)).astype("float32"), rng.uniform(-1, 1, (64, 32)).astype("float32")
    np.testing.assert_allclose(run(sch.mod, a, b), a @ b, rtol=1e-4, atol=1e-4)
    # every replay route refits: the hook's scheduled module (and its count of re-derived tiles) and the Database's TuningRecord
    mod, retiled = replay(held_out, json.dumps(recorded))
    assert retiled == 1
    tvm.ir.assert_structural_equal(mod, sch.mod)
    record = Record(workload_identity(matmul(448), {"kind": "llvm", "num-cores": 2}, "matmul"), json.dumps(recorded), [1e-3], {})
    assert tile_decision(tuning_record(record, held_out, [["TENSOR", "float32", s] for s in ([672, 64], [64, 32], [672, 32])]).trace) == [2, 6, 7, 8]


def test_a_trace_that_still_fits_replays_as_recorded() -> None:
    recorded = tiled(448, [1, 7, 8, 8])
    assert tile_decision(replay_schedule(matmul(448), recorded).trace) == [1, 7, 8, 8]
    assert tile_decision(replay_schedule(matmul(896), recorded).trace) == [2, 7, 8, 8]  # TVM's own re-derivation, already the nearest
