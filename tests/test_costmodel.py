"""The cost model the transfer bench judges as a ranking: real traces, real features, real xgboost."""

from __future__ import annotations

import json

import pytest
import tvm
from tvm import te

from schedhub.hooks import costmodel
from schedhub.hooks.identity import plain_json, workload_identity, workload_module
from schedhub.hooks.msdb import normalize_mod, replayed
from schedhub.registry import Record, Trial, TrialLog

TARGET = {"kind": "llvm", "mcpu": "znver1", "num-cores": 2}


def matmul(n: int) -> tvm.IRModule:
    a, b = te.placeholder((n, 64), name="A"), te.placeholder((64, 64), name="B")
    r = te.reduce_axis((0, 64), name="k")
    c = te.compute((n, 64), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def vectorized(mod: tvm.IRModule) -> str:
    """A trace that splits the matmul's inner loop and vectorizes it: what makes such a kernel fast."""
    sch = tvm.s_tir.Schedule(mod)
    block = sch.get_sblock("matmul")
    i, j, k = sch.get_loops(block)
    sch.reorder(i, k, j)
    _, inner = sch.split(j, factors=[None, 8])
    sch.vectorize(inner)
    sch.parallel(i)
    return json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":"))


def record(n: int, trace: str, secs: float, untuned_secs: float) -> Record:
    identity = workload_identity(matmul(n), TARGET, "matmul")
    return Record(identity, trace, [secs], {"untuned_secs": untuned_secs})


def test_a_model_trained_on_registry_records_ranks_a_schedule_it_never_saw_and_survives_json() -> None:
    # Vectorized schedules ran 20× faster than unscheduled kernels at every trained size.
    records = [record(n, vectorized(matmul(n)), 1e-6 * n, 20e-6 * n) for n in (16, 32, 64, 128, 256)]
    data = list(costmodel.samples(records))
    assert len(data) == 2 * len(records)  # each trace on its own workload, and each workload unscheduled
    assert all(len(s.features) == costmodel.WIDTH for s in data)
    model = costmodel.CostModel.train(data)

    unseen = normalize_mod(workload_module(workload_identity(matmul(96), TARGET, "matmul").workload)["main"])
    target, work = tvm.target.Target(TARGET), costmodel.flops(unseen)
    rows = [costmodel.features(replayed(unseen, vectorized(matmul(96))), target, work), costmodel.features(unseen, target, work)]
    fast, slow = model.predict(rows)
    assert fast > slow + 2  # log₂ GFLOPS: the vectorized schedule ranks first, by a wide margin

    again = costmodel.CostModel.from_json(model.to_json())
    assert again.predict(rows) == pytest.approx([fast, slow], abs=1e-6)


def test_a_model_is_read_only_from_json_and_needs_samples() -> None:
    with pytest.raises(ValueError):
        costmodel.CostModel.from_json("\x80\x04 not json")  # a pickle's first bytes, for one
    with pytest.raises(ValueError):
        costmodel.CostModel.train([])


def test_a_model_trained_on_the_measurement_log_learns_from_slow_trials_too() -> None:
    unscheduled = json.dumps(plain_json(tvm.s_tir.Schedule(matmul(8)).trace.as_json()))  # no instructions: the kernel as it is
    foreign = json.dumps([[["GetSBlock", [], ["conv", "main"], ["b0"]]], []])  # another structure's trace: does not replay
    logs = [TrialLog(workload_identity(matmul(n), TARGET, "matmul"),
                     [Trial(vectorized(matmul(n)), 1e-6 * n), Trial(unscheduled, 20e-6 * n), Trial(foreign, 1e-6)]) for n in (16, 32, 64, 128, 256)]  # fmt: skip
    data = list(costmodel.log_samples(logs))
    assert len(data) == 2 * len(logs)  # each replayable trial once; the foreign trace gives none
    model = costmodel.CostModel.train(data)
    unseen = normalize_mod(workload_module(workload_identity(matmul(96), TARGET, "matmul").workload)["main"])
    target, work = tvm.target.Target(TARGET), costmodel.flops(unseen)
    fast, slow = model.predict([costmodel.features(replayed(unseen, vectorized(matmul(96))), target, work), costmodel.features(unseen, target, work)])
    assert fast > slow + 2
