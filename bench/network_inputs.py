"""The input shape of each network of ``bench.networks``, in plain Python: the benchmark process that times TVM reads
them without importing PyTorch."""

from __future__ import annotations

INPUTS: dict[str, list[int]] = {
    "resnet50": [1, 3, 224, 224],
    "encoder_layer": [1, 256, 512],
    "mobilenetv2": [1, 3, 224, 224],
    "unet": [1, 3, 128, 128],
    "convmixer": [1, 3, 224, 224],
}
