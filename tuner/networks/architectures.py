"""The shipped networks' layer settings, in plain Python: shared by the Relax models
(:mod:`.models`) and their PyTorch twins (``bench.torch_models``), which must not import TVM."""

from __future__ import annotations

#: MobileNet-V2's inverted residual stages: (expansion, output channels, repeats, first stride).
MOBILENETV2_STAGES: list[tuple[int, int, int, int]] = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
