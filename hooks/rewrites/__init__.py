"""What a compile rewrites in a network before its kernels are fused and looked up: its convolutions' layout
(:mod:`.layouts`), its math (:mod:`.fastmath`), its 3×3 convolutions' algorithm (:mod:`.winograd`), and whether its
weights may be prepacked.

Prepacking (``prepack=True``): each fused kernel is marked with which of its arguments are weights (Relax's
``AttachAttrLayoutFreeBuffers``: constants and parameters), so that MetaSchedule's ``RewriteLayout`` postprocessor
chooses their layout with the schedule, as Ansor does on CPUs: a convolution's weights tiled as its loops read them,
not strided across output channels. A compile splits that rewrite out of each such kernel after its schedule is applied
(``SplitLayoutRewritePreproc``) and folds it into the constants (:mod:`.prepack`): the weights are prepacked at compile
time, once per machine. CPU schedules only: MetaSchedule's GPU postprocessors rewrite no layouts.

A record's workload is the kernel as it was rewritten when it was tuned, so the rewrites are part of what a kernel
*is*: a compile finds only records tuned with the same rewrites, and the tuner (``tuner.networks.models.kernels``) extracts
kernels with the same passes the hook runs (``hooks.pipeline.fusion_passes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import tvm
from tvm import relax

from .fastmath import fast_math_passes
from .layouts import Layout, check_layout, layout_passes
from .winograd import Conv, check_conv, conv_passes

Math = Literal["exact", "fast"]
MATHS: tuple[str, ...] = get_args(Math)


def check_math(math: str) -> Math:
    """``math`` if schedhub knows it, else a ValueError naming those it does."""
    if math not in MATHS:
        raise ValueError(f"unknown math {math!r}: schedhub compiles with one of {', '.join(MATHS)}")
    return math  # type: ignore[return-value]


@dataclass(frozen=True)
class Rewrites:
    """The rewrites of one compile (the defaults rewrite nothing)."""

    layout: Layout = "given"  # what 2-D convolutions are converted to
    math: Math = "exact"  # "fast": GELU, erf, exp, tanh and softmax by TVM's approximations
    prepack: bool = False  # weights in the layout each kernel's schedule chooses, packed at compile time
    conv: Conv = "direct"  # "winograd": 3×3 stride-1 convolutions by Winograd's F(4×4, 3×3) or F(2×2, 3×3)

    def __post_init__(self) -> None:
        check_layout(self.layout)
        check_math(self.math)
        check_conv(self.conv)
        if not isinstance(self.prepack, bool):
            raise ValueError(f"prepack is True or False, not {self.prepack!r}")

    def passes(self) -> list[tvm.transform.Pass]:
        """The Relax passes, before legalization, that make these rewrites."""
        return [*conv_passes(self.conv), *layout_passes(self.layout), *(fast_math_passes() if self.math == "fast" else [])]

    def fused_passes(self) -> list[tvm.transform.Pass]:
        """The passes after fusion: the kernels' weights marked as theirs to lay out (with ``prepack``)."""
        return [relax.transform.AttachAttrLayoutFreeBuffers()] if self.prepack else []

    def flags(self) -> list[str]:
        """The benches' options that ask for these rewrites (none for no rewrite); ``schedhub tune`` takes the same, though
        where neither the layout nor the packing is named an AVX2 or AVX-512 CPU tunes NHWC prepacked (``tuner.networks.plan.tuning_rewrites``)."""
        return [*(["--layout", self.layout] if self.layout != "given" else []), *(["--math", self.math] if self.math != "exact" else []),
                *(["--prepack"] if self.prepack else []), *(["--conv", self.conv] if self.conv != "direct" else [])]  # fmt: skip

    def parts(self) -> list[str]:
        """Each rewrite in words, e.g. ["convolutions NHWC", "fast math"] (none for the defaults)."""
        return [*([f"convolutions {self.layout}"] if self.layout != "given" else []), *(["fast math"] if self.math == "fast" else []),
                *(["weights prepacked"] if self.prepack else []), *(["3×3 convolutions by Winograd"] if self.conv == "winograd" else [])]  # fmt: skip

    def describe(self) -> str:
        """A short phrase for reports: "" for the defaults, else e.g. "convolutions NHWC, fast math"."""
        return ", ".join(self.parts())

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> Rewrites:
        """The rewrites a recorded bench row names (its ``layout``, ``math``, ``prepack``, ``conv``; absent: the default)."""
        return cls(row.get("layout", "given"), row.get("math", "exact"), bool(row.get("prepack", False)), row.get("conv", "direct"))


def unlowered_operators(mod: tvm.IRModule) -> list[str]:
    """The Relax operators ``mod``'s functions still call though legalization lowers them: after ``LegalizeOps``, a call
    left in a form TVM cannot lower (``conv2d_transpose`` in NHWC), which the build's VM codegen would refuse."""
    left: set[str] = set()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.get_attr("FLegalize") is not None:
            left.add(expr.op.name)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return sorted(left)


#: A compile's rewrites by default: none (what a parameter's default can share, the class being frozen).
NO_REWRITES = Rewrites()
