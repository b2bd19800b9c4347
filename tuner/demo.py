"""``schedhub demo``: the whole loop on embedded defaults, in one process tree.

1. a registry (LMDB in a fresh directory) served on 127.0.0.1 and a local Ray cluster start;
2. a shipped model compiles through the hook: every kernel misses and is queued;
3. a worker tunes the queue in the background (small budget) while a bar follows the queue;
4. the model compiles again: every kernel hits;
5. a table compares registry-tuned latency with numpy (and PyTorch when installed, in a process of its own), per
   kernel against TVM's unscheduled default and end to end against the first compile (on a CPU its misses ran the CPU
   rules' schedules), all measured in this run.

``device="cuda"`` runs it on this machine's GPU: the default is DLight's schedule there (what
"untuned" means on a GPU), and PyTorch runs on the GPU with TF32 off.
"""

from __future__ import annotations

import contextlib
import importlib.util
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schedhub.registry import RegistryClient, ServerThread

from .compare import baselines

from .execution import cluster

from .networks import models
from .workloads.search import TuneOptions, TuneResult, default_label
from .compare.torch_process import TorchProcess
from .execution.tvm_env import device_target, run_kernels_on_usable_cpus
from .worker import Worker

#: The demo model: an MLP at batch 32 (three dense kernels; a few minutes to tune on 2 cores).
DEMO_MODEL, DEMO_SHAPE = "mlp", {"batch": 32}


@dataclass
class DemoReport:
    kernels: list[dict[str, Any]] = field(default_factory=list)
    end_to_end: dict[str, float] = field(default_factory=dict)  # name → median ms
    first_compile: dict[str, int] = field(default_factory=dict)
    second_compile: dict[str, int] = field(default_factory=dict)
    registry: str = ""
    seconds: float = 0.0
    default: str = "untuned"  # what TVM runs without a record: "untuned" on a CPU, "DLight" on a GPU


def _vm_ms(ex: Any, x: np.ndarray, repeat: int = 7, device: str = "cpu") -> float:
    import tvm
    from tvm import relax

    dev = tvm.device(device)
    vm = relax.VirtualMachine(ex, dev)
    arg = tvm.runtime.tensor(x, dev)
    timer = vm.time_evaluator("forward", dev, number=20, repeat=repeat, min_repeat_ms=50)
    return statistics.median(timer(arg).results) * 1e3


def _numpy_mlp(weights: dict[str, np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def forward(x: np.ndarray) -> np.ndarray:
        h = np.maximum(x @ weights["fc1.weight"].T + weights["fc1.bias"], 0)
        h = np.maximum(h @ weights["fc2.weight"].T + weights["fc2.bias"], 0)
        return h @ weights["head.weight"].T + weights["head.bias"]

    return forward


def run(trials: int = 32, registry_dir: str | None = None, ray_address: str | None = None, say: Callable[[str], None] = print,
        on_queue: Callable[[int, int], None] | None = None, device: str = "cpu") -> DemoReport:  # fmt: skip
    """Run the demo on ``device`` (``"cpu"`` or ``"cuda"``); ``on_queue(done, total)`` follows the background tuning.
    Without ``registry_dir`` the registry lives in a temporary folder, removed when the demo ends."""
    if registry_dir is not None:
        return _run_demo(trials, registry_dir, ray_address, say, on_queue, device)
    with tempfile.TemporaryDirectory(prefix="schedhub-demo-") as scratch:
        report = _run_demo(trials, scratch, ray_address, say, on_queue, device)
    say(f"the demo's registry ({scratch}) was removed: pass --registry-dir to keep one")
    return report


def _run_demo(trials: int, registry_dir: str, ray_address: str | None, say: Callable[[str], None], on_queue: Callable[[int, int], None] | None,
              device: str) -> DemoReport:  # fmt: skip
    import tvm

    from schedhub import hooks
    from schedhub.hooks.kernels.identity import target_text

    run_kernels_on_usable_cpus()  # before a kernel runs: the target's cores, not half of them
    started = time.time()
    target = device_target(device)
    report = DemoReport(registry=registry_dir, default=default_label(target_text(target)))
    mod, weights, input_shape = models.export_with_weights(DEMO_MODEL, **DEMO_SHAPE)
    x = np.random.default_rng(1).standard_normal(input_shape).astype("float32")
    token = secrets.token_hex(16)
    with ServerThread(report.registry, tokens={token: "demo"}) as server, RegistryClient(server.url, token=token) as client:
        say(f"registry: {report.registry} served on {server.url}")
        say(f"ray: {cluster.start(ray_address)['address']}")
        with hooks.use(client, target) as session:
            untuned_ex = tvm.compile(mod, target)
        first = session.report
        report.first_compile = {"kernels": len(first.kernels), "hits": first.hits, "misses": first.misses}
        say(f"compile 1: {first.summary()}")
        results = _tune_queue(client, TuneOptions(trials=trials, trials_per_iter=min(16, trials)), on_queue)
        with hooks.use(client, target) as session:
            tuned_ex = tvm.compile(mod, target)
        second = session.report
        report.second_compile = {"kernels": len(second.kernels), "hits": second.hits, "misses": second.misses}
        say(f"compile 2: {second.summary()}")
    np.testing.assert_allclose(_run(tuned_ex, x, device), _numpy_mlp(weights)(x), rtol=1e-3, atol=1e-3)
    report.kernels = [_kernel_row(r) for r in results]
    report.end_to_end = _end_to_end(untuned_ex, tuned_ex, weights, x, device, report.default)
    report.seconds = time.time() - started
    return report


def _run(ex: Any, x: np.ndarray, device: str = "cpu") -> np.ndarray:
    import tvm
    from tvm import relax

    dev = tvm.device(device)
    return relax.VirtualMachine(ex, dev)["forward"](tvm.runtime.tensor(x, dev)).numpy()


def _tune_queue(client: RegistryClient, options: TuneOptions, on_queue: Callable[[int, int], None] | None) -> list[TuneResult]:
    """A worker drains the queue in a background thread; the caller sees the queue's progress."""
    # One model, a bar to the end: each job searched at once (a team's worker first passes every miss: see worker.py).
    worker = Worker(client, options, name="demo-worker", concurrency=2, lease_secs=120, poll_secs=0.5, first_pass=False, refine=False)  # a demo ends
    worker.publish_models = False  # nothing in the demo transfers: a served cost model would only delay its second compile
    total = client.stats()["queue"].get("pending", 0)
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(stats=worker.run(until_idle=True)), daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=1.0)
        if on_queue is not None:
            on_queue(client.stats()["queue"].get("done", 0), total)
    return outcome["stats"].results if "stats" in outcome else []


def _kernel_row(result: TuneResult) -> dict[str, Any]:
    ident = result.identity
    fn = baselines.numpy_kernel(ident.op, ident.args_info)
    if fn is not None:  # not while the last run's TVM threads spin (on 2 cores a kernel's numpy time came out above numpy's whole pass)
        baselines.spin_down()
    numpy_ms = statistics.median(baselines.time_callable(fn)) * 1e3 if fn else None
    tuned_ms = (result.best_secs or 0) * 1e3
    return {"op": ident.op, "key": ident.key[:12], "untuned_ms": result.untuned_secs * 1e3, "tuned_ms": tuned_ms,
            "numpy_ms": numpy_ms, "speedup": result.untuned_secs * 1e3 / tuned_ms if tuned_ms else None, "trials": result.trials}  # fmt: skip


def _end_to_end(untuned_ex: Any, tuned_ex: Any, weights: dict[str, np.ndarray], x: np.ndarray, device: str = "cpu",
                default: str = "untuned") -> dict[str, float]:  # fmt: skip
    """Median ms per forward pass, the configurations interleaved round by round (PyTorch, when
    installed, in a process of its own: beside TVM it was seen 25–35× slower)."""
    numpy_fn = _numpy_mlp(weights)
    samples: dict[str, list[float]] = {f"{default} TVM": [], "schedhub-tuned TVM": [], "numpy": []}
    with contextlib.ExitStack() as stack:
        torch_proc = stack.enter_context(TorchProcess(device=device)) if importlib.util.find_spec("torch") else None
        if torch_proc is not None:
            torch_out = torch_proc.load_network(DEMO_MODEL, weights, x, **DEMO_SHAPE)
            if not np.allclose(torch_out, numpy_fn(x), rtol=1e-3, atol=1e-3):
                raise RuntimeError("the PyTorch twin's output differs from numpy's: the baseline would time another model")
            samples["PyTorch"] = []
        for _ in range(3):  # each library timed after the last one's spinning threads went idle (2 cores)
            baselines.spin_down()
            samples[f"{default} TVM"].append(_vm_ms(untuned_ex, x, 3, device))
            samples["schedhub-tuned TVM"].append(_vm_ms(tuned_ex, x, 3, device))
            baselines.spin_down()
            samples["numpy"].append(statistics.median(baselines.time_callable(lambda: numpy_fn(x), 3, 0.05)) * 1e3)
            if torch_proc is not None:
                baselines.spin_down()
                samples["PyTorch"].append(torch_proc.time_network(3, 0.05) * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def render(report: DemoReport) -> list[list[str]]:
    """The report's rows for a table: per kernel, then end to end."""
    rows = []
    for k in report.kernels:
        rows.append([k["op"], f"{k['untuned_ms']:.3f}", f"{k['tuned_ms']:.3f}", f"{k['numpy_ms']:.3f}" if k["numpy_ms"] else "–",
                     f"{k['speedup']:.1f}×" if k["speedup"] else "–"])  # fmt: skip
    e = report.end_to_end
    if e:
        torch = f", PyTorch {e['PyTorch']:.3f}" if "PyTorch" in e else ""
        default = e[f"{report.default} TVM"]
        rows.append(["end to end (VM forward; left: the first compile)", f"{default:.3f}", f"{e['schedhub-tuned TVM']:.3f}", f"{e['numpy']:.3f}{torch}",
                     f"{default / e['schedhub-tuned TVM']:.1f}×"])  # fmt: skip
    return rows
