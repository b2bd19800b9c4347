"""Constants computed before legalization: every ``permute_dims`` or ``reshape`` of a constant, the elementwise
arithmetic of constants that folding BatchNorm into a convolution leaves, and each ``full`` or ``full_like`` of a
constant, done in numpy.

A network imported for inference holds its weights as constants, and its frontend and the hook's rewrites move some of
them: ``torch.export``'s importer reshapes each convolution's bias to ``(1, C, 1, 1)``, a linear layer's weight is
transposed, ``ConvertLayout`` transposes every convolution's weights to OHWI. ``FoldConstant`` folds those after
legalization by building and running a TIR kernel for each with LLVM, on every compile: 0.51 s of ResNet-18@224's
and 1.22 s of MobileNet-V2@224's (imported as the README imports them), 83 ms of ResNet-18's NHWC conversion.

:func:`fold_constant_moves` moves them in numpy (a copy of the same bytes in another order: the same values) and
``CanonicalizeBindings`` inlines the moved constants where they are used, so the fused module is the one the fold
gives (the same kernels, so the same keys; a kernel's name can differ in its number, e.g. ``fused_squeeze_transpose``
for ``…transpose1`` where an earlier transpose no longer exists). What these two leave is folded after legalization,
as before.

``FoldBatchnormToConv2D`` leaves each folded convolution's weights and bias as arithmetic on constants (``add`` of the
variance and ``epsilon``, ``sqrt``, ``divide``, ``multiply``, ``subtract``). Those are computed here too, in the
constants' dtype, each operation IEEE-rounded as LLVM rounds it (no operation is fused with another, as no folded
kernel fuses them): the same bytes. Done before the layout is converted, this also keeps ``ConvertLayout`` away from
an ``add`` of a tensor and a scalar literal (the ``epsilon``), on which TVM 0.27's layout inference reads a null
pointer and kills the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..kernels.relax_mutation import mutate_relax_functions

_PERMUTE_DIMS = tvm.ir.Op.get("relax.permute_dims")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
#: Elementwise operations computed in numpy where every operand is a constant: each one IEEE-rounded in numpy as in LLVM.
_ARITHMETIC: dict[tvm.ir.Op, Callable[..., np.ndarray]] = {
    tvm.ir.Op.get("relax.add"): np.add, tvm.ir.Op.get("relax.subtract"): np.subtract, tvm.ir.Op.get("relax.multiply"): np.multiply,
    tvm.ir.Op.get("relax.divide"): np.divide, tvm.ir.Op.get("relax.sqrt"): np.sqrt,
}  # fmt: skip
_FLOATS = ("float16", "float32", "float64")
_FULL, _FULL_LIKE = tvm.ir.Op.get("relax.full"), tvm.ir.Op.get("relax.full_like")


@mutator
class _ConstantMoves(PyExprMutator):  # type: ignore[misc]
    """Each ``permute_dims`` or ``reshape`` of a constant (or of a variable bound to one), and each elementwise operation
    of :data:`_ARITHMETIC` on constants (a float tensor's, or a scalar literal of its dtype), replaced by its result."""

    def visit_call_(self, call: relax.Call) -> Any:
        call = super().visit_call_(call)
        if isinstance(call, relax.Call) and call.op in _ARITHMETIC:
            return self._computed(call)
        if isinstance(call, relax.Call) and call.op in (_FULL, _FULL_LIKE):
            return self._filled(call)
        if not (isinstance(call, relax.Call) and call.op in (_PERMUTE_DIMS, _RESHAPE)):
            return call
        data = self._constant(call.args[0])
        if data is None:
            return call
        if call.op == _PERMUTE_DIMS:
            axes = call.attrs.axes
            moved = np.transpose(data, None if axes is None else [int(a) for a in axes])
        else:
            shape = call.args[1]
            if not (isinstance(shape, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm) for d in shape.values)):
                return call  # a shape known only at run time
            moved = np.reshape(data, [int(d) for d in shape.values])
        return host_constant(moved)

    def _computed(self, call: relax.Call) -> relax.Expr:
        """``call``'s result where its operands are constant float tensors of one dtype (a scalar literal taken in that
        dtype); else ``call`` as it is. Relax broadcasts as numpy does, and a float operation keeps its dtype."""
        tensors = [self._constant(arg) for arg in call.args]
        dtypes = {str(t.dtype) for t in tensors if t is not None}
        if len(dtypes) != 1 or next(iter(dtypes)) not in _FLOATS:
            return call
        dtype = np.dtype(next(iter(dtypes)))
        operands = [t if t is not None else _scalar(arg, dtype) for t, arg in zip(tensors, call.args, strict=True)]
        if any(o is None for o in operands):
            return call
        result = np.asarray(_ARITHMETIC[call.op](*operands))
        return host_constant(result) if result.dtype == dtype else call

    def _filled(self, call: relax.Call) -> relax.Expr:
        """A ``full`` (or ``full_like``) of a static shape and a constant value as the constant it makes (the
        ``torch.export`` importer fills attention's masked scores with ``full_like``; ``schedhub tune``'s import folds it,
        and the kernel that reads it must have one key whichever way the model was imported); else ``call`` as it is."""
        fill = self._constant(call.args[1])
        if call.op == _FULL:
            shape, like_dtype = call.args[0], None
        else:
            info = call.args[0].ty  # its static type: shape and dtype
            shape, like_dtype = getattr(info, "shape", None), getattr(info, "dtype", None)
        if fill is None or fill.size != 1 or not (isinstance(shape, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm) for d in shape.values)):
            return call
        named = str(call.attrs.dtype) if call.attrs.dtype is not None else ""
        dtype = named if named not in ("", "void") else str(like_dtype or fill.dtype)
        return host_constant(np.full([int(d) for d in shape.values], fill.reshape(()), dtype=dtype))

    def _constant(self, expr: relax.Expr) -> np.ndarray | None:
        """The value of ``expr`` where it is a constant or a variable bound to one in this function, else None."""
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        value = constant_tensor(expr)
        return host_view(value) if value is not None else None


def _scalar(expr: relax.Expr, dtype: np.dtype) -> np.ndarray | None:
    """A float literal of ``dtype`` (a scalar operand, e.g. BatchNorm's ``epsilon``) as a numpy scalar of it; None for
    anything else."""
    if isinstance(expr, tvm.tirx.FloatImm) and str(getattr(expr.ty, "dtype", "")) == str(dtype):
        return np.asarray(expr.value, dtype=dtype)
    return None


def host_view(tensor: tvm.runtime.Tensor) -> np.ndarray:
    """A constant's values as numpy reads them: its own memory where it is on the host (DLPack, no copy: ResNet-18@224's
    weights are 44 MB, moved and hashed on every compile that converts or prepacks them), else a copy."""
    try:
        return np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):
        return tensor.numpy()


#: What TVM asks of the memory of a tensor it is handed (DLPack): a start on a multiple of this many bytes.
TENSOR_ALIGNMENT = 64


def host_constant(values: np.ndarray) -> relax.Constant:
    """A Relax constant of ``values`` (any strides), copied once, into memory the constant then holds (DLPack). TVM's own
    route copies twice more (``relax.const``'s ``astype``, then ``tvm.runtime.tensor``): ResNet-18@224's 44 MB of packed
    weights took 30 ms there, mostly first touches of the fresh pages TVM allocates."""
    buffer = np.empty(values.nbytes + TENSOR_ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % TENSOR_ALIGNMENT
    held = buffer[start : start + values.nbytes].view(values.dtype).reshape(values.shape)
    np.copyto(held, values)
    try:
        return relax.const(tvm.runtime.from_dlpack(held))
    except (BufferError, RuntimeError, TypeError):  # no memory to align (no elements), a dtype numpy cannot hand over
        return relax.const(held, str(values.dtype))


def constant_tensor(expr: Any) -> tvm.runtime.Tensor | None:
    """The tensor a Relax constant holds; None for any other expression (a scalar literal among them)."""
    value = getattr(expr, "value", None) if isinstance(expr, tvm.ir.expr.Constant) else None
    return value if isinstance(value, tvm.runtime.Tensor) else None


@tvm.transform.module_pass(opt_level=0, name="SchedhubFoldConstantMoves")
def fold_constant_moves(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Each transpose or reshape of a constant in ``mod``'s Relax functions done in numpy (bound, not yet inlined)."""
    return mutate_relax_functions(_ConstantMoves(mod), mod)


def constant_passes() -> list[tvm.transform.Pass]:
    """The passes that move the constants and inline them: what runs before legalization on every compile."""
    return [fold_constant_moves, relax.transform.CanonicalizeBindings()]
