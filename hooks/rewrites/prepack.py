"""Weights prepacked at compile time.

A kernel scheduled with ``prepack=True`` (:mod:`.rewrites`) reads its weights in the layout its schedule chose.
After the schedules are applied, Relax's ``SplitLayoutRewritePreproc`` splits each such kernel in two: the layout
rewrite of its weights (``<kernel>_weight_prepack``) and the kernel on rewritten weights (``<kernel>_prepacked``).
Where the weights are constants, the rewrite is done now and its outputs become the model's constants.

``FoldConstant`` would do that by building every rewrite with LLVM and calling it, 1.5 s of ResNet-18's compile, and
the model's build would then compile every prepacked kernel again, 2.8 s more, where the same kernels unpacked link
their machine code from the object cache (:mod:`.objects`) in 0.25 s all told. So here:

- a rewrite that tiles its weights (each dimension split, the tiles reordered: what ``RewriteLayout`` writes) is done in
  numpy, a reshape and a transpose (:mod:`.tiling`), on every compile: ResNet-18@224's 44 MB in about 30 ms;
- any other rewrite's outputs are kept in the kernel cache (kind ``prepacked``, a ``.npy`` file per output with the
  SHA-256 of its bytes beside it, read without pickle and only where the bytes match), named by the scheduled kernel (its object id: key, trace, bounds) and the SHA-256 of every input's dtype,
  shape and bytes; a later compile maps them into memory and copies them once, into the constants, instead of building
  the rewrite. An entry that does not read whole, or not as arrays of the call's shapes and dtypes, is computed again;
- each prepacked kernel takes an object id of its own (its scheduled kernel's, split), so the object cache compiles
  its machine code once (starting as soon as the kernel is split, while the weights are rewritten) and links it into
  later builds like any scheduled kernel's; so does a rewrite left in the model (weights that are parameters). A
  kernel whose schedule laid no weights out is not split, and takes its scheduled kernel's object id back.

Weights that are parameters, not constants, are rewritten where the model runs, as ``SplitLayoutRewritePreproc``
leaves them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx

from ..kernels.cache import KernelCache, atomic_file, digest_path, keep_digest, mark_used, read_if_intact
from .constants import host_constant, host_view
from ..build.objects import OBJECT_ID, object_id_of
from ..kernels.relax_mutation import mutate_relax_functions
from .tiling import Tiling, tilings

#: The attribute a scheduled kernel that rewrites its weights' layout carries in place of ``OBJECT_ID``: its machine
#: code is that of the kernel split out of it, named from it (:func:`split_object_id`).
PACKED_OBJECT_ID = "schedhub.packed_object_id"
IS_SCHEDULED = "tirx.is_scheduled"  # what MetaScheduleApplyDatabase marks, and DLight skips
PREPACKED, WEIGHT_PREPACK = "_prepacked", "_weight_prepack"
KIND = "prepacked"
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def split_object_id(packed_object_id: str, part: str) -> str:
    """The object id of one part (``PREPACKED`` or ``WEIGHT_PREPACK``) split out of a scheduled kernel."""
    return f"{packed_object_id}{part}"


def split_packed_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """Each scheduled kernel that rewrites its weights' layout split in two, the rewrite and the kernel on rewritten
    weights, each part given an object id of its own where its kernel had one (its kernel's, split: the prepacked
    kernel marked scheduled); a kernel whose schedule laid no weights out is not split, and takes its own id back."""
    packed_ids = {gv.name_hint: str(func.attrs[PACKED_OBJECT_ID]) for gv, func in mod.functions_items()
                  if isinstance(func, tirx.PrimFunc) and func.attrs is not None and PACKED_OBJECT_ID in func.attrs}  # fmt: skip
    split = relax.transform.SplitLayoutRewritePreproc()(mod)
    out = split.clone()
    for gv, func in split.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        name, attrs = gv.name_hint, dict(func.attrs or {})  # the split copies its kernel's attributes to both parts
        func = func.without_attr(PACKED_OBJECT_ID) if PACKED_OBJECT_ID in attrs else func
        part = next((p for p in (PREPACKED, WEIGHT_PREPACK) if name.endswith(p)), None)
        if name in packed_ids:  # its schedule laid no weights out: not split, linked as it is
            func = func.with_attr(OBJECT_ID, packed_ids[name])
        elif part is not None:
            func = func if part == WEIGHT_PREPACK or attrs.get(IS_SCHEDULED) else func.with_attr(IS_SCHEDULED, True)
            if (packed_id := packed_ids.get(name[: -len(part)])) is not None:
                func = func.with_attr(OBJECT_ID, split_object_id(packed_id, part))
        out.update_func(gv, func)
    return out


def fold_constant_rewrites(mod: tvm.IRModule, cache: KernelCache) -> tvm.IRModule:
    """``mod`` (:func:`split_packed_kernels`) with the rewrite of its constant weights done now, read from ``cache``
    where this machine did it before; the rewrites done are left out of the module."""
    rewrites = _ConstantRewrites(mod, cache)
    folded = rewrites.run()
    if rewrites.missed:  # rewrites this machine never did: built in one module, called, kept, then folded in
        folded = _ConstantRewrites(folded, cache, done=rewrites.do_missed()).run()
    return tvm.transform.Sequential([relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()])(folded)


def is_weight_rewrite(name: str) -> bool:
    """Whether a PrimFunc of that name is a weights' rewrite :func:`split_packed_kernels` split out."""
    return name.endswith(WEIGHT_PREPACK)


Shapes = list[tuple[tuple[int, ...], str]]


@dataclass
class _Missed:
    """A rewrite's call on constants that the kernel cache did not hold: its rewrite, inputs, outputs' shapes, entry."""

    func: str
    inputs: list[np.ndarray]
    shapes: Shapes
    entry: Path | None


@relax.expr_functor.mutator
class _ConstantRewrites(relax.PyExprMutator):
    """Every call of a weights' rewrite on constants replaced by its outputs (a constant, or a tuple of them): computed in
    numpy where the rewrite is a tiling, else as the kernel cache holds them or ``done`` has them (by
    :func:`inputs_digest`); the rest are left, and noted in ``missed``."""

    def __init__(self, mod: tvm.IRModule, cache: KernelCache, done: dict[str, list[np.ndarray]] | None = None) -> None:
        super().__init__(mod)
        self.mod, self.cache, self.done = mod, cache, done or {}
        self.missed: dict[str, _Missed] = {}
        self.tilings: dict[str, list[Tiling] | None] = {}

    def run(self) -> tvm.IRModule:
        return mutate_relax_functions(self, self.mod)

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        if not (call.op.same_as(_CALL_TIR) and is_weight_rewrite(call.args[0].name_hint)):
            return call
        inputs = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
        if not all(isinstance(arg, tvm.ir.expr.Constant) for arg in inputs):
            return call  # parameters: rewritten where the model runs
        many = isinstance(call.ty, relax.TupleType)
        shapes = [(tuple(int(d) for d in t.shape.values), str(t.dtype)) for t in (call.ty.fields if many else [call.ty])]
        arrays = [host_view(arg.value) for arg in inputs]
        results = self._tiled(call.args[0], arrays, shapes) or self._kept(call.args[0], arrays, shapes)
        if results is None:
            return call
        consts = [host_constant(a) for a in results]
        return relax.Tuple(consts) if many else consts[0]

    def _tiled(self, rewrite: tvm.ir.GlobalVar, arrays: list[np.ndarray], shapes: Shapes) -> list[np.ndarray] | None:
        """The outputs of ``rewrite`` on ``arrays`` computed in numpy, where it is a tiling (:mod:`.tiling`)."""
        if rewrite.name_hint not in self.tilings:
            self.tilings[rewrite.name_hint] = tilings(self.mod[rewrite], len(arrays))
        found = self.tilings[rewrite.name_hint]
        if found is None or [(t.shape, str(arrays[t.source].dtype)) for t in found] != shapes:
            return None
        return [t.apply(arrays) for t in found]

    def _kept(self, rewrite: tvm.ir.GlobalVar, arrays: list[np.ndarray], shapes: Shapes) -> list[np.ndarray] | None:
        """The outputs of ``rewrite`` on ``arrays`` as the kernel cache keeps them or ``done`` has them; else None, the
        call noted in ``missed``."""
        name = rewrite.name_hint
        owner = object_id_of(self.mod[rewrite])  # None: no scheduled kernel names it, so no entry either
        digest = inputs_digest(owner or name, arrays)
        entry = None if owner is None or self.cache.root is None else self.cache.root / KIND / KernelCache.name(KIND, digest)
        results = self.done.get(digest) or (read_arrays(entry, shapes) if entry is not None else None)
        if results is None:
            self.missed[digest] = _Missed(name, arrays, shapes, entry)
        return results

    def do_missed(self) -> dict[str, list[np.ndarray]]:
        """The outputs of every missed call (by digest), each kept where the cache keeps them: the rewrites built for this
        CPU in one module (one LLVM run, where ``FoldConstant`` built each alone) and called on their inputs."""
        funcs = {m.func: self.mod[m.func].with_attr("global_symbol", m.func) for m in self.missed.values()}
        lib: Any = tvm.tirx.build(tvm.IRModule(funcs), target=tvm.target.Target("llvm"))
        dev, done = tvm.cpu(0), {}
        for digest, m in self.missed.items():
            outs = [tvm.runtime.empty(shape, dtype, dev) for shape, dtype in m.shapes]
            lib[m.func](*[tvm.runtime.tensor(a, dev) for a in m.inputs], *outs)
            done[digest] = [o.numpy() for o in outs]
            if m.entry is not None:
                write_arrays(self.cache, m.entry, done[digest])
        return done


def inputs_digest(object_id: str, inputs: list[np.ndarray]) -> str:
    """The SHA-256 naming the rewrite ``object_id`` names called on ``inputs`` (their dtypes, shapes and bytes)."""
    digest = hashlib.sha256(object_id.encode())
    for a in inputs:
        digest.update(f"\0{a.dtype.str}{a.shape}".encode())
        digest.update(np.ascontiguousarray(a).data)
    return digest.hexdigest()


def output_path(entry: Path, index: int) -> Path:
    """The file of an entry's ``index``-th array."""
    return entry.with_name(f"{entry.name}.{index}.npy")


def read_arrays(entry: Path, shapes: Shapes) -> list[np.ndarray] | None:
    """The arrays kept under ``entry`` when they are exactly of ``shapes`` (shape, dtype), else None; mapped from their
    files, not read (the caller copies each once, where it keeps it)."""
    paths = [output_path(entry, i) for i in range(len(shapes))]
    try:
        if any(read_if_intact(path) is None for path in paths):  # overwritten or cut short since it was kept: computed again
            return None
        arrays = [np.load(path, mmap_mode="r", allow_pickle=False) for path in paths]
    except (OSError, ValueError, EOFError):  # missing, cut short, not an .npy of plain values
        return None
    if any(a.shape != shape or str(a.dtype) != dtype for a, (shape, dtype) in zip(arrays, shapes, strict=True)):
        return None
    for path in paths:
        mark_used(path)
        mark_used(digest_path(path))  # pruned apart, the outputs would be computed again
    return arrays


def write_arrays(cache: KernelCache, entry: Path, arrays: list[np.ndarray]) -> None:
    """Keep ``arrays`` under ``entry``, each file whole or not at all; a full or read-only disk only loses them."""
    try:
        for index, values in enumerate(arrays):
            with atomic_file(output_path(entry, index)) as tmp, open(tmp, "wb") as f:
                np.save(f, values, allow_pickle=False)
            keep_digest(output_path(entry, index))
        cache.writes += 1
    except OSError as exc:
        cache.unwritable.note(exc)
