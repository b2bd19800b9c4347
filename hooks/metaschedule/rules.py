"""Rule-decided CPU schedules: what a missed kernel gets before anyone has tuned it (DLight's role, for CPUs).

TVM's default for a CPU kernel is the kernel unscheduled: one thread, no vectors, no tiling (ResNet-50 from an empty
registry ran 70× slower than PyTorch). On a GPU DLight's rules fill that role; this module does the same for CPUs
without timing anything. It takes the kernel's own MetaSchedule design space (the rules the tuner searches:
multi-level tiling, the epilogue fused at the tile, parallel outer loops, vectorized inner ones, unrolling) and,
instead of random decisions, decides every one by rule:

- the tiled block's innermost output axis becomes its vector: one or two vectors of the target's float32 lanes;
- the axis before it (with more than one iteration) becomes the rows of a register block: rows × vectors
  accumulators, as many as the vector registers hold beside the operands (12 of AVX2's 16, 24 of AVX-512's 32);
- the rows' remaining iterations are the second tiling level, so one weight panel serves every row tile of a
  parallel task from cache; every other spatial axis stays whole at the outer level, where the parallel loop is;
- each reduction axis is split with an inner step of at most 8; auto-unrolling is capped at 64 steps; producers
  (padding) are computed once, before the tiled block.

The result is an ordinary MetaSchedule trace (postprocessors applied), served like a record and checked against the
same bounds, but it is still a miss: it is reported and queued, and a tuned record replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from ..kernels.errors import TVM_ERRORS
from ..kernels.intrinsics import load_tensor_intrinsics
from .msdb import trace_text

log = logging.getLogger("schedhub")

#: Names these rules: a kernel cache entry of a ruled trace is keyed by it, so changed rules decide again.
RULES = "cpu-rules/1"
REDUCTION_STEP = 8  # the inner split of a reduction axis (1 measured 14% slower on BERT's matmuls, 32 the same)
UNROLL_STEPS = 64  # auto-unroll cap: unrolls a register block's rows and a reduction step, not a whole reduction
VECTORS = (2, 1)  # vectors per register-block row, preferred first (3 ran BERT's matmuls 2.5× slower than 2)
SPATIAL, REDUCTION = "spatial", "reduction"


def float32_lanes(target: tvm.target.Target) -> int:
    """The float32 lanes of ``target``'s widest vector registers: 16 (AVX-512), 8 (AVX, AVX2) or 4 (anything else)."""
    has = tvm.target.codegen.target_has_features
    return 16 if has("avx512f", target) else 8 if has("avx", target) else 4


def accumulators(target: tvm.target.Target) -> int:
    """How many vector registers a register block may keep its sums in: three quarters of them (the rest hold a
    row's operands), 12 of AVX2's 16, 24 of AVX-512's 32."""
    return 24 if float32_lanes(target) == 16 else 12


@dataclass(frozen=True)
class Tile:
    """One ``SamplePerfectTile`` of a design space: the loop's extent, how many factors it asks for, the largest
    innermost factor it allows, and the axis kind its factor count tells (the tiling rule splits a spatial axis into
    more levels than a reduction axis)."""

    extent: int
    levels: int
    max_innermost: int

    @property
    def kind(self) -> str:
        return SPATIAL if self.levels >= 3 else REDUCTION


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tile_decisions(tiles: Sequence[Tile], lanes: int, most_accumulators: int) -> list[list[int]]:
    """The factors of each tile, by the rules of the module's docstring. A run of spatial tiles is one tiled block's
    output axes, in the block's order (the last is innermost in memory)."""
    out: list[list[int] | None] = [None] * len(tiles)
    i = 0
    while i < len(tiles):
        if tiles[i].kind == REDUCTION:
            t = tiles[i]
            step = max(d for d in _divisors(t.extent) if d <= min(REDUCTION_STEP, t.max_innermost))
            out[i] = [t.extent // step] + [1] * (t.levels - 2) + [step]
            i += 1
            continue
        end = i
        while end + 1 < len(tiles) and tiles[end + 1].kind == SPATIAL and tiles[end + 1].levels == tiles[i].levels:
            end += 1
        out[i : end + 1] = _register_block(tiles[i : end + 1], lanes, most_accumulators)
        i = end + 1
    return [o for o in out if o is not None]


def _register_block(axes: Sequence[Tile], lanes: int, most_accumulators: int) -> list[list[int]]:
    """The factors of one tiled block's spatial axes: the innermost a vector register block wide, the one before it
    with more than one iteration the block's rows (its remainder at the second level), the rest whole outside."""
    inner = axes[-1]
    row = next((j for j in range(len(axes) - 2, -1, -1) if axes[j].extent > 1), None)
    row_extent = axes[row].extent if row is not None else 1
    best = (0, 1, 1)  # accumulators, rows, inner factor
    for vectors in VECTORS:
        width = vectors * lanes
        if inner.extent % width or width > inner.max_innermost:
            continue
        for rows in _divisors(row_extent):
            if rows * vectors <= most_accumulators and rows * vectors > best[0]:
                best = (rows * vectors, rows, width)
    if not best[0]:  # an innermost axis no vector divides: its largest factor up to two vectors, scalar rows
        width = max(d for d in _divisors(inner.extent) if d <= min(2 * lanes, inner.max_innermost))
        rows = max(d for d in _divisors(row_extent) if d <= most_accumulators // -(-width // lanes))
        best = (1, rows, width)
    _, rows, width = best
    out = []
    for j, axis in enumerate(axes):
        pad = [1] * (axis.levels - 2)
        if j == len(axes) - 1:
            out.append([axis.extent // width, *pad, width])
        elif j == row:
            out.append([1, axis.extent // rows, *pad[1:], rows])
        else:
            out.append([axis.extent, *pad, 1])
    return out


def _fuses_epilogue(space: tvm.s_tir.Schedule) -> int:
    return sum(inst.kind.name == "ReverseComputeAt" for inst in space.trace.insts)


def _tiles(normalized: tvm.IRModule, space: tvm.s_tir.Schedule) -> list[Tile]:
    """The design space's tile samplings, each with its loop's extent (read by replaying the space once)."""
    sch = tvm.s_tir.Schedule(normalized, seed=1)
    tiles: list[Tile] = []

    def note(inst: Any, inputs: list[Any], attrs: list[Any], decision: Any) -> Any:
        if inst.kind.name == "SamplePerfectTile":
            tiles.append(Tile(int(sch.get(inputs[0]).extent), int(attrs[0]), int(attrs[1])))
        return decision

    space.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=note)
    return tiles


def _decided(normalized: tvm.IRModule, space: tvm.s_tir.Schedule, target: tvm.target.Target) -> tvm.s_tir.Schedule:
    decisions = iter(tile_decisions(_tiles(normalized, space), float32_lanes(target), accumulators(target)))
    sch = tvm.s_tir.Schedule(normalized, seed=1)

    def decide(inst: Any, _inputs: list[Any], attrs: list[Any], decision: Any) -> Any:
        kind = inst.kind.name
        if kind == "SamplePerfectTile":
            return next(decisions)
        if kind == "SampleCategorical":  # the unroll cap: MetaSchedule's CPU rules sample nothing else this way
            candidates = [int(c) for c in attrs[0]]
            return candidates.index(UNROLL_STEPS) if UNROLL_STEPS in candidates else decision
        if kind == "SampleComputeLocation":
            return -1  # a producer computed once, before the block that reads it
        return decision

    space.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=decide)
    return sch


def ruled_trace(normalized: tvm.IRModule, target: tvm.target.Target) -> str | None:
    """The trace (MetaSchedule's JSON text, postprocessors applied) of ``normalized`` (a static-shape CPU kernel,
    MetaSchedule-normalized) scheduled by these rules; None where its design space has no schedule or the rules'
    decisions do not complete one (the kernel keeps TVM's default)."""
    if target.kind.name != "llvm":
        return None
    load_tensor_intrinsics()
    try:
        context = ms.TuneContext(mod=normalized, target=target, space_generator="post-order-apply", rand_state=1, num_threads=1)
        spaces = context.generate_design_space()
        if not spaces:
            return None
        space = max(reversed(spaces), key=_fuses_epilogue)  # the epilogue fused at the tile, the outermost such first
        sch = _decided(normalized, space, target)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in context.space_generator.postprocs):
            return None
        return trace_text(sch.trace)
    except (*TVM_ERRORS, StopIteration, ValueError) as exc:  # a space the rules do not fit: the default schedule
        log.debug("schedhub: no ruled schedule: %s", str(exc)[:200])
        return None
