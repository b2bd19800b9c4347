"""A learned ranking of schedules: xgboost over MetaSchedule's per-store features.

Trained on the registry's measurements: its measurement log (:func:`log_samples`: every trial a tuner
measured, slow ones included) or its served records (:func:`samples`: the winners, plus each workload's
unscheduled kernel at the untuned time the tuner recorded), each trace replayed on its own workload and
labelled with the speed it was measured at there (log₂ GFLOPS: TVM's FLOP estimate over its seconds). It
predicts a scheduled kernel's speed from its features alone, so candidates replayed on a kernel the
registry never saw can be ranked without running them.

The model is a regression over one vector per kernel (the per-store features summed and maxed over
its stores, and the workload's log₂ FLOPs). xgboost trains it; it is kept, served and evaluated as plain
trees (:class:`~schedhub.registry.Trees`), never pickled.
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

from schedhub.registry import MAX_TREE_DEPTH, Identity, Record, Tree, TrialLog, Trees

from ..kernels.identity import target_from_text, workload_module
from ..kernels.intrinsics import load_tensor_intrinsics
from .msdb import normalize_mod, replayed

PER_STORE = 164  # MetaSchedule's PerStoreFeature width (extract_workload=False)
WIDTH = 2 * PER_STORE + 1
PARAMS = {"max_depth": 6, "eta": 0.1, "subsample": 0.8, "colsample_bytree": 0.5, "min_child_weight": 2, "objective": "reg:squarederror",
          "nthread": 1, "seed": 0}  # fmt: skip
ROUNDS = 200
#: Names what :func:`features` computes: a served model is of use only to a compile that computes the same
#: (the registry keys models by it, beside the target and the compiler fingerprint).
FEATURES = f"per-store-sum-max:{PER_STORE}+log2-flops/1"


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
    """Predicts log₂ GFLOPS of a scheduled kernel from :func:`features`: a tree ensemble (the registry's
    :class:`~schedhub.registry.Trees`, validated) evaluated here with numpy, whether xgboost trained it in this
    process or a registry served it. xgboost never reads a model that crossed a process boundary."""

    def __init__(self, trees: Trees) -> None:
        self.trees = trees
        sizes = [len(t.left) for t in trees.trees]
        starts = np.cumsum([0, *sizes[:-1]])
        self._roots = starts.astype(np.int64)
        shift = np.concatenate([np.full(n, s) for n, s in zip(sizes, starts)])
        left = np.concatenate([t.left for t in trees.trees]).astype(np.int64)
        right = np.concatenate([t.right for t in trees.trees]).astype(np.int64)
        self._leaf = left == Tree.LEAF
        self._left = np.where(self._leaf, -1, left + shift)  # node indexes into the flat arrays
        self._right = np.where(self._leaf, -1, right + shift)
        self._feature = np.concatenate([t.feature for t in trees.trees]).astype(np.int64)
        self._value = np.concatenate([t.value for t in trees.trees]).astype(np.float32)
        self._default_left = np.concatenate([t.default_left for t in trees.trees]).astype(bool)
        self._depth = MAX_TREE_DEPTH  # validated: no path is longer; the walk stops early once every row sits on a leaf

    @classmethod
    def train(cls, data: list[Sample]) -> CostModel:
        return cls.fit([s.features for s in data], [s.log2_gflops for s in data])

    @classmethod
    def fit(cls, rows: list[np.ndarray], labels: list[float]) -> CostModel:
        """A model of ``rows`` (:func:`features`) labelled with their log₂ GFLOPS, trained by xgboost."""
        import xgboost as xgb

        if len(rows) < 2 or len(rows) != len(labels):
            raise ValueError(f"a cost model needs at least 2 samples, each labelled; got {len(rows)} rows, {len(labels)} labels")
        matrix = xgb.DMatrix(np.stack(rows), label=np.array(labels, dtype=np.float32))
        return cls(booster_trees(xgb.train(PARAMS, matrix, num_boost_round=ROUNDS), len(rows[0])))

    def predict(self, rows: list[np.ndarray]) -> list[float]:
        """Predicted log₂ GFLOPS of each row, as XGBoost evaluates its trees (float32 thresholds, NaN: the default branch)."""
        x = np.stack(rows).astype(np.float32)
        if x.ndim != 2 or x.shape[1] != self.trees.width:
            raise ValueError(f"the model reads {self.trees.width} features a row, got rows of shape {x.shape}")
        node = np.tile(self._roots, (len(x), 1))  # (rows, trees)
        row = np.arange(len(x))[:, None]
        for _ in range(self._depth):
            inner = ~self._leaf[node]
            if not inner.any():
                break
            value = x[row, self._feature[node]]
            left = np.where(np.isnan(value), self._default_left[node], value < self._value[node])
            node = np.where(inner, np.where(left, self._left[node], self._right[node]), node)
        return [float(p) for p in self.trees.base + self._value[node].sum(axis=1, dtype=np.float64)]

    def to_dict(self) -> dict[str, Any]:
        return self.trees.to_dict()

    @classmethod
    def from_obj(cls, obj: Any) -> CostModel:
        """A model from :meth:`to_dict`'s form, validated (raises InvalidRecord)."""
        return cls(Trees.from_obj(obj))


def booster_trees(booster: Any, width: int) -> Trees:
    """An xgboost regression booster's trees (its JSON: numerical splits; a leaf's output is its split condition)."""
    learner = json.loads(bytes(booster.save_raw(raw_format="json")))["learner"]
    base = float(str(learner["learner_model_param"]["base_score"]).strip("[]"))
    trees = []
    for tree in learner["gradient_booster"]["model"]["trees"]:
        if any(tree.get("split_type", [])):
            raise ValueError("a categorical split: the cost model's features are all numerical")
        left, right = tree["left_children"], tree["right_children"]
        trees.append({"left": left, "right": right, "feature": [f if l != Tree.LEAF else 0 for f, l in zip(tree["split_indices"], left)],
                      "value": tree["split_conditions"], "default_left": [int(d) for d in tree["default_left"]]})  # fmt: skip
    return Trees.from_obj({"width": width, "base": base, "trees": trees})
