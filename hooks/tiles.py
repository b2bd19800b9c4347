"""Refitting a trace's tile sizes to a kernel of other extents (the heart of a transfer).

A trace tuned for one shape replayed on another keeps every ``SamplePerfectTile`` decision that
still multiplies out; where one does not, TVM re-derives it by putting the whole remaining extent
in the first factor that no longer divides it and 1 everywhere outside (``[1, 7, 8, 8]`` tuned at 448
becomes ``[1, 1, 84, 8]`` at 672): a register tile of 84 rows where the tuner chose 8×8.

:func:`fitted` re-derives such decisions instead to the factorization of the new extent whose
*inner tile sizes* (the products of the innermost factors: the vector width, the register tile, the
cache tile) are nearest to the tuned ones, so that each tile keeps the size the tuner found for the
memory level it was chosen for and the extent's growth goes to the outer loops (``[2, 6, 7, 8]``
above). It needs only the new extents, which a first replay reveals (TVM's decisions multiply out to
the loop's extent), so the fit is: replay, refit the decisions that changed, replay again.
"""

from __future__ import annotations

import functools
import math
from typing import Any

TILE = "SamplePerfectTile"
MAX_EXTENT = 1 << 32  # loop extents beyond this are not worth factorizing
MAX_PASSES = 3  # a refit can change a later loop's extent (a tile of a tile); after this, keep what TVM derived


def fitted(recorded: list[Any], replayed: list[Any]) -> list[Any] | None:
    """``recorded`` (a trace's JSON: ``[instructions, decisions]``) with the tile decisions that TVM had
    to re-derive on replay (``replayed``, the replayed trace's JSON) refitted by :func:`nearest_tiles`;
    None when there is nothing to refit (every tuned decision still fits)."""
    if len(recorded) < 2 or len(replayed) < 2:
        return None
    insts = recorded[0]
    now = {int(i): d for i, d in replayed[1]}
    decisions = []
    changed = False
    for index, decision in recorded[1]:
        index = int(index)
        new = now.get(index)
        if _is_tile(insts, index) and _ints(decision) and _ints(new) and list(new) != list(decision) and len(new) == len(decision):
            extent = math.prod(new)
            refit = nearest_tiles(extent, [int(x) for x in decision], _max_innermost(insts[index]))
            if refit is not None and refit != [int(x) for x in decision]:
                decision, changed = refit, True
        decisions.append([index, decision])
    return [insts, decisions] if changed else None


def nearest_tiles(extent: int, tuned: list[int], max_innermost: int = 0) -> list[int] | None:
    """The factors of ``extent`` (as many as ``tuned``, outermost first) whose inner tile sizes are nearest to
    ``tuned``'s, in log distance summed over the inner levels; the innermost factor at most ``max_innermost``
    (when positive). None for an extent or a tiling this cannot factor (non-positive, too large)."""
    levels = len(tuned)
    if levels < 1 or not 0 < extent <= MAX_EXTENT or any(t < 1 for t in tuned):
        return None
    if levels == 1:
        return [extent]
    wanted = [math.log(p) for p in _suffix_products(tuned)[:-1]]  # inner tile sizes, innermost first
    divisors = _divisors(extent)
    # best[p]: (cost, factors innermost first) of the inner levels so far with tile size p (a divisor of extent)
    best: dict[int, tuple[float, list[int]]] = {1: (0.0, [])}
    for level in range(levels - 1):
        step: dict[int, tuple[float, list[int]]] = {}
        for inner, (cost, factors) in best.items():
            for size in divisors:
                if size % inner:
                    continue
                factor = size // inner
                if level == 0 and max_innermost > 0 and factor > max_innermost:
                    continue
                total = cost + abs(math.log(size) - wanted[level])
                if size not in step or total < step[size][0]:
                    step[size] = (total, [*factors, factor])
        best = step
    if not best:
        return None
    _, factors = min(best.values(), key=lambda entry: (entry[0], entry[1]))
    return [extent // math.prod(factors), *reversed(factors)]


def _suffix_products(tiles: list[int]) -> list[int]:
    """Products of the innermost 1, 2, … factors."""
    out, product = [], 1
    for factor in reversed(tiles):
        product *= factor
        out.append(product)
    return out


@functools.lru_cache(maxsize=256)
def _divisors(n: int) -> tuple[int, ...]:
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return (*small, *reversed(large))


def _is_tile(insts: list[Any], index: int) -> bool:
    return 0 <= index < len(insts) and isinstance(insts[index], list) and bool(insts[index]) and insts[index][0] == TILE


def _max_innermost(inst: list[Any]) -> int:
    """A ``SamplePerfectTile``'s ``max_innermost_factor`` attribute (its second), 0 when absent."""
    attrs = inst[2] if len(inst) > 2 and isinstance(inst[2], list) else []
    value = attrs[1] if len(attrs) > 1 else 0
    return value if type(value) is int else 0


def _ints(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(x) is int and x > 0 for x in value)
