"""Models shipped with schedhub (Relax ``nn``, no downloads) and the kernels a model compiles to.

Each model is a function ``(batch, **shape options) -> (nn.Module, input shape)``; weights are
parameters (``export_tvm`` makes them function inputs), so one architecture at one shape has one
set of kernels whatever its weights. BatchNorm is folded into convolution bias as inference
compilers do, and global average pooling is a sum times 1/(H·W): ``nn`` has no pooling module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from schedhub.registry import Identity

if TYPE_CHECKING:
    from schedhub.hooks.rewrites import Rewrites

from .architectures import MOBILENETV2_STAGES


class ConvBN(nn.Module):
    """Convolution with folded batch norm (a bias), optionally followed by ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True) -> None:
        self.conv = nn.Conv2D(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=True)
        self.relu = relu

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = self.conv(x)
        return nn.relu(y) if self.relu else y


def _size(dim: Any) -> Any:
    """A static dimension as an int, a symbolic one as the variable it is."""
    return int(dim) if isinstance(dim, (int, tvm.tirx.IntImm)) else dim


def _global_pool(x: nn.Tensor) -> nn.Tensor:
    _, _, h, w = x.shape
    return nn.op.sum(x, axis=[2, 3]) * (1.0 / (int(h) * int(w)))


class MLP(nn.Module):
    def __init__(self, features: int = 256, hidden: int = 512, classes: int = 10) -> None:
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.head(nn.relu(self.fc2(nn.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        self.a = ConvBN(cin, cout, 3, stride)
        self.b = ConvBN(cout, cout, 3, relu=False)
        self.down = ConvBN(cin, cout, 1, stride, relu=False) if stride != 1 or cin != cout else None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        skip = self.down(x) if self.down is not None else x
        return nn.relu(self.b(self.a(x)) + skip)


class ResNet18(nn.Module):
    """ResNet-18's convolution stack; the stem's max-pool is a stride-2 3×3 convolution here."""

    def __init__(self, classes: int = 1000) -> None:
        self.stem = ConvBN(3, 64, 7, 2)
        self.pool = ConvBN(64, 64, 3, 2)
        widths, blocks, cin = [64, 128, 256, 512], [], 64
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = self.pool(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.fc(_global_pool(x))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        hidden = cin * expand
        self.expand = ConvBN(cin, hidden, 1) if expand != 1 else None
        self.depthwise = ConvBN(hidden, hidden, 3, stride, groups=hidden)
        self.project = ConvBN(hidden, cout, 1, relu=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.depthwise(y))
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """MobileNet-V2's inverted-residual stack (ReLU in place of ReLU6, BN folded)."""

    SETTINGS = MOBILENETV2_STAGES

    def __init__(self, classes: int = 1000) -> None:
        self.stem = ConvBN(3, 32, 3, 2)
        blocks, cin = [], 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                blocks.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.last = ConvBN(cin, 1280, 1)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(_global_pool(self.last(x)))


class BertLayer(nn.Module):
    """One BERT-base encoder layer: self-attention and the GELU feed-forward, post-LayerNorm."""

    def __init__(self, hidden: int = 768, heads: int = 12, ffn: int = 3072) -> None:
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        b, s = (_size(d) for d in x.shape[:2])  # a batch or a sequence length may be symbolic (a dynamic shape)
        h = int(x.shape[2])
        d = h // self.heads
        qkv = nn.op.reshape(self.qkv(x), (b, s, 3, self.heads, d))
        q, k, v = (nn.op.permute_dims(nn.op.squeeze(t, 2), [0, 2, 1, 3]) for t in nn.op.split(qkv, 3, axis=2))
        scores = nn.op.matmul(q, nn.op.permute_dims(k, [0, 1, 3, 2])) * (1.0 / d**0.5)
        ctx = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
        ctx = nn.op.reshape(nn.op.permute_dims(ctx, [0, 2, 1, 3]), (b, s, h))
        x = self.norm1(x + self.out(ctx))
        return self.norm2(x + self.down(nn.op.gelu(self.up(x))))


@dataclass(frozen=True)
class ModelSpec:
    """A shipped architecture: how the module and its input shape follow from the shape options."""

    build: Callable[[dict[str, int]], nn.Module]
    input_shape: Callable[[dict[str, int]], tuple[int, ...]]
    defaults: dict[str, int]


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(lambda o: MLP(o["features"], o["hidden"]), lambda o: (o["batch"], o["features"]), {"batch": 1, "features": 256, "hidden": 512}),
    "resnet18": ModelSpec(lambda o: ResNet18(), lambda o: (o["batch"], 3, o["image"], o["image"]), {"batch": 1, "image": 224}),
    "mobilenetv2": ModelSpec(lambda o: MobileNetV2(), lambda o: (o["batch"], 3, o["image"], o["image"]), {"batch": 1, "image": 224}),
    "bert_layer": ModelSpec(lambda o: BertLayer(), lambda o: (o["batch"], o["seq"], 768), {"batch": 1, "seq": 128}),
}


def model_names() -> list[str]:
    return sorted(MODELS)


def export_with_weights(name: str, seed: int = 0, **shape: int) -> tuple[tvm.IRModule, dict[str, np.ndarray], tuple[int, ...]]:
    """A shipped model with seeded random weights bound as constants, as deployed models are.

    Weight-only work (transposes, reshapes) then folds away at compile time and ``forward``
    takes only the input. Returns ``(module, weights by parameter name, input shape)``.
    """
    mod, params, input_shape = export(name, **shape)
    rng = np.random.default_rng(seed)
    weights = {n: (rng.standard_normal([int(d) for d in p.shape]) * 0.05).astype(p.dtype) for n, p in params}
    bound = relax.transform.BindParams("forward", {n: tvm.runtime.tensor(w) for n, w in weights.items()})(mod)
    return bound, weights, input_shape


def export(name: str, **shape: int) -> tuple[tvm.IRModule, list[tuple[str, Any]], tuple[int, ...]]:
    """A shipped model as ``(Relax module with "forward", parameter specs, input shape)``; weights are inputs."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; shipped models: {', '.join(model_names())}")
    spec = MODELS[name]
    unknown = set(shape) - set(spec.defaults)
    if unknown:
        raise ValueError(f"model {name!r} takes shape options {sorted(spec.defaults)}, not {sorted(unknown)}")
    options = {**spec.defaults, **shape}
    input_shape = spec.input_shape(options)
    mod, params = spec.build(options).export_tvm({"forward": {"x": nn.spec.Tensor(input_shape, "float32")}})
    return mod, params, input_shape


@dataclass(frozen=True)
class Kernel:
    """One fused kernel of a model: its identity and how many times the model calls it."""

    name: str
    identity: Identity
    calls: int


def kernels(mod: tvm.IRModule, target: Any, rewrites: Rewrites | None = None) -> list[Kernel]:
    """The fused kernels the compile hook looks up for ``mod`` on ``target`` after ``rewrites``: by default those a
    compile with ``use(...)``'s defaults takes for a network the registry holds nothing of, and ``schedhub tune`` tunes
    (``hooks.serving.choice.compiled_first``: NHWC and prepacked on a CPU with AVX2 or AVX-512); ``hooks.rewrites.NO_REWRITES``
    for the network as given; the rewrites of ``hooks.use(..., layout=, math=, prepack=)``: same passes, same keys."""
    from tvm import tirx

    from schedhub.hooks.kernels.identity import workload_identity
    from schedhub.hooks.kernels.defaults import is_gpu
    from schedhub.hooks.pipeline import call_counts, fusion_passes, gpu_backend
    from schedhub.hooks.serving.choice import compiled_first

    tgt = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    with tgt:
        if is_gpu(tgt):  # the GPU route dispatches to libraries first
            mod = tvm.transform.Sequential(gpu_backend(tgt).library_dispatch_passes(tgt))(mod)
        fused = fusion_passes(rewrites if rewrites is not None else compiled_first(tgt, [mod]))(mod)
    calls = call_counts(fused)
    found: dict[str, Kernel] = {}
    for gv, func in fused.functions_items():
        if isinstance(func, tirx.PrimFunc):
            ident = workload_identity(func, tgt, gv.name_hint)
            prev = found.get(ident.key)
            n = calls.get(gv.name_hint, 1)
            found[ident.key] = Kernel(gv.name_hint, ident, n + (prev.calls if prev else 0))
    return list(found.values())
