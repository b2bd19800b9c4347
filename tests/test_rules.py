"""The CPU rules (hooks.metaschedule.rules): what a kernel the registry cannot serve gets instead of TVM's unscheduled default."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.relax.frontend import nn

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks import use
from schedhub.hooks.metaschedule import rules
from schedhub.hooks.kernels.identity import workload_module
from schedhub.hooks.metaschedule.rules import Tile, tile_decisions
from schedhub.registry import LocalRegistry, Record
from schedhub.tuner.networks.models import kernels

from .networks import bound, run

CPU = tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})  # AVX2: 8 float32 lanes
GIVEN = {"layout": "given", "prepack": False}


def conv_tiles(n: int, h: int, w: int, c: int, k: int, r: int) -> list[Tile]:
    """MetaSchedule's tiles of an NHWC convolution: four levels per output axis, two per reduction axis."""
    return [Tile(e, 4, 64) for e in (n, h, w, c)] + [Tile(e, 2, 64) for e in (r, r, k)]


def test_a_convolution_gets_a_register_block_of_vectors_by_rows_and_its_rows_remainder_at_the_second_level() -> None:
    n, h, w, c, ry, rx, rc = tile_decisions(conv_tiles(1, 56, 56, 64, 64, 3), lanes=8, most_accumulators=12)
    assert c == [4, 1, 1, 16]  # two AVX2 vectors of output channels
    assert w == [1, 14, 1, 4]  # 4 rows: 8 accumulators (6 rows do not divide 56)
    assert h == [56, 1, 1, 1] and n == [1, 1, 1, 1]  # whole at the outer level, where the parallel loop is
    assert rc == [8, 8] and ry == [1, 3] and rx == [1, 3]
    _, _, w512, c512, *_ = tile_decisions(conv_tiles(1, 56, 56, 64, 64, 3), lanes=16, most_accumulators=24)
    assert c512 == [2, 1, 1, 32] and w512 == [1, 7, 1, 8]  # AVX-512: twice the lanes, twice the accumulators


def image_tiles(h: int, w: int, c: int, k: int) -> list[Tile]:
    """:func:`conv_tiles` of a 1×1 convolution, each output axis with the operands it indexes."""
    reads = (frozenset({"data"}), frozenset({"data"}), frozenset({"data"}), frozenset({"weights"}))
    return [Tile(e, 4, 64, r) for e, r in zip((1, h, w, c), reads)] + [Tile(e, 2, 64) for e in (1, 1, k)]


def test_a_short_row_lets_the_register_block_span_the_image_rows_too_where_the_operands_allow() -> None:
    n, h, w, c, *_ = tile_decisions(image_tiles(14, 14, 256, 1024), lanes=8, most_accumulators=12)
    assert c == [16, 1, 1, 16] and w == [1, 7, 1, 2] and h == [7, 1, 1, 2]  # 2 x 2 pixels by 2 vectors: 8 accumulators, not 7 x 1
    _, h1, w1, c1, *_ = tile_decisions(conv_tiles(1, 14, 14, 256, 1024, 1), lanes=8, most_accumulators=12)
    assert (h1, w1, c1) == ([14, 1, 1, 1], [1, 2, 1, 7], [32, 1, 1, 8])  # operands unknown: the rows from one axis, as before
    _, h56, w56, _, *_ = tile_decisions(image_tiles(56, 56, 64, 64), lanes=8, most_accumulators=12)
    assert w56 == [1, 14, 1, 4] and h56 == [56, 1, 1, 1]  # a long row fills the block alone: the rows stay on it
    batched = [Tile(12, 4, 64, frozenset({"a", "b"})), Tile(14, 4, 64, frozenset({"a"})), Tile(64, 4, 64, frozenset({"b"})), Tile(64, 2, 64)]
    b, i, _, _ = tile_decisions(batched, lanes=8, most_accumulators=12)
    assert b == [12, 1, 1, 1] and i == [1, 2, 1, 7]  # a batch indexes the weights too (each of its rows would need its own): 7 rows of one


def test_weights_far_larger_than_the_image_make_their_blocks_the_parallel_loop_and_the_image_axes_go_inside() -> None:
    heavy = {"data": 7 * 7 * 512 * 4, "weights": 512 * 512 * 9 * 4}  # ResNet-50's last 3x3 convolutions: 9.4 MB of weights, 100 KB of image
    n, h, w, c, *_ = tile_decisions(image_tiles(7, 7, 512, 4608), lanes=8, most_accumulators=12, operand_bytes=heavy)
    assert c == [64, 1, 1, 8] and w == [1, 1, 1, 7]  # 7 pixels by one vector, as before
    assert h == [1, 7, 1, 1]  # the image rows inside each task: a task reads its weight panel once, for every pixel
    _, h_light, *_ = tile_decisions(image_tiles(7, 7, 512, 4608), lanes=8, most_accumulators=12, operand_bytes={"data": 1, "weights": 2})
    assert h_light == [7, 1, 1, 1]  # weights no larger than twice the image: the image rows stay the outer parallel loop
    _, h_few, *_ = tile_decisions(image_tiles(7, 7, 32, 4608), lanes=8, most_accumulators=12, operand_bytes=heavy)
    assert h_few == [7, 1, 1, 1]  # 2 weight blocks: too few to be the parallel loop alone


def test_the_ruled_schedule_of_a_small_image_convolution_blocks_two_image_axes(tmp_path: Path) -> None:
    from schedhub.hooks.metaschedule.msdb import normalize_mod

    class Conv(nn.Module):
        def __init__(self) -> None:
            self.conv = nn.Conv2D(64, 64, 1, bias=False, data_layout="NHWC")

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.conv(x)

    mod = bound(Conv(), (1, 14, 14, 64), scale=0.1)
    conv = next(k for k in kernels(mod, CPU, NO_REWRITES) if "conv2d" in k.name)
    normalized = normalize_mod(workload_module(conv.identity.workload))
    anchor = rules._anchor_operands(normalized)
    assert anchor is not None
    operands, sizes = anchor
    assert [e for e, _ in operands] == [1, 14, 14, 64]
    assert operands[1][1] == operands[2][1] != operands[3][1] and not operands[1][1] & operands[3][1]  # rows and columns: the image only
    spatial = [t for t in rules._tiles(normalized, _space(normalized), anchor) if t.kind == rules.SPATIAL]
    assert [t.reads for t in spatial] == [r for _, r in operands]
    assert sizes[next(iter(operands[3][1]))] == 64 * 64 * 4  # the weights' bytes, as the rules weigh them against the image's
    assert rules.ruled_trace(normalized, CPU) is not None


def _space(normalized: tvm.IRModule) -> tvm.s_tir.Schedule:
    from tvm.s_tir import meta_schedule as ms

    context = ms.TuneContext(mod=normalized, target=CPU, space_generator="post-order-apply", rand_state=1, num_threads=1)
    return max(reversed(context.generate_design_space()), key=rules._fuses_epilogue)


def test_an_axis_no_vector_divides_keeps_its_own_factor_and_every_decision_multiplies_out() -> None:
    *_, c, _, _, _ = tile_decisions(conv_tiles(1, 7, 7, 3, 3, 1), lanes=8, most_accumulators=12)
    assert c == [1, 1, 1, 3]
    rng = random.Random(0)
    for _ in range(300):
        tiles = [Tile(rng.choice([1, 2, 3, 7, 12, 49, 56, 64, 96, 100, 768, 2304]), rng.choice([2, 4]), 64) for _ in range(rng.randint(1, 7))]
        for tile, factors in zip(tiles, tile_decisions(tiles, 8, 12), strict=True):
            assert len(factors) == tile.levels and int(np.prod(factors)) == tile.extent and factors[-1] <= tile.max_innermost


class Net(nn.Module):
    def __init__(self) -> None:
        self.l1 = nn.Linear(64, 256)
        self.l2 = nn.Linear(256, 64)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.l2(nn.relu(self.l1(x)))


def test_a_kernel_the_registry_cannot_serve_gets_the_ruled_schedule_and_is_still_a_reported_miss(tmp_path: Path) -> None:
    mod = bound(Net(), (32, 64), scale=0.1)
    x = np.random.default_rng(1).standard_normal((32, 64)).astype("float32")
    store = tmp_path / "store"
    outputs, reports = {}, {}
    for ruled in (False, True):
        with use(store, CPU, cache=tmp_path / f"cache-{ruled}", rules=ruled, **GIVEN) as session:
            ex = tvm.compile(mod, CPU)
            matmul = next(k for k in kernels(mod, CPU, NO_REWRITES) if "matmul" in k.name)
            scheduled = session.scheduled(workload_module(matmul.identity.workload)["main"], CPU, matmul.name)
        outputs[ruled], reports[ruled] = run(ex, x), session.reports[0]
        if ruled:  # parallel outer loops and vectors, where the default is one thread of scalar loops
            assert scheduled is not None and "T.parallel" in scheduled.script() and "T.vectorized" in scheduled.script()
        else:
            assert scheduled is None
    assert all(k.outcome == "miss" and k.detail.startswith("ruled:") for k in reports[True].kernels)
    assert not any(k.detail for k in reports[False].kernels)
    assert f"{len(reports[True].kernels)} misses ({len(reports[True].kernels)} of them given the CPU rules' schedules" in reports[True].summary()
    with LocalRegistry(store) as reg:  # queued all the same, for a worker to tune
        assert {j["op"] for j in reg.jobs("pending")} >= {k.op for k in reports[True].kernels}
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=1e-4, atol=1e-4)


def test_on_a_cpu_the_rules_schedule_comes_before_a_transfer_and_a_measured_compile_times_both(tmp_path: Path) -> None:
    """A neighbour tuned at another batch: untimed, the rules' schedule is served ahead of it (rules=False: it is
    transferred, so it applies); a measured compile times it beside the rules' schedule and serves the faster."""
    from schedhub.hooks.kernels.measure import host_cpu
    from schedhub.hooks.metaschedule.msdb import normalize_mod

    host = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})  # measured only for this machine's CPU
    mod = bound(Net(), (32, 64), scale=0.1)
    x = np.random.default_rng(1).standard_normal((32, 64)).astype("float32")
    with LocalRegistry(tmp_path / "store") as reg:
        for k in kernels(bound(Net(), (16, 64), scale=0.1), host, NO_REWRITES):  # the neighbour's own ruled schedules stand in for tuned ones
            trace = rules.ruled_trace(normalize_mod(workload_module(k.identity.workload)), host)
            reg.put(Record(k.identity, trace or "", [1e-6], {"tuner": "tests.test_rules"}))
    expected = run(tvm.compile(mod, host), x)
    reports = {}
    for name, options in (("transfers", {"rules": False}), ("untimed", {}), ("timed", {"measure": 30.0})):
        with use(tmp_path / "store", host, trust="any", report_misses=False, cache=tmp_path / f"cache-{name}", **GIVEN, **options) as session:
            ex = tvm.compile(mod, host)
        reports[name] = session.reports[0]
        np.testing.assert_allclose(run(ex, x), expected, rtol=1e-4, atol=1e-4)
    assert reports["transfers"].transfers == len(reports["transfers"].kernels) > 0, reports["transfers"].summary()
    untimed = reports["untimed"]
    assert untimed.transfers == 0 and all(k.detail.startswith("ruled:") for k in untimed.kernels), untimed.summary()
    for k in reports["timed"].kernels:  # each the faster of the two, both timed
        ruled_id = next(u.detail.split(":")[1] for u in untimed.kernels if u.key == k.key)
        served = k.detail.split(":")[1]
        assert k.outcome in ("transfer", "miss") and len(k.measured) == 2 and ruled_id in k.measured, k
        assert (served == ruled_id) == (k.outcome == "miss")
        assert k.measured[served] == min(k.measured.values())


def test_a_ruled_trace_is_worked_out_once_a_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = bound(Net(), (32, 64), scale=0.1)
    with use(tmp_path / "store", CPU, cache=tmp_path / "cache", **GIVEN) as first:
        tvm.compile(mod, CPU)

    def refuse(*_args: object) -> None:
        raise AssertionError("the kernel cache holds the ruled trace")

    monkeypatch.setattr("schedhub.hooks.serving.session.ruled_trace", refuse)
    with use(tmp_path / "store", CPU, cache=tmp_path / "cache", **GIVEN) as again:
        tvm.compile(mod, CPU)
    assert [k.detail for k in again.reports[0].kernels] == [k.detail for k in first.reports[0].kernels]
    assert all(k.detail.startswith("ruled:") for k in again.reports[0].kernels)


def test_a_network_whose_kernels_no_rule_covers_compiles_with_the_default(tmp_path: Path) -> None:
    """A symbolic batch: the rules need static sizes, so every kernel keeps TVM's default, and the compile works."""
    mod, spec = Net().export_tvm({"forward": {"x": nn.spec.Tensor(("n", 64), "float32")}})
    params = [np.random.default_rng(0).standard_normal([int(d) for d in p.shape]).astype("float32") * 0.1 for _, p in spec]
    with use(tmp_path / "store", CPU, cache=tmp_path / "cache", **GIVEN) as session:
        ex = tvm.compile(mod, CPU)
    matmuls = [k for k in session.report.kernels if "matmul" in k.op]  # of a symbolic size (a weight's transpose is static)
    assert len(matmuls) == 2 and all(k.outcome == "miss" and not k.detail for k in matmuls), session.report.kernels
    x = np.random.default_rng(1).standard_normal((5, 64)).astype("float32")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    out = vm["forward"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()
    np.testing.assert_allclose(out, np.maximum(x @ params[0].T + params[1], 0) @ params[2].T + params[3], rtol=1e-4, atol=1e-4)


def test_a_kernel_whose_design_space_the_rules_cannot_complete_keeps_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rule_fits(*_args: object) -> list[list[int]]:
        raise ValueError("max() arg is an empty sequence")  # what a rule meets where no factor qualifies

    monkeypatch.setattr(rules, "tile_decisions", no_rule_fits)
    mod = bound(Net(), (32, 64), scale=0.1)
    with use(tmp_path / "store", CPU, cache=tmp_path / "cache", **GIVEN) as session:
        ex = tvm.compile(mod, CPU)
    tiled = [k for k in session.report.kernels if "matmul" in k.op]
    assert tiled and all(k.outcome == "miss" and not k.detail for k in tiled)
    x = np.random.default_rng(1).standard_normal((32, 64)).astype("float32")
    assert np.isfinite(run(ex, x)).all()


def test_a_layout_rewrite_of_a_buffer_that_is_not_a_weight_is_refused() -> None:
    """A trace tuned where a block's read was a weight (a bias) replayed where it is an activation (a residual input)
    rewrites the activation's layout with an index map that drops its axes: ResNet-50's convolutions served transfers
    from ResNet-18's computed a wrong result so. The guard refuses a layout rewrite of any buffer that is not one of the
    kernel's layout-free arguments."""
    from schedhub.hooks.metaschedule.guard import WrongLayoutRewrite, check_layout_rewrites
    from schedhub.hooks.metaschedule.msdb import normalize_mod, replayed
    from schedhub.hooks.rewrites import Rewrites

    mod = bound(Net(), (32, 64), scale=0.1)
    matmul = next(k for k in kernels(mod, CPU, Rewrites("given", prepack=True)) if "matmul" in k.name)
    kernel = normalize_mod(workload_module(matmul.identity.workload))
    scheduled = replayed(kernel, rules.ruled_trace(kernel, CPU))["main"]
    assert "layout_rewrite_preproc" in scheduled.script()  # the weights are prepacked by the schedule
    check_layout_rewrites(scheduled)  # as tuned: its weights only
    with pytest.raises(WrongLayoutRewrite, match="not a layout-free argument"):
        check_layout_rewrites(scheduled.with_attr("layout_free_buffers", []))  # as if they were activations
    activations = tvm.IRModule({"main": kernel["main"].with_attr("layout_free_buffers", [])})
    with pytest.raises(WrongLayoutRewrite):  # every replay of a record goes through the guard
        replayed(activations, rules.ruled_trace(kernel, CPU))
