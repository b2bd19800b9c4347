"""A learned ranking of schedules: xgboost over MetaSchedule's per-store features.

Trained on the registry's measurements: its measurement log (:func:`log_samples`: every trial a tuner
measured, slow ones included) or its served records (:func:`samples`: the winners, plus each workload's
unscheduled kernel at the untuned time the tuner recorded), each trace replayed on its own workload and
labelled with the speed it was measured at there (log₂ GFLOPS: TVM's FLOP estimate over its seconds). It
predicts a scheduled kernel's speed from its features alone, so candidates replayed on a kernel the
registry never saw can be ranked without running them.

The model is a regression over one vector per kernel (the per-store features summed and maxed over
its stores, and the workload's log₂ FLOPs). Saved as xgboost's JSON, never pickled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

from schedhub.registry import Identity, Record, TrialLog

from .identity import target_from_text, workload_module
from .intrinsics import load_tensor_intrinsics
from .msdb import normalize_mod, replayed

PER_STORE = 164  # MetaSchedule's PerStoreFeature width (extract_workload=False)
WIDTH = 2 * PER_STORE + 1
PARAMS = {"max_depth": 6, "eta": 0.1, "subsample": 0.8, "colsample_bytree": 0.5, "min_child_weight": 2, "objective": "reg:squarederror",
          "nthread": 1, "seed": 0}  # fmt: skip
ROUNDS = 200


def flops(mod: tvm.IRModule) -> float:
    """TVM's FLOP estimate of a kernel (1 for a kernel without arithmetic, so speeds stay finite)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    return max(float(estimate_tir_flops(mod)), 1.0)


def features(scheduled: tvm.IRModule, target: tvm.target.Target, work: float) -> np.ndarray:
    """One kernel's vector: its per-store features summed and maxed over stores, then log₂ ``work`` (FLOPs)."""
    load_tensor_intrinsics()  # MetaSchedule's TuneContext imports them: cheaply, once a process
    context = ms.TuneContext(mod=scheduled, target=target)
    candidate = ms.MeasureCandidate(tvm.s_tir.Schedule(scheduled), ms.arg_info.ArgInfo.from_prim_func(scheduled["main"]))
    per_store = ms.feature_extractor.PerStoreFeature(extract_workload=False).extract_from(context, [candidate])[0].numpy()
    if per_store.size == 0:
        per_store = np.zeros((1, PER_STORE), dtype=np.float32)
    return np.concatenate([per_store.sum(axis=0), per_store.max(axis=0), [math.log2(work)]]).astype(np.float32)


@dataclass(frozen=True)
class Sample:
    """A kernel's features and the speed it ran at (log₂ GFLOPS)."""

    features: np.ndarray
    log2_gflops: float


def samples(records: Iterable[Record]) -> Iterator[Sample]:
    """Training samples from records: each trace on its own workload, and each workload once unscheduled
    (at the ``untuned_secs`` its tuner recorded, where it did). A trace that does not replay is skipped."""
    kernels = Kernels()
    unscheduled_done: set[str] = set()
    for record in records:
        if not record.run_secs:
            continue
        sample = kernels.sample(record.identity, record.trace, record.mean_secs)
        if sample is None:
            continue
        yield sample
        untuned = record.provenance.get("untuned_secs")
        if record.key not in unscheduled_done and isinstance(untuned, (int, float)) and 0 < untuned < 1e9:
            unscheduled_done.add(record.key)
            unscheduled = kernels.sample(record.identity, None, float(untuned))
            if unscheduled is not None:
                yield unscheduled


def log_samples(logs: Iterable[TrialLog]) -> Iterator[Sample]:
    """Training samples from the registry's measurement log: every logged trial on its own workload."""
    kernels = Kernels()
    for log in logs:
        for trial in log.trials:
            sample = kernels.sample(log.identity, trial.trace, trial.secs)
            if sample is not None:
                yield sample


class Kernels:
    """Each workload parsed and normalized once while samples are made from its traces."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[tvm.IRModule, tvm.target.Target, float] | None] = {}

    def sample(self, identity: Identity, trace: str | None, secs: float) -> Sample | None:
        """``trace`` (None: the unscheduled kernel) on ``identity``'s workload, labelled with ``secs``; None when it does not replay."""
        if not 0 < secs < 1e9:
            return None
        found = self.features(identity, trace)
        return None if found is None else Sample(found[0], log2_gflops(found[1], secs))

    def features(self, identity: Identity, trace: str | None) -> tuple[np.ndarray, float] | None:
        """:func:`features` of ``trace`` (None: unscheduled) on ``identity``'s workload, and the workload's FLOPs; None when it does not replay."""
        if identity.key not in self._by_key:
            try:
                normalized = normalize_mod(workload_module(identity.workload)["main"])
                self._by_key[identity.key] = (normalized, target_from_text(identity.target), flops(normalized))
            except Exception:  # an odd workload: no samples
                self._by_key[identity.key] = None
        found = self._by_key[identity.key]
        if found is None:
            return None
        normalized, target, work = found
        try:
            scheduled = normalized if trace is None else replayed(normalized, trace)
            return features(scheduled, target, work), work
        except Exception:  # a trace of another compiler that does not replay here: no sample
            return None


def log2_gflops(work: float, secs: float) -> float:
    """The label of a kernel of ``work`` FLOPs that ran in ``secs``."""
    return math.log2(work / secs / 1e9)


class CostModel:
    """Predicts log₂ GFLOPS of a scheduled kernel from :func:`features`."""

    def __init__(self, booster: Any) -> None:
        self.booster = booster

    @classmethod
    def train(cls, data: list[Sample]) -> CostModel:
        return cls.fit([s.features for s in data], [s.log2_gflops for s in data])

    @classmethod
    def fit(cls, rows: list[np.ndarray], labels: list[float]) -> CostModel:
        """A model of ``rows`` (:func:`features`) labelled with their log₂ GFLOPS."""
        import xgboost as xgb

        if len(rows) < 2 or len(rows) != len(labels):
            raise ValueError(f"a cost model needs at least 2 samples, each labelled; got {len(rows)} rows, {len(labels)} labels")
        matrix = xgb.DMatrix(np.stack(rows), label=np.array(labels, dtype=np.float32))
        return cls(xgb.train(PARAMS, matrix, num_boost_round=ROUNDS))

    def predict(self, rows: list[np.ndarray]) -> list[float]:
        import xgboost as xgb

        return [float(p) for p in self.booster.predict(xgb.DMatrix(np.stack(rows)))]

    def to_json(self) -> str:
        return bytes(self.booster.save_raw(raw_format="json")).decode()

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        import xgboost as xgb

        json.loads(text)  # refuse anything that is not JSON before xgboost reads it
        booster = xgb.Booster()
        booster.load_model(bytearray(text.encode()))
        return cls(booster)
