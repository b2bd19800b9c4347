"""Convolution layouts: a network whose convolutions the hook converts to NHWC finds the records tuned in NHWC, runs right,
and is a different set of kernels from the layout the frontend gave (hooks/rewrites/layouts.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from schedhub.cli.tune_cmds import LAYOUTS as CLI_LAYOUTS
from schedhub.hooks import use
from schedhub.hooks import pipeline
from schedhub.hooks.serving import choice
from schedhub.hooks.rewrites import layouts
from schedhub.hooks.rewrites.layouts import LAYOUTS, check_layout
from schedhub.hooks.rewrites import NO_REWRITES, Rewrites
from schedhub.tuner.networks import models

from .hand_tuner import tune
from .networks import bound, run, store_of

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})


class ConvNet(nn.Module):
    def __init__(self) -> None:
        self.first = nn.Conv2D(4, 8, 3, padding=1, bias=True)
        self.second = nn.Conv2D(8, 8, 3, padding=1, bias=True)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.relu(self.second(nn.op.relu(self.first(x))))


def conv_net() -> tvm.IRModule:
    """Two 3×3 convolutions with bias and ReLU, weights bound as constants."""
    return bound(ConvNet(), (1, 4, 12, 12))


@pytest.fixture(scope="module")
def nhwc_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry holding a real (hand-tuned, timed) record of every kernel of :func:`conv_net` converted to NHWC."""
    return store_of(tmp_path_factory.mktemp("layouts") / "store", (k.identity for k in models.kernels(conv_net(), CPU, Rewrites("NHWC"))), tune)


def test_converted_network_hits_every_kernel_and_computes_the_same(nhwc_store: Path, tmp_path: Path) -> None:
    mod = conv_net()
    x = np.random.default_rng(1).standard_normal((1, 4, 12, 12)).astype("float32")
    expected = run(tvm.compile(mod, CPU), x)
    with use(nhwc_store, CPU, layout="NHWC", trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        ex = tvm.compile(mod, CPU)
    kernels = models.kernels(mod, CPU, Rewrites("NHWC"))
    assert any("transpose" in k.identity.op or "layout" in k.identity.op for k in kernels), [k.identity.op for k in kernels]
    assert session.report.hits == len(kernels) and not session.report.misses, session.report.summary()
    np.testing.assert_allclose(run(ex, x), expected, rtol=1e-4, atol=1e-4)


def test_layout_is_part_of_what_a_kernel_is(nhwc_store: Path, tmp_path: Path) -> None:
    """The NCHW compile of the same network finds none of the NHWC convolutions' records: a record is served only in its
    own layout. A compile that leaves the layout to the registry (the default) finds them."""
    given = {k.identity.key for k in models.kernels(conv_net(), CPU, NO_REWRITES) if "conv2d" in k.identity.op}
    converted = {k.identity.key for k in models.kernels(conv_net(), CPU, Rewrites("NHWC")) if "conv2d" in k.identity.op}
    assert len(given) == len(converted) == 2 and not given & converted
    with use(nhwc_store, CPU, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache", layout="given") as session:
        tvm.compile(conv_net(), CPU)
    assert session.report.hits == 0 and session.report.misses == 2, session.report.summary()
    with use(nhwc_store, CPU, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        tvm.compile(conv_net(), CPU)
    assert session.report.misses == 0 and session.rewrites.layout == "NHWC", session.report.summary()  # its transposes too


def squeeze_stack_net() -> tvm.IRModule:
    """A convolution, then a ``squeeze`` with a negative axis and a ``stack``: forms TVM 0.27's ``ConvertLayout`` raises
    on (ViT's attention squeezes so), wherever they are in the network."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 12, 12), "float32"))
    weight = relax.const(np.random.default_rng(2).standard_normal((8, 4, 3, 3)).astype("float32"))
    with bb.function("forward", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, weight))
            y = bb.emit(relax.op.squeeze(bb.emit(relax.op.expand_dims(y, [-2])), [-2]))
            y = bb.emit(relax.op.stack([y, bb.emit(relax.op.multiply(y, relax.const(2.0, "float32")))], axis=-1))
            out = bb.emit_output(bb.emit(relax.op.sum(y, axis=[-1])))
        bb.emit_func_output(out)
    return bb.get()


def test_a_negative_squeeze_and_a_stack_convert_and_compute_the_same(tmp_path: Path) -> None:
    mod = squeeze_stack_net()
    x = np.random.default_rng(1).standard_normal((1, 4, 12, 12)).astype("float32")
    expected = run(tvm.compile(mod, CPU), x)
    with use(tmp_path / "store", CPU, layout="NHWC", prepack=False, report_misses=False, cache=tmp_path / "cache") as session:
        ex = tvm.compile(mod, CPU)
    assert session.rewrites.layout == "NHWC" and not session.report.problems, session.report.problems
    np.testing.assert_allclose(run(ex, x), expected, rtol=1e-4, atol=1e-4)


def test_a_layout_tvm_cannot_convert_is_not_weighed_and_is_named_where_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite TVM raises on never breaks a compile that only weighs it; one that names it is told what to name instead."""
    monkeypatch.setitem(layouts._DESIRED, "NHWC", {"relax.nn.conv2d": ["NHWC", "XYZW"]})  # a kernel layout TVM cannot convert to
    mod = conv_net()
    x = np.random.default_rng(1).standard_normal((1, 4, 12, 12)).astype("float32")
    with use(tmp_path / "store", CPU, report_misses=False, cache=tmp_path / "cache") as session:
        ex = tvm.compile(mod, CPU)
    assert session.rewrites.layout == "given" and not any("NHWC" in option for option in session.report.rewrite_options), session.report.summary()
    assert any(p.startswith("not weighed: TVM could not compile this network with convolutions NHWC") for p in session.report.problems), session.report.problems
    np.testing.assert_allclose(run(ex, x), run(tvm.compile(mod, CPU), x), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="could not compile this network with convolutions NHWC.*use\\(..., layout='given'\\)"):  # RewriteFailed, through TVM's FFI
        with use(tmp_path / "store", CPU, layout="NHWC", prepack=False, report_misses=False, cache=tmp_path / "cache"):
            tvm.compile(mod, CPU)


def test_a_layout_tvm_could_not_convert_is_not_tried_again_until_the_hook_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure is kept in the machine's kernel cache: the next compile says it without converting the network again,
    and a version of the hook's source that may convert it tries again."""
    monkeypatch.setitem(layouts._DESIRED, "NHWC", {"relax.nn.conv2d": ["NHWC", "XYZW"]})
    fused: list[str] = []
    unpacked = pipeline.unpacked_fusion_passes
    monkeypatch.setattr(pipeline, "unpacked_fusion_passes", lambda rewrites: fused.append(rewrites.layout) or unpacked(rewrites))

    def compile_weighing() -> list[str]:
        fused.clear()
        with use(tmp_path / "store", CPU, report_misses=False, cache=tmp_path / "cache") as session:
            tvm.compile(conv_net(), CPU)
        assert session.rewrites.layout == "given", session.report.summary()
        assert any(p.startswith("not weighed: TVM could not compile this network with convolutions NHWC") for p in session.report.problems)
        return sorted(fused)

    assert compile_weighing() == ["NHWC", "given"]  # the first fuses both options
    assert compile_weighing() == ["given"]  # the next only the one it compiles
    monkeypatch.setattr(choice, "source_digest", lambda: "another version of the hook")
    assert compile_weighing() == ["NHWC", "given"]


def test_unknown_layout_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="NCHW16c.*given, NHWC"):
        check_layout("NCHW16c")
    with pytest.raises(ValueError, match="unknown convolution layout"):
        Rewrites("nhwc")  # type: ignore[arg-type]


def test_cli_offers_the_hooks_layouts() -> None:
    assert tuple(CLI_LAYOUTS) == LAYOUTS
