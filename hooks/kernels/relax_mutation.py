"""A Relax mutator applied to every Relax function of a module: what the hook's module-level rewrites share (fast math,
Winograd, the layouts' constant transposes, kernel objects' extern calls)."""

from __future__ import annotations

import tvm
from tvm import relax


def mutate_relax_functions(mutator: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each Relax function as ``mutator`` (made on ``mod``) rewrites it, through the mutator's block builder."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()
