"""The engines a user would run a PyTorch model on instead of schedhub, each as its documentation says it runs fastest.

Imported only in an engine's own process (:mod:`.torch_process`), which never imports TVM:

- ``pytorch``: eager PyTorch, ``torch.inference_mode``;
- ``inductor``: ``torch.compile`` (Inductor) with ``freezing`` (weights folded as constants) and the C++ wrapper, in
  ``max-autotune`` mode on a CPU (``SCHEDHUB_INDUCTOR_MODE`` names another, e.g. ``default``, where that takes too long);
- ``onnxruntime``: the model exported by ``torch.onnx.export``, run by ONNX Runtime with every graph optimization
  (``ORT_ENABLE_ALL``), sequential execution and ``threads`` intra-op threads;
- ``openvino``: the same ONNX file compiled by OpenVINO for its CPU plugin with the ``LATENCY`` hint, ``threads``
  inference threads and ``INFERENCE_PRECISION_HINT`` f32 (on AMX or bf16 CPUs it would otherwise run bf16).

Each gives a function that runs the model once on its inputs and returns its first output in numpy: what is checked
against eager PyTorch's output and what is timed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ENGINES: tuple[str, ...] = ("pytorch", "inductor", "onnxruntime", "openvino")
#: The packages an engine needs beyond PyTorch (``pip install 'schedhub[engines]'``).
PACKAGES: dict[str, tuple[str, ...]] = {"pytorch": (), "inductor": (), "onnxruntime": ("onnxruntime", "onnx", "onnxscript"),
                                        "openvino": ("openvino", "onnx", "onnxscript")}  # fmt: skip
GPU_ENGINES: tuple[str, ...] = ("pytorch", "inductor")


class EngineUnavailable(RuntimeError):
    """An engine that cannot run here: a package missing, or a device it does not run on."""


def check_engine(engine: str, device: str = "cpu") -> None:
    """Raise ValueError for an unknown engine, :class:`EngineUnavailable` (one line) where it cannot run here."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: schedhub times one of {', '.join(ENGINES)}")
    if device != "cpu" and engine not in GPU_ENGINES:
        raise EngineUnavailable(f"{engine} is timed on a CPU only here, not on {device}")
    missing = [name for name in PACKAGES[engine] if importlib.util.find_spec(name) is None]
    if missing:
        raise EngineUnavailable(f"{engine} is not installed ({', '.join(missing)} missing): pip install 'schedhub[engines]'")


def first_output(out: Any) -> np.ndarray:
    """A model's first output in host memory, as numpy (a tuple or list of outputs gives its first)."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out.detach().cpu().numpy() if hasattr(out, "detach") else np.asarray(out)


def compiled(engine: str, net: Any, inputs: tuple[Any, ...], threads: int, workdir: Path, device: str = "cpu") -> Callable[[], np.ndarray]:
    """``net`` (a PyTorch module in eval mode) on ``inputs`` (tensors on ``device``) as ``engine`` runs it."""
    check_engine(engine, device)
    if engine == "pytorch":
        return _eager(net, inputs)
    if engine == "inductor":
        return _inductor(net, inputs, device)
    onnx_file = exported(net, inputs, workdir)
    arrays = [x.detach().cpu().numpy() for x in inputs]
    return _onnxruntime(onnx_file, arrays, threads) if engine == "onnxruntime" else _openvino(onnx_file, arrays, threads)


def _eager(net: Any, inputs: tuple[Any, ...]) -> Callable[[], np.ndarray]:
    import torch

    def run() -> np.ndarray:
        with torch.inference_mode():
            return first_output(net(*inputs))

    return run


def _inductor(net: Any, inputs: tuple[Any, ...], device: str) -> Callable[[], np.ndarray]:
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True  # weights as constants, folded into the graph (inference)
    inductor_config.cpp_wrapper = True
    mode = os.environ.get("SCHEDHUB_INDUCTOR_MODE", "max-autotune" if device == "cpu" else "max-autotune-no-cudagraphs")
    fast = torch.compile(net, backend="inductor", mode=mode)
    with torch.no_grad():  # freezing needs no_grad, not inference_mode
        fast(*inputs)  # compiles

    def run() -> np.ndarray:
        with torch.no_grad():
            return first_output(fast(*inputs))

    return run


def exported(net: Any, inputs: tuple[Any, ...], workdir: Path) -> Path:
    """``net`` exported to ONNX by ``torch.onnx.export`` (the dynamo exporter), as ONNX Runtime and OpenVINO read it."""
    import torch

    path = workdir / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(net, inputs, str(path), dynamo=True, external_data=False)
    return path


def onnxruntime_options(threads: int) -> Any:
    """ONNX Runtime's session options as its documentation says a latency-bound CPU model runs fastest: every graph
    optimization, one request at a time on ``threads`` threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


def _onnxruntime(path: Path, arrays: list[np.ndarray], threads: int) -> Callable[[], np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), onnxruntime_options(threads), providers=["CPUExecutionProvider"])
    feeds = {arg.name: array for arg, array in zip(session.get_inputs(), arrays)}
    return lambda: first_output(session.run(None, feeds))


def _openvino(path: Path, arrays: list[np.ndarray], threads: int) -> Callable[[], np.ndarray]:
    import openvino as ov

    core = ov.Core()
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
    model = core.compile_model(core.read_model(str(path)), "CPU", config)
    request = model.create_infer_request()
    return lambda: first_output(request.infer(arrays)[model.output(0)])
