"""PyTorch baselines timed in a process of their own, which never imports TVM; and the engines a user would pick
instead (``engine=``: Inductor, ONNX Runtime, OpenVINO, :mod:`.engines`), each in a process of its own, its output checked
against eager PyTorch's before it is timed.

In a process that had imported TVM, PyTorch's ResNet-18 was seen 25–35× slower, intermittently
(two runtimes' thread pools on the same cores). So the demo and the benchmarks keep PyTorch in a
child process and talk to it in JSON lines over its stdin/stdout; arrays travel as ``.npy``/``.npz``
files loaded with ``allow_pickle=False``; the network's PyTorch twin comes from a factory named
``module:function`` (imported by name in the child). The child stays up for a whole run, so its
timings still interleave with TVM's round by round.

    with TorchProcess() as torch_proc:
        out = torch_proc.load_network("mlp", weights, x, batch=4)   # its output, to check against TVM's
        secs = torch_proc.time_network()                             # seconds per forward pass
        secs = torch_proc.time_kernel("fused_matmul_add_relu", args_info)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import engines
from .engines import check_engine

#: The default factory: the shipped MLP (the demo's model) from its Relax weights.
MLP_FACTORY = "schedhub.tuner.compare.torch_process:mlp_twin"


#: What holds PyTorch's CPU kernels (ATen's, oneDNN's, MKL's) to one instruction set: its baseline for code TVM built for an
#: older CPU than this one (``bench.models --mcpu``), timed on the same vectors.
ISA_ENV: dict[str, dict[str, str]] = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


class TorchProcessError(RuntimeError):
    """The PyTorch process failed a request (its message says why)."""


class TorchProcess:
    """The PyTorch child; ``cwd`` where its factory modules import from (``bench`` needs the repository root).

    ``device``: ``"cpu"`` or ``"cuda"``; ``isa``: on a CPU, the instruction set its kernels are held to (:data:`ISA_ENV`;
    None: the best this CPU has). On CUDA, TF32 is off (fp32 matmuls and convolutions, as TVM
    computes them) and a timed forward pass ends when the GPU has finished it (synchronized), the
    input already on the device, as TVM's timings are taken."""

    def __init__(self, cwd: str | Path | None = None, device: str = "cpu", isa: str | None = None, engine: str = "pytorch") -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"PyTorch baselines run on 'cpu' or 'cuda', not {device!r}")
        if isa is not None and isa not in ISA_ENV:
            raise ValueError(f"PyTorch is held to one of {', '.join(ISA_ENV)}, not {isa!r}")
        check_engine(engine, device)  # a missing package is one line here, not a child's traceback
        self.engine = engine
        self._dir = tempfile.TemporaryDirectory(prefix="schedhub-torch-")
        env = {**os.environ, **ISA_ENV[isa]} if isa is not None else None
        self._proc = subprocess.Popen([sys.executable, "-u", "-m", "schedhub.tuner.compare.torch_process", device, engine], cwd=cwd, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip

    def __enter__(self) -> TorchProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(30)
        self._dir.cleanup()

    def _ask(self, **request: Any) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise TorchProcessError(f"the PyTorch process exited (code {self._proc.wait(10)})")
        answer = json.loads(line)
        if "error" in answer:
            raise TorchProcessError(answer["error"])
        return answer

    def load_network(self, name: str, weights: dict[str, np.ndarray], x: np.ndarray, factory: str = MLP_FACTORY, **shape: int) -> np.ndarray:
        """Build the PyTorch twin of shipped model ``name`` with these weights (``factory(name, weights, **options)``);
        its output on ``x`` as the process's engine computes it (checked against eager PyTorch's)."""
        from ..networks.models import MODELS  # here, not in the PyTorch process: it imports TVM

        if name in MODELS:
            shape = {**MODELS[name].defaults, **shape}
        folder = Path(self._dir.name)
        np.savez(folder / "weights.npz", **weights)
        np.save(folder / "x.npy", x)
        self._ask(cmd="load", name=name, factory=factory, dir=str(folder), shape=shape)
        return np.load(folder / "out.npy", allow_pickle=False)

    def load_module(self, factory: str, input_shapes: list[list[int]], threads: int) -> None:
        """Build a PyTorch module from ``factory`` (``pkg.mod:function``, called with no arguments; eval mode) with random
        inputs of ``input_shapes``, on ``threads`` threads: the model a user brought, to time as it is."""
        self._ask(cmd="load_module", factory=factory, shapes=input_shapes, threads=threads)

    def time_network(self, repeat: int = 3, min_secs: float = 0.1) -> float:
        """Median seconds per forward pass of the loaded network."""
        return float(self._ask(cmd="time", repeat=repeat, min_secs=min_secs)["secs"])

    def cpu_capability(self) -> str:
        """The instruction set PyTorch's vectorized CPU kernels run (``torch.backends.cpu.get_cpu_capability``: "AVX512", "AVX2"…)."""
        return str(self._ask(cmd="capability")["capability"])

    def time_kernel(self, op: str, args_info: list[Any], repeat: int = 5, min_secs: float = 0.05) -> float | None:
        """Median seconds of PyTorch's equivalent of a fused kernel (None: no equivalent)."""
        secs = self._ask(cmd="kernel", op=op, args_info=args_info, repeat=repeat, min_secs=min_secs)["secs"]
        return None if secs is None else float(secs)


def mlp_twin(name: str, weights: dict[str, np.ndarray], features: int, hidden: int, classes: int = 10, **_: int) -> Any:
    """The shipped MLP (``fc1``, ``fc2``, ``head`` with ReLUs) in PyTorch, carrying the Relax weights."""
    import torch

    if name != "mlp":
        raise ValueError(f"the default factory builds the shipped mlp only, not {name!r}")
    net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, classes))  # fmt: skip
    state = {f"{i}.{part}": torch.from_numpy(np.ascontiguousarray(weights[f"{layer}.{part}"]))
             for i, layer in ((0, "fc1"), (2, "fc2"), (4, "head")) for part in ("weight", "bias")}  # fmt: skip
    net.load_state_dict(state, strict=True)
    return net.eval()


def _forward(net: Any, x: Any) -> np.ndarray:
    """``net`` on ``x`` (a tensor on the net's device): the output in host memory."""
    import torch

    with torch.inference_mode():
        return net(x).cpu().numpy()


def _timed_forward(net: Any, x: Any, device: str) -> Any:
    """One forward pass that returns when the device is done with it (the output stays there)."""
    import torch

    def run() -> None:
        with torch.inference_mode():
            net(*x) if isinstance(x, tuple) else net(x)
        if device == "cuda":
            torch.cuda.synchronize()

    return run


def _prepare_device(device: str) -> None:
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


#: How far an engine's output may be from eager PyTorch's, relative to the output's scale.
ENGINE_MAX_REL_ERROR = 1e-3


def _engine_run(engine: str, net: Any, x: Any, threads: int, folder: Path, device: str) -> tuple[Any, np.ndarray]:
    """``net`` on ``x`` as ``engine`` runs it: the run, and its output, checked against eager PyTorch's."""
    inputs = x if isinstance(x, tuple) else (x,)
    expected = engines.compiled("pytorch", net, inputs, threads, folder, device)()
    run = engines.compiled(engine, net, inputs, threads, folder, device)
    out = run()
    error = float(np.abs(out - expected).max()) / (float(np.abs(expected).max()) or 1.0) if out.shape == expected.shape else float("inf")
    if not error <= ENGINE_MAX_REL_ERROR:
        raise RuntimeError(f"{engine}'s output is {error:.3g} of its scale from eager PyTorch's (at most {ENGINE_MAX_REL_ERROR:g})")
    return run, out


def _serve(device: str = "cpu", engine: str = "pytorch") -> None:
    """The child: answers one JSON request per line until stdin closes."""
    import importlib
    import statistics

    import torch

    from . import baselines

    answers = os.fdopen(os.dup(1), "w")  # the protocol's own: what libraries print (ONNX's exporter does) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _prepare_device(device)
    net: Any = None
    x: Any = None
    run: Any = None  # the loaded network as the engine runs it (eager PyTorch: timed as before, the device synchronized)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["cmd"] == "load":
                folder = Path(request["dir"])
                with np.load(folder / "weights.npz", allow_pickle=False) as loaded:
                    weights = {k: loaded[k] for k in loaded.files}
                module, _, function = request["factory"].partition(":")
                loaded_net = getattr(importlib.import_module(module), function)(request["name"], weights, **request["shape"]).to(device)
                net, x = loaded_net, torch.from_numpy(np.load(folder / "x.npy", allow_pickle=False)).to(device)
                if engine == "pytorch":
                    run, out = None, _forward(net, x)
                else:
                    run, out = _engine_run(engine, net, x, torch.get_num_threads(), folder, device)
                np.save(folder / "out.npy", out)
                answer: dict[str, Any] = {"ok": True}
            elif request["cmd"] == "load_module":
                torch.set_num_threads(int(request["threads"]))
                module, _, function = request["factory"].partition(":")
                net = getattr(importlib.import_module(module), function)().eval().to(device)
                x = tuple(torch.randn(*shape, device=device, generator=torch.Generator(device).manual_seed(0)) for shape in request["shapes"])
                run = None if engine == "pytorch" else _engine_run(engine, net, x, int(request["threads"]), Path(tempfile.mkdtemp()), device)[0]
                answer = {"ok": True}
            elif request["cmd"] == "time":
                samples = baselines.time_callable(run or _timed_forward(net, x, device), request["repeat"], request["min_secs"])
                answer = {"secs": statistics.median(samples)}
            elif request["cmd"] == "kernel":
                fn = baselines.kernel_baseline(request["op"], request["args_info"], "torch")
                answer = {"secs": statistics.median(baselines.time_callable(fn, request["repeat"], request["min_secs"])) if fn else None}
            elif request["cmd"] == "capability":
                answer = {"capability": torch.backends.cpu.get_cpu_capability()}
            else:
                answer = {"error": f"unknown request {request['cmd']!r}"}
        except Exception as exc:  # the parent gets the reason, the child keeps serving
            answer = {"error": f"{exc.__class__.__name__}: {exc}"}
        if "tvm" in sys.modules:
            answer = {"error": "TVM got imported into the PyTorch process"}
        print(json.dumps(answer), file=answers, flush=True)


if __name__ == "__main__":
    _serve(*sys.argv[1:3])
