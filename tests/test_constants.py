"""Constants computed in numpy before legalization (hooks/rewrites/constants.py): a compile's weights' transposes and reshapes,
and BatchNorm's folded arithmetic, are done at once, and the fused module has the kernels (so the keys) and computes
the outputs ``FoldConstant`` gave."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend import nn

from schedhub.hooks.rewrites.constants import TENSOR_ALIGNMENT, fold_constant_moves, host_constant, host_view
from schedhub.hooks.pipeline import fusion_passes
from schedhub.hooks.rewrites import Rewrites

from .networks import bound, run
from .torch_factories import conv_bn

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})


class ConvLinear(nn.Module):
    """A convolution with bias (its importer reshapes the bias), then a linear layer (its weight is transposed)."""

    def __init__(self) -> None:
        self.conv = nn.Conv2D(4, 8, 3, padding=1, bias=True)
        self.linear = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.linear(nn.op.reshape(nn.op.relu(self.conv(x)), (1, 8 * 6 * 6)))


def conv_linear() -> tvm.IRModule:
    return bound(ConvLinear(), (1, 4, 6, 6))


def constant_moves(mod: tvm.IRModule) -> int:
    """How many ``permute_dims`` or ``reshape`` calls of the module's Relax functions move a constant, or a variable bound to one."""
    moves = (tvm.ir.Op.get("relax.permute_dims"), tvm.ir.Op.get("relax.reshape"))
    found: list[relax.Call] = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            constants: list[relax.Var] = []

            def visit(expr: relax.Expr) -> None:
                if isinstance(expr, relax.Call) and expr.op in moves:
                    arg = expr.args[0]
                    if isinstance(arg, tvm.ir.expr.Constant) or any(arg.same_as(var) for var in constants):
                        found.append(expr)

            for block in func.body.blocks:
                for binding in block.bindings:
                    if isinstance(binding.value, tvm.ir.expr.Constant):
                        constants.append(binding.var)
                    relax.analysis.post_order_visit(binding.value, visit)
    return len(found)


def folded_by_tvm(rewrites: Rewrites) -> tvm.transform.Pass:
    """The fusion as it was before :mod:`schedhub.hooks.rewrites.constants`: every constant's move folded by ``FoldConstant``."""
    return tvm.transform.Sequential([
        relax.transform.FoldBatchnormToConv2D(), *rewrites.passes(), relax.transform.FoldConstant(), relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()])  # fmt: skip


def test_every_transpose_and_reshape_of_a_constant_is_done_in_numpy_to_the_same_values() -> None:
    for layout in ("given", "NHWC"):
        moved = tvm.transform.Sequential(Rewrites(layout).passes())(conv_linear())
        assert constant_moves(moved) >= 2, layout  # the bias's reshape and the linear weight's transpose (and NHWC's)
        folded = fold_constant_moves(moved)
        assert constant_moves(folded) == 0, layout
        assert tvm_ffi.structural_equal(relax.transform.FoldConstant()(folded), relax.transform.FoldConstant()(moved)), layout


def test_a_reshape_to_a_shape_known_only_at_run_time_is_left_to_the_build() -> None:
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = bb.emit(relax.const(np.arange(8, dtype="float32")))
            fixed = bb.emit(relax.op.reshape(weight, relax.ShapeExpr([2, 4])))
            dynamic = bb.emit(relax.op.reshape(weight, relax.ShapeExpr([n, 4])))
            out = bb.emit_output(relax.Tuple([fixed, dynamic]))
        bb.emit_func_output(out)
    assert constant_moves(bb.get()) == 2
    assert constant_moves(fold_constant_moves(bb.get())) == 1


@tvm.ir.instrument.pass_instrument
class MovesBeforeLegalizing:
    """Counts the constants' moves left in the module each time ``LegalizeOps`` is about to run."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == "LegalizeOps":
            self.seen.append(constant_moves(mod))


def test_a_fused_network_has_the_kernels_and_computes_the_outputs_foldconstant_gave() -> None:
    """No constant is left for ``FoldConstant`` to move after legalization; the kernels are the same workloads (so a
    record tuned before is found), and the outputs are the same bits."""
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype("float32")
    for layout in ("given", "NHWC"):
        moves = MovesBeforeLegalizing()
        with CPU, tvm.transform.PassContext(instruments=[moves]):
            ours = fusion_passes(Rewrites(layout))(conv_linear())
        assert moves.seen == [0], layout
        with CPU:
            theirs = folded_by_tvm(Rewrites(layout))(conv_linear())
        kernels = [sorted(tvm_ffi.structural_hash(f) for _, f in m.functions_items() if isinstance(f, tvm.tirx.PrimFunc)) for m in (ours, theirs)]
        assert kernels[0] == kernels[1] and len(kernels[0]) >= 3, layout
        outputs = [run(tvm.compile(m, CPU), x) for m in (ours, theirs)]
        np.testing.assert_array_equal(outputs[0], outputs[1])


_ARITHMETIC = tuple(tvm.ir.Op.get(f"relax.{name}") for name in ("add", "subtract", "multiply", "divide", "sqrt"))


def constant_arithmetic(mod: tvm.IRModule) -> int:
    """How many elementwise operations of the module's Relax functions have only constants (or scalars) as operands."""
    count = 0
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            constants: list[relax.Var] = []
            for block in func.body.blocks:
                for binding in block.bindings:
                    value = binding.value
                    if isinstance(value, tvm.ir.expr.Constant):
                        constants.append(binding.var)
                    elif isinstance(value, relax.Call) and value.op in _ARITHMETIC:
                        if all(isinstance(a, tvm.ir.expr.Constant) or any(a.same_as(v) for v in constants) for a in value.args):
                            constants.append(binding.var)
                            count += 1
    return count


def users_conv_bn() -> tvm.IRModule:
    """A convolution and a trained BatchNorm, imported as a user imports a model (``from_exported_program``)."""
    from tvm.relax.frontend.torch import from_exported_program

    x = torch.zeros((1, 3, 16, 16))
    return from_exported_program(torch.export.export(conv_bn().eval(), (x,)))


def test_batch_norms_folded_arithmetic_is_computed_in_numpy_to_the_bits_llvm_gives() -> None:
    """``FoldBatchnormToConv2D`` leaves the weights' scale and the bias as arithmetic on constants (with ``epsilon`` a
    scalar operand); numpy computes them to the same bytes as ``FoldConstant``'s kernels."""
    folded = relax.transform.FoldBatchnormToConv2D()(users_conv_bn())
    assert constant_arithmetic(folded) >= 5  # add epsilon, sqrt, divide, multiply (weights and mean), subtract
    ours = fold_constant_moves(folded)
    assert constant_arithmetic(ours) == 0
    legalized = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.FoldConstant()])
    with CPU:
        by_llvm, by_numpy = legalized(folded), legalized(relax.transform.CanonicalizeBindings()(ours))
    weights = [[t.tobytes() for t in main_constants(m)] for m in (by_numpy, by_llvm)]
    assert weights[0] == weights[1] and len(weights[0]) == 2  # the convolution's weights and its bias


def main_constants(mod: tvm.IRModule) -> list[np.ndarray]:
    found: list[np.ndarray] = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: found.append(e.value.numpy()) if isinstance(getattr(e, "value", None), tvm.runtime.Tensor) else None)
    return found


@tvm.ir.instrument.pass_instrument
class RefuseConstantArithmetic:
    """Fails the compile where ``ConvertLayout`` would meet arithmetic on constants: on an ``add`` of a tensor and a
    scalar its layout inference reads a null pointer and kills the process (TVM 0.27)."""

    def run_before_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == "ConvertLayout" and constant_arithmetic(mod):
            raise AssertionError(f"{constant_arithmetic(mod)} operations on constants reach ConvertLayout")


@pytest.mark.parametrize("prepack", [False, True])
def test_a_network_with_batch_norm_converts_to_nhwc_and_computes_the_same(prepack: bool) -> None:
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    with CPU, tvm.transform.PassContext(instruments=[RefuseConstantArithmetic()]):
        converted = fusion_passes(Rewrites("NHWC", prepack=prepack))(users_conv_bn())
    outputs = [relax.VirtualMachine(tvm.compile(m, CPU), tvm.cpu())["main"](tvm.runtime.tensor(x))[0].numpy()
               for m in (converted, fusion_passes(Rewrites())(users_conv_bn()))]
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("values", [
    np.arange(24, dtype="float32").reshape(2, 3, 4).transpose(2, 0, 1),  # strided: a transpose's view
    np.arange(7, dtype="int8"),
    np.array(2.5, dtype="float64"),
    np.zeros((0, 3), dtype="float32"),
], ids=["transposed", "int8", "scalar", "empty"])
def test_a_computed_constant_holds_its_own_copy_of_the_values(values: np.ndarray) -> None:
    """A constant made from numpy values holds them in their shape and dtype, in memory of its own (aligned as TVM asks of
    a tensor it is handed), so the values it was made from may change after."""
    expected = values.copy()
    const = host_constant(values)
    held = host_view(const.value)
    assert held.shape == expected.shape and held.dtype == expected.dtype
    np.testing.assert_array_equal(held, expected)
    assert held.size == 0 or held.ctypes.data % TENSOR_ALIGNMENT == 0
    if values.size:
        values[...] = 0
        np.testing.assert_array_equal(host_view(const.value), expected)
        assert not np.shares_memory(held, values)
