"""numpy and PyTorch equivalents of fused kernels, timed at the kernel's own shapes (baselines, not tuners).

A fused kernel is named after its ops (``fused_matmul1_add_relu``, ``fused_conv2d3_add2_relu1``)
and its arguments are ``ArgInfo`` JSON: inputs in order, the output last. Matmul kernels map to
``numpy.matmul`` / ``torch.matmul``; convolutions (padding k//2, stride from the shapes, groups
from the weight) to im2col + GEMM in numpy, as a framework without a tuned convolution does, and
to ``torch.nn.functional.conv2d`` (oneDNN) in PyTorch. A Winograd convolution (``fused_conv2d_winograd…``,
``hooks.use(..., conv="winograd")``) has the baselines of the direct convolution it replaces
(:func:`direct_equivalent`). Other kernels have no baseline.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..execution.kernels import random_arguments

_EPILOGUE = {"add", "relu", "multiply"}


def _ops(op: str) -> list[str]:
    return [re.sub(r"\d+$", "", part) for part in op.split("_") if part and part != "fused"]


def is_winograd(op: str) -> bool:
    """Whether ``op`` names a Winograd convolution kernel (``hooks.rewrites.winograd``)."""
    return _ops(op)[:2] == ["conv2d", "winograd"]


def direct_equivalent(op: str, args_info: list[Any]) -> tuple[str, list[Any]]:
    """The direct convolution a Winograd kernel replaces, as (op, args_info): its weights ``(α, α, in, out)`` become
    OIHW 3×3; any other kernel as it is. Its baselines and its FLOPs are the direct convolution's."""
    if not is_winograd(op) or len(args_info) < 2 or len(args_info[1][2]) != 4:
        return op, args_info
    kind, dtype, (_, _, in_channels, out_channels) = args_info[1]
    direct = re.sub(r"_winograd\d*", "", op, count=1)
    return direct, [args_info[0], [kind, dtype, [out_channels, in_channels, 3, 3]], *args_info[2:]]


def in_nchw(op: str, args_info: list[Any], layout: str) -> list[Any]:
    """``args_info`` of a kernel compiled with convolutions in ``layout`` ("given" or "NHWC", ``hooks.rewrites.layouts``), as the
    same kernel's in NCHW data and OIHW weights: the layout numpy's and PyTorch's baselines compute a convolution in
    (the libraries' own, as their users run them). Every 4-D tensor but the weights is NHWC there, the weights OHWI."""
    if layout == "given" or _ops(op)[:1] != ["conv2d"]:
        return args_info
    if layout != "NHWC":
        raise ValueError(f"no baseline for convolutions in layout {layout!r}")

    def moved(info: Any) -> Any:  # NHWC -> NCHW, and OHWI -> OIHW alike: the last axis moves to the second place
        kind, dtype, shape = info
        return [kind, dtype, [shape[0], shape[3], shape[1], shape[2]]] if len(shape) == 4 else info

    return [moved(info) for info in args_info]


def _epilogue(ops: list[str], extra: list[Any], relu: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def apply(y: Any) -> Any:
        rest = iter(extra)
        for op in ops:
            if op == "add":
                y = y + next(rest)
            elif op == "multiply":
                y = y * next(rest)
            elif op == "relu":
                y = relu(y)
        return y

    return apply


def _conv2d(x: np.ndarray, w: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    n, c, h, _ = x.shape
    o, cg, kh, kw = w.shape
    groups = c // cg
    stride, pad = h // out_hw[0] if out_hw[0] else 1, kh // 2
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = out_hw
    cols = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride][:, :, :oh, :ow]
    cols = cols.reshape(n, groups, cg, oh, ow, kh, kw)
    wg = w.reshape(groups, o // groups, cg, kh, kw)
    if groups == 1:
        patches = cols[:, 0].transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, cg * kh * kw)
        y = patches @ wg[0].reshape(o, -1).T
        return y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    return np.einsum("ngchwij,gocij->ngohw", cols, wg, optimize=True).reshape(n, o, oh, ow)


def numpy_kernel(op: str, args_info: list[Any]) -> Callable[[], Any] | None:
    """A zero-argument callable computing the kernel in numpy on random inputs, or None."""
    return kernel_baseline(op, args_info, "numpy")


def supported(op: str, args_info: list[Any]) -> bool:
    """Whether a kernel has baselines: a matmul or conv2d whose add/multiply/relu epilogue takes only tensor arguments.

    (A multiply by a constant folded into the kernel, as attention's scaling, has no argument to read it from.)
    """
    op, args_info = direct_equivalent(op, args_info)
    ops = _ops(op)
    binary = sum(o in ("add", "multiply") for o in ops[1:])
    shapes = [a[2] for a in args_info]
    convolution = ops[:1] == ["conv2d"] and len(shapes) >= 2 and len(shapes[0]) == len(shapes[1]) == 4
    return (ops[:1] == ["matmul"] or convolution) and set(ops[1:]) <= _EPILOGUE and len(args_info) == 3 + binary


def kernel_baseline(op: str, args_info: list[Any], library: str = "numpy") -> Callable[[], Any] | None:
    """The kernel in ``library`` ("numpy" or "torch") on random inputs, or None when it has no equivalent.

    Raises ImportError for "torch" when PyTorch is not installed.
    """
    if not supported(op, args_info):
        return None
    op, args_info = direct_equivalent(op, args_info)
    ops = _ops(op)
    arrays = random_arguments(args_info)
    inputs, out = arrays[:-1], arrays[-1]
    out_hw = (out.shape[2], out.shape[3]) if ops[0] == "conv2d" else (0, 0)
    if library == "torch":
        return _torch_kernel(ops, inputs, out_hw)
    if library != "numpy":
        raise ValueError(f"unknown baseline library {library!r}")
    a, b = inputs[0], inputs[1]
    tail = _epilogue(ops[1:], list(inputs[2:]), lambda y: np.maximum(y, 0))
    if ops[0] == "matmul":
        return lambda: tail(np.matmul(a, b))
    return lambda: tail(_conv2d(a, b, out_hw))


def _torch_kernel(ops: list[str], inputs: list[np.ndarray], out_hw: tuple[int, int]) -> Callable[[], Any]:
    import torch

    a, b, *extra = (torch.from_numpy(x) for x in inputs)
    tail = _epilogue(ops[1:], extra, torch.relu)
    if ops[0] == "matmul":
        return lambda: _no_grad(lambda: tail(torch.matmul(a, b)))
    stride, groups = a.shape[2] // out_hw[0], a.shape[1] // b.shape[1]
    conv = torch.nn.functional.conv2d
    return lambda: _no_grad(lambda: tail(conv(a, b, stride=stride, padding=b.shape[2] // 2, groups=groups)))


def _no_grad(fn: Callable[[], Any]) -> Any:
    import torch

    with torch.inference_mode():
        return fn()


#: Seconds for a library's spinning worker threads (TVM's pool, OpenBLAS's, PyTorch's OpenMP) to go idle. On
#: 2 cores a pool still spinning starves the next library's barriers: the demo's PyTorch baseline, timed right
#: after numpy and TVM, read 12.2 ms in one of three runs against 0.34-0.35 in the others.
SPIN_DOWN_SECS = 0.5


def spin_down() -> None:
    """Wait until the last library's worker threads stopped spinning, before timing another one."""
    time.sleep(SPIN_DOWN_SECS)


def time_callable(fn: Callable[[], Any], repeat: int = 5, min_secs: float = 0.1) -> list[float]:
    """Per-call seconds: ``repeat`` samples, each averaging enough calls to last ``min_secs``."""
    fn()  # warm-up
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < min_secs / 4 or calls == 0:
        fn()
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    number = max(1, int(min_secs / max(per_call, 1e-9)))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return samples
