"""Fast math: a network compiled with ``math="fast"`` finds the records tuned with it, computes what the exact compile
computes to float32 rounding, calls no scalar ``erf``, and is a different set of kernels from the exact network
(hooks/rewrites/fastmath.py, hooks/rewrites/__init__.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.relax.frontend import nn

from schedhub.cli.tune_cmds import MATHS as CLI_MATHS
from schedhub.hooks import use
from schedhub.hooks.pipeline import fusion_passes
from schedhub.hooks.rewrites import MATHS, NO_REWRITES, Rewrites
from schedhub.tuner.networks import models

from .hand_tuner import tune
from .networks import bound, run, store_of

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})
FAST = Rewrites(math="fast")


class GeluBlock(nn.Module):
    """A transformer's feed-forward half in small: matmul + bias + GELU, matmul, softmax."""

    def __init__(self) -> None:
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.softmax(self.down(nn.op.gelu(self.up(x))), axis=-1)


def gelu_block() -> tvm.IRModule:
    return bound(GeluBlock(), (8, 16), scale=0.3)


@pytest.fixture(scope="module")
def fast_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry holding a real (hand-tuned, timed) record of every kernel of :func:`gelu_block` with fast math."""
    return store_of(tmp_path_factory.mktemp("fastmath") / "store", (k.identity for k in models.kernels(gelu_block(), CPU, FAST)), tune)


def test_fast_network_hits_every_kernel_and_computes_what_the_exact_one_does(fast_store: Path, tmp_path: Path) -> None:
    mod = gelu_block()
    x = np.random.default_rng(1).standard_normal((8, 16)).astype("float32") * 3
    expected = run(tvm.compile(mod, CPU), x)
    with use(fast_store, CPU, math="fast", trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        ex = tvm.compile(mod, CPU)
    kernels = models.kernels(mod, CPU, FAST)
    assert session.report.hits == len(kernels) and not session.report.misses, session.report.summary()
    np.testing.assert_allclose(run(ex, x), expected, rtol=1e-5, atol=1e-6)


def test_fast_kernels_call_no_scalar_erf_or_exp() -> None:
    """The exact network's GELU and softmax call erf and exp (scalar C library calls on x86); the fast one's do not."""

    def calls(rewrites: Rewrites) -> set[str]:
        with CPU:
            fused = fusion_passes(rewrites)(gelu_block())
        text = "\n".join(f.script() for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
        return {name for name in ("T.erf(", "T.exp(") if name in text}

    assert calls(Rewrites()) == {"T.erf(", "T.exp("}
    assert calls(FAST) == set()


def test_math_is_part_of_what_a_kernel_is(fast_store: Path, tmp_path: Path) -> None:
    """The exact compile finds none of the fast kernels' records: their workloads differ where math is computed."""
    exact = {k.identity.key for k in models.kernels(gelu_block(), CPU, NO_REWRITES)}
    fast = {k.identity.key for k in models.kernels(gelu_block(), CPU, FAST)}
    assert len(exact - fast) == 2 and len(fast - exact) == 2, (exact, fast)  # the GELU matmul and the softmax
    with use(fast_store, CPU, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        tvm.compile(gelu_block(), CPU)
    assert session.report.misses == 2 and session.report.hits == len(exact) - 2, session.report.summary()


def test_unknown_math_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'approximate'.*exact, fast"):
        Rewrites(math="approximate")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown math"), use(tmp_path / "store", CPU, math="quick"):  # type: ignore[arg-type]
        pass


def test_cli_offers_the_hooks_maths() -> None:
    assert tuple(CLI_MATHS) == MATHS
    assert FAST.flags() == ["--math", "fast"] and Rewrites().flags() == [] and Rewrites("NHWC", "fast").describe() == "convolutions NHWC, fast math"
