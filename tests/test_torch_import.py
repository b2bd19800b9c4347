"""A PyTorch model imported through ``torch.export`` for inference: BatchNorm folded into the convolution."""

from __future__ import annotations

import numpy as np
import torch
import tvm
from tvm import relax

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.tuner.networks import plan
from schedhub.tuner.networks.models import kernels

from .torch_factories import conv_bn


def test_batch_norm_is_folded_into_the_convolution_and_the_output_kept() -> None:
    ref = plan.parse_model('{"torch": "tests.torch_factories:conv_bn", "inputs": {"x": [1, 3, 16, 16]}}')
    mod = plan.load(ref)
    target = tvm.target.Target(plan.resolve_target("host"))
    assert [k.identity.op for k in kernels(mod, target, NO_REWRITES)] == ["fused_conv2d_add_relu"]  # not conv2d + fused_batch_norm_relu
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    with torch.no_grad():
        want = conv_bn().eval()(torch.from_numpy(x)).numpy()
    got = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = (got[0] if not hasattr(got, "numpy") else got).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_model_imported_as_users_do_gets_the_keys_schedhub_tune_tuned(tmp_path) -> None:
    """A user imports with ``from_exported_program(torch.export.export(...))``; ``schedhub tune`` and ``profile`` import
    through ``plan.from_torch_export``, which folds BatchNorm. The hook's fusion folds it too: one model, one set of keys.
    Left to their defaults, both take the rewrites this CPU is best tuned with (NHWC prepacked on AVX2 or AVX-512), the compile
    because the registry knows nothing of the model: it queues what ``schedhub tune`` would tune."""
    from tvm.relax.frontend.torch import from_exported_program

    from schedhub.hooks import use

    ref = plan.parse_model('{"torch": "tests.torch_factories:conv_bn", "inputs": {"x": [1, 3, 16, 16]}}')
    host = plan.resolve_target("host")
    target = tvm.target.Target(host)
    rewrites = plan.tuning_rewrites(host, plan.AUTO, "exact", None, "direct")
    tuned_keys = {k.identity.key for k in kernels(plan.load(ref), target, rewrites)}
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    users = from_exported_program(torch.export.export(conv_bn().eval(), (torch.from_numpy(x),)))
    assert {k.identity.key for k in kernels(users, target, rewrites)} == tuned_keys
    with use(tmp_path / "store", target, report_misses=False) as session:
        ex = tvm.compile(users, target)
    assert {k.key for k in session.report.kernels} == tuned_keys
    with torch.no_grad():
        want = conv_bn().eval()(torch.from_numpy(x)).numpy()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    np.testing.assert_allclose((got[0] if not hasattr(got, "numpy") else got).numpy(), want, rtol=1e-4, atol=1e-4)


def test_an_encoder_layer_imported_as_users_do_has_the_keys_schedhub_tune_imports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``from_exported_program`` leaves attention's ``full_like`` of a constant where ``schedhub tune``'s import folds it:
    the softmax kernel got another key (``…_full_where…``), one kernel a tuned network never hit. The hook folds it. By
    default ``models.kernels``, ``schedhub tune``'s plan and ``use()`` then give one set of keys, whichever path imported
    the layer."""
    from tvm.relax.frontend.torch import from_exported_program

    from schedhub.hooks import use

    from .torch_factories import encoder_layer

    with torch.no_grad():
        exported = torch.export.export(encoder_layer(), (torch.randn(1, 64, 32),))  # at 8 tokens TVM folds it itself
    host = plan.resolve_target("host")
    target = tvm.target.Target(host)
    tuned_mod, users = plan.from_torch_export(exported), from_exported_program(exported)
    given = {k.identity.key: k.name for k in kernels(tuned_mod, target, NO_REWRITES)}
    imported = {k.identity.key: k.name for k in kernels(users, target, NO_REWRITES)}
    assert any("softmax" in name for name in imported.values())
    assert imported == given
    planned = {k.identity.key for k in kernels(tuned_mod, target, plan.tuning_rewrites(host, plan.AUTO, "exact", None, "direct", [tuned_mod]))}
    assert {k.identity.key for k in kernels(users, target)} == {k.identity.key for k in kernels(tuned_mod, target)} == planned
    with use(tmp_path / "store", target, report_misses=False, cache=tmp_path / "cache") as session:
        tvm.compile(users, target)
    assert {k.key for k in session.report.kernels} == planned
