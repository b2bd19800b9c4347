"""A transfer's trace replayed with the recorded tiles of the loops TVM would re-derive, the einsum padded to them.

TVM re-derives a recorded tiling that no longer fits its loop. For a symbolic extent (a dynamic batch or
sequence length) it gives ``[n, 1, 1, 1]``: the loop runs outermost, untiled, and a matmul's every parallel task
computes one row, so the weights stream through the cache once a row. For a static extent the recorded inner
tiles do not divide, the first that does not takes the rest (the BERT layer's tilings at 128 rows replayed at 100:
``[2, 8, 4, 2]`` became ``[1, 1, 50, 2]`` and ``[1, 4, 4, 8]`` ``[1, 1, 1, 100]``). Keeping the recorded inner
tiles with a predicate for the remainder puts a bounds check in the innermost loop and was slower still
(ARCHITECTURE §8).

Here the einsum's spatial loops are padded instead (``pad_einsum``) to a multiple of the recorded inner tiles, so
the same trace replays with those tiles and no predicate in the hot loop: rows past the size are computed into a
padded buffer and dropped. The padded input copies are parallel loops of their own. :func:`_levels` says which
tiles are kept at which size (padding at most doubles the work); a symbolic kernel holds every level and TVM's
re-derivation, chosen at run time; a static one gets the level that fits, or none.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..kernels.errors import TVM_ERRORS
from .msdb import postprocessing_starts, sketch


PADDED = "re-derived loops padded to their recorded tiles"  # in the kernel cache's key of every schedule, with whether they were
MAX_TILE = 1024  # the largest product of recorded inner tiles a symbolic loop is padded to
MAX_STATIC_PADDING = 1.5  # the most rows padding may add to a static loop's, as a share of its own (bench.studies.dynamic's static
#                           exports from records at batch 64 and sequence 128: padding 16 rows to 32 made the MLP 1.57x
#                           slower than TVM's refit, 100 to 104 and 128 made the BERT layer 6.7x faster)
VECTOR = 16  # lanes a padded copy's innermost loop is vectorized by, where its extent divides
MAX_SYMBOLIC_UNROLL = 64  # unroll steps a level padding two loops of symbolic extent keeps: the BERT layer's attention
#                           scores (n x n) took 4.6 s to build with the recorded 512 (symbolic strides in every unrolled
#                           statement), 2.3 s with 64, and ran as fast; a projection (one such loop) ran 1.7-3x slower at 64


@dataclass(frozen=True)
class _Tiling:
    instruction: int  # the SamplePerfectTile's index in the trace
    block: str
    loop: int  # the loop's position among the block's loops (its iteration variable's, under trivial binding)
    inner: list[int]  # the recorded tile sizes inside the outermost


def padded_dispatch(normalized: tvm.IRModule, trace: list[Any], rederived: tvm.s_tir.Schedule) -> tvm.IRModule | None:
    """``normalized`` scheduled by ``trace`` with the spatial loops whose recorded tiling TVM re-derived (a symbolic
    size, or one the recorded inner tiles do not divide) padded to the recorded inner tiles (:func:`_levels`): for a
    symbolic size dispatched at run time against ``rederived`` (the same trace as TVM replays it), for a static one
    the level that fits, chosen here. None where nothing is to be padded (or, static, no level fits). Raises TVM's
    error where the padded replay fails."""
    sch = tvm.s_tir.Schedule(normalized)
    tilings = [t for t in _rederived_tilings(trace, rederived) if _spatial(sch, t)]
    if not tilings:
        return None
    extents = {t.instruction: _extent(sch, t) for t in tilings}
    levels = [([t for t, _ in kept], tirx.all(*(runs(extents[t.instruction]) for t, runs in kept))) for kept in _levels(tilings)]
    if all(isinstance(e, tirx.IntImm) for e in extents.values()):  # static: the first level whose condition holds
        chosen = next((kept for kept, holds in levels if _true(holds)), [])
        sizes = [(extents[t.instruction].value, math.prod(t.inner)) for t in chosen]
        if not any(size % tile for size, tile in sizes) or any(-(-size // tile) * tile > MAX_STATIC_PADDING * size for size, tile in sizes):
            return None  # nothing to pad (where the tiles divide, TVM's own refit stays, §8), or too much
        return _padded(normalized, trace, chosen).mod
    plain = _root_children(tvm.s_tir.Schedule(normalized), sketch(trace))  # once for every level
    symbolic = {t.instruction for t in tilings if not isinstance(extents[t.instruction], tirx.IntImm)}

    def unroll(kept: list[_Tiling]) -> int | None:
        return MAX_SYMBOLIC_UNROLL if sum(t.instruction in symbolic for t in kept) > 1 else None

    return _dispatched([(holds, _padded(normalized, trace, kept, plain, unroll(kept)).mod) for kept, holds in levels], rederived.mod)


def _dispatched(branches: list[tuple[Any, tvm.IRModule]], otherwise: tvm.IRModule) -> tvm.IRModule:
    """One kernel that runs the first of ``branches`` (condition, scheduled kernel) whose condition holds, else ``otherwise``."""
    roots = [mod["main"].body.block for _, mod in branches] + [otherwise["main"].body.block]
    body: Any = _block(roots[-1].body, "rederived")
    for level in reversed(range(len(branches))):
        body = tirx.IfThenElse(branches[level][0], _block(roots[level].body, f"padded{level}"), body)
    allocated: list[Any] = []  # once, for every branch: the buffers padding left alone are the same in each
    for buffer in (b for root in roots for b in root.alloc_buffers):
        if not any(buffer.same_as(b) for b in allocated):
            allocated.append(buffer)
    out = otherwise.clone()
    out.update_func(out.get_global_var("main"), otherwise["main"].with_body(_block(body, "root", allocated)))
    return s_tir.transform.ConvertSSA()(out)  # the loops padding left alone are the same variables in each branch


def _levels(tilings: list[_Tiling]) -> list[list[tuple[_Tiling, Callable[[Any], Any]]]]:
    """The padded schedules, tried in order, each as its tilings and when each lets it run (a condition on the loop's
    extent ``n``): the recorded inner tiles ``[t1, *rest]`` where ``n`` fills them and padding to them costs no more
    rows than padding to ``rest``; then ``[1, *rest]`` where ``n`` fills half of ``rest``. A tiling with nothing to
    trim (``t1`` or ``rest`` is 1) keeps its tiles where ``n`` fills half of them. Else TVM's re-derivation: padding
    at most doubles the work. Per kernel on the BERT layer's projections (records at sequence 128, kernels at 4 to
    64 rows, 14 cases) this chose the fastest of the three schedules every time; the full tiles alone where they
    fit once picked 2 slower ones, by 3-15%, and the register tile alone (2 rows) ran about as slow as the
    re-derivation."""
    full: list[tuple[_Tiling, Callable[[Any], Any]]] = []
    trimmed: list[tuple[_Tiling, Callable[[Any], Any]]] = []
    for t in tilings:
        whole, rest = math.prod(t.inner), math.prod(t.inner[1:])
        if t.inner[0] > 1 and rest > 1:
            full.append((t, lambda n, whole=whole, rest=rest: tirx.all(n >= whole, _ceil(n, whole) == _ceil(n, rest))))
            trimmed.append((dataclasses.replace(t, inner=[1, *t.inner[1:]]), lambda n, rest=rest: 2 * n >= rest))
        else:
            full.append((t, lambda n, whole=whole: 2 * n >= whole))
    return [full, trimmed] if trimmed else [full]


def _ceil(n: Any, tile: int) -> Any:
    """``n`` rounded up to a multiple of ``tile``."""
    return tirx.floordiv(n + (tile - 1), tile) * tile


def _true(condition: Any) -> bool:
    """Whether a condition on static extents holds (TVM's operators fold it to a constant)."""
    return isinstance(condition, tirx.IntImm) and bool(condition.value)


def _block(body: Any, name: str, alloc_buffers: list[Any] | None = None) -> s_tir.SBlockRealize:
    """``body`` in a block without iterators (TVM's passes expect a kernel's body to be one)."""
    return s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], name, body, alloc_buffers=alloc_buffers or []))


def _rederived_tilings(trace: list[Any], replayed: tvm.s_tir.Schedule) -> list[_Tiling]:
    """The recorded tilings (a block's own loop, inner tiles worth padding to) that TVM re-derived: for a symbolic
    extent, or a static one the recorded tiles no longer divide."""
    insts, decisions = trace
    recorded = [i for i, inst in enumerate(insts) if inst[0] == "SamplePerfectTile"]
    sampled = [inst for inst in replayed.trace.insts if inst.kind.name == "SamplePerfectTile"]
    if len(recorded) != len(sampled):
        return []
    loops = _block_loops(insts)
    decided = {d[0]: d[1] for d in decisions if isinstance(d, list) and len(d) == 2}
    out = []
    for index, inst in zip(recorded, sampled):
        values = [replayed.get(rv) if rv is not None else None for rv in inst.outputs]
        tiles = decided.get(index)
        where = loops.get(insts[index][1][0]) if insts[index][1] else None
        if where is None or not _tile_list(tiles) or values[1:] == tiles[1:]:  # the inner tiles replayed as recorded
            continue
        inner = tiles[1:]
        if 1 < math.prod(inner) <= MAX_TILE:
            out.append(_Tiling(index, where[0], where[1], inner))
    return out


def _block_loops(insts: list[Any]) -> dict[str, tuple[str, int]]:
    """Each loop variable the first ``GetLoops`` of a block (``GetSBlock`` by name) binds, before anything split
    or moved its loops: (block name, loop position)."""
    blocks = {inst[3][0]: inst[2][0] for inst in insts if inst[0] == "GetSBlock" and inst[3] and inst[2]}
    out: dict[str, tuple[str, int]] = {}
    seen: set[str] = set()
    for inst in insts:
        if inst[0] == "GetLoops" and inst[1] and inst[1][0] in blocks and blocks[inst[1][0]] not in seen:
            seen.add(blocks[inst[1][0]])
            out.update({rv: (blocks[inst[1][0]], pos) for pos, rv in enumerate(inst[3])})
    return out


def _tile_list(tiles: Any) -> bool:
    return isinstance(tiles, list) and len(tiles) >= 2 and all(type(t) is int and t > 0 for t in tiles)


def _spatial(sch: tvm.s_tir.Schedule, tiling: _Tiling) -> bool:
    """Whether the tiling's loop is a spatial one of a block of the kernel (rows past ``n`` may be computed and
    dropped; a reduction's may not), the loop over its iterator (a block the trace made has none to pad)."""
    try:
        rv = sch.get_sblock(tiling.block)
    except TVM_ERRORS:
        return False
    block, loops = sch.get(rv), sch.get_loops(rv)
    if tiling.loop >= min(len(block.iter_vars), len(loops)):
        return False
    iterator = block.iter_vars[tiling.loop]
    return iterator.iter_type == tirx.IterVar.DataPar and tvm_ffi.structural_equal(sch.get(loops[tiling.loop]).extent, iterator.dom.extent)


def _extent(sch: tvm.s_tir.Schedule, tiling: _Tiling) -> Any:
    return sch.get(sch.get_sblock(tiling.block)).iter_vars[tiling.loop].dom.extent


def _padded(normalized: tvm.IRModule, trace: list[Any], tilings: list[_Tiling], plain: list[str] | None = None,
            unroll: int | None = None) -> tvm.s_tir.Schedule:  # fmt: skip
    """``normalized`` with each tiling's block padded, ``trace`` replayed with the recorded inner tiles, and the
    padding copies the trace does not know of made parallel loops. ``plain``: the root's children after the trace's
    sketch on ``normalized`` unpadded (:func:`_root_children`; replayed here when not given). ``unroll``: the most
    steps the trace's ``pragma_auto_unroll_max_step`` keeps (None: as recorded)."""
    sch = tvm.s_tir.Schedule(normalized)
    for block, pads in _pads_by_block(tilings).items():
        rv = sch.get_sblock(block)
        sch.pad_einsum(rv, [pads.get(pos, 1) for pos in range(len(sch.get_loops(rv)))])
        for consumer in sch.get_consumers(rv):  # the copy out of the padded buffer: read from it directly where it can be
            if sch.get(consumer).name_hint.endswith("_pad"):
                try:
                    sch.compute_inline(consumer)
                except tvm.s_tir.ScheduleError:  # it writes the kernel's output: it stays a copy
                    pass
    insts, decisions = copy.deepcopy(trace)
    for tiling in tilings:
        outputs = insts[tiling.instruction][3]
        for inst in insts:
            if inst[0] == "Split" and inst[1][1:] == outputs:
                inst[1] = [inst[1][0], None, *tiling.inner]
    for inst in insts if unroll is not None else []:
        if inst[0] == "Annotate" and inst[2] == ["pragma_auto_unroll_max_step"] and type(inst[1][1]) is int:
            inst[1][1] = min(inst[1][1], unroll)
    added = _added_children(sch, insts, decisions, plain if plain is not None else _root_children(tvm.s_tir.Schedule(normalized), sketch(trace)))
    tvm.s_tir.schedule.Trace.apply_json_to_schedule([insts, decisions], sch)
    for name in added:
        _parallel_copy(sch, name)
    return sch


def _pads_by_block(tilings: list[_Tiling]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for t in tilings:
        out.setdefault(t.block, {})[t.loop] = math.prod(t.inner)
    return out


def _added_children(sch: tvm.s_tir.Schedule, insts: list[Any], decisions: list[Any], plain: list[str]) -> list[str]:
    """The blocks padding added beside the root's children (``plain`` before it) as the trace's postprocessing lists
    them (``GetChildBlocks`` of the root): each such instruction is given a variable for them, in their places.
    Raises ValueError where the children differ otherwise (the padded replay would bind the wrong blocks)."""
    cut = postprocessing_starts(insts)
    padded = _root_children(sch.copy(), sketch([insts, decisions]))
    if [name for name in padded if name in plain] != plain:
        raise ValueError(f"padding changed the kernel's blocks: {plain} became {padded}")
    added = [name for name in padded if name not in plain]
    roots = {inst[3][0] for inst in insts if inst[0] == "GetSBlock" and inst[2] and inst[2][0] == "root"}
    for at, inst in enumerate(insts[cut:], cut):
        if inst[0] == "GetChildBlocks" and inst[1] and inst[1][0] in roots:
            if len(inst[3]) != len(plain):
                raise ValueError(f"the trace's postprocessing lists {len(inst[3])} blocks where the kernel has {len(plain)}")
            named = iter(inst[3])
            inst[3] = [f"b_padding{at}_{i}" if name in added else next(named) for i, name in enumerate(padded)]
    return added


def _root_children(sch: tvm.s_tir.Schedule, sketched: list[Any]) -> list[str]:
    """The names of the root's children once ``sketched`` (a trace's sketch) is applied to ``sch``."""
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(sketched, sch)
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _parallel_copy(sch: tvm.s_tir.Schedule, name: str) -> None:
    """A padding copy as a parallel loop over all but its innermost dimension, that one vectorized where it divides."""
    loops = sch.get_loops(sch.get_sblock(name))
    outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(outer)
    inner = sch.get(loops[-1]).extent
    if len(loops) > 1 and isinstance(inner, tirx.IntImm) and inner.value % VECTOR == 0:
        sch.vectorize(sch.split(loops[-1], [None, VECTOR])[1])
