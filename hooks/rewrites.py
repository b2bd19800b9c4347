"""What a compile rewrites in a network before its kernels are fused and looked up: its convolutions' layout
(:mod:`.layouts`) and its math (:mod:`.fastmath`).

A record's workload is the kernel as it was rewritten when it was tuned, so the rewrites are part of what a kernel
*is*: a compile finds only records tuned with the same rewrites, and the tuner (``tuner.models.kernels``) extracts
kernels with the same passes the hook runs (``hooks.pipeline.fusion_passes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import tvm

from .fastmath import fast_math_passes
from .layouts import Layout, check_layout, layout_passes

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

    def __post_init__(self) -> None:
        check_layout(self.layout)
        check_math(self.math)

    def passes(self) -> list[tvm.transform.Pass]:
        """The Relax passes, before legalization, that make these rewrites."""
        return [*layout_passes(self.layout), *(fast_math_passes() if self.math == "fast" else [])]

    def flags(self) -> list[str]:
        """The ``schedhub tune`` options that ask for these rewrites (none for the defaults)."""
        return [*(["--layout", self.layout] if self.layout != "given" else []), *(["--math", self.math] if self.math != "exact" else [])]

    def describe(self) -> str:
        """A short phrase for reports: "" for the defaults, else e.g. "convolutions NHWC, fast math"."""
        parts = [*([f"convolutions {self.layout}"] if self.layout != "given" else []), *(["fast math"] if self.math == "fast" else [])]
        return ", ".join(parts)
