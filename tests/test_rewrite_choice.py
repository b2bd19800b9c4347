"""Rewrites chosen by the registry's records (``use(..., layout="auto", prepack="auto")``, hooks/serving/choice.py): a compile
weighs every option's kernels in one lookup, compiles the option the records hold in full and claim fastest, computes
what the plain network computes, and falls back to the given option where the records say nothing."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.relax.frontend import nn

from schedhub.hooks import use
from schedhub.hooks.serving.choice import Holding, RewriteOptions, choose, network_digest
from schedhub.hooks.rewrites.layouts import converts
from schedhub.hooks.kernels.identity import plain_json
from schedhub.hooks.rewrites import NO_REWRITES, Rewrites
from schedhub.registry import Identity, LocalRegistry, Record
from schedhub.tuner.networks import models

from .networks import bound, run
from .test_prepack import ConvNet, conv_net, packing_schedule

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 1})  # compiled for, never run
GIVEN, NHWC_PACKED = Rewrites(), Rewrites("NHWC", prepack=True)
OPTIONS = RewriteOptions.of("auto", "exact", "auto", "direct")


def kernel_identities(rewrites: Rewrites) -> list[Identity]:
    return [k.identity for k in models.kernels(conv_net(), CPU, rewrites)]


def drawn(identity: Identity) -> Record:
    """A real schedule of the kernel, drawn from its CPU design space and postprocessed (with prepacking, its weights laid
    out by ``RewriteLayout``), its time left for each test to claim."""
    trace = json.dumps(plain_json(packing_schedule(identity).trace.as_json()), separators=(",", ":"))
    return Record(identity, trace, [1e-4], {"tuner": "tests.test_rewrite_choice"})


@pytest.fixture(scope="module")
def records() -> dict[Rewrites, list[Record]]:
    """Schedules of every kernel of :func:`conv_net` with no rewrites, and converted to NHWC with prepacked weights."""
    return {rewrites: [drawn(i) for i in kernel_identities(rewrites)] for rewrites in (GIVEN, NHWC_PACKED)}


def claiming(record: Record, secs: float) -> Record:
    """``record`` as a pusher claiming ``secs`` a call for it."""
    return dataclasses.replace(record, run_secs=[secs])


def store(root: Path, records: dict[Rewrites, list[Record]], secs: dict[Rewrites, float], keep: Callable[[Record], bool] = lambda _: True) -> Path:
    with LocalRegistry(root) as reg:
        for rewrites, each in records.items():
            for record in filter(keep, each):
                reg.put(claiming(record, secs[rewrites]))
    return root


def compile_auto(registry: Path, cache: Path) -> tuple[object, tvm.runtime.Executable]:
    with use(registry, CPU, layout="auto", prepack="auto", trust="any", transfer=False, cache=cache) as session:
        ex = tvm.compile(conv_net(), CPU)
    return session, ex


@pytest.mark.parametrize("faster", [NHWC_PACKED, GIVEN], ids=["nhwc-prepacked-faster", "given-faster"])
def test_auto_compiles_the_option_whose_records_claim_the_least_time(records: dict, faster: Rewrites, tmp_path: Path) -> None:
    slower = GIVEN if faster == NHWC_PACKED else NHWC_PACKED
    registry = store(tmp_path / "store", records, {faster: 1e-5, slower: 1e-4})  # each kernel: NHWC's 4 (2 transposes) against 2
    x = np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype("float32")
    expected = run(tvm.compile(conv_net(), CPU), x)
    session, ex = compile_auto(registry, tmp_path / "cache")
    report = session.report  # type: ignore[attr-defined]
    assert report.hits == len(records[faster]) and not report.misses, report.summary()
    assert {k.key for k in report.kernels} == {r.key for r in records[faster]}
    assert report.lookups == 1, "every option's kernels are looked up in the compile's one request"
    assert report.rewrites == (faster.describe() or "none") and len(report.rewrite_options) == 4, report.summary()
    assert "rewrites chosen by the registry's records" in report.summary()
    np.testing.assert_allclose(run(ex, x), expected, rtol=1e-4, atol=1e-4)


def test_auto_keeps_the_option_held_in_full_over_a_faster_one_held_in_part(records: dict, tmp_path: Path) -> None:
    """A network tuned in full under one option is not left for one whose records claim less but miss a kernel."""
    dropped = next(r.key for r in records[NHWC_PACKED] if "conv2d" in r.identity.op)
    registry = store(tmp_path / "store", records, {NHWC_PACKED: 1e-5, GIVEN: 1e-3}, keep=lambda r: r.key != dropped)
    session, _ = compile_auto(registry, tmp_path / "cache")
    report = session.report  # type: ignore[attr-defined]
    assert report.rewrites == "none" and report.hits == len(records[GIVEN]) and not report.misses, report.summary()


def test_auto_on_an_empty_registry_compiles_the_given_option_and_queues_only_its_kernels(tmp_path: Path) -> None:
    LocalRegistry(tmp_path / "store").close()
    session, _ = compile_auto(tmp_path / "store", tmp_path / "cache")
    report = session.report  # type: ignore[attr-defined]
    assert report.rewrites == "none" and report.hits == 0, report.summary()
    with LocalRegistry(tmp_path / "store") as reg:
        queued = {job["key"] for job in reg.jobs("pending")}
    assert queued == {i.key for i in kernel_identities(GIVEN)}, "misses are reported under the option compiled, none under the others"


@pytest.mark.parametrize(("target", "taken"), [(CPU, GIVEN), (AVX512, NHWC_PACKED)], ids=["cpu", "avx512"])
def test_auto_with_the_registry_down_compiles_the_option_the_cpu_is_best_tuned_with(target: tvm.target.Target, taken: Rewrites, tmp_path: Path) -> None:
    """No record to weigh: the option whose misses the CPU rules serve best (NHWC prepacked where AVX2 or AVX-512 is)."""
    with pytest.warns(UserWarning, match="registry"):
        with use("http://127.0.0.1:9", target, layout="auto", prepack="auto", timeout=0.5, cache=tmp_path / "cache") as session:
            tvm.compile(conv_net(), target)
    assert session.rewrites == taken and session.report.count("offline") == len(models.kernels(conv_net(), target, taken)), session.report.summary()


def test_a_network_the_registry_knows_nothing_of_is_compiled_and_queued_as_this_cpu_tunes_best(tmp_path: Path) -> None:
    """On a CPU with AVX-512, nothing held and nothing near: NHWC with prepacked weights, the misses queued what
    ``schedhub tune`` tunes there; a network without convolutions in its own layout, prepacked (compiled, not run:
    this machine may lack AVX-512)."""
    LocalRegistry(tmp_path / "store").close()
    with use(tmp_path / "store", AVX512, cache=tmp_path / "cache") as session:
        tvm.compile(conv_net(), AVX512)
    assert session.rewrites == NHWC_PACKED and session.report.misses == len(session.report.kernels), session.report.summary()
    assert "rewrites chosen by what this CPU is best tuned with" in session.report.summary()
    with LocalRegistry(tmp_path / "store") as reg:
        queued = {job["key"] for job in reg.jobs("pending")}
    assert queued == {k.identity.key for k in models.kernels(conv_net(), AVX512, NHWC_PACKED)}
    with use(tmp_path / "store", AVX512, report_misses=False, cache=tmp_path / "cache") as session:
        tvm.compile(bound(Dense(), (2, 16)), AVX512)
    assert session.rewrites == Rewrites(prepack=True), session.report.summary()


def test_the_planning_apis_kernels_are_by_default_those_a_default_compile_looks_up(tmp_path: Path) -> None:
    """``models.kernels(mod, target)`` (to seed, inspect or push) addresses the keys ``use(...)``'s defaults compile and
    queue for a network the registry holds nothing of: a convolutional one NHWC and prepacked, a dense one prepacked."""
    LocalRegistry(tmp_path / "store").close()
    networks = (conv_net(), bound(Dense(), (2, 16)))
    for net in networks:
        with use(tmp_path / "store", AVX512, cache=tmp_path / "cache"):
            tvm.compile(net, AVX512)
    with LocalRegistry(tmp_path / "store") as reg:
        queued = {job["key"] for job in reg.jobs("pending")}
    planned = {k.identity.key for net in networks for k in models.kernels(net, AVX512)}
    assert queued == planned
    assert not planned & {k.identity.key for net in networks for k in models.kernels(net, AVX512, NO_REWRITES)}, "the rewrites changed every key"


@pytest.mark.parametrize("tuned", [NHWC_PACKED, GIVEN], ids=["nhwc-prepacked", "given"])
def test_a_network_with_neighbours_in_the_registry_is_compiled_as_the_cpu_tunes_best_and_served_their_transfers(tuned: Rewrites, tmp_path: Path) -> None:
    """Records of the same kernels at another size, tuned as this CPU tunes best (NHWC prepacked): that option's misses
    are served them now. Tuned in the given layout only: no record of this network in any option, so the option the
    CPU tunes best is compiled all the same (its misses get the CPU rules' schedules, which beat the given layout's
    kernels with or without transfers: ResNet-18@160 ruled NHWC prepacked ran 24 ms where the given layout's ran 97)."""
    wider = [drawn(k.identity) for k in models.kernels(bound(ConvNet(), (1, 8, 12, 12)), AVX512, tuned)]
    with LocalRegistry(tmp_path / "store") as reg:
        for record in wider:
            reg.put(record)
    with use(tmp_path / "store", AVX512, trust="any", report_misses=False, cache=tmp_path / "cache", rules=False) as session:
        tvm.compile(conv_net(), AVX512)  # rules=False: untimed, the rules' schedules rank ahead of transfers on a CPU
    report = session.report
    assert session.rewrites == NHWC_PACKED and "best tuned with" in report.summary(), report.summary()
    assert report.transfers == (len(report.kernels) if tuned == NHWC_PACKED else 0) and len(report.kernels) > 0, report.summary()
    assert report.lookups == 1, "the option compiled asked its neighbours in the compile's one request"


def test_options_are_every_combination_of_the_values_left_to_auto() -> None:
    assert OPTIONS.options == (Rewrites(), Rewrites(prepack=True), Rewrites("NHWC"), NHWC_PACKED)
    assert RewriteOptions.of("NHWC", "fast", "auto", "direct").options == (Rewrites("NHWC", "fast"), Rewrites("NHWC", "fast", True))
    assert RewriteOptions.of("given", "exact", False, "winograd").fixed


def test_a_gpu_compile_does_not_weigh_prepacking() -> None:
    """MetaSchedule's GPU postprocessors lay out no weights: on a GPU target "auto" keeps them as given."""
    gpu = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    assert OPTIONS.for_target(gpu).options == (Rewrites(), Rewrites("NHWC"))
    assert OPTIONS.for_target(CPU) == OPTIONS
    assert RewriteOptions.of("given", "exact", True, "direct").for_target(gpu).options == (Rewrites(prepack=True),)  # asked for by name: kept


class Dense(nn.Module):
    def __init__(self) -> None:
        self.fc = nn.Linear(16, 8)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.relu(self.fc(x))


def test_a_network_without_convolutions_is_weighed_in_the_given_layout_only(tmp_path: Path) -> None:
    """Converting convolutions changes nothing in a network without them: the default compile fuses it in the given
    layout alone and weighs only its packing, where a network with convolutions is weighed in both layouts."""
    dense = bound(Dense(), (2, 16))
    assert not converts("NHWC", dense) and converts("NHWC", conv_net()) and not converts("given", conv_net())
    assert OPTIONS.for_module(dense).options == (Rewrites(), Rewrites(prepack=True))
    assert OPTIONS.for_module(conv_net()) == OPTIONS
    assert RewriteOptions.of("NHWC", "exact", "auto", "direct").for_module(dense).options == (Rewrites("NHWC"), Rewrites("NHWC", prepack=True))  # named: kept
    LocalRegistry(tmp_path / "store").close()
    with use(tmp_path / "store", CPU, layout="auto", prepack="auto", report_misses=False, cache=tmp_path / "cache") as session:
        tvm.compile(dense, CPU)
    assert [each.split(":")[0] for each in session.report.rewrite_options] == ["no rewrites", "weights prepacked"], session.report.summary()


def test_ties_go_to_the_earliest_option() -> None:
    holdings = [Holding(Rewrites(), 3, 0, 3, 0.0), Holding(NHWC_PACKED, 4, 0, 3, 0.0)]
    assert choose(holdings).rewrites == Rewrites()
    assert choose([*holdings, Holding(Rewrites("NHWC"), 4, 4, 0, 9.0)]).rewrites == Rewrites("NHWC")


def test_options_are_ranked_by_the_share_of_their_kernels_held_and_time_only_where_all_are() -> None:
    """Another network's records can hold a kernel two options do not both have (NHWC's input transpose): that option
    holds a larger share and misses no more; the time the other claims, holding nothing, decides nothing."""
    nothing, one = Holding(Rewrites(), 32, 0, 32, 0.0), Holding(NHWC_PACKED, 34, 1, 33, 3e-5)  # one kernel more missed, too
    assert choose([nothing, one]) is one and choose([one, nothing]) is one
    assert choose([Holding(Rewrites(), 32, 1, 31, 5e-5), one]).rewrites == Rewrites()  # a larger share
    held = [Holding(Rewrites(), 32, 32, 0, 9e-3), Holding(NHWC_PACKED, 33, 33, 0, 8e-3)]
    assert choose(held) is held[1]  # every kernel held: the least time


@pytest.mark.parametrize(("layout", "prepack", "match"), [("Auto", False, "unknown convolution layout 'Auto'.*'auto'"), ("given", "yes", "prepack is True, False or 'auto'")])
def test_a_misspelt_choice_is_refused_before_anything_opens(layout: str, prepack: object, match: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=match):
        with use(tmp_path / "never", CPU, layout=layout, prepack=prepack):  # type: ignore[arg-type]
            pass
    assert not (tmp_path / "never").exists()


def test_a_later_compile_weighs_the_options_from_the_kernel_cache_and_fuses_only_the_one_it_compiles(
    records: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each option's kernels are kept on the machine: converting ResNet-18 to NHWC costs 2 s of fusion that a later compile
    choosing the given layout need not pay. An entry that does not read as kernels is fused again, never served."""
    from schedhub.hooks import pipeline
    from schedhub.hooks.serving.choice import OPTION_KERNELS

    registry = store(tmp_path / "store", records, {NHWC_PACKED: 1e-5, GIVEN: 1e-4})
    fused: list[Rewrites] = []
    real = pipeline.unpacked_fusion_passes
    monkeypatch.setattr(pipeline, "unpacked_fusion_passes", lambda rewrites: (fused.append(rewrites), real(rewrites))[1])
    first, _ = compile_auto(registry, tmp_path / "cache")
    assert sorted(map(repr, fused)) == sorted(map(repr, [GIVEN, Rewrites("NHWC")]))  # each layout fused once, its prepacked twin with it
    entries = sorted((tmp_path / "cache" / OPTION_KERNELS).glob("*.json"))
    assert len(entries) == 4
    fused.clear()
    later, _ = compile_auto(registry, tmp_path / "cache")
    assert fused == [Rewrites("NHWC")], "only the option compiled is fused"
    for each in entries:
        each.write_text('{"kernels": [{"identity": {"key": "not a key"}, "calls": 1}]}')
    fused.clear()
    spoilt, _ = compile_auto(registry, tmp_path / "cache")
    assert len(fused) == 2
    for session in (first, later, spoilt):
        report = session.report  # type: ignore[attr-defined]
        assert report.rewrites == NHWC_PACKED.describe() and report.hits == len(records[NHWC_PACKED]) and not report.misses, report.summary()


def test_auto_asks_neighbours_for_the_lead_options_misses_at_once_and_for_another_options_after(records: dict, tmp_path: Path) -> None:
    """Options are weighed on exact records: the compile's one request asks neighbours only for the lead option's misses
    (what a compile takes where no option holds more: one request, as a fixed compile makes; here, a CPU without AVX2,
    the given layout), and another option's misses are asked again, with candidates, where the compile takes it (here:
    one convolution's record on the other's; the rules off, which rank ahead of transfers untimed)."""
    convs = [r for r in records[GIVEN] if "conv2d" in r.identity.op]
    assert len(convs) == 2 and convs[0].identity.structure == convs[1].identity.structure
    registry = store(tmp_path / "store", {GIVEN: records[GIVEN]}, {GIVEN: 1e-4}, keep=lambda r: r.key != convs[1].key)
    with use(registry, CPU, layout="auto", prepack="auto", trust="any", cache=tmp_path / "cache", rules=False) as session:
        tvm.compile(conv_net(), CPU)
    report = session.report
    assert report.rewrites == "none" and report.hits == len(records[GIVEN]) - 1 and report.transfers == 1, report.summary()
    assert report.lookups == 1, "one request weighs every option and asks the first option's miss for candidates"
    full = store(tmp_path / "full", {GIVEN: records[GIVEN]}, {GIVEN: 1e-4})
    with use(full, CPU, layout="auto", prepack="auto", trust="any", cache=tmp_path / "cache") as session:
        tvm.compile(conv_net(), CPU)
    assert session.report.hits == len(records[GIVEN]) and session.report.lookups == 1, session.report.summary()
    with use(tmp_path / "empty", CPU, layout="auto", prepack="auto", trust="any", cache=tmp_path / "cache") as session:
        tvm.compile(conv_net(), CPU)
    assert session.report.misses == len(records[GIVEN]) and session.report.lookups == 1, session.report.summary()
    packed = [r for r in records[NHWC_PACKED] if "conv2d" in r.identity.op]
    held = store(tmp_path / "packed", {NHWC_PACKED: records[NHWC_PACKED]}, {NHWC_PACKED: 1e-5}, keep=lambda r: r.key != packed[1].key)
    with use(held, CPU, layout="auto", prepack="auto", trust="any", cache=tmp_path / "cache", rules=False) as session:
        tvm.compile(conv_net(), CPU)
    report = session.report
    assert report.rewrites == NHWC_PACKED.describe() and report.transfers == 1 and report.lookups == 2, report.summary()


def scaled(factor: float) -> tvm.IRModule:
    """``x * factor + 1``: legalization writes the scalar into the kernel, the 8 ones stay an argument."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.multiply(x, relax.const(factor, "float32")), relax.const(np.ones(8, "float32"))))
        bb.emit_func_output(out)
    return bb.get()


def test_an_options_kernels_are_kept_by_the_networks_structure_and_scalar_constants_not_its_weights_values() -> None:
    """Weights retrained keep the kernels (and their cost: a structural hash of ResNet-18's weights took 24 ms a compile);
    a scalar written into a kernel, or another shape, names other kernels."""
    assert network_digest(conv_net()) == network_digest(bound(ConvNet(), (1, 8, 10, 10), scale=2.0))
    assert network_digest(conv_net()) != network_digest(bound(ConvNet(), (1, 8, 12, 12)))
    kernels = {f: sorted(str(k.identity.key) for k in models.kernels(scaled(f), CPU, NO_REWRITES)) for f in (0.5, 0.7)}
    assert kernels[0.5] != kernels[0.7]
    assert network_digest(scaled(0.5)) != network_digest(scaled(0.7))


def test_a_kept_identity_is_taken_only_where_its_key_derives_from_its_fields() -> None:
    """The kernel cache is this machine's own, read as written (as its identity entries are), but an entry that does not
    name its kernel by its fields (another shape, a field changed) is no identity, and the option is fused again."""
    from schedhub.hooks.kernels.identity import kept_identity

    identity = kernel_identities(GIVEN)[0]
    assert kept_identity(identity.to_dict()) == identity
    for changed in ({"workload": identity.workload + " "}, {"schema": "other/9"}, {"args_info": "[]"}, {"op": None}):
        assert kept_identity({**identity.to_dict(), **changed}) is None, changed
    assert kept_identity("not an identity") is None
