"""Small Relax networks with weights bound as constants (as ``torch.export`` imports a trained model), their runs,
and registries of records for their kernels: what the rewrite tests (layouts, fast math, prepacking) share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from schedhub.registry import Identity, LocalRegistry, Record


def bound(module: nn.Module, input_shape: tuple[int, ...], scale: float = 1.0) -> tvm.IRModule:
    """``module``'s ``forward`` on a float32 input of ``input_shape``, its weights random (seed 0, times ``scale``) and bound."""
    mod, params = module.export_tvm({"forward": {"x": nn.spec.Tensor(input_shape, "float32")}})
    rng = np.random.default_rng(0)
    weights = {name: tvm.runtime.tensor((rng.standard_normal([int(d) for d in p.shape]) * scale).astype("float32")) for name, p in params}
    return relax.transform.BindParams("forward", weights)(mod)


def run(ex: tvm.runtime.Executable, x: np.ndarray) -> np.ndarray:
    """The compiled network's output on ``x`` (this CPU)."""
    return relax.VirtualMachine(ex, tvm.cpu())["forward"](tvm.runtime.tensor(x)).numpy()


def store_of(root: Path, identities: Iterable[Identity], record: Callable[[Identity], Record]) -> Path:
    """A registry at ``root`` holding ``record(identity)`` for each identity."""
    with LocalRegistry(root) as reg:
        for identity in identities:
            reg.put(record(identity))
    return root


def use_transfers(*args: Any, **kwargs: Any) -> Any:
    """``hooks.use`` as the tests of transfers need it: the CPU rules off (an untimed compile with them ranks the rules'
    schedules ahead of transfers on a CPU, and a measured one times them beside), and the given layout with unpacked
    weights where a test names neither (their records are tuned so; left to "auto", an AVX2 CPU would compile the
    network NHWC prepacked, which none of them holds)."""
    from schedhub.hooks import use

    return use(*args, **{"rules": False, "layout": "given", "prepack": False, **kwargs})
