"""The shipped Relax models (``schedhub.tuner.networks.models``) rebuilt in PyTorch: the baseline.

Module and parameter names mirror the Relax ones, so the Relax weights load with
``load_state_dict(strict=True)``: a missing, extra or differently shaped parameter is an error,
which makes "same architecture, same shapes" a checked fact rather than a claim. The benchmark
also compares the two models' outputs on the same input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from schedhub.tuner.networks.architectures import MOBILENETV2_STAGES


class ConvBN(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=True)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y) if self.relu else y


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int = 10) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(features, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.a = ConvBN(cin, cout, 3, stride)
        self.b = ConvBN(cout, cout, 3, relu=False)
        self.down = ConvBN(cin, cout, 1, stride, relu=False) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x) if self.down is not None else x
        return torch.relu(self.b(self.a(x)) + skip)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem, self.pool = ConvBN(3, 64, 7, 2), ConvBN(64, 64, 3, 2)
        blocks, cin = [], 64
        for i, w in enumerate([64, 128, 256, 512]):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean(dim=(2, 3)))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.expand = ConvBN(cin, hidden, 1) if expand != 1 else None
        self.depthwise = ConvBN(hidden, hidden, 3, stride, groups=hidden)
        self.project = ConvBN(hidden, cout, 1, relu=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.depthwise(y))
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = ConvBN(3, 32, 3, 2)
        blocks, cin = [], 32
        for expand, cout, repeats, stride in MOBILENETV2_STAGES:
            for i in range(repeats):
                blocks.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.last = ConvBN(cin, 1280, 1)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(self.last(x).mean(dim=(2, 3)))


class BertLayer(nn.Module):
    def __init__(self, hidden: int = 768, heads: int = 12, ffn: int = 3072) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        ctx = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / d**0.5), dim=-1) @ v
        x = self.norm1(x + self.out(ctx.permute(0, 2, 1, 3).reshape(b, s, h)))
        return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))


def build(name: str, weights: dict[str, np.ndarray], **shape: int) -> nn.Module:
    """The PyTorch twin of shipped model ``name`` carrying ``weights`` (by Relax parameter name), in eval mode.

    Given every option it needs (``bench.torch_process`` passes them all), it does not import TVM.
    """
    options = shape
    if name == "mlp" and not {"features", "hidden"} <= set(shape):
        from schedhub.tuner.networks.models import MODELS  # imports TVM

        options = {**MODELS[name].defaults, **shape}
    factories: dict[str, Any] = {
        "mlp": lambda: MLP(options["features"], options["hidden"]),
        "resnet18": ResNet18,
        "mobilenetv2": MobileNetV2,
        "bert_layer": BertLayer,
    }
    net = factories[name]()
    net.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}, strict=True)
    return net.eval()


def forward(net: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return net(torch.from_numpy(x)).numpy()
