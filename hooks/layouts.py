"""Convolution layouts: the layout a compile converts a network's 2-D convolutions to before they are fused and looked up.

A record's workload is in the layout it was tuned in, so the layout is part of what a kernel *is*: a compile that
converts looks up the converted kernels, and the tuner (``tuner.models.kernels``) extracts them with the same passes.

- ``"given"``: the layout the frontend gave (``torch.export`` and ONNX give NCHW): no conversion.
- ``"NHWC"``: data NHWC, weights OHWI (Relax's ``ConvertLayout``; the weights are constants, so their transpose
  folds away at compile time, in numpy (:mod:`.constants`), and only the network's input and output are
  transposed at run time).

TVM 0.27's ``ConvertLayout`` raises on a ``squeeze`` with a negative axis (``std::bad_alloc``: ViT's attention has one)
and on every ``stack``, wherever they are in the network, so before converting (:func:`convertible_forms`) a
``squeeze`` takes its axes counted from the front and a ``stack`` becomes the ``concat`` of its inputs each expanded
at its axis: the same values, in forms it converts.

Blocked layouts (NCHW[x]c) are not offered: TVM 0.27's Relax legalizes a ``conv2d`` through TOPI only when its data
and kernel layouts have four dimensions (``legalize_ops/nn.py``), so a blocked convolution would stay a Relax op no
schedule applies to.
"""

from __future__ import annotations

from typing import Literal, get_args

import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from .relax_mutation import mutate_relax_functions

Layout = Literal["given", "NHWC"]
LAYOUTS: tuple[str, ...] = get_args(Layout)

#: The ``ConvertLayout`` map of each layout that converts (``"given"`` converts nothing).
_DESIRED: dict[str, dict[str, list[str]]] = {"NHWC": {"relax.nn.conv2d": ["NHWC", "OHWI"]}}


def check_layout(layout: str) -> Layout:
    """``layout`` if schedhub knows it, else a ValueError naming those it does."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown convolution layout {layout!r}: schedhub converts to one of {', '.join(LAYOUTS)}")
    return layout  # type: ignore[return-value]


def layout_passes(layout: Layout) -> list[tvm.transform.Pass]:
    """The passes that convert a Relax module's convolutions to ``layout`` (none for "given"); the weights' transposes
    they leave are folded with every other constant's move (:mod:`.constants`)."""
    desired = _DESIRED.get(check_layout(layout))
    return [] if desired is None else [convertible_forms, relax.transform.ConvertLayout(desired)]


def _from_front(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


@expr_functor.mutator
class _Convertible(PyExprMutator):
    """Each ``squeeze`` of known rank with its axes counted from the front, and each ``stack`` of known rank as the
    ``concat`` of its inputs each expanded at its axis (the same values); the rest as it is."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        name = getattr(call.op, "name", "")
        if name == "relax.squeeze" and call.attrs.axis is not None and any(int(a) < 0 for a in call.attrs.axis):
            ndim = int(getattr(call.args[0].ty, "ndim", -1))
            if ndim >= 0:
                return self.builder_.normalize(relax.op.squeeze(call.args[0], [_from_front(int(a), ndim) for a in call.attrs.axis]))
        if name == "relax.stack":
            fields = list(getattr(call.args[0].ty, "fields", None) or [])
            ndim = int(getattr(fields[0], "ndim", -1)) if fields else -1
            if ndim >= 0:  # the result has one more dimension than each input
                axis = _from_front(int(call.attrs.axis), ndim + 1)
                tup = call.args[0]
                items = list(tup.fields) if isinstance(tup, relax.Tuple) else [relax.TupleGetItem(tup, i) for i in range(len(fields))]
                expanded = [self.builder_.emit(relax.op.expand_dims(item, [axis])) for item in items]
                return self.builder_.normalize(relax.op.concat(expanded, axis))
        return call


@tvm.transform.module_pass(opt_level=0, name="SchedhubConvertibleForms")
def convertible_forms(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every Relax function's ``squeeze`` and ``stack`` in the forms ``ConvertLayout`` reads (:class:`_Convertible`)."""
    return mutate_relax_functions(_Convertible(mod), mod)


def converts(layout: Layout, mod: tvm.IRModule) -> bool:
    """Whether converting ``mod`` to ``layout`` changes anything: it calls an operator the layout converts. A network
    without 2-D convolutions (a transformer, an MLP) is the same network in every layout, and is fused once."""
    desired = _DESIRED.get(check_layout(layout))
    if not desired:
        return False
    found = False

    def visit(expr: relax.Expr) -> None:
        nonlocal found
        found = found or (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in desired)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func.body, visit)
    return found
