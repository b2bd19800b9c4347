"""Small PyTorch models the engine tests load by factory name in an engine's own process (tests/test_engines.py)."""

from __future__ import annotations

import torch


def conv_net() -> torch.nn.Module:
    """A convolution, BatchNorm, ReLU, pooling and a linear head: what every engine runs."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()  # fmt: skip


class ExportsOtherwise(torch.nn.Module):
    """A model whose exported graph computes something else than it does eagerly: an engine's output that must not pass."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if torch.onnx.is_in_onnx_export() else x + 1


def exports_otherwise() -> torch.nn.Module:
    return ExportsOtherwise().eval()
