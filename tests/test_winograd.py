"""Winograd convolutions: a network compiled with ``conv="winograd"`` computes its eligible 3×3 convolutions by
F(4×4, 3×3) on weights transformed at compile time, finds the records tuned that way (its schedules from MetaSchedule's
own design space, Winograd's rules and weight prepacking among them), and computes what the direct network computes to
float32 rounding (hooks/rewrites/winograd.py, hooks/rewrites/__init__.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.relax.frontend import nn
from tvm.s_tir import meta_schedule as ms

from schedhub.cli.tune_cmds import CONVS as CLI_CONVS
from schedhub.hooks import use
from schedhub.hooks.rewrites import winograd
from schedhub.hooks.kernels.identity import plain_json, workload_module
from schedhub.hooks.pipeline import fusion_passes
from schedhub.hooks.rewrites import NO_REWRITES, Rewrites
from schedhub.hooks.rewrites.winograd import CONVS, MIN_TILES, TILES, winograd_weights
from schedhub.registry import Identity, Record
from schedhub.tuner.compare import baselines
from schedhub.tuner.execution import kernels
from schedhub.tuner.networks import models

from bench.tuner import flops

from .networks import bound, run, store_of

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})
WINOGRAD = Rewrites(prepack=True, conv="winograd")


class ConvNet(nn.Module):
    """A 3×3 stride-1 convolution on 16×16 (16 output tiles: Winograd's), then a 3×3 stride-2 one (direct)."""

    def __init__(self) -> None:
        self.first = nn.Conv2D(8, 16, 3, padding=1, bias=True)
        self.down = nn.Conv2D(16, 16, 3, stride=2, padding=1, bias=True)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.relu(self.down(nn.op.relu(self.first(x))))


SHAPE = (1, 8, 16, 16)


def conv_net() -> tvm.IRModule:
    return bound(ConvNet(), SHAPE, scale=0.3)


@pytest.fixture(scope="module")
def design_spaces() -> dict[str, tuple[Identity, tvm.IRModule, ms.TuneContext, list[tvm.s_tir.Schedule]]]:
    """Per kernel of :func:`conv_net` with Winograd and prepacking (by name): its identity, workload, tuning context and
    CPU design spaces (Winograd's custom rules where its blocks ask for them)."""
    spaces = {}
    for kernel in models.kernels(conv_net(), CPU, WINOGRAD):
        mod = workload_module(kernel.identity.workload)
        context = ms.TuneContext(mod=mod, target=CPU, space_generator="post-order-apply", search_strategy="replay-trace", task_name="main")
        spaces[kernel.name] = (kernel.identity, mod, context, context.space_generator.generate_design_space(mod))
    return spaces


@pytest.fixture(scope="module")
def winograd_store(tmp_path_factory: pytest.TempPathFactory, design_spaces: dict[str, tuple[Identity, tvm.IRModule, ms.TuneContext, list[tvm.s_tir.Schedule]]]) -> Path:
    """Per kernel, its first design space with MetaSchedule's postprocessors applied (``RewriteLayout`` among them), as a
    search's candidates are."""

    def searched_record(identity: Identity) -> Record:
        _, _, context, spaces = next(entry for entry in design_spaces.values() if entry[0] == identity)
        sch = spaces[0].copy()
        for postproc in context.space_generator.postprocs:
            assert postproc.apply(sch), postproc
        return Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "tests.test_winograd"})

    return store_of(tmp_path_factory.mktemp("winograd") / "store", (entry[0] for entry in design_spaces.values()), searched_record)


def test_winograd_network_hits_every_kernel_and_computes_what_the_direct_one_does(winograd_store: Path, tmp_path: Path) -> None:
    mod = conv_net()
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    expected = run(tvm.compile(mod, CPU), x)
    with use(winograd_store, CPU, prepack=True, conv="winograd", trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        ex = tvm.compile(mod, CPU)
    assert session.report.hits == 2 and not session.report.misses, session.report.summary()
    assert [k.name for k in models.kernels(mod, CPU, WINOGRAD) if "winograd" in k.name]  # served a Winograd kernel, not two direct ones
    np.testing.assert_allclose(run(ex, x), expected, rtol=1e-4, atol=1e-4)


def test_the_input_transform_computes_its_tiles_where_it_reads_them_whatever_the_seed(design_spaces: dict[str, Any]) -> None:
    """Every design space of the Winograd kernel, replayed with fresh decisions, computes the input tiles inside the
    transform's tile loops (sampled locations made some seeds' searches end in "The block no longer exists")."""
    _, mod, _, spaces = next(entry for name, entry in design_spaces.items() if "winograd" in name)
    for space in spaces:
        for seed in range(1, 21):
            sch = tvm.s_tir.Schedule(mod, seed=seed)
            tvm.s_tir.schedule.Trace(space.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            tile_loops = [sch.get_sref(loop) for loop in sch.get_loops(sch.get_sblock("input_tile"))[:3]]
            assert tile_loops == [sch.get_sref(loop) for loop in sch.get_loops(sch.get_sblock("data_pack"))[:3]], seed


def test_only_eligible_convolutions_are_rewritten() -> None:
    """The stride-1 convolution is another kernel under Winograd; the stride-2 one is the same kernel with the same key."""
    direct = {k.name: k.identity.key for k in models.kernels(conv_net(), CPU, NO_REWRITES)}
    winograd = {k.name: k.identity.key for k in models.kernels(conv_net(), CPU, Rewrites(conv="winograd"))}
    assert [name for name in winograd if "winograd" in name] == ["fused_conv2d_winograd_add_relu"], winograd
    assert set(direct.values()) - set(winograd.values()) and len(set(direct.values()) & set(winograd.values())) == 1


def packed_weight_shapes(mod: tvm.IRModule) -> list[list[int]]:
    """The transformed weights' shapes ``(m+2, m+2, in, out)`` of ``mod``'s Winograd kernels under ``conv="winograd"``."""
    return [k.identity.args_info[1][2] for k in models.kernels(mod, CPU, Rewrites(conv="winograd")) if "winograd" in k.name]


def test_a_convolution_with_few_output_tiles_takes_smaller_tiles_or_stays_direct(tmp_path: Path) -> None:
    """Below MIN_TILES tiles of 4×4 a convolution takes F(2×2, 3×3) where 2×2 tiles reach MIN_TILES (ResNet's 7×7
    stage: 4 tiles of 4×4, 16 of 2×2), and computes what the direct one does; below that too it stays direct."""
    assert TILES == (4, 2) and MIN_TILES == 16
    assert packed_weight_shapes(conv_net()) == [[6, 6, 8, 16]]  # 16×16: 16 tiles of 4×4
    shape = (1, 8, 7, 7)  # 7×7 outputs: 4 tiles of 4×4, 16 of 2×2
    mod = bound(ConvNet(), shape, scale=0.3)
    assert packed_weight_shapes(mod) == [[4, 4, 8, 16]]
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    with use(tmp_path / "store", CPU, conv="winograd", transfer=False, report_misses=False, cache=tmp_path / "cache"):
        ex = tvm.compile(mod, CPU)
    np.testing.assert_allclose(run(ex, x), run(tvm.compile(mod, CPU), x), rtol=1e-4, atol=1e-4)
    assert packed_weight_shapes(bound(ConvNet(), (1, 8, 6, 6), scale=0.3)) == []  # 6×6 outputs: 9 tiles of 2×2


def test_a_tile_size_is_part_of_the_kernel() -> None:
    """F(2×2) and F(4×4) of one layer are different workloads with different keys: a record of one is never served
    for the other."""
    mod = bound(ConvNet(), (1, 8, 16, 16), scale=0.3)
    keys = {}
    for tiles in ((4,), (2,)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(winograd, "TILES", tiles)
            keys[tiles] = {k.identity.key for k in models.kernels(mod, CPU, Rewrites(conv="winograd")) if "winograd" in k.name}
    assert len(keys[(4,)]) == len(keys[(2,)]) == 1 and keys[(4,)] != keys[(2,)]


def test_constant_weights_are_transformed_at_compile_time() -> None:
    """Bound weights: the transform folds into a constant, no kernel computes it. Weights that are inputs: it is a kernel."""

    def kernel_names(mod: tvm.IRModule) -> list[str]:
        with CPU:
            fused = fusion_passes(Rewrites(conv="winograd"))(mod)
        return [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]

    assert not [name for name in kernel_names(conv_net()) if "winograd_weights" in name]
    unbound, _ = ConvNet().export_tvm({"forward": {"x": nn.spec.Tensor(SHAPE, "float32")}})
    assert [name for name in kernel_names(unbound) if "winograd_weights" in name]


def test_unknown_conv_is_refused_by_name_and_the_cli_offers_the_hooks_convs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'fft'.*direct, winograd"):
        Rewrites(conv="fft")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown convolution algorithm"), use(tmp_path / "store", CPU, conv="fast"):  # type: ignore[arg-type]
        pass
    assert tuple(CLI_CONVS) == CONVS
    assert WINOGRAD.flags() == ["--prepack", "--conv", "winograd"] and WINOGRAD.describe() == "weights prepacked, 3×3 convolutions by Winograd"


def test_a_winograd_kernels_baselines_and_flops_are_the_direct_convolution_it_replaces() -> None:
    """The heaviest-kernels table compares a Winograd kernel with numpy's and PyTorch's direct convolution of the same
    layer and counts the direct convolution's FLOPs: they compute what the kernel computes from the weights it packs."""
    kernel = next(k for k in models.kernels(conv_net(), CPU, Rewrites(conv="winograd")) if baselines.is_winograd(k.identity.op))
    op, direct = baselines.direct_equivalent(kernel.identity.op, kernel.identity.args_info)
    assert "winograd" not in op and direct[1][2] == [16, 8, 3, 3]  # OIHW: 8 channels in, 16 out
    assert flops(kernel.identity.args_info, kernel.identity.op) == 2.0 * 16 * 16 * 16 * 8 * 9
    data, weights, *rest = kernels.random_arguments(direct)  # the arrays the baselines compute on
    placeholder = te.placeholder(weights.shape, "float32", "w")
    transform = tvm.compile(te.create_prim_func([placeholder, winograd_weights(placeholder)]), CPU)
    packed = tvm.runtime.tensor(np.zeros([int(d) for d in kernel.identity.args_info[1][2]], "float32"))
    transform["main"](tvm.runtime.tensor(weights), packed)
    args = [tvm.runtime.tensor(a) for a in (data, *rest)]
    tvm.compile(workload_module(kernel.identity.workload), CPU)["main"](args[0], packed, *args[1:])
    for library in ("numpy", "torch"):
        got = baselines.kernel_baseline(kernel.identity.op, kernel.identity.args_info, library)()
        np.testing.assert_allclose(np.asarray(got), args[-1].numpy(), rtol=1e-3, atol=1e-3, err_msg=library)
