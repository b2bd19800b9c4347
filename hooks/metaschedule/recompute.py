"""A transfer that recomputes a reduction for every element of its consumer: its compute locations moved out.

MetaSchedule samples where each producer block is computed (``SampleComputeLocation``: under a loop of its
consumer, at the root, or inlined). Under the consumer's inner loops, the producer is computed again for every
iteration of them; where it is a reduction over the same dimension, the kernel's work grows by a factor of that
dimension's size. A record tuned for the BERT layer's softmax at sequence 32 computed each row's maximum inside the
loop over the row's elements (32 times too often there, and still the fastest of its trials); replayed at sequence
100 it ran 4.1-4.3 ms where the unscheduled kernel ran 0.44 ms, and with the row maximum moved out one loop
0.26-0.38 ms.

So a transfer's kernel is weighed by its stores (each store statement times the iterations around it, a symbolic
size counted as :data:`SYMBOLIC_SIZE`) against the unscheduled kernel's. Past :data:`MAX_RECOMPUTE` times as many,
each compute location of the trace, in order, is moved outward one loop at a time (the sketch replayed with that
decision, the target's postprocessors applied again) and kept where it stores least, the innermost such location
(the record's own choice where nothing stores less). A record of the kernel's own workload (an exact hit, or one of
another compiler build or CPU) keeps its schedule: it was measured there.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import tvm
from tvm import s_tir, tirx

from .guard import ScheduleLimits, nested_statements
from .msdb import postprocessors, sketch, sketch_replayed, tensorizes

RELOCATED = "compute locations moved where a transfer recomputes"  # in the kernel cache's key of every schedule, with whether they were
MAX_RECOMPUTE = 2.0  # stores over the unscheduled kernel's past which the compute locations are moved (the BERT layer's
#                      transferred matmuls store 1.00x, its layer norm 1.28x, the softmax above 27x)
SYMBOLIC_SIZE = 128  # what a symbolic extent counts as
MAX_VARIANTS = 32  # sketches replayed for one kernel
GAIN = 0.9  # a location is moved where that leaves at most this share of the stores

_ARITHMETIC: dict[type, Callable[[int, int], int]] = {
    tirx.Add: operator.add, tirx.Sub: operator.sub, tirx.Mul: operator.mul, tirx.FloorDiv: operator.floordiv,
    tirx.FloorMod: operator.mod, tirx.Min: min, tirx.Max: max,
}  # fmt: skip


def relocated(normalized: tvm.IRModule, trace: list[Any], replayed: tvm.s_tir.Schedule, target: tvm.target.Target,
              limits: ScheduleLimits) -> tvm.s_tir.Schedule | None:  # fmt: skip
    """``normalized`` scheduled by ``trace`` (a trace's JSON, ``replayed`` on it) with its compute locations moved
    outward where the replayed kernel stores over :data:`MAX_RECOMPUTE` times what the unscheduled one does, or None
    (it does not, or no move stores less). Every schedule it returns passes ``limits``."""
    own, served = stores(normalized["main"]), stores(replayed.mod["main"])
    if own is None or served is None or served <= MAX_RECOMPUTE * max(own, 1):
        return None
    sketched = sketch(trace)
    if tensorizes(sketched):  # its postprocessing needs intrinsics this does not load
        return None
    decided = {d[0]: d[1] for d in sketched[1]}
    locations = [i for i, inst in enumerate(sketched[0]) if inst[0] == "SampleComputeLocation" and type(decided.get(i)) is int and decided[i] >= 0]
    postprocs = postprocessors(target)
    best: tuple[int, tvm.s_tir.Schedule | None] = (served, None)
    moved: dict[int, int] = {}
    variants = 0
    for index in locations:
        for location in range(decided[index] - 1, -2, -1):  # outward: the consumer's outer loops, then the root
            if variants == MAX_VARIANTS:
                return best[1]
            variants += 1
            sch = sketch_replayed(normalized, sketched, {**moved, index: location}, postprocs, limits)
            count = stores(sch.mod["main"]) if sch is not None else None
            if count is not None and count <= GAIN * best[0]:
                best, moved[index] = (count, sch), location
    return best[1]


def stores(func: tirx.PrimFunc) -> int | None:
    """How many stores ``func`` makes: each store statement times the iterations of the loops around it (a symbolic
    extent counted as :data:`SYMBOLIC_SIZE`; a reduction block's init not counted), or None where an extent is not
    arithmetic this can follow."""
    total = 0
    stack: list[tuple[Any, int]] = [(func.body, 1)]
    while stack:
        node, iterations = stack.pop()
        if node is None:
            continue
        if isinstance(node, tirx.For):
            extent = _value(node.extent)
            if extent is None:
                return None
            stack.append((node.body, iterations * max(extent, 0)))
            continue
        if isinstance(node, s_tir.SBlock):  # its init runs once per output, not once per iteration: not counted
            stack.append((node.body, iterations))
            continue
        inside = nested_statements(node)
        if inside is not None:
            stack.extend((s, iterations) for s in inside)
        elif isinstance(node, tirx.BufferStore):
            total += iterations
    return total


def _value(expr: Any) -> int | None:
    """An extent's value, every variable in it taken as :data:`SYMBOLIC_SIZE` (None: an expression this does not follow)."""
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        return SYMBOLIC_SIZE
    if isinstance(expr, tirx.Cast):
        return _value(expr.value)
    apply = _ARITHMETIC.get(type(expr))
    if apply is None:
        return None
    a, b = _value(expr.a), _value(expr.b)
    if a is None or b is None or (b == 0 and isinstance(expr, (tirx.FloorDiv, tirx.FloorMod))):
        return None
    return apply(a, b)
