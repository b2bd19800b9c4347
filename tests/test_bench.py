"""The benchmark's baselines are the same computation as the kernels and models they are compared with."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from bench import report, torch_models
from schedhub.tuner import baselines, kernels, models
from schedhub.tuner.tvm_env import host_target

SMALL = {"mlp": {}, "resnet18": {"image": 32}, "mobilenetv2": {"image": 32}, "bert_layer": {"seq": 8}}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_pytorch_twin_loads_the_relax_weights_and_computes_the_same_outputs(name: str) -> None:
    mod, weights, input_shape = models.export_with_weights(name, batch=2, **SMALL[name])
    net = torch_models.build(name, weights, batch=2, **SMALL[name])  # strict: every name and shape must match
    x = np.random.default_rng(3).standard_normal(input_shape).astype("float32")
    expected = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target(host_target())), tvm.cpu())["forward"](tvm.runtime.tensor(x)).numpy()
    got = torch_models.forward(net, x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


def test_pytorch_twin_refuses_weights_of_another_shape() -> None:
    _, weights, _ = models.export_with_weights("mlp", hidden=64)
    with pytest.raises(RuntimeError, match="size mismatch"):
        torch_models.build("mlp", weights)  # default hidden 512


def test_kernel_baselines_compute_what_the_tvm_kernel_computes() -> None:
    """numpy and PyTorch baselines of every matmul/conv kernel (strided, depthwise, 1×1, batched) match TVM's build."""
    target = tvm.target.Target(host_target())
    checked = 0
    for name, shape in (("mobilenetv2", {"image": 32}), ("bert_layer", {"seq": 8}), ("resnet18", {"image": 32})):
        mod, _, _ = models.export_with_weights(name, **shape)
        for k in models.kernels(mod, target):
            if not baselines.supported(k.identity.op, k.identity.args_info):
                continue
            from schedhub.hooks.identity import workload_module

            lib = tvm.compile(workload_module(k.identity.workload), target)
            args = [tvm.runtime.tensor(a) for a in kernels.random_arguments(k.identity.args_info)]
            lib["main"](*args)
            for library in ("numpy", "torch"):
                got = baselines.kernel_baseline(k.identity.op, k.identity.args_info, library)()
                np.testing.assert_allclose(np.asarray(got), args[-1].numpy(), rtol=1e-3, atol=1e-3, err_msg=f"{library} {k.name}")
            checked += 1
    assert checked >= 30
    assert baselines.kernel_baseline("fused_softmax", [["TENSOR", "float32", [2, 2]]] * 2, "torch") is None
    scaled = [["TENSOR", "float32", [1, 12, 8, 64]], ["TENSOR", "float32", [1, 12, 64, 8]], ["TENSOR", "float32", [1, 12, 8, 8]]]
    assert baselines.kernel_baseline("fused_matmul1_multiply", scaled, "numpy") is None  # its constant is inside the kernel


def _summary(median: float, lo: float, hi: float) -> dict[str, float]:
    return {"median": median, "min": lo, "max": hi, "n": 5}


def test_agreement_compares_each_figure_by_overlap_of_its_ranges() -> None:
    def run(tuned: dict[str, float]) -> dict[str, object]:
        row = {"network": "mlp", "batch": 1, "timing": {"untuned": _summary(10, 9, 11), "tuned": tuned}}
        return {"models": {"rows": [row]}, "hook": {"plain_tvm_ms": _summary(300, 280, 320)}}

    rows = {r["figure"]: r for r in report.agreement(run(_summary(1.0, 0.9, 1.1)), run(_summary(1.3, 1.2, 1.4)))}
    assert set(rows) == {"models: mlp b1 untuned ms", "models: mlp b1 tuned ms", "hook: plain_tvm compile ms"}
    assert rows["models: mlp b1 untuned ms"]["agree"] and rows["hook: plain_tvm compile ms"]["agree"]
    assert not rows["models: mlp b1 tuned ms"]["agree"]
    assert rows["models: mlp b1 tuned ms"]["change"] == pytest.approx(0.3)
