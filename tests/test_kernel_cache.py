"""The hook's apply pass and its per-machine kernel cache: what TVM's MetaScheduleApplyDatabase
gives, and a second compile that replays nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks import use
from schedhub.hooks.kernels.cache import MAX_BYTES_ENV, KernelCache, prune
from schedhub.hooks.build.objects import OBJECT_ID
from schedhub.hooks.pipeline import IS_SCHEDULED, apply_records, fusion_passes, prefetch
from schedhub.registry import LocalRegistry
from schedhub.tuner.networks.models import kernels

from .hand_tuner import tune
from .test_transfer import CPU, export, forward, reference


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> LocalRegistry:
    """Hand-tuned records of every kernel of the MLP at batch 4."""
    reg = LocalRegistry(tmp_path_factory.mktemp("cached"), sync=False)
    reg.put_many([tune(k.identity) for k in kernels(export(4), CPU, NO_REWRITES)])
    return reg


def test_the_session_applies_exactly_what_metaschedule_applies(registry: LocalRegistry) -> None:
    with CPU:
        fused = fusion_passes()(export(4))
    with use(registry, CPU, cache=False), CPU:
        ours = apply_records(prefetch(fused))
        theirs = relax.transform.MetaScheduleApplyDatabase()(fused)  # TVM's pass, through the session's database
    prims = {gv.name_hint: f for gv, f in theirs.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert len(prims) == 4 and all(f.attrs.get(IS_SCHEDULED) for f in prims.values())
    for name, func in prims.items():  # body and attributes; ours also names the kernel's machine code
        assert str(ours[name].attrs[OBJECT_ID]).startswith("object-")
        tvm.ir.assert_structural_equal(ours[name].without_attr(OBJECT_ID), func)


def test_a_second_compile_replays_nothing_and_a_damaged_entry_is_replayed(tmp_path: Path, registry: LocalRegistry) -> None:
    """Entries counted for one fixed set of rewrites: ``"auto"`` (the default) also identifies the prepacked twins' kernels."""
    cache = tmp_path / "cache"
    x = np.random.default_rng(5).standard_normal((4, 64)).astype("float32")
    with use(registry, CPU, cache=cache, prepack=False) as first:
        tvm.compile(export(4), CPU)
    assert first.report.hits == 4 and first.cache.hits == 0
    assert len(list((cache / "identity").glob("*.json"))) == len(list((cache / "scheduled").glob("*.json"))) == 4
    with use(registry, CPU, cache=cache, prepack=False) as second:
        ex = tvm.compile(export(4), CPU)
    assert second.report.hits == 4 and second.cache.misses == 0 and second.cache.hits == 8  # identities and schedules
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)
    for i, entry in enumerate(sorted((cache / "scheduled").glob("*.json"))):  # damaged two ways
        entry.write_text(json.dumps({"module": "{not TVM's json"}) if i % 2 else "{truncated")
    with use(registry, CPU, cache=cache, prepack=False) as third:
        ex = tvm.compile(export(4), CPU)
    assert third.report.hits == 4 and third.report.problems == []  # replayed again: nothing refused
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)
    with use(registry, CPU, cache=cache, prepack=False) as fourth:
        tvm.compile(export(4), CPU)
    assert fourth.cache.misses == 0  # rewritten by the third compile


def test_a_trace_that_failed_on_a_kernel_is_remembered_and_still_refused(tmp_path: Path, registry: LocalRegistry) -> None:
    records = {r.identity.op: r for s in registry.summaries() for r in registry.get(s.key)}
    transpose = next(r for op, r in records.items() if op.startswith("transpose"))
    matmul = next(r for op, r in records.items() if "matmul" in op)
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.put(type(matmul).from_obj(matmul.to_dict() | {"trace": transpose.trace}))  # a matmul key with a transpose's trace
        outcomes = []
        for _ in range(2):
            with use(reg, CPU, cache=tmp_path / "cache", transfer=False) as session:
                tvm.compile(export(4), CPU)
            outcomes.append({k.op: k.outcome for k in session.report.kernels}[matmul.identity.op])
        assert outcomes == ["fallback", "fallback"]
        assert "ReplayFailed" in session.report.problems[0]  # the second time from the cache, without a replay
        assert [e for e in (tmp_path / "cache" / "scheduled").glob("*.json") if "error" in json.loads(e.read_text())]


def _static_libraries(ex: object) -> list[object]:
    return [m for m in ex.mod.imports if m.kind == "static_library"]  # type: ignore[attr-defined]


def test_scheduled_kernels_are_compiled_once_per_machine_and_linked(tmp_path: Path, registry: LocalRegistry) -> None:
    cache = tmp_path / "cache"
    x = np.random.default_rng(6).standard_normal((4, 64)).astype("float32")
    with use(registry, CPU, cache=cache) as first:
        ex = tvm.compile(export(4), CPU)
    assert first.report.hits == 4 and first.objects is not None and first.objects.compiled == first.objects.linked == 4
    assert len(_static_libraries(ex)) == 4 and len(list((cache / "objects").glob("*.o"))) == 4
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)  # linked when the VM loads it

    with use(registry, CPU, cache=cache) as second:
        ex = tvm.compile(export(4), CPU)
    assert second.objects is not None and (second.objects.compiled, second.objects.linked) == (0, 4)
    assert (second.report.linked, second.report.objects_compiled) == (4, 0) and "4 kernel objects linked (0 compiled now)" in second.report.summary()
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)
    ex.export_library(str(tmp_path / "model.so"))  # the objects go into an exported library too
    np.testing.assert_allclose(forward(tvm.runtime.load_module(str(tmp_path / "model.so")), x), reference(x), rtol=1e-4, atol=1e-4)

    damaged = sorted((cache / "objects").glob("*.o"))
    damaged[0].write_bytes(b"not an object")
    damaged[1].write_bytes(damaged[1].read_bytes()[: len(damaged[1].read_bytes()) // 2])  # an ELF file cut short
    overwritten = bytearray(damaged[2].read_bytes())
    overwritten[len(overwritten) // 2] ^= 0xFF
    damaged[2].write_bytes(bytes(overwritten))  # one byte of its code changed
    with use(registry, CPU, cache=cache) as third:
        ex = tvm.compile(export(4), CPU)
    assert third.objects is not None and (third.objects.compiled, third.objects.linked) == (3, 4)
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)

    with use(registry, CPU, cache=cache, link=False) as unlinked:
        ex = tvm.compile(export(4), CPU)
    assert unlinked.objects is None and _static_libraries(ex) == []
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_objects_that_cannot_be_written_or_built_leave_their_kernels_to_the_models_own_module(tmp_path: Path, registry: LocalRegistry,
                                                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A full or unwritable cache disk (a folder of the cache here a file) does not break the compile: those kernels are
    built in the model's own module, as without the cache, and the report says so once. An object build that TVM
    refuses would fail the model's build as well: those kernels go back to their unscheduled form (their records are
    refused and complained about), and the compile goes on."""
    from schedhub.hooks.build import objects

    x = np.random.default_rng(9).standard_normal((4, 64)).astype("float32")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "objects").write_text("not a folder")
    with use(registry, CPU, cache=cache) as unwritable:
        ex = tvm.compile(export(4), CPU)
    assert unwritable.report.hits == 4 and unwritable.objects is not None and unwritable.objects.linked == 0 and _static_libraries(ex) == []
    assert len(unwritable.report.problems) == 1 and "kernel objects not cached" in unwritable.report.problems[0]  # said once, not per kernel
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)

    entries = tmp_path / "entries"
    entries.mkdir()
    (entries / "scheduled").write_text("not a folder")
    with use(registry, CPU, cache=entries) as lost:
        ex = tvm.compile(export(4), CPU)
    assert lost.report.hits == 4 and lost.objects is not None and lost.objects.linked == 4
    assert len(lost.report.problems) == 1 and "the kernel cache in" in lost.report.problems[0] and "Error: " in lost.report.problems[0]
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)

    def refused(*_args: object) -> None:
        raise tvm.error.InternalError("an object build TVM refuses")

    monkeypatch.setattr(objects.ObjectCache, "_compile", staticmethod(refused))
    with use(registry, CPU, cache=tmp_path / "other") as failing:
        ex = tvm.compile(export(4), CPU)
    assert [k.outcome for k in failing.report.kernels] == ["fallback"] * 4
    assert failing.objects is not None and failing.objects.linked == 0 and _static_libraries(ex) == []
    assert len(failing.report.problems) == 4 and all("does not build: InternalError: an object build TVM refuses" in p for p in failing.report.problems)
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_what_tvm_raises_is_what_the_hook_catches_as_a_tvm_error() -> None:
    """apache-tvm 0.27 raises Python's own types through tvm-ffi; ``tvm.TVMError`` is gone."""
    from schedhub.hooks.kernels.errors import TVM_ERRORS

    assert not hasattr(tvm, "TVMError") and not hasattr(tvm.error, "TVMError")
    sch = tvm.s_tir.Schedule(export_kernel())
    with pytest.raises(TVM_ERRORS):
        sch.get_sblock("no such block")
    with pytest.raises(TVM_ERRORS):
        tvm.tirx.build(tvm.IRModule(), target=tvm.target.Target({"kind": "no such kind"}))


def export_kernel() -> tvm.IRModule:
    """One kernel of the MLP as its own module."""
    from schedhub.hooks.kernels.identity import workload_module

    return workload_module(kernels(export(4), CPU, NO_REWRITES)[0].identity.workload)


def test_each_kernels_object_compiles_from_the_moment_it_is_scheduled(tmp_path: Path, registry: LocalRegistry) -> None:
    cache = tmp_path / "cache"
    with CPU:
        fused = fusion_passes()(export(4))
    with use(registry, CPU, cache=cache) as session, CPU:
        scheduled = apply_records(prefetch(fused))  # the apply pass alone, no link yet
        assert session.objects is not None
        session.objects.settle()  # waits for the compiles the apply pass started (what a measurement does first)
        assert len(list((cache / "objects").glob("*.o"))) == 4
        session.objects.close()  # forgets them: the link below finds them cached
        linked, done = session.objects.link(scheduled, CPU)
    assert (done.linked, done.compiled) == (4, 0)  # nothing left to compile when the build links
    assert not any(isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get(OBJECT_ID) for _, f in linked.functions_items())


def test_the_cache_is_bounded_and_keeps_what_was_used_recently(tmp_path: Path, registry: LocalRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    stale = cache / "scheduled"
    stale.mkdir(parents=True)
    day_ago = time.time() - 86400
    for i in range(8):  # entries of kernels nobody compiled for a day: 8 × 64 KiB
        path = stale / f"stale-{i}.json"
        path.write_text(json.dumps({"module": "x" * (64 << 10)}))
        os.utime(path, (day_ago + i, day_ago + i))
    monkeypatch.setenv(MAX_BYTES_ENV, str(300 << 10))
    with use(registry, CPU, cache=cache, prepack=False) as session:
        ex = tvm.compile(export(4), CPU)
    assert session.report.hits == 4 and session.objects is not None and session.objects.linked == 4
    left = sorted(p.name for p in stale.glob("stale-*.json"))
    assert 0 < len(left) < 8 and left == [f"stale-{i}.json" for i in range(8 - len(left), 8)]  # the oldest went first
    assert sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) <= 300 << 10
    # What this compile wrote or used stays, and the next compile is served from it.
    assert len(list((cache / "identity").glob("*.json"))) == 4 and len(list((cache / "objects").glob("*.o"))) == 4
    x = np.random.default_rng(6).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)
    with use(registry, CPU, cache=cache, prepack=False) as again:
        tvm.compile(export(4), CPU)
    assert again.cache.misses == 0 and again.objects is not None and again.objects.compiled == 0


def test_a_hit_marks_an_entry_used_so_pruning_keeps_it(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    for i in range(4):
        cache.put("scheduled", (str(i),), {"module": "x" * 1000})
    week_ago = time.time() - 7 * 86400
    for path in (tmp_path / "scheduled").iterdir():
        os.utime(path, (week_ago, week_ago))
    assert cache.get("scheduled", "2") is not None  # used now
    assert prune(tmp_path, 2500) > 0
    assert [i for i in range(4) if cache.get("scheduled", str(i)) is not None] == [2]
    assert prune(tmp_path, 10_000) == 0  # under the bound: nothing goes
