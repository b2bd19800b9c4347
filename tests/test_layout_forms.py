"""Every operator form a network may hold computes the same once its convolutions are converted to NHWC, and a network
with a transpose convolution compiles under the defaults (hooks/rewrites/layouts.py: what TVM's ``ConvertLayout`` gets wrong
keeps the given layout; hooks/pipeline.py: a rewrite that leaves an operator TVM cannot lower is not taken)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program

from schedhub.hooks import use

from schedhub.hooks.rewrites import layouts
from schedhub.hooks.serving.choice import has_wide_vectors
from schedhub.hooks.kernels.threads import host_target
from schedhub.registry import LocalRegistry

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})


class Lambda(nn.Module):
    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)  # type: ignore[operator]


def _after_conv(*layers: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), *layers)


FORMS: dict[str, object] = {  # each a torch module after a convolution: what ConvertLayout meets after a converted one
    "conv_transpose2d": lambda: _after_conv(nn.ConvTranspose2d(8, 4, 2, stride=2)),  # TVM 0.27: NHWC, not lowered
    "conv_transpose2d_groups": lambda: _after_conv(nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1, groups=2)),
    "layer_norm_over_channels": lambda: _after_conv(nn.LayerNorm([8, 16, 16])),  # TVM 0.27: NaN
    "conv3d_after_unsqueeze": lambda: _after_conv(Lambda(lambda x: x.unsqueeze(1)), nn.Conv3d(1, 2, 3, padding=1)),  # TVM 0.27: wrong
    "conv1d": lambda: _after_conv(Lambda(lambda x: x.reshape(1, 8, -1)), nn.Conv1d(8, 8, 3, padding=1)),
    "conv_transpose1d": lambda: _after_conv(Lambda(lambda x: x.reshape(1, 8, -1)), nn.ConvTranspose1d(8, 4, 2, stride=2)),
    "max_pool2d": lambda: _after_conv(nn.MaxPool2d(2)),
    "avg_pool2d": lambda: _after_conv(nn.AvgPool2d(3, stride=2, padding=1)),
    "adaptive_avg_pool2d": lambda: _after_conv(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)),
    "upsample_nearest": lambda: _after_conv(nn.Upsample(scale_factor=2)),
    "upsample_bilinear": lambda: _after_conv(nn.Upsample(scale_factor=2, mode="bilinear")),
    "bicubic_resize": lambda: _after_conv(Lambda(lambda x: torch.nn.functional.interpolate(x, size=(20, 12), mode="bicubic"))),
    "pixel_shuffle": lambda: _after_conv(nn.PixelShuffle(2)),
    "group_norm": lambda: _after_conv(nn.GroupNorm(2, 8)),
    "instance_norm": lambda: _after_conv(nn.InstanceNorm2d(8, affine=True)),
    "batch_norm_after_relu": lambda: _after_conv(nn.ReLU(), nn.BatchNorm2d(8)),
    "softmax_over_channels": lambda: _after_conv(nn.Softmax(dim=1)),
    "channel_shuffle": lambda: _after_conv(nn.ChannelShuffle(2)),
    "pads": lambda: _after_conv(nn.ZeroPad2d((1, 2, 0, 1)), nn.ReflectionPad2d(1)),
    "prelu_hardswish": lambda: _after_conv(nn.PReLU(8), nn.Hardswish()),
    "mean_over_space": lambda: _after_conv(Lambda(lambda x: x.mean(dim=(2, 3), keepdim=True) * x)),
    "chunk_and_concat": lambda: _after_conv(Lambda(lambda x: torch.cat(list(reversed(x.chunk(2, dim=1))), 1))),
    "reductions_over_channels": lambda: _after_conv(Lambda(lambda x: x.sum(1) + x.max(1)[0] + x.var(1) + x.std(1))),
    "slices_flip_roll": lambda: _after_conv(Lambda(lambda x: torch.roll(torch.flip(x[:, 2:6, ::2, 1:], [1]), 1, 2))),
    "einsum": lambda: _after_conv(Lambda(lambda x: torch.einsum("bchw,bdhw->bcd", x, x))),
    "cumsum_topk": lambda: _after_conv(Lambda(lambda x: torch.topk(torch.cumsum(x, 1), 2, dim=1)[0])),
    "tile_repeat": lambda: _after_conv(Lambda(lambda x: x.repeat(1, 2, 1, 1) + x.repeat_interleave(2, dim=1))),
    "permute_then_layer_norm": lambda: _after_conv(Lambda(lambda x: x.permute(0, 2, 3, 1)), nn.LayerNorm(8), Lambda(lambda x: x.permute(0, 3, 1, 2))),
}


def _imported(module: nn.Module, x: torch.Tensor) -> tuple[tvm.IRModule, np.ndarray]:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.5, 0.5)
        expected = module.eval()(x).numpy()
    return from_exported_program(torch.export.export(module, (x,))), expected


def _run(ex: tvm.runtime.Executable, x: torch.Tensor) -> np.ndarray:
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_operator_form_computes_the_same_with_convolutions_nhwc(form: str) -> None:
    x = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    mod, expected = _imported(FORMS[form](), x)  # type: ignore[operator]
    converted = tvm.transform.Sequential(layouts.layout_passes("NHWC"))(mod)
    np.testing.assert_allclose(_run(tvm.compile(converted, CPU), x), expected, rtol=1e-4, atol=1e-4)


def test_the_fence_leaves_no_trace_where_nothing_needs_it() -> None:
    """A network of converted operators only is converted as ``ConvertLayout`` alone converts it: the same keys."""
    mod, _ = _imported(_after_conv(nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3)), torch.randn(1, 4, 16, 16))
    alone = relax.transform.ConvertLayout(layouts._DESIRED["NHWC"])(mod)
    tvm.ir.assert_structural_equal(tvm.transform.Sequential(layouts.layout_passes("NHWC"))(mod), alone)


class UNet(nn.Module):
    """A small U-Net: convolutions down, a transpose convolution up, the skip concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.inner = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.out = nn.Conv2d(16, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x)
        return self.out(torch.cat([self.up(self.inner(skip)), skip], 1))


def _queued_keys(store: Path) -> set[str]:
    with LocalRegistry(store) as reg:
        return {job["key"] for job in reg.queue.jobs()}


def test_a_unet_compiles_under_the_defaults_and_queues_only_what_it_compiled(tmp_path: Path) -> None:
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    mod, expected = _imported(UNet(), x)
    target = tvm.target.Target(host_target())
    with use(tmp_path / "store", target, cache=tmp_path / "cache") as session:
        ex = tvm.compile(mod, target)
    np.testing.assert_allclose(_run(ex, x), expected, rtol=1e-4, atol=1e-4)
    if has_wide_vectors(target):  # an unknown network compiles as this CPU is best tuned: NHWC, transpose convolution kept
        assert session.rewrites.layout == "NHWC", session.report.summary()
    assert any("conv2d_transpose" in k.op for k in session.report.kernels), [k.op for k in session.report.kernels]
    assert _queued_keys(tmp_path / "store") == {k.key for k in session.report.kernels}
    with use(tmp_path / "store", target, layout="NHWC", prepack=True, cache=tmp_path / "cache"):  # named: the same
        np.testing.assert_allclose(_run(tvm.compile(mod, target), x), expected, rtol=1e-4, atol=1e-4)


def test_a_rewrite_that_leaves_an_operator_unlowered_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the transpose convolution let through the fence, ``ConvertLayout`` leaves it in a form no pass lowers: a
    compile weighing NHWC compiles the given layout and says why, one naming NHWC is told what to name instead, and
    neither queues a kernel it did not compile."""
    monkeypatch.setattr(layouts, "CONVERTED_OPERATORS", layouts.CONVERTED_OPERATORS | {"relax.nn.conv2d_transpose"})
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    mod, expected = _imported(UNet(), x)
    target = tvm.target.Target(host_target())  # NHWC is weighed on every CPU: the network has convolutions
    with use(tmp_path / "store", target, cache=tmp_path / "cache") as session:
        ex = tvm.compile(mod, target)
    assert session.rewrites.layout == "given", session.report.summary()
    assert any("cannot lower relax.nn.conv2d_transpose" in p for p in session.report.problems), session.report.problems
    np.testing.assert_allclose(_run(ex, x), expected, rtol=1e-4, atol=1e-4)
    assert _queued_keys(tmp_path / "store") == {k.key for k in session.report.kernels}
    with pytest.raises(RuntimeError, match="cannot lower relax.nn.conv2d_transpose.*use\\(..., layout='given'"):
        with use(tmp_path / "other", target, layout="NHWC", prepack=False, cache=tmp_path / "cache"):
            tvm.compile(mod, target)
