"""A network compiled through the hook from a registry and timed: what ``schedhub tune --until`` checks its estimate
against (:func:`.network.tune_network`'s ``measure``).

The estimate (Σ calls × each kernel's best time alone) runs ahead of the network: each kernel was timed on the same
arguments again and again, its weights in cache, where inside the network it finds them out of it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from schedhub.hooks.rewrites import Rewrites
from schedhub.registry import Registry

#: Seconds to wait before timing: the tuner's worker processes' TVM thread pools spin on for a moment after a task.
SETTLE_SECS = 1.0


def entry_function(mod: Any) -> str:
    """The module's entry: ``forward`` (TVM's ``nn.Module`` export) or ``main`` (the frontends' imports)."""
    names = {gv.name_hint for gv in mod.functions}
    for name in ("forward", "main"):
        if name in names:
            return name
    raise ValueError(f"the model has neither a 'forward' nor a 'main' function (it has {sorted(names)})")


def random_inputs(mod: Any, func: str, seed: int = 0) -> list[np.ndarray]:
    """Standard-normal inputs for ``func``'s parameters, which must all be tensors of static shapes."""
    import tvm
    from tvm import relax

    rng = np.random.default_rng(seed)
    inputs = []
    for param in mod[func].params:
        info = param.ty
        if not isinstance(info, relax.TensorType) or info.shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in info.shape.values):
            raise ValueError(f"input {param.name_hint} of {func} is not a tensor of a static shape ({info}): the network cannot be timed")
        shape = tuple(int(d) for d in info.shape.values)
        inputs.append(rng.standard_normal(shape).astype(str(info.dtype)))
    return inputs


def time_network(ex: Any, func: str, inputs: list[np.ndarray], repeat: int = 5, min_repeat_ms: int = 200) -> float:
    """Median seconds of one call of ``func`` on the CPU over ``repeat`` samples of at least ``min_repeat_ms`` each."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    vm[func](*args)  # warm-up: the thread pool started, the code paged in
    timer = vm.time_evaluator(func, dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return statistics.median(timer(*args).results)


def hooked_network_secs(mod: Any, registry: Registry, target: Any, rewrites: Rewrites, settle_secs: float = SETTLE_SECS) -> float:
    """``mod`` compiled for the CPU ``target`` through the hook from ``registry`` with ``rewrites``, and timed
    (:func:`time_network`) after ``settle_secs``."""
    import tvm

    from schedhub.hooks import use

    func = entry_function(mod)
    inputs = random_inputs(mod, func)
    with use(registry, target, report_misses=False, layout=rewrites.layout, math=rewrites.math, prepack=rewrites.prepack, conv=rewrites.conv):
        ex = tvm.compile(mod, tvm.target.Target(target))
    time.sleep(settle_secs)
    return time_network(ex, func, inputs)
