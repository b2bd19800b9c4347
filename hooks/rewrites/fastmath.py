"""Fast math: the network's transcendental functions computed by TVM's vectorizable approximations.

LLVM has no vector ``erf``, so a GELU fused into a matmul's epilogue calls the C library's scalar ``erff`` once per
element: in the BERT layer (seq 128) that one call was about a third of its heaviest kernel's time (3.6 ms against
``fast_erf``'s 1.0 ms over 128×3072 elements on a 2-core x86). With ``math="fast"`` a compile replaces

- ``nn.gelu`` with ``0.5·x·(1 + fast_erf(x/√2))``, and ``nn.gelu_tanh`` with its ``fast_tanh`` form (float32 and
  float16; other types are left exact), then
- ``erf``, ``exp``, ``tanh`` and ``softmax`` with ``fast_erf``, ``fast_exp``, ``fast_tanh`` and ``fast_softmax``
  (Relax's own ``FastMathTransform``).

The approximations are within a few float32 ulps of the exact functions, but not bit-equal, so this is opt-in, and part
of what a kernel *is*: its fused workloads, and so its keys, differ from the exact compile's.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, topi
from tvm.relax import PyExprMutator, expr_functor

from ..kernels.relax_mutation import mutate_relax_functions

_FAST_TYPES = ("float32", "float16")  # the types TOPI's fast_erf and fast_tanh compute
_SQRT_HALF = math.sqrt(0.5)
_TANH_SCALE = math.sqrt(2.0 / math.pi)


def fast_gelu(x: te.Tensor) -> te.Tensor:
    """GELU, ``0.5·x·(1 + erf(x/√2))``, with ``fast_erf``."""
    erf = topi.fast_erf(topi.multiply(x, tvm.tirx.const(_SQRT_HALF, x.dtype)))
    return topi.multiply(topi.multiply(x, tvm.tirx.const(0.5, x.dtype)), topi.add(erf, tvm.tirx.const(1.0, x.dtype)))


def fast_gelu_tanh(x: te.Tensor) -> te.Tensor:
    """GELU's tanh form, ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, with ``fast_tanh``."""
    cube = topi.multiply(topi.multiply(x, x), x)
    inner = topi.multiply(topi.add(x, topi.multiply(cube, tvm.tirx.const(0.044715, x.dtype))), tvm.tirx.const(_TANH_SCALE, x.dtype))
    return topi.multiply(topi.multiply(x, tvm.tirx.const(0.5, x.dtype)), topi.add(topi.fast_tanh(inner), tvm.tirx.const(1.0, x.dtype)))


_GELUS = {"relax.nn.gelu": fast_gelu, "relax.nn.gelu_tanh": fast_gelu_tanh}


@expr_functor.mutator
class _FastGelu(PyExprMutator):
    """Each float32/float16 GELU computed with the fast approximations (a ``call_te`` that LegalizeOps leaves be)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        compute = _GELUS.get(getattr(call.op, "name", ""))
        if compute is None or str(getattr(call.args[0].ty, "dtype", "")) not in _FAST_TYPES:
            return call
        return self.builder_.call_te(compute, call.args[0], primfunc_name_hint=compute.__name__)


@tvm.transform.module_pass(opt_level=0, name="SchedhubFastGelu")
def fast_gelus(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every Relax function's GELUs with ``fast_erf`` / ``fast_tanh``."""
    return mutate_relax_functions(_FastGelu(mod), mod)


def fast_math_passes() -> list[tvm.transform.Pass]:
    """The passes that put fast approximations in place of GELU, erf, exp, tanh and softmax."""
    return [fast_gelus, relax.transform.FastMathTransform()]
