"""Model benchmark, after the Ansor artifact's evaluation: network × batch → PyTorch, untuned TVM, schedhub-tuned.

    python -m bench.models [--quick] [--trials N] [--networks a,b] [--seed-store DIR] [--out bench/results/<mode>/models.json]
    python -m bench.models --device cuda [--trials N] [--networks a,b] [--seed-store DIR]   # on a GPU: bench/results/gpu/

On a GPU (``--device cuda``, the "gpu" mode) the target is the device's own (``Target.from_device``),
the default every record must beat is DLight's schedule (TVM's GPU default), PyTorch runs on
the GPU with TF32 off, and timings end when the GPU is done; the per-kernel numpy rows are left out.

Quick mode: every shipped network (ResNet-18, MobileNet-V2, a BERT-base layer, an MLP) at small
shapes, batch 1 and 4. Full mode: the networks at real sizes, ResNet-18 and MobileNet-V2 at 224
imported from their PyTorch twins through ``torch.export`` (BatchNorm folded, as a user imports a
trained model), at a budget of 64 trials per kernel. PyTorch always runs in a process of its own
(``schedhub.tuner.compare.torch_process``: beside TVM it was seen 25–35× slower).

1. the kernels are tuned with ``schedhub.tuner`` on a local Ray cluster into an embedded LMDB
   registry (a kernel shared with an earlier network is not tuned twice), budget from the mode;
   ``--seed-store`` starts that registry as a copy of another (say the quick run's), so the
   search is warm-started from its schedules of the same ops at other shapes, and its records of
   the very same kernels are tuned again at this budget; then the Ray cluster stops, so that
   nothing else runs on the cores while timing;
2. the model (seeded weights bound) compiles with plain ``tvm.compile`` (TVM's default
   schedules) and with ``schedhub.hooks.use(registry)``, where every kernel must hit;
3. the PyTorch twin (``bench.torch_models``, same weights) runs the same input in the PyTorch
   process; the three outputs are checked against each other;
4. untuned, tuned and PyTorch forward passes are timed side by side: rounds interleave the three,
   each sample is a median over repeats after warm-up.

Per kernel, the untuned and tuned times are the tuner's side-by-side re-measurement; numpy and
PyTorch equivalents (matmul, conv2d) are timed at the kernel's shapes (numpy here, PyTorch in its
process), and so is a large square sgemm: the machine's practical peak for this run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from schedhub.hooks.rewrites.layouts import LAYOUTS
from schedhub.hooks.rewrites import MATHS, Rewrites
from schedhub.hooks.rewrites.winograd import CONVS
from schedhub.registry import LocalRegistry
from schedhub.tuner.compare import baselines
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.workloads import dispatch
from schedhub.tuner.networks import models
from schedhub.tuner.networks.allocation import POLICIES, Goal
from schedhub.tuner.networks.network import tune_network
from schedhub.tuner.networks.network_timing import hooked_network_secs
from schedhub.tuner.workloads.search import TuneOptions, TuneResult, default_label
from schedhub.tuner.compare.engines import ENGINES, EngineUnavailable, check_engine
from schedhub.tuner.compare.torch_process import TorchProcess

from .report import environment
from .stats import ratio, summary
from .torch_export import RELAX, TORCH_EXPORT, TORCH_EXPORT_PLAIN, import_twin
from .tuner import flops, require_device

@dataclass(frozen=True)
class Network:
    """One row of the table: a shipped network at a batch and shape, built in Relax or imported from its PyTorch twin."""

    name: str
    batch: int
    shape: dict[str, int] = field(default_factory=dict)
    frontend: str = RELAX  # or TORCH_EXPORT

    def label(self) -> str:
        return " ".join([self.name, f"b{self.batch}", *(f"{k} {v}" for k, v in self.shape.items())]) + (
            f" ({self.frontend})" if self.frontend != RELAX else "")


def _grid(networks: dict[str, dict[str, int]], batches: list[int]) -> list[Network]:
    return [Network(name, batch, shape) for name, shape in networks.items() for batch in batches]


#: The networks and tuning budgets of the two modes.
MODES: dict[str, dict[str, Any]] = {
    "full": {
        "networks": [Network("resnet18", 1, {"image": 224}, TORCH_EXPORT), Network("mobilenetv2", 1, {"image": 224}, TORCH_EXPORT),
                     Network("bert_layer", 1, {"seq": 128}), Network("mlp", 1), Network("mlp", 16)],  # fmt: skip
        # 64 candidates in rounds of 16; a population of 128 × 2 genetic rounds (MetaSchedule's 512 × 4
        # spends minutes per round searching on 2 cores for little gain at this budget).
        "options": TuneOptions(trials=64, trials_per_iter=16, population=128, genetic_iters=2),
        "rounds": 5,
    },
    "quick": {
        "networks": _grid({"resnet18": {"image": 64}, "mobilenetv2": {"image": 64}, "bert_layer": {"seq": 32}, "mlp": {}}, [1, 4]),
        # One round of 8 candidates from a small population: seconds per kernel instead of minutes.
        # One search thread: the seed then fixes the candidates, so a second run tunes the same ones.
        "options": TuneOptions(trials=8, trials_per_iter=8, population=32, genetic_iters=1, publish=2, search_threads=1,
                               final_timing={"number": 3, "repeat": 3, "min_repeat_ms": 20}),  # fmt: skip
        "rounds": 5,
    },
    "gpu": {
        "networks": [Network("mlp", 64, {"features": 1024, "hidden": 4096}), Network("bert_layer", 1, {"seq": 128}), Network("resnet18", 1, {"image": 224})],
        # 64 trials: on an H100 the MLP's 64×4096×4096 matmul tuned at 32 trials lost to DLight, at 64 it beat it.
        "options": TuneOptions(trials=64, trials_per_iter=32, population=256, genetic_iters=2),
        "rounds": 7,
    },
}

#: The practical peak: a square sgemm of this size in numpy (here) and PyTorch (its process).
PEAK_SGEMM_N = 2048


@dataclass(frozen=True)
class Spending:
    """How a network's trials are spent: each kernel the same budget (``policy`` None), or in rounds (of ``round_trials``)
    to the kernel a policy of ``tuner.networks.allocation`` picks (budget: trials per kernel × kernels), stopping early once the compiled network
    beats PyTorch's latency (``until_pytorch``: checked when the estimate does) or after ``max_minutes``; the networks rewritten as
    ``rewrites`` says (convolution layout, fast math: ``hooks.rewrites``)."""

    policy: str | None = None
    until_pytorch: bool = False
    max_minutes: float | None = None
    rewrites: Rewrites = Rewrites()
    warm_model: bool = True  # each search's cost model starts trained on the registry's log (a network's later rounds: on its earlier ones)
    round_trials: int | None = None  # trials a round (None: the mode's trials_per_iter); MetaSchedule's iterations inside stay that size


def networks_of(mode: str, only: list[str] | None = None, batch: int | None = None) -> list[Network]:
    """The ``mode``'s networks, those named ``only``, each at ``batch`` instead of its own (once: the full mode's MLP at b1
    and b16 is one network at ``batch``)."""
    networks = [n for n in MODES[mode]["networks"] if not only or n.name in only]
    if not networks:
        raise ValueError(f"no {mode} network is named {only}; there are {sorted({n.name for n in MODES[mode]['networks']})}")
    if batch is None:
        return networks
    at_batch = [replace(n, batch=batch) for n in networks]
    return [n for i, n in enumerate(at_batch) if n not in at_batch[:i]]


def run(mode: str, trials: int | None = None, only: list[str] | None = None, seed_store: Path | None = None, keep_store: Path | None = None,
        say: Callable[[str], None] = print, device: str = "cpu", spending: Spending = Spending(), batch: int | None = None,
        mcpu: str | None = None, engines: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """The table for ``mode``; ``trials`` overrides the mode's per-kernel budget, ``only`` keeps the networks of
    these names, ``batch`` runs each at that batch instead of the mode's (:func:`networks_of`), ``seed_store`` is copied
    in as the starting registry and the registry is copied out to ``keep_store`` at the end (a row tuned in runs that
    resume through the registry); ``device``: ``"cpu"`` or ``"cuda"``; ``spending``: how each network's trials are spent;
    ``mcpu``: the LLVM CPU to tune and compile for instead of this one (:func:`older_cpu`: PyTorch held to its vectors);
    ``engines``: what a user would run the network on instead, each timed beside eager PyTorch in a process of its own
    (``inductor``, ``onnxruntime``, ``openvino``: ``schedhub.tuner.compare.engines``), its output checked against PyTorch's."""
    import tvm

    from schedhub import hooks
    from schedhub.hooks.kernels.identity import target_text

    config = MODES[mode]
    options: TuneOptions = replace(config["options"], warm_model=spending.warm_model)
    if trials:
        options = replace(options, trials=trials, trials_per_iter=min(options.trials_per_iter, trials))
    networks = networks_of(mode, only, batch)
    on_gpu = device != "cpu"
    target, isa = older_cpu(mcpu) if mcpu else (tvm_env.device_target(device), None)
    tvm_env.prepare()
    out: dict[str, Any] = {**({"pytorch_isa": isa} if isa else {}), "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": environment()["commit"], "mode": mode,
                           "device": device, "device_name": str(tvm.cuda(0).device_name) if on_gpu else tvm_env.host_target()["mcpu"],
                           "default": default_label(target_text(target)), "target": json.loads(target_text(target)), "options": asdict(options),
                           "networks": [asdict(n) for n in networks], "rounds": config["rounds"], "rows": [], "kernels": [], "spending": asdict(spending)}  # fmt: skip
    tuned: dict[str, TuneResult] = {}
    with contextlib.ExitStack() as stack:
        # PyTorch never shares a process with TVM; it starts before Ray's workers and sleeps while they tune
        torch_proc = stack.enter_context(TorchProcess(cwd=Path(__file__).resolve().parent.parent, device=device, isa=isa))
        others = {e: stack.enter_context(TorchProcess(cwd=Path(__file__).resolve().parent.parent, device=device, isa=isa, engine=e)) for e in engines if e != "pytorch"}
        out["engines"] = ["pytorch", *others]
        cluster.start()
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-bench-models-"))) / "store"
        if seed_store is not None:
            shutil.copytree(seed_store, root)
        registry = stack.enter_context(LocalRegistry(root))
        if keep_store is not None:  # the next run resumes from it (--seed-store); kept also when a later step fails
            stack.callback(lambda: out.__setitem__("kept_bytes", keep_registry(registry, keep_store)))
        out["seed_keys"] = len(registry.summaries()) if seed_store is not None else 0
        configs = []
        for network in networks:
            started = time.time()
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="schedhub-export-")))
            mod, func, weights, input_shape = build_network(network, workdir)
            kernels = models.kernels(mod, target, spending.rewrites)
            if spending.policy is None:
                tuned_now, how = _tune_evenly(registry, network, kernels, tuned, options), None
            else:
                reference = None
                if spending.until_pytorch:
                    torch_proc.load_network(network.name, weights, network_input(input_shape), factory=TORCH_TWINS, batch=network.batch, **network.shape)
                    reference = torch_proc.time_network(repeat=5, min_secs=0.2)
                measure = None if on_gpu else partial(hooked_network_secs, mod, registry, target, spending.rewrites)  # the CPU's network only
                tuned_now, how = _tune_in_rounds(registry, network, kernels, tuned, options, spending, reference, say, measure)
            say(f"{network.label()}: {len(kernels)} kernels, {tuned_now} tuned now, {time.time() - started:.0f} s")
            configs.append((network, mod, func, weights, input_shape, kernels, tuned_now, time.time() - started, how))
        # Nothing of Ray may share the 2 cores with the timings: a busy raylet or worker stalls
        # PyTorch's spinning OpenMP barriers by whole scheduler ticks.
        cluster.stop()
        if not on_gpu:
            out["peak_gflops"], out["peak_sgemm_n"] = practical_peak(torch_proc), PEAK_SGEMM_N
            say(f"practical peak (sgemm {PEAK_SGEMM_N}): " + ", ".join(f"{k} {v:.1f} GFLOPS" for k, v in out["peak_gflops"].items()))
        for network, mod, func, weights, input_shape, kernels, tuned_now, tune_secs, how in configs:
            untuned_ex = tvm.compile(mod, target)
            with hooks.use(registry, target, layout=spending.rewrites.layout, math=spending.rewrites.math, prepack=spending.rewrites.prepack,
                           conv=spending.rewrites.conv) as session:
                tuned_ex = tvm.compile(mod, target)
            report = session.report
            if report.hits != len(kernels) or report.misses:
                raise RuntimeError(f"{network.label()}: the tuned compile hit {report.hits} of {len(kernels)} kernels")
            row = _time_network(network, func, weights, input_shape, untuned_ex, tuned_ex, config["rounds"], torch_proc, device, others)
            row.update({"kernels": len(kernels), "tuned_now": tuned_now, "tune_secs": tune_secs, "layout": spending.rewrites.layout, "math": spending.rewrites.math, "prepack": spending.rewrites.prepack, "conv": spending.rewrites.conv, "tuning": how,
                        "trials": how["trials"] if how else sum(tuned[k.identity.key].trials + tuned[k.identity.key].warm_started for k in kernels)})  # fmt: skip
            out["rows"].append(row)
            row["default_records"] = sum(bool(tuned[k.identity.key].records[0].provenance.get("default_schedule")) for k in kernels)
            if not on_gpu:
                out["kernels"] += [{**k, **asdict(spending.rewrites)} for k in _kernel_rows(network.name, network.batch, kernels, tuned, torch_proc, spending.rewrites.layout)]
            t = row["timing"]
            say(f"{network.label()}: " + ", ".join(f"{name} {t[name]['median']:.3f} ms" for name in ("pytorch", *others)) +
                f", untuned {t['untuned']['median']:.3f} ms, tuned {t['tuned']['median']:.3f} ms")
    return out


def older_cpu(mcpu: str) -> tuple[Any, str]:
    """This machine's CPU target with LLVM's ``mcpu`` CPU in its place, and the instruction set that holds PyTorch to the same
    vectors (:data:`~schedhub.tuner.compare.torch_process.ISA_ENV`): code for a CPU without AVX-512 (e.g. ``znver3``), timed on this one."""
    import tvm

    def has(feature: str, tgt: Any) -> bool:
        return bool(tvm.target.codegen.target_has_features(feature, tgt))

    host, target = tvm.target.Target(tvm_env.host_target()), tvm.target.Target({**tvm_env.host_target(), "mcpu": mcpu})
    if not has("avx512f", host) or has("avx512f", target) or not has("avx2", target):
        raise ValueError(f"--mcpu {mcpu}: an AVX2 CPU without AVX-512, on a machine with it (PyTorch is held to AVX2 only)")
    return target, "avx2"


def _tune_evenly(registry: LocalRegistry, network: Network, kernels: list[models.Kernel], tuned: dict[str, TuneResult], options: TuneOptions) -> int:
    """Each kernel not tuned yet gets ``options.trials``; returns how many were tuned."""
    todo = list({k.identity.key: k.identity for k in kernels if k.identity.key not in tuned}.values())
    # One job at a time: two jobs on 2 cores are no faster here, and one job's search and
    # verification run on the cores while the other's candidates are timed (Ray gives a
    # task's CPU back while it waits), which inflated some tuning measurements 3×.
    # retune: a seed store's record of the same kernel is a warm start, not this budget's result.
    done = dispatch.tune_many(registry, todo, options, concurrency=1, retune=True, pushed_by="bench.models")
    if done.failed:
        raise RuntimeError(f"{network.label()}: tuning failed for {len(done.failed)} kernels: {done.failed}")
    tuned.update({r.identity.key: r for r in done.tuned})
    return len(done.tuned)


def _tune_in_rounds(registry: LocalRegistry, network: Network, kernels: list[models.Kernel], tuned: dict[str, TuneResult], options: TuneOptions,
                    spending: Spending, reference_secs: float | None, say: Callable[[str], None], measure: Callable[[], float] | None) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """The network tuned in rounds of ``options.trials_per_iter`` (``tuner.networks.network``); each kernel's last round is its
    result (a round starts from the kernel's best so far, so its side-by-side timing holds the best). With
    ``reference_secs`` the estimate meeting it is checked by ``measure`` (the compiled network timed; None: not checked). Returns the kernels
    tuned and how: per round the trials, minutes and the network's estimate; the checks; why it stopped; PyTorch's latency it aimed at."""
    goal = Goal(latency_secs=reference_secs, max_trials=options.trials * len(kernels),
                max_secs=spending.max_minutes * 60 if spending.max_minutes else None)  # fmt: skip
    assert spending.policy is not None
    state = tune_network(registry, [(k.identity, k.calls) for k in kernels], options, POLICIES[spending.policy], goal,
                         round_trials=spending.round_trials or options.trials_per_iter, pushed_by="bench.models", measure=measure,
                         on_check=lambda c: say(f"{network.label()} check at {c.trials_spent} trials: compiled {c.measured_secs * 1e3:.3f} ms, "
                                                f"estimate {c.estimate_secs * 1e3:.3f} ms, PyTorch {reference_secs * 1e3:.3f} ms"),  # type: ignore[operator]
                         on_round=lambda r: say(f"{network.label()} round {r.number}: {r.kernel.op} ×{r.kernel.calls}, {r.trials_spent} trials, "
                                                f"{r.elapsed_secs / 60:.1f} min, estimate "
                                                + (f"{r.network_secs * 1e3:.3f} ms" if r.network_secs else "— (a kernel not timed yet)")))  # fmt: skip
    say(f"{network.label()}: stopped: {state.stopped_because}")
    for k in state.kernels:
        if k.failed:
            say(f"{network.label()}: {k.op} could not be tuned and keeps the default schedule: {k.failed}")
    tuned.update({r.kernel.key: r.result for r in state.rounds})
    rounds = [{"kernel": r.kernel.op, "trials": r.trials_spent, "minutes": r.elapsed_secs / 60, "estimate_ms": (r.network_secs or 0) * 1e3} for r in state.rounds]
    checks = [{"trials": c.trials_spent, "estimate_ms": c.estimate_secs * 1e3, "measured_ms": c.measured_secs * 1e3} for c in state.checks]
    return len({r.kernel.key for r in state.rounds}), {"policy": spending.policy, "round_trials": spending.round_trials or options.trials_per_iter, "rounds": rounds, "checks": checks,
                                                       "trials": state.trials, "stopped_because": state.stopped_because,
                                                       "failed": {k.op: k.failed for k in state.kernels if k.failed},
                                                       "pytorch_before_ms": reference_secs * 1e3 if reference_secs else None}  # fmt: skip


def keep_registry(registry: LocalRegistry, folder: Path) -> int:
    """The run's registry backed up into ``folder`` (its size in bytes). Where ``folder`` holds a store already (the
    run's ``--seed-store``, resumed in place), the copy replaces it once whole: a failure on the way leaves the old one."""
    if not (folder / "data.mdb").exists():
        return registry.backup(folder)
    fresh = Path(tempfile.mkdtemp(prefix=f".{folder.name}-new-", dir=folder.parent))
    size = registry.backup(fresh)
    replaced = Path(tempfile.mkdtemp(prefix=f".{folder.name}-old-", dir=folder.parent)) / folder.name
    folder.rename(replaced)
    fresh.rename(folder)
    shutil.rmtree(replaced.parent)
    return size


def check_keep_store(keep: Path | None, seed: Path | None) -> str | None:
    """Why ``--keep-store`` cannot take the run's registry, found before any tuning: it holds a store other than the
    run's ``--seed-store`` (None: it can)."""
    if keep is None or not (keep / "data.mdb").exists() or (seed is not None and keep.resolve() == seed.resolve()):
        return None
    return f"--keep-store {keep} already holds a store: name a new or empty folder, or the --seed-store to update it in place"


def build_network(network: Network, workdir: Path) -> tuple[Any, str, dict[str, np.ndarray], tuple[int, ...]]:
    """The network's module, entry function, weights and input shape."""
    mod, weights, input_shape = models.export_with_weights(network.name, batch=network.batch, **network.shape)
    if network.frontend in (TORCH_EXPORT, TORCH_EXPORT_PLAIN):
        twin = import_twin(network.name, weights, {"batch": network.batch, **network.shape}, workdir, plain=network.frontend == TORCH_EXPORT_PLAIN)
        return twin, "main", weights, input_shape
    if network.frontend != RELAX:
        raise ValueError(f"unknown frontend {network.frontend!r}")
    return mod, "forward", weights, input_shape


def practical_peak(torch_proc: TorchProcess, n: int = PEAK_SGEMM_N) -> dict[str, float]:
    """GFLOPS of a square float32 matmul of size ``n`` in numpy (this process) and PyTorch (its process)."""
    args_info = [["TENSOR", "float32", [n, n]]] * 3
    work = 2.0 * n**3
    numpy_fn = baselines.kernel_baseline("fused_matmul", args_info, "numpy")
    assert numpy_fn is not None
    numpy_secs = statistics.median(baselines.time_callable(numpy_fn, 5, 0.2))
    baselines.spin_down()  # OpenBLAS's spinning threads stop before PyTorch's start
    torch_secs = torch_proc.time_kernel("fused_matmul", args_info, repeat=5, min_secs=0.2)
    return {"numpy": work / numpy_secs / 1e9, **({"pytorch": work / torch_secs / 1e9} if torch_secs else {})}


TORCH_TWINS = "bench.torch_models:build"  # the PyTorch twins of every shipped network


def _time_network(network: Network, func: str, weights: dict[str, np.ndarray], input_shape: tuple[int, ...], untuned_ex: Any, tuned_ex: Any,
                  rounds: int, torch_proc: TorchProcess, device: str = "cpu", others: dict[str, TorchProcess] | None = None) -> dict[str, Any]:  # fmt: skip
    x = network_input(input_shape)
    pytorch = torch_proc.load_network(network.name, weights, x, factory=TORCH_TWINS, batch=network.batch, **network.shape)
    engines = {name: (proc.load_network(network.name, weights, x, factory=TORCH_TWINS, batch=network.batch, **network.shape), proc.time_network)
               for name, proc in (others or {}).items()}  # fmt: skip
    timing, errors = time_side_by_side({"untuned": untuned_ex, "tuned": tuned_ex}, x, rounds, pytorch, torch_proc.time_network, func, device, engines)
    check_agreement(network.label(), errors)
    return {"network": network.name, "batch": network.batch, "shape": network.shape, "frontend": network.frontend, "input_shape": list(input_shape),
            "timing": timing, "max_rel_error": errors, "speedup_vs_untuned": ratio(timing["untuned"], timing["tuned"], paired=True),
            **{f"speedup_vs_{name}": ratio(timing[name], timing["tuned"], paired=True) for name in ("pytorch", *engines)}}  # fmt: skip


#: How far (relative to the first output's scale) the outputs of one network's executables may differ.
MAX_REL_ERROR = 1e-3


def network_input(shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """The input every configuration of a network is timed and checked on (seeded: the same in every bench)."""
    return np.random.default_rng(1).standard_normal(shape).astype("float32")


def check_agreement(label: str, errors: dict[str, float]) -> None:
    """Raise when an output of :func:`time_side_by_side`'s ``errors`` is further than :data:`MAX_REL_ERROR` from the first's."""
    if max(errors.values(), default=0.0) > MAX_REL_ERROR:
        raise AssertionError(f"{label}: outputs disagree (max error relative to the output's scale: {errors})")


def time_side_by_side(executables: dict[str, Any], x: np.ndarray, rounds: int, pytorch_out: np.ndarray | None = None,
                      pytorch_timer: Callable[[], float] | None = None, func: str = "forward", device: str = "cpu",
                      engines: dict[str, tuple[np.ndarray, Callable[[], float]]] | None = None) -> tuple[dict[str, Any], dict[str, float]]:  # fmt: skip
    """Time the executables (on ``device``), PyTorch and the other ``engines`` (each in its process, when given: its output
    and its timer) in interleaved rounds, in ms; and the max error of each output relative to the first executable's
    output scale."""
    runs = {k: _vm_run(ex, x, func, device) for k, ex in executables.items()}
    torch = ({"pytorch": (pytorch_out, pytorch_timer)} if pytorch_timer is not None else {}) | (engines or {})
    outputs = {k: out for k, (out, _) in (runs | torch).items()}
    first = outputs[next(iter(executables))]
    scale = float(np.abs(first).max()) or 1.0
    errors = {k: float(np.abs(v - first).max()) / scale for k, v in list(outputs.items())[1:]}
    timers = {k: timer for k, (_, timer) in (runs | torch).items()}
    samples: dict[str, list[float]] = {k: [] for k in timers}
    for _ in range(rounds):
        for k, timer in timers.items():
            baselines.spin_down()  # the last one's pool (TVM's, PyTorch's in its process) idle: on 2 cores a spinning pool starves the next
            samples[k].append(timer() * 1e3)
    return {k: summary(v) for k, v in samples.items()}, errors


def _vm_run(ex: Any, x: np.ndarray, func: str = "forward", device: str = "cpu") -> tuple[np.ndarray, Callable[[], float]]:
    """One VM for ``ex`` on ``device``: its output on ``x`` (also the warm-up) and a timer giving seconds
    per forward pass (input already on the device), the median of 3 repeats of at least 100 ms each."""
    import tvm
    from tvm import relax

    dev = tvm.device(device)
    vm = relax.VirtualMachine(ex, dev)
    arg = tvm.runtime.tensor(x, dev)
    output = vm[func](arg)
    output = (output[0] if not hasattr(output, "numpy") else output).numpy()  # an imported model returns a tuple
    evaluator = vm.time_evaluator(func, dev, number=1, repeat=3, min_repeat_ms=100)
    return output, lambda: statistics.median(evaluator(arg).results)


def _kernel_rows(network: str, batch: int, kernels: list[models.Kernel], tuned: dict[str, TuneResult], torch_proc: TorchProcess,
                 layout: str = "given", baselined: int = 3) -> list[dict[str, Any]]:  # fmt: skip
    """One row per kernel, heaviest (untuned time × calls) first; the ``baselined`` heaviest matmul/conv kernels get numpy
    and PyTorch times (PyTorch in its own process), convolutions in NCHW whatever ``layout`` they were compiled in."""
    rows = sorted((_kernel_row(network, batch, k, tuned[k.identity.key]) for k in kernels), key=lambda r: -r["untuned_ms"] * r["calls"])
    heaviest = [r for r in rows if r["flops"]][:baselined]
    def numpy_secs(op: str, args_info: list[Any]) -> float | None:
        fn = baselines.kernel_baseline(op, args_info, "numpy")
        return statistics.median(baselines.time_callable(fn, 5, 0.05)) if fn else None

    def secs_or_none(secs_of: Callable[[str, list[Any]], float | None], row: dict[str, Any]) -> float | None:
        """A library's time for the row's kernel (in the library's layout), None where it fails: a baseline that
        cannot run must not cost the run its tuned network."""
        try:
            return secs_of(row["op"], baselines.in_nchw(row["op"], row["args_info"], layout))
        except Exception as exc:  # noqa: BLE001 — reported, and the row says it has no baseline
            print(f"{row['op']}: no baseline: {exc.__class__.__name__}: {exc}", flush=True)
            return None

    for library, secs_of in (("numpy", numpy_secs), ("torch", torch_proc.time_kernel)):
        # One library at a time, after the last one's worker threads stopped spinning: on 2 cores,
        # OpenBLAS's, PyTorch's and TVM's spinning pools starve each other's barriers (it showed as
        # single kernels at 0.1 GFLOPS).
        baselines.spin_down()
        for row in heaviest:
            secs = secs_or_none(secs_of, row)
            row[f"{library}_ms"] = secs * 1e3 if secs is not None else None
    return rows


def _kernel_row(network: str, batch: int, kernel: models.Kernel, result: TuneResult) -> dict[str, Any]:
    ident = kernel.identity
    work = flops(ident.args_info, ident.op) if baselines.supported(ident.op, ident.args_info) else None
    row: dict[str, Any] = {"network": network, "batch": batch, "op": kernel.name, "key": ident.key, "calls": kernel.calls, "flops": work,
                           "flops_direct_equivalent": baselines.is_winograd(ident.op),
                           "untuned_ms": result.untuned_secs * 1e3, "tuned_ms": (result.best_secs or result.untuned_secs) * 1e3,
                           "default_schedule": bool(result.records[0].provenance.get("default_schedule")),
                           "curve_ms": [(i, s * 1e3) for i, s in result.curve], "args_info": ident.args_info}  # fmt: skip
    return row


def merge(paths: list[Path]) -> dict[str, Any]:
    """Runs of one mode recorded one network at a time (hours each on 2 cores) as one table: their rows and kernels in order,
    each row with the command that recorded it and its CPU (runs may come from different machines); the first run's
    metadata, and every run's command. A run may itself be a merged table: its rows keep their own commands and CPUs."""
    runs = [json.loads(p.read_text()) for p in paths]
    if len({r["mode"] for r in runs}) != 1:
        raise SystemExit("--merge takes runs of one mode")
    out = {**runs[0], "rows": [], "kernels": [], "commands": [r["command"] for r in runs], "wall_secs": sum(r.get("wall_secs", 0.0) for r in runs)}
    for run in runs:
        own = {"command": run["command"], "recorded": run["recorded"], "commit": run["commit"], "cpu": run.get("device_name")}
        out["rows"] += [{**own, **row} for row in run["rows"]]  # a merged table's rows keep theirs
        peak = max(run.get("peak_gflops", {}).values(), default=None)
        rewrites = run.get("spending", {}).get("rewrites", {})  # what the run's compiles rewrote, on each kernel row
        out["kernels"] += [{**rewrites, "cpu": own["cpu"], **({"peak_gflops": peak} if peak else {}), **k} for k in run["kernels"]]  # each run's own peak and CPU
    out["command"] = "; ".join(out["commands"])
    return out


def _exit_on_signal(signum: int, _frame: Any) -> None:
    """A signal to stop, as an exit: the run's stack unwinds (its registry kept where --keep-store asks, Ray stopped)."""
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, help="trials per kernel (default: 8 quick, 64 full)")
    parser.add_argument("--networks", help="comma-separated names: only these networks of the mode")
    parser.add_argument("--batch", type=int, help="run each network at this batch instead of the mode's (a b1 run's --keep-store as --seed-store "
                        "warm-starts it)")  # fmt: skip
    parser.add_argument("--seed-store", type=Path, help="start the registry as a copy of this LMDB store (warm starts)")
    parser.add_argument("--keep-store", type=Path, help="copy the registry here at the end (a new or empty folder, or the --seed-store: updated in place): a later run's --seed-store")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the gpu mode's networks on this machine's GPU")
    parser.add_argument("--policy", choices=sorted(POLICIES), help="tune each network in rounds, each to the kernel this policy picks "
                        "(budget: --trials times the kernels) instead of --trials to every kernel")  # fmt: skip
    parser.add_argument("--until", choices=["pytorch"], help="with --policy: stop a network once it is faster than PyTorch (timed before it "
                        "is tuned): checked on the compiled network whenever the estimate is")  # fmt: skip
    parser.add_argument("--max-minutes", type=float, help="with --policy: stop a network's tuning after this many minutes")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="given", help="convert the networks' convolutions first (hooks.rewrites.layouts)")
    parser.add_argument("--math", choices=list(MATHS), default="exact", help="fast: GELU, erf, exp, tanh, softmax approximated (hooks.rewrites.fastmath)")
    parser.add_argument("--prepack", action="store_true", help="weights laid out by each kernel's schedule, packed at compile time (hooks.rewrites)")
    parser.add_argument("--conv", choices=list(CONVS), default="direct", help="winograd: 3×3 stride-1 convolutions by Winograd's F(4×4, 3×3), F(2×2, 3×3) on small images (hooks.rewrites.winograd)")
    parser.add_argument("--round-trials", type=int, help="with --policy: trials a round (default: the mode's 16 on a CPU, 32 on a GPU; Ansor's is 64)")
    parser.add_argument("--warm-model", action="store_true", default=True,
                        help="start each search's cost model trained on the registry's log (TuneOptions.warm_model; the default)")
    parser.add_argument("--cold-model", action="store_false", dest="warm_model",
                        help="start each search's cost model cold, as MetaSchedule does (rows recorded before warm was the default: cold)")
    parser.add_argument("--mcpu", help="tune and compile for this LLVM CPU instead of this machine's, e.g. znver3: AVX2 code on an AVX-512 "
                        "machine, PyTorch held to AVX2 too (a study of older CPUs; keep its --out apart from the table's)")  # fmt: skip
    parser.add_argument("--engines", default="pytorch", help="comma-separated engines timed beside schedhub, each in a process of its own: "
                        f"{', '.join(ENGINES)} (pip install 'schedhub[engines]'; pytorch is always timed)")  # fmt: skip
    parser.add_argument("--out", type=Path)
    parser.add_argument("--merge", type=Path, nargs="+", help="write these runs' tables as one (--out), tuning nothing")
    args = parser.parse_args()
    if args.merge:
        if not args.out:
            parser.error("--merge writes to --out")
        args.out.write_text(json.dumps(merge(args.merge), indent=1))
        return
    if (args.until or args.max_minutes or args.round_trials) and not args.policy:
        parser.error("--until, --max-minutes and --round-trials go with --policy")
    if args.round_trials is not None and args.round_trials < 1:
        parser.error("--round-trials takes 1 or more")
    require_device(parser.prog, args.device)
    if (why := check_keep_store(args.keep_store, args.seed_store)) is not None:
        parser.error(why)
    # a lent GPU machine's session ends the run with `timeout` (SIGTERM): unwound as an exit, it still keeps --keep-store
    signal.signal(signal.SIGTERM, _exit_on_signal)
    mode = "gpu" if args.device == "cuda" else "quick" if args.quick else "full"
    out = args.out or Path(__file__).parent / "results" / mode / "models.json"
    started = time.time()
    spending = Spending(args.policy, args.until == "pytorch", args.max_minutes, Rewrites(args.layout, args.math, args.prepack, args.conv), args.warm_model, args.round_trials)
    if args.batch is not None and args.batch < 1:
        parser.error("--batch must be at least 1")
    engines = tuple(dict.fromkeys(e.strip().lower() for e in args.engines.split(",") if e.strip()))
    try:
        for engine in engines:
            check_engine(engine, args.device)
    except (ValueError, EngineUnavailable) as exc:
        parser.error(str(exc))
    if args.mcpu:
        if args.device != "cpu" or not args.out:
            parser.error("--mcpu is a CPU study: it takes --out (a file apart from the table's)")
        try:
            older_cpu(args.mcpu)
        except ValueError as exc:
            parser.error(str(exc))
    result = run(mode, args.trials, args.networks.split(",") if args.networks else None, args.seed_store, args.keep_store, device=args.device, spending=spending,
                 batch=args.batch, mcpu=args.mcpu, engines=engines)  # fmt: skip
    result["wall_secs"] = time.time() - started
    result["command"] = " ".join(["python -m bench.models", *(["--quick"] if args.quick else []), *([f"--device {args.device}"] if args.device != "cpu" else []),
                                  *([f"--trials {args.trials}"] if args.trials else []),
                                  *([f"--networks {args.networks}"] if args.networks else []), *([f"--engines {','.join(engines)}"] if engines != ("pytorch",) else []), *([f"--mcpu {args.mcpu}"] if args.mcpu else []), *([f"--batch {args.batch}"] if args.batch else []), *(["--seed-store DIR"] if args.seed_store else []), *(["--keep-store DIR"] if args.keep_store else []),
                                  *(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k in ("policy", "until", "max_minutes", "round_trials") and v),
                                  *spending.rewrites.flags(), "--warm-model" if args.warm_model else "--cold-model"])  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
