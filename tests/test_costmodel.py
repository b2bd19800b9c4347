"""The cost model the transfer bench judges as a ranking: real traces, real features, real xgboost."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import te

from schedhub.hooks.metaschedule import costmodel
from schedhub.hooks.kernels.identity import plain_json, workload_identity, workload_module
from schedhub.hooks.metaschedule.msdb import normalize_mod, replayed
from schedhub.registry import InvalidRecord, Record, Trial, TrialLog, packb, unpackb

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


def test_a_model_trained_on_registry_records_ranks_a_schedule_it_never_saw_and_survives_the_wire() -> None:
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

    again = costmodel.CostModel.from_obj(unpackb(packb(model.to_dict())))  # as a registry stores and serves it
    assert again.predict(rows) == pytest.approx([fast, slow], abs=1e-6)


def test_the_trees_predict_what_xgboost_predicts_missing_features_included() -> None:
    import xgboost as xgb

    rng = np.random.default_rng(0)
    rows = rng.random((300, costmodel.WIDTH)).astype(np.float32)
    labels = rows[:, :5].sum(axis=1) * 3 + rows[:, 100]
    booster = xgb.train(costmodel.PARAMS, xgb.DMatrix(rows, label=labels), num_boost_round=50)
    model = costmodel.CostModel(costmodel.booster_trees(booster, costmodel.WIDTH))
    probe = rng.random((64, costmodel.WIDTH)).astype(np.float32)
    probe[::3, :5] = np.nan  # missing: each split's default branch
    ours = np.array(model.predict(list(probe)))
    assert np.abs(ours - booster.predict(xgb.DMatrix(probe))).max() < 1e-4
    assert ours.std() > 0.5  # the rows differ: a constant model would not pass as equal
    with pytest.raises(ValueError):
        model.predict([probe[0][:10]])  # a row of another width


def test_a_model_needs_samples_and_a_malformed_one_is_refused_before_it_is_evaluated() -> None:
    with pytest.raises(ValueError):
        costmodel.CostModel.train([])
    good = {"width": 4, "base": 0.5, "trees": [{"left": [1, -1, -1], "right": [2, -1, -1], "feature": [3, 0, 0], "value": [0.5, -1.0, 1.0], "default_left": [1, 0, 0]}]}
    model = costmodel.CostModel.from_obj(good)
    assert model.predict([np.array([0, 0, 0, 0.2]), np.array([0, 0, 0, 0.9]), np.array([0, 0, 0, np.nan])]) == [-0.5, 1.5, -0.5]
    for change in ({"left": [0, -1, -1]},  # a loop back to itself
                   {"left": [1, -1, -1], "right": [1, -1, -1]},  # two parents of one node, one node no parent
                   {"feature": [4, 0, 0]},  # past the width
                   {"value": [float("nan"), 0, 0]},
                   {"left": [1, -1]}):  # fmt: skip  # ragged
        with pytest.raises(InvalidRecord):
            costmodel.CostModel.from_obj({**good, "trees": [{**good["trees"][0], **change}]})
    with pytest.raises(InvalidRecord):
        costmodel.CostModel.from_obj("\x80\x04 not a model")  # a pickle's first bytes, for one


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
