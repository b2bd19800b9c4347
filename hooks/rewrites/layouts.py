"""Convolution layouts: the layout a compile converts a network's 2-D convolutions to before they are fused and looked up.

A record's workload is in the layout it was tuned in, so the layout is part of what a kernel *is*: a compile that
converts looks up the converted kernels, and the tuner (``tuner.networks.models.kernels``) extracts them with the same passes.

- ``"given"``: the layout the frontend gave (``torch.export`` and ONNX give NCHW): no conversion.
- ``"NHWC"``: data NHWC, weights OHWI (Relax's ``ConvertLayout``; the weights are constants, so their transpose
  folds away at compile time, in numpy (:mod:`.constants`), and only the network's input and output are
  transposed at run time).

TVM 0.27's ``ConvertLayout`` raises on a ``squeeze`` with a negative axis (``std::bad_alloc``: ViT's attention has one)
and on every ``stack``, wherever they are in the network, so before converting (:func:`convertible_forms`) a
``squeeze`` takes its axes counted from the front and a ``stack`` becomes the ``concat`` of its inputs each expanded
at its axis: the same values, in forms it converts.

TVM 0.27's ``ConvertLayout`` also converts operators it gets wrong: a ``conv2d_transpose`` to an NHWC form no pass
lowers (the build fails in VM codegen), a ``layer_norm`` over the channels to new axes with its weights left as they
were (NaN), a ``conv3d`` after an ``expand_dims`` to a data layout its weights do not follow (wrong values). So only the
operators whose converted forms were checked to compute the same (:data:`CONVERTED_OPERATORS`, each one tried in
``tests/test_layout_forms.py``) take the new layout: every other operator that ``ConvertLayout`` would convert is
fenced first (:func:`fenced_forms`): its inputs go back to the given layout, and it computes as the network gave it.

Blocked layouts (NCHW[x]c) are not offered: TVM 0.27's Relax legalizes a ``conv2d`` through TOPI only when its data
and kernel layouts have four dimensions (``legalize_ops/nn.py``), so a blocked convolution would stay a Relax op no
schedule applies to.
"""

from __future__ import annotations

from typing import Literal, get_args

import tvm
from tvm import relax
from tvm.relax import PyExprMutator, expr_functor

from ..kernels.relax_mutation import mutate_relax_functions

Layout = Literal["given", "NHWC"]
LAYOUTS: tuple[str, ...] = get_args(Layout)

#: The ``ConvertLayout`` map of each layout that converts (``"given"`` converts nothing).
_DESIRED: dict[str, dict[str, list[str]]] = {"NHWC": {"relax.nn.conv2d": ["NHWC", "OHWI"]}}


_ELEMENTWISE = (
    "abs acos acosh asin asinh atan atanh ceil cos cosh erf exp floor isfinite isinf isnan log negative round rsqrt sigmoid "
    "sign sin sinh sqrt square tan tanh trunc bitwise_not logical_not astype add subtract multiply divide floor_divide "
    "floor_mod mod power maximum minimum atan2 log_add_exp ewise_fma equal not_equal greater greater_equal less less_equal "
    "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor left_shift right_shift"
)
#: The operators whose forms ``ConvertLayout`` converts were checked to compute the same (``tests/test_layout_forms.py``
#: tries each); the rest of those it would convert keep the given layout (:func:`fenced_forms`).
CONVERTED_OPERATORS: frozenset[str] = frozenset(
    [f"relax.{name}" for name in _ELEMENTWISE.split()]
    + [f"relax.{name}" for name in "concat split strided_slice permute_dims squeeze flip mean sum max min".split()]
    + [f"relax.nn.{name}" for name in "relu gelu gelu_tanh silu selu dropout prelu softmax batch_norm group_norm instance_norm".split()]
    + ["relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d", "relax.image.resize2d"]
)
#: An identity that ``ConvertLayout`` does not see through (it has no layout inference): the fence (:func:`fenced_forms`).
_FENCE = tvm.ir.Op.get("relax.builtin.stop_lift_params")


def check_layout(layout: str) -> Layout:
    """``layout`` if schedhub knows it, else a ValueError naming those it does."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown convolution layout {layout!r}: schedhub converts to one of {', '.join(LAYOUTS)}")
    return layout  # type: ignore[return-value]


def layout_passes(layout: Layout) -> list[tvm.transform.Pass]:
    """The passes that convert a Relax module's convolutions to ``layout`` (none for "given"); the weights' transposes
    they leave are folded with every other constant's move (:mod:`.constants`)."""
    desired = _DESIRED.get(check_layout(layout))
    return [] if desired is None else [convertible_forms, fenced_forms(desired), relax.transform.ConvertLayout(desired), unfenced_forms]


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


def _converted_by_inference(op: tvm.ir.Op, desired: dict[str, list[str]]) -> bool:
    """Whether ``ConvertLayout`` would give ``op``'s call a layout other than the given one: it infers one for it."""
    return op.name not in desired and op.get_attr("FRelaxInferLayout") is not None


class FenceUnavailable(ValueError):
    """A network that already calls the operator the fence is made of: it cannot be told apart from the fence."""


@expr_functor.mutator
class _Fenced(PyExprMutator):
    """Each tensor input of a call ``ConvertLayout`` would convert but :data:`CONVERTED_OPERATORS` does not hold, through
    the fence; the rest as it is."""

    def __init__(self, mod: tvm.IRModule, desired: dict[str, list[str]]) -> None:
        super().__init__(mod)
        self.desired = desired

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.same_as(_FENCE):
            raise FenceUnavailable("the network calls relax.builtin.stop_lift_params, which the layout rewrite fences with")
        if call.op.name in CONVERTED_OPERATORS or not _converted_by_inference(call.op, self.desired):
            return call
        return relax.Call(call.op, [self._fence(arg) for arg in call.args], call.attrs, call.ty_args, call.span)

    def _fence(self, arg: relax.Expr) -> relax.Expr:
        if isinstance(arg.ty, relax.TensorType):
            return self.builder_.emit(relax.Call(_FENCE, [arg]))
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([self._fence(field) for field in arg.fields])
        return arg


@expr_functor.mutator
class _Unfenced(PyExprMutator):
    """Each fence replaced by what it fences (after ``ConvertLayout``, which put it back in the given layout)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        return call.args[0] if isinstance(call.op, tvm.ir.Op) and call.op.same_as(_FENCE) else call


def fenced_forms(desired: dict[str, list[str]]) -> tvm.transform.Pass:
    """A pass that fences every call ``ConvertLayout(desired)`` would convert and :data:`CONVERTED_OPERATORS` does not
    hold: such an operator computes in the layout the network gave it (its inputs converted back)."""

    @tvm.transform.module_pass(opt_level=0, name="SchedhubFencedForms")
    def fence(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return mutate_relax_functions(_Fenced(mod, desired), mod)

    return fence


@tvm.transform.module_pass(opt_level=0, name="SchedhubUnfencedForms")
def unfenced_forms(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every fence of :func:`fenced_forms` gone, what it fenced in its place."""
    return mutate_relax_functions(_Unfenced(mod), mod)


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
