"""Synthesis: a kernel with no record anywhere gets a schedule drawn from its own design space, ranked by
a cost model trained on the registry's measurement log and timed here (real samples, timings, xgboost)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks.kernels.defaults import default_schedule
from schedhub.hooks.kernels.identity import workload_module
from schedhub.hooks.kernels.measure import KernelBench, build_all, host_cpu
from schedhub.hooks.metaschedule.msdb import normalize_mod, replayed, trace_text
from schedhub.hooks.metaschedule.synthesis import TIMED, design_space_samples
from schedhub.registry import LocalRegistry, Record, Trial, TrialLog
from schedhub.tuner.networks.models import kernels

from .networks import use_transfers as use
from .test_transfer import export, forward, reference

HOST = {"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2}  # measured only for this machine's CPU
DRAWN = 16  # design-space samples timed per kernel of the training log


def measured_log(batch: int) -> list[TrialLog]:
    """The MLP's kernels at ``batch``: design-space samples, each timed here, as the log a tuner pushes."""
    target = tvm.target.Target(HOST)
    logs = []
    for kernel in kernels(export(batch), target, NO_REWRITES):
        normalized = normalize_mod(workload_module(kernel.identity.workload)["main"])
        samples = design_space_samples(normalized, target, DRAWN)
        default, *built = build_all([normalized, *(s.mod for s in samples)], target, workers=2)
        bench = KernelBench(default, kernel.identity.args_info, target)
        timed = [(trace_text(s.trace), bench.time(lib).secs) for s, lib in zip(samples, built)]
        logs.append(TrialLog(kernel.identity, [Trial(trace, secs) for trace, secs in timed if secs]))
    return logs


@pytest.fixture(scope="module")
def training_log() -> list[TrialLog]:
    return measured_log(4)


def registry_with(root: Path, logs: list[TrialLog], pushed_by: str = "worker", verified: bool = True) -> LocalRegistry:
    """A registry without a single record: only the measurement log."""
    reg = LocalRegistry(root, sync=False)
    for entry in logs:
        reg.push_trials(entry, pushed_by, verified=verified)
    return reg


def test_the_default_schedule_is_timed_on_the_bench_inputs_as_a_contender() -> None:
    """``KernelBench.time_default`` times the kernel as its target builds it without records (on a GPU DLight's
    schedule, the contender a candidate must beat; here the unscheduled kernel, which the samples beat)."""
    target = tvm.target.Target(HOST)
    kernel = kernels(export(8), target, NO_REWRITES)[0]
    normalized = normalize_mod(workload_module(kernel.identity.workload)["main"])
    samples = design_space_samples(normalized, target, 8)
    default, *built = build_all([default_schedule(normalized, target), *(s.mod for s in samples)], target, workers=2)
    bench = KernelBench(default, kernel.identity.args_info, target)
    timed = [t.secs for t in map(bench.time, built) if t.secs]
    assert timed and bench.time_default() > min(timed)


def test_a_design_space_sample_replays_from_its_trace_text() -> None:
    kernel = kernels(export(8), tvm.target.Target(HOST), NO_REWRITES)[0]
    normalized = normalize_mod(workload_module(kernel.identity.workload)["main"])
    samples = design_space_samples(normalized, tvm.target.Target(HOST), 4)
    assert len(samples) >= 2 and len({trace_text(s.trace) for s in samples}) == len(samples)
    assert all(tvm_ffi.structural_equal(replayed(normalized, trace_text(s.trace)), s.mod) for s in samples)


def test_kernels_without_any_record_are_served_the_fastest_synthesized_schedule(tmp_path: Path, training_log: list[TrialLog]) -> None:
    host = tvm.target.Target(HOST)
    with registry_with(tmp_path / "store", training_log) as reg:
        with use(reg, host, cache=tmp_path / "plain", measure=120) as plain:
            tvm.compile(export(16), host)
        assert plain.report.misses == len(plain.report.kernels) > 0  # nothing to transfer: every kernel misses
        with use(reg, host, cache=tmp_path / "cache", measure=120, synthesize=16) as session:
            ex = tvm.compile(export(16), host)
        report = session.report
        synthesized = [k for k in report.kernels if k.outcome == "synthesized"]
        assert len(synthesized) == len(report.kernels) and report.misses == 0, report.summary()
        assert session.log_model.trained_on[next(iter(session.log_model.trained_on))] == sum(len(e.trials) for e in training_log)
        for k in synthesized:  # the fastest of the timed samples is served
            relation, tid, _ = k.detail.split(":")
            timed = {t: s for t, s in k.measured.items() if s is not None}
            assert relation == "synthesized" and tid == min(timed, key=timed.__getitem__)
        assert sum(len(k.measured) >= 2 for k in synthesized) >= 2  # the matmuls had several to choose from (a transpose has one)
        assert max(len(k.measured) for k in synthesized) == TIMED  # the model's best TIMED of a matmul's 16 samples, not only its first choice
        assert {j["key"] for j in reg.jobs("pending")} == {k.key for k in report.kernels}  # still queued for tuning
        x = np.random.default_rng(3).standard_normal((16, 64)).astype("float32")
        np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)

    # Once a machine: another registry without a log serves the same schedules from this machine's cache.
    with registry_with(tmp_path / "empty", []) as empty, use(empty, host, cache=tmp_path / "cache", measure=120, synthesize=16) as again:
        tvm.compile(export(16), host)
    assert [(k.outcome, k.detail) for k in again.report.kernels] == [(k.outcome, k.detail) for k in report.kernels]
    assert again.log_model.trained_on == {}  # no model was needed


def test_only_a_trusted_log_trains_the_model(tmp_path: Path, training_log: list[TrialLog]) -> None:
    host = tvm.target.Target(HOST)
    with registry_with(tmp_path / "store", training_log, pushed_by="stranger", verified=False) as reg:
        with use(reg, host, cache=tmp_path / "verified", measure=60, synthesize=8) as strict:
            tvm.compile(export(16), host)
        assert strict.report.synthesized == 0 and strict.log_model.trained_on == {}
        with use(reg, host, cache=tmp_path / "named", measure=60, synthesize=8, trust={"stranger"}) as named:
            tvm.compile(export(16), host)
        assert named.report.synthesized == len(named.report.kernels) > 0


def test_synthesis_needs_a_measurement_budget_and_a_sane_sample_count(tmp_path: Path, training_log: list[TrialLog]) -> None:
    host = tvm.target.Target(HOST)
    with registry_with(tmp_path / "store", training_log) as reg:
        with use(reg, host, cache=tmp_path / "cache", synthesize=16) as unmeasured:  # nothing is served unmeasured
            tvm.compile(export(16), host)
        assert unmeasured.report.synthesized == 0 and unmeasured.report.misses == len(unmeasured.report.kernels)
        for bad in (-1, 10**6, 2.5, True):
            with pytest.raises(ValueError, match="synthesize"), use(reg, host, synthesize=bad):
                pass


def test_the_model_is_trained_once_per_log_content_and_a_grown_log_featurizes_only_its_new_trials(tmp_path: Path, training_log: list[TrialLog]) -> None:
    from schedhub.hooks.kernels.cache import KernelCache
    from schedhub.hooks.kernels.identity import target_text
    from schedhub.hooks.kernels.measure import Budget
    from schedhub.hooks.metaschedule.synthesis import LogModel

    target = target_text(tvm.target.Target(HOST))
    first, rest = training_log[:1], training_log[1:]
    with registry_with(tmp_path / "store", first + rest) as reg:
        cache = KernelCache(tmp_path / "cache")
        assert LogModel(reg, cache, lambda e: True, verified_only=True).get(target, Budget(0)) is None  # no time: no model
        assert LogModel(reg, cache, lambda e: True, verified_only=True).get(target, Budget(120)) is not None
        trained = cache.writes
        again = LogModel(reg, cache, lambda e: True, verified_only=True)
        assert again.get(target, Budget(120)) is not None and cache.writes == trained  # read back, nothing featurized or trained
        more = measured_log(32)  # the log grows: only the new trials are featurized
        for entry in more:
            reg.push_trials(entry, "worker")
        grown = LogModel(reg, cache, lambda e: True, verified_only=True)
        assert grown.get(target, Budget(120)) is not None
        known = {(e.identity.key, t.trace) for e in training_log for t in e.trials}
        new_trials = {(e.identity.key, t.trace) for e in more for t in e.trials} - known  # the weight transposes do not depend on the batch
        assert cache.writes - trained == len(new_trials) + 1  # each new trial's features, and the model
        assert grown.trained_on[target] == len(known) + len(new_trials)


def test_a_worker_publishes_the_model_when_the_log_grew_and_a_compile_uses_it_without_training(tmp_path: Path, training_log: list[TrialLog]) -> None:
    from schedhub.hooks.kernels.cache import KernelCache
    from schedhub.hooks.metaschedule.costmodel import FEATURES
    from schedhub.hooks.kernels.identity import compiler_fingerprint, target_text
    from schedhub.hooks.kernels.measure import Budget
    from schedhub.hooks.metaschedule.synthesis import LogModel
    from schedhub.tuner.workloads.publish import publish_cost_model

    target = target_text(tvm.target.Target(HOST))
    logged = sum(len(e.trials) for e in training_log)
    with registry_with(tmp_path / "store", training_log) as reg:
        cache = KernelCache(tmp_path / "cache")
        first = publish_cost_model(reg, target, cache, "w")
        assert first.stored and (first.trials, first.served_before) == (logged, 0)
        again = publish_cost_model(reg, target, cache, "w")
        assert not again.stored and "learned from" in again.reason  # the log did not grow: not trained again
        compile_side = LogModel(reg, KernelCache(tmp_path / "fresh"), lambda e: e.verified, verified_only=True)
        model = compile_side.get(target, Budget(0))  # no time to train: the served model
        served = reg.cost_model(target, compiler_fingerprint(), FEATURES)
        assert model is not None and served is not None and model.trees == served.trees and compile_side.trained_on[target] == logged
        for entry in training_log:  # a second worker's log of the same trials: the log doubles
            reg.push_trials(entry, "w2")
        grown = publish_cost_model(reg, target, cache, "w")
        assert grown.stored and (grown.trials, grown.served_before) == (2 * logged, logged)
    with registry_with(tmp_path / "claims", training_log, verified=False) as reg:
        claimed = publish_cost_model(reg, target, cache, "w")  # only a verified log teaches a served model
        assert not claimed.stored and "train no model" in claimed.reason


def test_a_model_past_the_logs_cap_is_trained_again_once_enough_of_what_it_would_learn_from_is_new(
    tmp_path: Path, training_log: list[TrialLog], monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """A model learns from at most MAX_LOG_TRIALS of the log. Once the log is past it, the count stays at the cap
    while the trials it covers change (here a second worker's timings of the same kernels take half the places):
    the machine that published the model counts what is new to it and trains again; another machine, which does
    not know what the served model learned from, counts the log's growth (none)."""
    from schedhub.hooks.metaschedule import synthesis
    from schedhub.hooks.kernels.cache import KernelCache
    from schedhub.hooks.kernels.identity import target_text
    from schedhub.tuner.workloads import publish
    from schedhub.tuner.workloads.publish import publish_cost_model

    target = target_text(tvm.target.Target(HOST))
    logged = sum(len(e.trials) for e in training_log)
    monkeypatch.setattr(synthesis, "MAX_LOG_TRIALS", logged)
    monkeypatch.setattr(publish, "MIN_NEW_TRIALS", 8)
    with registry_with(tmp_path / "store", training_log) as reg:
        cache = KernelCache(tmp_path / "cache")
        assert publish_cost_model(reg, target, cache, "w").stored
        for entry in training_log:
            reg.push_trials(entry, "w2")
        elsewhere = publish_cost_model(reg, target, KernelCache(tmp_path / "other"), "w3")
        assert not elsewhere.stored and elsewhere.trials == logged  # the capped count did not grow
        again = publish_cost_model(reg, target, cache, "w")
        assert again.stored and (again.trials, again.served_before) == (logged, logged)
        assert not publish_cost_model(reg, target, cache, "w").stored  # nothing new since


def test_a_registry_that_refuses_a_model_is_answered_per_target_and_nothing_is_served(tmp_path: Path, training_log: list[TrialLog]) -> None:
    """A token without the worker role trains the model and is refused the push: each target's refusal comes
    back once to the caller (a worker stops trying; ``tune --publish`` logs it), and no model is served."""
    from schedhub.hooks.kernels.cache import KernelCache
    from schedhub.hooks.metaschedule.costmodel import FEATURES
    from schedhub.hooks.kernels.identity import compiler_fingerprint, target_text
    from schedhub.registry import Forbidden, Principal, RegistryClient, ServerThread
    from schedhub.tuner.workloads.dispatch import publish_each, publish_models

    target = target_text(tvm.target.Target(HOST))
    registry_with(tmp_path / "store", training_log).close()
    with ServerThread(tmp_path / "store", tokens={"r-tok": Principal("reader", "read")}, sync=False) as srv, RegistryClient(srv.url, token="r-tok") as reader:
        outcomes = list(publish_each(reader, [target, target], KernelCache(tmp_path / "cache")))
        assert [t for t, _ in outcomes] == [target] and isinstance(outcomes[0][1], Forbidden)
        assert publish_models(reader, [target]) == []
        assert reader.cost_model(target, compiler_fingerprint(), FEATURES) is None


SIBLING = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2}  # another CPU model of the registry (never run here)


def as_sibling(logs: list[TrialLog], batch: int) -> tuple[list[TrialLog], list[Record]]:
    """``logs`` as a sibling CPU's tuner would have pushed them (the same workloads under its target), and a
    record of that CPU for each kernel at ``batch``: what makes it a neighbour of this CPU's kernels."""
    sibling = tvm.target.Target(SIBLING)
    by_workload = {k.identity.workload: k.identity for k in kernels(export(4), sibling, NO_REWRITES)}
    relabelled = [TrialLog(by_workload[e.identity.workload], e.trials) for e in logs]
    records = []
    for kernel in kernels(export(batch), sibling, NO_REWRITES):
        normalized = normalize_mod(workload_module(kernel.identity.workload)["main"])
        records.append(Record(kernel.identity, trace_text(design_space_samples(normalized, sibling, 1)[0].trace), [1e-4], {"tuner": "test"}))
    return relabelled, records


def test_a_small_own_log_is_topped_up_with_a_siblings_log(tmp_path: Path, training_log: list[TrialLog], monkeypatch: pytest.MonkeyPatch) -> None:
    from schedhub.hooks.metaschedule import synthesis
    from schedhub.hooks.kernels.cache import KernelCache
    from schedhub.hooks.kernels.identity import target_text
    from schedhub.hooks.kernels.measure import Budget
    from schedhub.hooks.metaschedule.synthesis import LogModel

    host, sibling = target_text(tvm.target.Target(HOST)), target_text(tvm.target.Target(SIBLING))
    sibling_log, _ = as_sibling(training_log, 8)
    own, lent = (sum(len(e.trials) for e in log) for log in (training_log, sibling_log))
    with registry_with(tmp_path / "store", training_log + sibling_log) as reg:
        cache = KernelCache(tmp_path / "cache")

        def model(siblings: list[str], top_up: bool = True) -> LogModel:
            log_model = LogModel(reg, cache, lambda e: True, verified_only=True)
            if not top_up:
                log_model.top_up = False  # the default tops up
            assert log_model.get(host, Budget(120), siblings) is not None
            return log_model

        assert model([]).trained_on == {host: own}  # no sibling named: its own log alone
        assert model(["cuda -arch=sm_90", sibling], top_up=False).trained_on == {host: own}  # what a target with a model kept before
        topped = model(["{\"kind\":\"cuda\"}", sibling])  # another kind is never a sibling
        assert topped.trained_on == {host: own + lent} and topped.borrowed == {host: sibling}
        assert topped.get(host, Budget(120)) is topped.get(host, Budget(120), [sibling])  # lent once: the target's later kernels too
        monkeypatch.setattr(synthesis, "MAX_LOG_TRIALS", own)  # an own log that fills the model's training: nothing to top up
        full = model([sibling])
        assert full.trained_on == {host: own} and full.borrowed == {}


def test_a_cpu_model_new_to_the_registry_borrows_the_model_of_its_neighbours_cpu(tmp_path: Path, training_log: list[TrialLog]) -> None:
    from schedhub.hooks.kernels.identity import target_text

    host = tvm.target.Target(HOST)
    sibling_log, sibling_records = as_sibling(training_log, 8)
    with registry_with(tmp_path / "log-only", sibling_log) as reg:  # another CPU's log, no neighbour of it: no model
        with use(reg, host, cache=tmp_path / "log-only-cache", measure=120, synthesize=16, prepack=False) as alone:  # the kernels below
            tvm.compile(export(16), host)
        assert alone.report.synthesized == 0 and alone.log_model.borrowed == {} and alone.log_model.trained_on == {}
        lone = alone.report.kernels[0].op  # the first kernel a compile reaches; no record of the sibling's: no neighbour names it
        assert "matmul" in lone
        reg.put_many([r for r in sibling_records if r.identity.op != lone], "worker")  # the sibling CPU's records at batch 8
        with use(reg, host, cache=tmp_path / "cache", measure=120, synthesize=16, prepack=False) as session:
            ex = tvm.compile(export(16), host)  # the lone kernel is compiled first: it borrows through its neighbours' kernels
    report = session.report
    assert session.log_model.borrowed == {target_text(host): target_text(tvm.target.Target(SIBLING))}
    assert report.misses == 0 and report.transfers + report.synthesized == len(report.kernels), report.summary()
    assert max(len(k.measured) for k in report.kernels) >= TIMED  # the borrowed model's best samples were timed beside the transfer
    assert report.kernels[0].op == lone and report.kernels[0].outcome == "synthesized"  # reached first: the compile's other kernels named the sibling
    x = np.random.default_rng(5).standard_normal((16, 64)).astype("float32")
    np.testing.assert_allclose(forward(ex, x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_served_model_the_compile_cannot_use_is_only_a_model_less(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A served model of another feature width (a worker of another schedhub), and a registry whose every answer
    is garbage (a hostile or broken server): the compile's model source says so in the log, serves no model and
    raises nothing, so the compile goes on without synthesis."""
    import logging

    import msgpack

    from schedhub.hooks.kernels.cache import KernelCache
    from schedhub.hooks.metaschedule.costmodel import FEATURES, WIDTH
    from schedhub.hooks.kernels.identity import compiler_fingerprint, target_text
    from schedhub.hooks.kernels.measure import Budget
    from schedhub.hooks.metaschedule.synthesis import LogModel
    from schedhub.registry import CostModelEntry, RegistryClient

    from .scripted_server import Reply, ScriptedServer

    target = target_text(tvm.target.Target(HOST))
    tree = {"left": [1, -1, -1], "right": [2, -1, -1], "feature": [1, 0, 0], "value": [0.5, -1.0, 1.0], "default_left": [1, 0, 0]}
    narrow = CostModelEntry.from_obj({"target": target, "compiler": compiler_fingerprint(), "features": FEATURES, "trials": 900,
                                      "model": {"width": WIDTH - 1, "base": 0.0, "trees": [tree]}})  # fmt: skip
    caplog.set_level(logging.WARNING, logger="schedhub")
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        reg.push_cost_model(narrow, "worker")
        assert reg.cost_model(target, compiler_fingerprint(), FEATURES) is not None  # the store serves it
        models = LogModel(reg, KernelCache(tmp_path / "cache"), lambda e: True, verified_only=False)
        assert models.served(target) is None and models.get(target, Budget(5)) is None  # nor a log to train on
    assert f"reads {WIDTH - 1} features, not {WIDTH}" in caplog.text
    caplog.clear()
    garbage = Reply(200, "application/msgpack", msgpack.packb({"target": target, "model": [1, 2, 3]}))
    with ScriptedServer(garbage) as scripted, RegistryClient(scripted.url, retries=0, timeout=2) as client:
        models = LogModel(client, KernelCache(tmp_path / "cache"), lambda e: True, verified_only=False)
        assert models.get(target, Budget(5)) is None and models.served(target) is None
        assert scripted.requests == 2  # the model and the log, each asked once a session
    assert "could not read the registry's cost model" in caplog.text and "could not read the registry's measurement log" in caplog.text
