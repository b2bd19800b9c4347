"""Prepacked weights: a kernel whose schedule lays its weights out as it reads them (MetaSchedule's ``RewriteLayout``)
is served with that rewrite split out and folded into the constants at compile time, computes what the plain network
computes, and is a different kernel from the one compiled without prepacking (hooks/rewrites/__init__.py, hooks/pipeline.py);
the tuner's builds time such a kernel on its packed weights and check it whole (tuner/execution/kernels.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.s_tir import meta_schedule as ms

from schedhub.hooks import use
from schedhub.hooks.kernels.cache import digest_path, keep_digest
from schedhub.hooks.kernels.identity import plain_json, workload_module
from schedhub.hooks.pipeline import apply_database, call_counts
from schedhub.hooks.rewrites import prepack
from schedhub.hooks.rewrites.prepack import KIND
from schedhub.hooks.rewrites import NO_REWRITES, Rewrites
from schedhub.registry import Identity, Record
from schedhub.tuner.execution import kernels as tasks
from schedhub.tuner.networks import models
from schedhub.tuner.execution import tvm_env

from .networks import bound, run, store_of

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})
PREPACK = Rewrites(prepack=True)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        self.first = nn.Conv2D(8, 16, 3, padding=1, bias=True)
        self.second = nn.Conv2D(16, 16, 3, padding=1, bias=True)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.relu(self.second(nn.op.relu(self.first(x))))


def conv_net() -> tvm.IRModule:
    """Two 3×3 convolutions with bias and ReLU, weights bound as constants."""
    return bound(ConvNet(), (1, 8, 10, 10))


#: The design space's draws are seeded: a layout drawn at random can be one TVM sees as a reshape, which no object cache
#: links (``has_reshape_pattern``), and a test asserting what is linked would pass or fail by the draw.
SEED = 1


def packing_schedule(identity: Identity) -> tvm.s_tir.Schedule:
    """A schedule from the kernel's own CPU design space with MetaSchedule's postprocessors applied, ``RewriteLayout`` among them."""
    mod = workload_module(identity.workload)
    context = ms.TuneContext(mod=mod, target=CPU, space_generator="post-order-apply", search_strategy="replay-trace", task_name="main", rand_state=SEED)
    sch = context.space_generator.generate_design_space(mod)[0]
    for postproc in context.space_generator.postprocs:
        assert postproc.apply(sch), postproc
    return sch


def packing_record(identity: Identity) -> Record:
    sch = packing_schedule(identity)
    assert any(inst.kind.name == "TransformLayout" for inst in sch.trace.insts), "RewriteLayout chose no weight layout"
    return Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "tests.test_prepack"})


@pytest.fixture(scope="module")
def packing_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry holding, for each convolution of :func:`conv_net` marked for prepacking, a schedule that rewrites its weights."""
    return store_of(tmp_path_factory.mktemp("prepack") / "store", (k.identity for k in models.kernels(conv_net(), CPU, PREPACK)), packing_record)


def test_prepacked_network_hits_every_kernel_packs_its_weights_at_compile_time_and_computes_the_same(packing_store: Path, tmp_path: Path) -> None:
    mod = conv_net()
    x = np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype("float32")
    expected = run(tvm.compile(mod, CPU), x)
    with use(packing_store, CPU, prepack=True, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        applied = apply_database(mod)
        ex = tvm.compile(mod, CPU)
    assert session.report.hits == 2 and not session.report.misses, session.report.summary()
    kernels = [k.name for k in models.kernels(mod, CPU, PREPACK)]
    left = {gv.name_hint for gv, f in applied.functions_items() if isinstance(f, tvm.tirx.PrimFunc)} | set(call_counts(applied))
    assert not left & {*kernels, *(f"{k}_weight_prepack" for k in kernels)}, left  # split, and no weight rewrite left to run
    np.testing.assert_allclose(run(ex, x), expected, rtol=1e-4, atol=1e-4)


def test_prepacking_is_part_of_what_a_kernel_is(packing_store: Path, tmp_path: Path) -> None:
    """A compile that does not prepack finds none of the prepacked kernels' records; one that leaves prepacking to the
    registry (the default) finds them."""
    plain = {k.identity.key for k in models.kernels(conv_net(), CPU, NO_REWRITES)}
    packed = {k.identity.key for k in models.kernels(conv_net(), CPU, PREPACK)}
    assert len(plain) == len(packed) == 2 and not plain & packed
    with use(packing_store, CPU, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache", prepack=False) as session:
        tvm.compile(conv_net(), CPU)
    assert session.report.hits == 0 and session.report.misses == 2, session.report.summary()
    with use(packing_store, CPU, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        tvm.compile(conv_net(), CPU)
    assert session.report.hits == 2 and session.rewrites.prepack, session.report.summary()


def test_a_build_that_packs_weights_is_timed_on_them_and_checked_whole() -> None:
    """The build task answers a packing schedule with the arguments it is timed on and a whole build to check; measured
    with them it runs and matches the unscheduled kernel, measured without them it cannot even be called."""
    identity = models.kernels(conv_net(), CPU, PREPACK)[0].identity
    sch = packing_schedule(identity)
    searched = tasks.build(tvm.ir.save_json(sch.mod), identity.target)
    assert searched["artifact"] and "check_artifact" not in searched  # a search's candidate: one build, timed as MetaSchedule times it
    built = tasks.build(tvm.ir.save_json(sch.mod), identity.target, checkable=True)
    assert built["artifact"] and built["check_artifact"] and built["args_info"] != identity.args_info, built.get("error")
    assert built["args_info"] == tvm_env.packed_args_info(sch.mod)
    default = tasks.build(tvm.ir.save_json(workload_module(identity.workload)), identity.target, checkable=True)
    assert "check_artifact" not in default  # nothing packed: timed and checked as it is
    timing = {"number": 1, "repeat": 1, "min_repeat_ms": 0}
    answer = tasks.measure([default["artifact"], built["artifact"]], identity.args_info, timing, reference=default["artifact"], target_text=identity.target,
                           own_args=[None, built["args_info"]], checks=[None, built["check_artifact"]])  # fmt: skip
    assert [r["error"] for r in answer["results"]] == [None, None] and all(r["run_secs"] for r in answer["results"])
    unpacked = tasks.measure([built["artifact"]], identity.args_info, timing, reference=default["artifact"], target_text=identity.target)
    assert unpacked["results"][0]["run_secs"] is None and "run failed" in unpacked["results"][0]["error"]
    # The search's own build at hand (publishing times it again), only the whole build is made, to check it.
    whole = tasks.build(tvm.ir.save_json(sch.mod), identity.target, whole_only=True)
    assert whole["artifact"] is None and whole["error"] is None and whole["args_info"] == built["args_info"] and whole["check_artifact"]
    answer = tasks.measure([default["artifact"], searched["artifact"]], identity.args_info, timing, target_text=identity.target, first_is_reference=True,
                           own_args=[None, whole["args_info"]], checks=[None, whole["check_artifact"]])  # fmt: skip
    assert [r["error"] for r in answer["results"]] == [None, None], answer


def test_a_kernel_timed_with_its_caches_flushed_is_flushed_before_every_run() -> None:
    """``flush_cache`` (every argument but the first flushed, as a network's kernel finds its weights) times each run
    on its own: TVM flushes before each repeat, so ``number`` runs a repeat would time one flushed run and the rest
    warm. (It also failed every run before: TVM 0.27's Device has no ``device_type`` any more.)"""
    identity = models.kernels(conv_net(), CPU, NO_REWRITES)[0].identity
    default = tasks.build(tvm.ir.save_json(workload_module(identity.workload)), identity.target)
    answer = tasks.measure([default["artifact"]], identity.args_info, {"number": 3, "repeat": 2, "min_repeat_ms": 10, "flush_cache": True},
                           target_text=identity.target)  # fmt: skip
    assert answer["results"][0]["error"] is None and len(answer["results"][0]["run_secs"]) == 6, answer


def test_weights_tiled_by_their_schedule_are_packed_in_numpy_to_the_bits_of_tvms_rewrite(packing_store: Path, tmp_path: Path,
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``RewriteLayout``'s rewrites of the test network are tilings (hooks/rewrites/tiling.py): a compile does them in numpy and
    keeps nothing in the kernel cache, and the model computes what it computes with TVM's build of them, bit for bit."""
    mod, x = conv_net(), np.random.default_rng(2).standard_normal((1, 8, 10, 10)).astype("float32")

    def compile_prepacked(cache: Path) -> tuple[np.ndarray, Any]:
        with use(packing_store, CPU, prepack=True, trust="any", transfer=False, report_misses=False, cache=cache) as session:
            ex = tvm.compile(mod, CPU)
        return run(ex, x), session.report

    tiled, report = compile_prepacked(tmp_path / "tiled")
    assert report.hits == 2 and not (tmp_path / "tiled" / KIND).exists(), report.summary()
    monkeypatch.setattr(prepack, "tilings", lambda func, inputs: None)
    built, report = compile_prepacked(tmp_path / "built")
    assert report.hits == 2 and len(list((tmp_path / "built" / KIND).glob("*.npy"))) == 4, report.summary()  # two rewrites of two outputs
    np.testing.assert_array_equal(tiled, built)
    np.testing.assert_allclose(tiled, run(tvm.compile(mod, CPU), x), rtol=1e-4, atol=1e-4)


def test_a_later_prepacked_compile_links_its_kernels_and_reads_its_packed_weights_from_the_kernel_cache(packing_store: Path, tmp_path: Path,
                                                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a weights' rewrite is no tiling numpy does, the first prepacked compile keeps its outputs (and compiles each
    prepacked kernel's machine code); a later one reads the one and links the other, and computes the same, bit for bit.
    What it reads is what the entry holds (zeroed weights under their digest give another output); an entry overwritten
    (its bytes no longer its digest's), cut short, of other shapes or dtypes, or gone, or its digest gone, is rewritten again."""
    monkeypatch.setattr(prepack, "tilings", lambda func, inputs: None)
    mod, cache = conv_net(), tmp_path / "cache"
    x = np.random.default_rng(2).standard_normal((1, 8, 10, 10)).astype("float32")

    def compile_prepacked() -> tuple[np.ndarray, Any]:
        with use(packing_store, CPU, prepack=True, trust="any", transfer=False, report_misses=False, cache=cache) as session:
            ex = tvm.compile(mod, CPU)
        return run(ex, x), session.report

    first, report = compile_prepacked()
    assert report.hits == 2 and report.objects_compiled == report.linked == 2, report.summary()
    np.testing.assert_allclose(first, run(tvm.compile(mod, CPU), x), rtol=1e-4, atol=1e-4)
    entries = sorted((cache / KIND).glob("*.npy"))  # a file per output of each rewrite
    assert len({path.name.split(".")[0] for path in entries}) == 2, entries
    second, report = compile_prepacked()
    assert report.linked == 2 and report.objects_compiled == 0, report.summary()
    np.testing.assert_array_equal(second, first)
    kept = np.load(entries[0], allow_pickle=False)
    np.save(entries[0], np.zeros_like(kept))
    keep_digest(entries[0])  # an entry whose digest vouches for it is read as it is
    assert not np.array_equal(compile_prepacked()[0], first)
    np.save(entries[0], kept)
    keep_digest(entries[0])
    for spoilt in (lambda: np.save(entries[0], np.zeros_like(kept)), lambda: entries[0].write_bytes(entries[0].read_bytes()[:-4]),
                   lambda: np.save(entries[0], kept[:1]), lambda: np.save(entries[0], kept.astype("float64")), entries[0].unlink,
                   digest_path(entries[0]).unlink):
        spoilt()
        np.testing.assert_array_equal(compile_prepacked()[0], first)
        np.testing.assert_array_equal(np.load(entries[0], allow_pickle=False), kept)


def test_weights_given_as_parameters_are_packed_where_the_model_runs(tmp_path: Path) -> None:
    """Weights the model takes as parameters are no constants to rewrite at compile time: their rewrite stays in the
    model (linked from the object cache like the kernels), runs on what it is given, and the model computes what the
    plain one does."""
    mod, params = ConvNet().export_tvm({"forward": {"x": nn.spec.Tensor((1, 8, 10, 10), "float32")}})
    convs = [k.identity for k in models.kernels(mod, CPU, PREPACK) if "conv2d" in k.name]
    store = store_of(tmp_path / "store", convs, packing_record)
    rng = np.random.default_rng(3)
    weights = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.shape]).astype("float32")) for _, p in params]
    x = tvm.runtime.tensor(rng.standard_normal((1, 8, 10, 10)).astype("float32"))
    expected = relax.VirtualMachine(tvm.compile(mod, CPU), tvm.cpu())["forward"](x, *weights).numpy()
    with use(store, CPU, prepack=True, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
        applied = apply_database(mod)
        ex = tvm.compile(mod, CPU)
    assert len(convs) == 2 and session.report.hits == 2, session.report.summary()
    rewrites = [gv for gv, f in applied.functions_items() if gv.name_hint.endswith("_weight_prepack")]
    assert not rewrites and session.report.linked == 4, session.report.summary()  # both kernels, both rewrites: linked objects
    assert str(applied["forward"]).count("call_dps_packed") == 4
    assert not (tmp_path / "cache" / KIND).exists()
    np.testing.assert_allclose(relax.VirtualMachine(ex, tvm.cpu())["forward"](x, *weights).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_a_kernel_whose_schedule_lays_no_weights_out_is_linked_as_it_is(tmp_path: Path) -> None:
    """A kernel marked for prepacking whose record rewrites no layout is not split: it keeps its machine code's object
    id and is linked from the object cache like the split kernels (it was compiled with the model on every compile)."""
    identities = [k.identity for k in models.kernels(conv_net(), CPU, PREPACK)]
    assert "conv2d" in identities[1].op

    def plain(identity: Identity) -> Record:
        sch = tvm.s_tir.Schedule(workload_module(identity.workload))
        sch.parallel(sch.get_loops(sch.get_sblock("conv2d_nchw"))[0])
        return Record(identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-4], {"tuner": "tests.test_prepack"})

    store = store_of(tmp_path / "store", identities, lambda i: plain(i) if i == identities[1] else packing_record(i))
    x = np.random.default_rng(4).standard_normal((1, 8, 10, 10)).astype("float32")
    outputs = []
    for _ in range(2):
        with use(store, CPU, prepack=True, trust="any", transfer=False, report_misses=False, cache=tmp_path / "cache") as session:
            outputs.append(run(tvm.compile(conv_net(), CPU), x))
        assert session.report.hits == 2 and session.report.linked == 2, session.report.summary()
    assert session.report.objects_compiled == 0, session.report.summary()
    np.testing.assert_array_equal(outputs[1], outputs[0])
    np.testing.assert_allclose(outputs[0], run(tvm.compile(conv_net(), CPU), x), rtol=1e-4, atol=1e-4)
