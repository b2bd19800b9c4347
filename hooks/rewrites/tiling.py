"""A weights' layout rewrite done in numpy where it is a tiling: each output a reshape of one input, then a transpose.

MetaSchedule's ``RewriteLayout`` lays a kernel's weights out as its loops read them: each dimension split into tiles
and the tiles reordered (``w[o // 32, o % 32 // 8, kh, i // 4, kw, i % 4, o % 8] = W[o, kh, kw, i]``). Built with LLVM
and called, ResNet-18@224's 21 rewrites took 1.4 s of the compile that first met its weights (0.6 s building, 0.8 s
running the plain loops); a reshape and a transpose of the same arrays in numpy take about 30 ms, less than reading
them back from the kernel cache.

:func:`tilings` reads that form from a rewrite's PrimFunc, strictly: only loops over each input's whole shape, each
storing one output element from the input element at the loop position, each output index one of the input's
indices divided and taken modulo by constants that tile it (its outer tile may be cut short: padded with zeros), every
output element written at most once. Anything else (an index that sums tiles, a guard, another statement) answers
None, and the rewrite is built and called as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir, tirx


@dataclass(frozen=True)
class Tiling:
    """One output of a rewrite: input ``source`` padded with zeros to ``padded`` (each dimension to a whole number of
    its outer tiles), each dimension split into its tiles (``split``, outer tile first), the tiles in the output's order
    (``order``), then shaped as the output (``shape``)."""

    source: int
    padded: tuple[int, ...]
    split: tuple[int, ...]
    order: tuple[int, ...]
    shape: tuple[int, ...]

    def apply(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """The output, a view of the input where numpy can make one. Where the rewrite pads, TVM's leaves the padding as
        the output's memory was (the kernel never reads it into a result); here it is zero."""
        values = inputs[self.source]
        if values.shape != self.padded:
            values = np.pad(values, [(0, p - n) for p, n in zip(self.padded, values.shape, strict=True)])
        return values.reshape(self.split).transpose(self.order).reshape(self.shape)


#: A part of one input index: (which index, tile size below it, its extent), e.g. ``i % 32 // 8`` is (i, 8, 4).
Part = tuple[int, int, int]

#: The most dimensions a tiling may split its input into (numpy's arrays have at most 64).
MAX_SPLIT = 32


def tilings(func: tirx.PrimFunc, inputs: int) -> list[Tiling] | None:
    """Each output of ``func`` (its parameters after the first ``inputs``) as a :class:`Tiling` of an input, in order;
    None where ``func`` is not plainly a tiling of its inputs."""
    buffers = list(func.params)
    if not 0 < inputs < len(buffers) or not all(isinstance(b, tirx.Buffer) and _static(b) for b in buffers):
        return None
    realize = func.body
    if not (isinstance(realize, s_tir.SBlockRealize) and isinstance(realize.block, s_tir.SBlock) and _plain_block(realize.block)):
        return None
    stores = _stores(realize.block.body, [])
    if stores is None:
        return None
    found: dict[int, Tiling] = {}
    for store, loops in stores:
        out = next((i for i, b in enumerate(buffers[inputs:]) if b.same_as(store.buffer)), None)
        tiling = _tiling(store, loops, buffers[:inputs])
        if out is None or out in found or tiling is None:
            return None
        found[out] = tiling
    return [found[i] for i in range(len(buffers) - inputs)] if len(found) == len(buffers) - inputs else None


def _static(buffer: tirx.Buffer) -> bool:
    """A buffer of constant shape, compact (no strides of its own, no offset): as Relax passes a tensor."""
    offset = buffer.elem_offset
    return all(isinstance(d, tirx.IntImm) for d in buffer.shape) and not buffer.strides and isinstance(offset, tirx.IntImm) and int(offset) == 0


def _shape(buffer: tirx.Buffer) -> tuple[int, ...]:
    return tuple(int(d) for d in buffer.shape)


def _plain_block(block: s_tir.SBlock) -> bool:
    """A block with nothing but its body: no initialization, buffers of its own or matched."""
    return block.init is None and not block.alloc_buffers and not block.match_buffers


#: A block's iteration variables, each with its extent.
Iterators = list[tuple[tirx.Var, int]]


def _stores(stmt: tirx.Stmt, loops: Iterators) -> list[tuple[tirx.BufferStore, Iterators]] | None:
    """Each store under ``stmt`` with its block's iteration variables, each bound to its own enclosing loop from 0 over
    the variable's whole domain (``loops``: those enclosing ``stmt``); None where ``stmt`` holds anything else."""
    if isinstance(stmt, tirx.SeqStmt):
        found = []
        for each in stmt.seq:
            inner = _stores(each, loops)
            if inner is None:
                return None
            found.extend(inner)
        return found
    if isinstance(stmt, tirx.For):
        if not (isinstance(stmt.min, tirx.IntImm) and int(stmt.min) == 0 and isinstance(stmt.extent, tirx.IntImm)):
            return None
        return _stores(stmt.body, [*loops, (stmt.loop_var, int(stmt.extent))])
    if not (isinstance(stmt, s_tir.SBlockRealize) and isinstance(stmt.block, s_tir.SBlock) and _plain_block(stmt.block)):
        return None
    block, values = stmt.block, list(stmt.iter_values)
    if not (isinstance(stmt.predicate, tirx.IntImm) and int(stmt.predicate) == 1 and isinstance(block.body, tirx.BufferStore)):
        return None
    loop_of = [_find(value, [var for var, _ in loops]) for value in values]
    if None in loop_of or len(set(loop_of)) != len(values):
        return None
    iterators: Iterators = []
    for iv, loop in zip(block.iter_vars, loop_of, strict=True):
        dom, extent = iv.dom, loops[loop][1]  # type: ignore[index]
        if int(iv.iter_type) != tirx.IterVar.DataPar or not (isinstance(dom.min, tirx.IntImm) and int(dom.min) == 0):
            return None
        if not (isinstance(dom.extent, tirx.IntImm) and int(dom.extent) == extent):
            return None
        iterators.append((iv.var, extent))
    return [(block.body, iterators)]


def _find(expr: tirx.PrimExpr, variables: list[tirx.Var]) -> int | None:
    """Which of ``variables`` ``expr`` is (None: none of them)."""
    return next((i for i, var in enumerate(variables) if var.same_as(expr)), None)


def _tiling(store: tirx.BufferStore, iterators: Iterators, inputs: list[tirx.Buffer]) -> Tiling | None:
    """The store as a tiling of the input it loads from, element for element at the loop position over its whole shape."""
    load, variables = store.value, [var for var, _ in iterators]  # a buffer's load is a TensorLoad of it
    if not (isinstance(load, tvm.ir.TensorLoad) and isinstance(load.source, tirx.Buffer) and load.source.dtype == store.buffer.dtype):
        return None
    source = next((i for i, b in enumerate(inputs) if b.same_as(load.source)), None)
    extents, shape = _shape(load.source), _shape(store.buffer)
    if source is None or extents != tuple(extent for _, extent in iterators) or [_find(i, variables) for i in load.indices] != list(range(len(variables))):
        return None
    if len(store.indices) != len(shape):
        return None
    parts: list[Part] = []  # the output's dimensions of their own extent but those of extent 1 (always 0)
    for index, size in zip(store.indices, shape, strict=True):
        part = (0, 1, 1) if isinstance(index, tirx.IntImm) and int(index) == 0 else _part(index, variables, extents)
        if part is None or part[2] != size:
            return None
        if size > 1:
            parts.append(part)
    padded: list[int] = []
    split: list[int] = []
    position: dict[tuple[int, int], int] = {}  # (index, tile size below) → its dimension in ``split``
    for dim, extent in enumerate(extents):  # an index of extent 1 may take no part
        mine = sorted((p for p in parts if p[0] == dim), key=lambda p: -p[1])  # outer tile first
        below = 1
        for _, lower, size in reversed(mine):  # each tile starts where the one inside it ends
            if lower != below:
                return None
            below *= size
        if below != extent and not (mine and extent < below < extent + mine[0][1]):  # they cover it, the outer tile cut short at most
            return None
        padded.append(below)
        for _, lower, size in mine:
            position[(dim, lower)] = len(split)
            split.append(size)
    if len(split) > MAX_SPLIT:
        return None
    order = tuple(position[(dim, lower)] for dim, lower, _ in parts)
    return Tiling(source, tuple(padded), tuple(split), order, shape)


def _part(index: tirx.PrimExpr, variables: list[tirx.Var], extents: tuple[int, ...]) -> Part | None:
    """An output index as a part of one input index: the variable itself, or it divided or taken modulo by a
    constant that its part's extent is a multiple of; the whole index by any constant (its outer tile is then cut
    short: padded)."""
    if isinstance(index, tirx.Var):
        dim = _find(index, variables)
        return None if dim is None else (dim, 1, extents[dim])
    if not (isinstance(index, (tirx.FloorDiv, tirx.FloorMod)) and isinstance(index.b, tirx.IntImm)):
        return None
    inner, by = _part(index.a, variables, extents), int(index.b)
    if inner is None or by <= 0 or (inner[2] % by and inner[1:] != (1, extents[inner[0]])):  # only the whole index may be padded
        return None
    dim, lower, extent = inner
    if isinstance(index, tirx.FloorDiv):
        return dim, lower * by, -(-extent // by)
    return inner if by >= extent else (dim, lower, by)  # a modulo past the values: them as they are

