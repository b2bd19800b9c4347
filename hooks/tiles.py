"""Tile sizes for a loop the recorded trace never saw: the one rule the hook adds to TVM's replay.

Replayed on a kernel of other extents, a trace keeps every ``SamplePerfectTile`` decision that still
multiplies out, and TVM re-derives the others: the remaining extent goes into the first factor that no
longer divides it. That keeps what the tuner chose in most cases (a full-width tile stays full
width; refitting to the "nearest" tiling instead lost on 14 of 20 ResNet-18 kernels, see
docs/ARCHITECTURE.md §8).

It goes wrong where the tuned loop had extent 1 (a batch-1 workload's batch rows): the recorded
decision is all ones, it says nothing about the loop, and TVM puts the whole new extent in the outermost
factor, where no tile reuses it. On CPU multi-level tiling (MetaSchedule's ``SSRSRS``: spatial tiles
``[outer, outer, cache, register]``), :func:`untuned_loops` gives it the cache tile instead: a batch-1
MLP's matmuls replayed at batch 16 and 64 ran 1.16–1.8× faster, a ResNet convolution at batch 2 7%.
"""

from __future__ import annotations

from typing import Any

TILE = "SamplePerfectTile"
CPU_TILING = '"SSRSRS"'  # the tiling_structure annotation MetaSchedule's CPU multi-level tiling writes
CPU_SPATIAL_LEVELS = 4
CACHE_LEVEL = 2


def untuned_loops(recorded: list[Any], replayed: list[Any]) -> list[Any] | None:
    """``recorded`` (a trace's JSON: ``[instructions, decisions]``) with each spatial tile of CPU multi-level
    tiling that was all ones when tuned and spans more than one iteration now (``replayed``: the trace TVM
    replayed, its decisions re-derived) moved from the outermost factor to the cache tile; None when the
    trace has none."""
    if len(recorded) < 2 or len(replayed) < 2 or not _cpu_tiled(recorded[0]):
        return None
    insts, now = recorded[0], {_int(i): d for i, d in replayed[1]}
    decisions, changed = [], False
    for index, decision in recorded[1]:
        new = now.get(_int(index))
        if _is_tile(insts, index) and _ones(decision, CPU_SPATIAL_LEVELS) and _untuned_extent(new):
            decision, changed = [1] * CACHE_LEVEL + [new[0]] + [1] * (CPU_SPATIAL_LEVELS - CACHE_LEVEL - 1), True
        decisions.append([index, decision])
    return [insts, decisions] if changed else None


def has_untuned_loops(recorded: list[Any]) -> bool:
    """Whether :func:`untuned_loops` may change ``recorded`` on some kernel (cheap: no replay needed)."""
    return (len(recorded) > 1 and isinstance(recorded[1], list) and _cpu_tiled(recorded[0])
            and any(isinstance(d, list) and len(d) == 2 and _is_tile(recorded[0], d[0]) and _ones(d[1], CPU_SPATIAL_LEVELS) for d in recorded[1]))  # fmt: skip


def _cpu_tiled(insts: Any) -> bool:
    return isinstance(insts, list) and any(
        isinstance(inst, list) and len(inst) > 2 and inst[0] == "Annotate" and CPU_TILING in (inst[1] or [])
        and inst[2] == ["meta_schedule.tiling_structure"]
        for inst in insts
    )  # fmt: skip


def _is_tile(insts: list[Any], index: Any) -> bool:
    i = _int(index)
    return 0 <= i < len(insts) and isinstance(insts[i], list) and bool(insts[i]) and insts[i][0] == TILE


def _ones(decision: Any, levels: int) -> bool:
    return isinstance(decision, list) and len(decision) == levels and all(type(x) is int and x == 1 for x in decision)


def _untuned_extent(new: Any) -> bool:
    """TVM's re-derivation of an all-ones decision for a loop that grew: the new extent outermost, ones inside."""
    return isinstance(new, list) and len(new) == CPU_SPATIAL_LEVELS and type(new[0]) is int and new[0] > 1 and _ones([1, *new[1:]], CPU_SPATIAL_LEVELS)


def _int(value: Any) -> int:
    return value if type(value) is int else -1
