"""PyTorch networks no bench tunes, for the first-compile study (``bench.networks:NAME``, zero-argument factories).

Written from their published architectures (torchvision's wheels do not import beside the pinned CPU torch): each
factory seeds its weights (and gives BatchNorm trained-looking statistics, so folding them changes the weights) and
returns the network in eval mode; ``bench.network_inputs.INPUTS`` holds each one's input shape (torch-free, for the TVM
process). PyTorch only: the processes that time PyTorch never import TVM.
"""

from __future__ import annotations

import torch
from torch import nn

from .torch_models import MobileNetV2


def _seeded(net: nn.Module) -> nn.Module:
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return net.eval()


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    """ResNet-50's block (torchvision's v1.5: the stride on the 3×3 convolution)."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(*_conv_bn(cin, width, 1), nn.ReLU(), *_conv_bn(width, width, 3, stride), nn.ReLU(), *_conv_bn(width, cout, 1))
        self.skip = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return _seeded(nn.Sequential(*layers))


def encoder_layer() -> nn.Module:
    """PyTorch's own TransformerEncoderLayer: d 512, 8 heads, feed-forward 2048 (sequence 256 in :data:`INPUTS`)."""
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True).eval()


def mobilenetv2() -> nn.Module:
    torch.manual_seed(0)
    return _seeded(MobileNetV2())


class UNet(nn.Module):
    """A small U-Net (three levels, 32-128 channels): transposed convolutions up, skips concatenated."""

    def __init__(self) -> None:
        super().__init__()

        def double(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(*_conv_bn(cin, cout, 3), nn.ReLU(), *_conv_bn(cout, cout, 3), nn.ReLU())

        self.down1, self.down2, self.bottom = double(3, 32), double(32, 64), double(64, 128)
        self.up2, self.dec2 = nn.ConvTranspose2d(128, 64, 2, 2), double(128, 64)
        self.up1, self.dec1 = nn.ConvTranspose2d(64, 32, 2, 2), double(64, 32)
        self.head = nn.Conv2d(32, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(nn.functional.max_pool2d(d1, 2))
        b = self.bottom(nn.functional.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], 1))
        return self.head(self.dec1(torch.cat([self.up1(u2), d1], 1)))


def unet() -> nn.Module:
    torch.manual_seed(0)
    return _seeded(UNet())


class ConvMixerLayer(nn.Module):
    def __init__(self, dim: int, kernel: int) -> None:
        super().__init__()
        self.mix = nn.Sequential(nn.Conv2d(dim, dim, kernel, groups=dim, padding=kernel // 2), nn.GELU(), nn.BatchNorm2d(dim))
        self.point = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.point(x + self.mix(x))


def convmixer() -> nn.Module:
    """ConvMixer-256/8 (Trockman & Kolter, 2022): patches of 7, depthwise 9×9 mixing, GELU, BatchNorm after each."""
    torch.manual_seed(0)
    dim = 256
    stem = [nn.Conv2d(3, dim, 7, 7), nn.GELU(), nn.BatchNorm2d(dim)]
    return _seeded(nn.Sequential(*stem, *(ConvMixerLayer(dim, 9) for _ in range(8)), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(dim, 1000)))
