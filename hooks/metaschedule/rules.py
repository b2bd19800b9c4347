"""Rule-decided CPU schedules: what a missed kernel gets before anyone has tuned it (DLight's role, for CPUs).

TVM's default for a CPU kernel is the kernel unscheduled: one thread, no vectors, no tiling (ResNet-50 from an empty
registry ran 70× slower than PyTorch). On a GPU DLight's rules fill that role; this module does the same for CPUs
without timing anything. It takes the kernel's own MetaSchedule design space (the rules the tuner searches:
multi-level tiling, the epilogue fused at the tile, parallel outer loops, vectorized inner ones, unrolling) and,
instead of random decisions, decides every one by rule:

- the tiled block's innermost output axis becomes its vector: one or two vectors of the target's float32 lanes;
- the axis before it (with more than one iteration) becomes the rows of a register block: rows × vectors
  accumulators, as many as the vector registers hold beside the operands (12 of AVX2's 16, 24 of AVX-512's 32);
- where that axis is short (a convolution's 14 or 7 columns), the rows may span a second axis, the one before it,
  when neither indexes the operand the vector axis reads (an image's rows and columns, never a batched matmul's
  batch, whose rows would each need their own weights): on ResNet-50's 14×14 convolutions a block of 2 × 2 pixels
  by 2 vectors (8 accumulators) ran 1.12–1.28× faster inside the network than 7 pixels of one row by one vector (7);
- the rows' remaining iterations are the second tiling level, so one weight panel serves every row tile of a
  parallel task from cache; the second axis's, and every other spatial axis, stay at the outer level, where the
  parallel loop is, unless the weights outweigh the image (over twice its bytes, ResNet-50's 14×14 and 7×7 stages):
  then the vector axis's blocks alone are the parallel loop and the image's axes go inside each task, so a task reads
  its weight panel once for the whole image (the 7×7 stage's convolutions ran 1.08–1.36× faster in the network);
- each reduction axis is split with an inner step of at most 8; auto-unrolling is capped at 64 steps; producers
  (padding) are computed once, before the tiled block.

The result is an ordinary MetaSchedule trace (postprocessors applied), served like a record and checked against the
same bounds, but it is still a miss: it is reported and queued, and a tuned record replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from ..kernels.errors import TVM_ERRORS
from ..kernels.intrinsics import load_tensor_intrinsics
from .guard import buffer_bytes
from .msdb import trace_text

log = logging.getLogger("schedhub")

#: Names these rules: a kernel cache entry of a ruled trace is keyed by it, so changed rules decide again.
RULES = "cpu-rules/2"
REDUCTION_STEP = 8  # the inner split of a reduction axis (1 measured 14% slower on BERT's matmuls, 32 the same)
UNROLL_STEPS = 64  # auto-unroll cap: unrolls a register block's rows and a reduction step, not a whole reduction
WEIGHT_HEAVY = 2  # weights over this many times the image's bytes: the weights' blocks are the parallel loop (_weights_inside)
MIN_PARALLEL = 8  # the fewest weight blocks that parallel loop may have
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
    innermost factor it allows, the axis kind its factor count tells (the tiling rule splits a spatial axis into
    more levels than a reduction axis) and, where known, the operands the axis indexes."""

    extent: int
    levels: int
    max_innermost: int
    #: the operands (read buffers) of the tiled block this axis indexes; None where not known (then no block spans it)
    reads: frozenset[str] | None = field(default=None, compare=False)

    @property
    def kind(self) -> str:
        return SPATIAL if self.levels >= 3 else REDUCTION


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tile_decisions(tiles: Sequence[Tile], lanes: int, most_accumulators: int, operand_bytes: Mapping[str, int] | None = None) -> list[list[int]]:
    """The factors of each tile, by the rules of the module's docstring. A run of spatial tiles is one tiled block's
    output axes, in the block's order (the last is innermost in memory); ``operand_bytes``: the size of each operand
    the tiles' ``reads`` name (:func:`_weights_inside`)."""
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
        out[i : end + 1] = _register_block(tiles[i : end + 1], lanes, most_accumulators, operand_bytes or {})
        i = end + 1
    return [o for o in out if o is not None]


def _register_block(axes: Sequence[Tile], lanes: int, most_accumulators: int, operand_bytes: Mapping[str, int]) -> list[list[int]]:
    """The factors of one tiled block's spatial axes: the innermost a vector register block wide, the one before it
    with more than one iteration the block's rows (its remainder at the second level), the rows spanning the axis
    before that too where :func:`_second_row_axis` allows, the rest whole outside, or inside each parallel task where
    :func:`_weights_inside` says so."""
    inner = axes[-1]
    row = next((j for j in range(len(axes) - 2, -1, -1) if axes[j].extent > 1), None)
    second = _second_row_axis(axes, row)
    row_extent = axes[row].extent if row is not None else 1
    second_extent = axes[second].extent if second is not None else 1
    best = (0, 0, 0, 1, 1)  # accumulators, vectors, rows on the row axis, rows on the second axis, inner factor
    for vectors in VECTORS:
        width = vectors * lanes
        if inner.extent % width or width > inner.max_innermost:
            continue
        for rows in _divisors(row_extent):
            for more in _divisors(second_extent):
                if rows * more * vectors <= most_accumulators and (rows * more * vectors, vectors, rows) > best[:3]:
                    best = (rows * more * vectors, vectors, rows, more, width)
    if not best[0]:  # an innermost axis no vector divides: its largest factor up to two vectors, scalar rows
        width = max(d for d in _divisors(inner.extent) if d <= min(2 * lanes, inner.max_innermost))
        rows = max(d for d in _divisors(row_extent) if d <= most_accumulators // -(-width // lanes))
        best = (1, 1, rows, 1, width)
    _, _, rows, more, width = best
    inside = _weights_inside(axes, row, inner.extent // width, operand_bytes)
    out = []
    for j, axis in enumerate(axes):
        pad = [1] * (axis.levels - 2)
        if j == len(axes) - 1:
            out.append([axis.extent // width, *pad, width])
        elif j == row:
            out.append([1, axis.extent // rows, *pad[1:], rows])
        elif j == second:
            out.append([1, axis.extent // more, *pad[1:], more] if inside else [axis.extent // more, *pad, more])
        else:
            out.append([1, axis.extent, *pad[1:], 1] if inside else [axis.extent, *pad, 1])
    return out


def _weights_inside(axes: Sequence[Tile], row: int | None, blocks: int, operand_bytes: Mapping[str, int]) -> bool:
    """Whether the vector axis's blocks (``blocks`` of them) are the parallel loop, every other axis inside each task:
    where the operand the vector axis reads (a convolution's weights) is over :data:`WEIGHT_HEAVY` times the size of
    the one the rows read (its image) and the blocks are :data:`MIN_PARALLEL` or more. Each task then reads its panel
    of weights once for all its pixels; with the image rows outermost, a task takes one row and the next row's task reads
    the same panel again, from memory where the weights outgrow the caches (ResNet-50's 7×7 convolutions, 9.4 MB of
    weights for 100 KB of image, ran 2× slower inside the network than timed alone)."""
    if row is None or blocks < MIN_PARALLEL or axes[-1].reads is None or axes[row].reads is None:
        return False
    weights = sum(operand_bytes.get(name, 0) for name in axes[-1].reads - axes[row].reads)
    image = sum(operand_bytes.get(name, 0) for name in axes[row].reads - axes[-1].reads)
    return image > 0 and weights > WEIGHT_HEAVY * image


def _second_row_axis(axes: Sequence[Tile], row: int | None) -> int | None:
    """The axis before ``row`` with more than one iteration, where a register block's rows may span it: both index
    operands known not to be the one the vector (innermost) axis reads, so every row of the block shares its vectors'
    operand (a convolution's image rows and columns beside its output channels; a batched matmul's batch indexes both
    operands and is never taken)."""
    if row is None:
        return None
    second = next((j for j in range(row - 1, -1, -1) if axes[j].extent > 1), None)
    if second is None:
        return None
    inner, spans = axes[-1].reads, (axes[row].reads, axes[second].reads)
    if inner is None or any(r is None or not r or r & inner for r in spans):
        return None
    return second


def _fuses_epilogue(space: tvm.s_tir.Schedule) -> int:
    return sum(inst.kind.name == "ReverseComputeAt" for inst in space.trace.insts)


def _tiles(normalized: tvm.IRModule, space: tvm.s_tir.Schedule, anchor: tuple[list[tuple[int, frozenset[str]]], dict[str, int]] | None) -> list[Tile]:
    """The design space's tile samplings, each with its loop's extent (read by replaying the space once) and, for the
    block the space tiles, the operands each spatial axis indexes (``anchor``: :func:`_anchor_operands`)."""
    sch = tvm.s_tir.Schedule(normalized, seed=1)
    tiles: list[Tile] = []

    def note(inst: Any, inputs: list[Any], attrs: list[Any], decision: Any) -> Any:
        if inst.kind.name == "SamplePerfectTile":
            tiles.append(Tile(int(sch.get(inputs[0]).extent), int(attrs[0]), int(attrs[1])))
        return decision

    space.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=note)
    spatial = [j for j, t in enumerate(tiles) if t.kind == SPATIAL]
    if anchor is not None and len(spatial) == len(anchor[0]) and all(tiles[j].extent == e for j, (e, _) in zip(spatial, anchor[0])):
        for j, (_, reads) in zip(spatial, anchor[0]):
            tiles[j] = Tile(tiles[j].extent, tiles[j].levels, tiles[j].max_innermost, reads)
    return tiles


def _anchor_operands(normalized: tvm.IRModule) -> tuple[list[tuple[int, frozenset[str]]], dict[str, int]] | None:
    """Each spatial axis of the kernel's anchor block (its convolution or matmul), in order, with its extent and the
    read buffers whose indices use it; and each read buffer's bytes. None where the kernel has no anchor block with
    static extents."""
    from tvm.s_tir.analysis import find_anchor_sblock

    try:
        block = find_anchor_sblock(normalized)
    except TVM_ERRORS:
        return None
    if block is None:
        return None
    axes = []
    for iv in block.iter_vars:
        if int(iv.iter_type) != 0:  # not a data-parallel axis
            continue
        if not isinstance(iv.dom.extent, tvm.tirx.IntImm):
            return None
        reads = frozenset(r.source.name for r in block.reads
                          if any(iv.var.same_as(v) for rg in r.region for v in tvm.tirx.analysis.undefined_vars(rg.min)))  # fmt: skip
        axes.append((int(iv.dom.extent), reads))
    sizes = {name: size for name, size in ((r.source.name, _buffer_bytes(normalized, r.source.name)) for r in block.reads) if size}
    return axes, sizes


def _buffer_bytes(normalized: tvm.IRModule, name: str) -> int:
    """The bytes of the buffer named ``name`` (a parameter or an intermediate of ``normalized``); 0 where not found or
    not static."""
    func = normalized["main"]
    body = func.body
    intermediates = list(body.block.alloc_buffers) if isinstance(body, tvm.s_tir.SBlockRealize) else []
    return next((buffer_bytes(b) or 0 for b in [*func.params, *intermediates] if getattr(b, "name", None) == name), 0)


def _decided(normalized: tvm.IRModule, space: tvm.s_tir.Schedule, target: tvm.target.Target) -> tvm.s_tir.Schedule:
    anchor = _anchor_operands(normalized)
    decisions = iter(tile_decisions(_tiles(normalized, space, anchor), float32_lanes(target), accumulators(target), anchor[1] if anchor else None))
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
