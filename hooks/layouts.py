"""Convolution layouts: the layout a compile converts a network's 2-D convolutions to before they are fused and looked up.

A record's workload is in the layout it was tuned in, so the layout is part of what a kernel *is*: a compile that
converts looks up the converted kernels, and the tuner (``tuner.models.kernels``) extracts them with the same passes.

- ``"given"``: the layout the frontend gave (``torch.export`` and ONNX give NCHW): no conversion.
- ``"NHWC"``: data NHWC, weights OHWI (Relax's ``ConvertLayout``; the weights are constants, so their transpose
  folds away at compile time, in numpy (:mod:`.constants`), and only the network's input and output are
  transposed at run time).

Blocked layouts (NCHW[x]c) are not offered: TVM 0.27's Relax legalizes a ``conv2d`` through TOPI only when its data
and kernel layouts have four dimensions (``legalize_ops/nn.py``), so a blocked convolution would stay a Relax op no
schedule applies to.
"""

from __future__ import annotations

from typing import Literal, get_args

import tvm
from tvm import relax

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
    return [] if desired is None else [relax.transform.ConvertLayout(desired)]


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
