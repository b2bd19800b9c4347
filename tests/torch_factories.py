"""PyTorch models for the tests, importable as ``tests.torch_factories:NAME`` (a zero-argument factory)."""

from __future__ import annotations

import torch


class ConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        with torch.no_grad():  # trained-looking statistics, so folding them changes the weights
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 2)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def conv_bn() -> torch.nn.Module:
    return ConvBn()


def encoder_layer() -> torch.nn.Module:
    """PyTorch's TransformerEncoderLayer, small: its attention fills masked scores with ``full_like``."""
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True).eval()
