"""Convolution layouts: the layout a compile converts a network's 2-D convolutions to before they are fused and looked up.

A record's workload is in the layout it was tuned in, so the layout is part of what a kernel *is*: a compile that
converts looks up the converted kernels, and the tuner (``tuner.models.kernels``) extracts them with the same passes.

- ``"given"``: the layout the frontend gave (``torch.export`` and ONNX give NCHW): no conversion.
- ``"NHWC"``: data NHWC, weights OHWI (Relax's ``ConvertLayout``; the weights are constants, so their transpose
  folds away at compile time, in numpy (:func:`fold_constant_transposes`), and only the network's input and output are
  transposed at run time).

Blocked layouts (NCHW[x]c) are not offered: TVM 0.27's Relax legalizes a ``conv2d`` through TOPI only when its data
and kernel layouts have four dimensions (``legalize_ops/nn.py``), so a blocked convolution would stay a Relax op no
schedule applies to.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

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
    """The passes that convert a Relax module's convolutions to ``layout`` and fold the weights' transposes (none for "given")."""
    desired = _DESIRED.get(check_layout(layout))
    return [] if desired is None else [relax.transform.ConvertLayout(desired), fold_constant_transposes, relax.transform.FoldConstant()]


_PERMUTE_DIMS = tvm.ir.Op.get("relax.permute_dims")


@mutator
class _ConstantTransposes(PyExprMutator):  # type: ignore[misc]
    """Each ``permute_dims`` of a constant replaced by the transposed constant."""

    def visit_call_(self, call: relax.Call) -> Any:
        call = super().visit_call_(call)
        if not (isinstance(call, relax.Call) and call.op == _PERMUTE_DIMS and isinstance(call.args[0], tvm.ir.expr.Constant)):
            return call
        data = call.args[0].value.numpy()
        axes = call.attrs.axes
        return relax.const(np.ascontiguousarray(np.transpose(data, None if axes is None else [int(a) for a in axes])), str(data.dtype))


@tvm.transform.module_pass(opt_level=0, name="SchedhubFoldConstantTransposes")
def fold_constant_transposes(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """The weights' transposes ``ConvertLayout`` leaves, done in numpy: ``FoldConstant`` builds and runs a TIR kernel for
    each (1.9 of the 2.0 s converting ResNet-18@224 took, against 0.2 s), and gives the same module."""
    return mutate_relax_functions(_ConstantTransposes(mod), mod)
