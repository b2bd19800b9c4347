"""Cost models the registry serves, so a compile ranks schedules without training a model itself.

A trusted worker trains a gradient-boosted tree ensemble on a target's verified measurement log
(``schedhub.hooks.metaschedule.costmodel``) and pushes its trees; a compile that misses ranks its transfer
candidates with them and synthesizes schedules from them. Training one costs a compile 14–29 s on a
fresh machine (featurizing every logged trial, then fitting): served, it costs one download.

One model per (canonical target, compiler fingerprint, feature set): its features are computed by
one TVM build, so another build's model ranks nothing. A push replaces the model, except that a
claim (a pusher without the worker role) never replaces a verified one; over HTTP only worker and
admin tokens push, since a model decides what every compile with a transfer is served and no one
could check a claim's.

The trees are plain numbers, validated here without xgboost or numpy (the server refuses a
malformed model, and a client validates what it reads again): each tree's nodes are listed with
their children after them, every node but the root has one parent, and a split reads one of
``width`` features. Evaluation follows XGBoost: at a split, a feature below ``value`` (or missing,
where ``default_left``) goes left; a leaf's ``value`` is its output; a prediction is ``base`` plus
one leaf of every tree.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import lmdb

from ._errors import InvalidRecord, PayloadTooLarge
from ._keys import target_kind
from ._limits import check_kind, check_number
from ._records import _require_map, _text, packb, unpackb

MAX_TREES = 4096
MAX_MODEL_NODES = 1 << 18  # every tree's nodes together (~12 MiB of msgpack at most: under a request's 16 MiB)
MAX_TREE_DEPTH = 32
MAX_WIDTH = 1 << 14  # features a model reads
MAX_VALUE = 1e9  # a threshold, a leaf's output or the base score
MAX_FEATURES_CHARS = 256  # the feature set's name
MAX_MODEL_TRIALS = 1 << 30
LEAF = -1
_TREE_FIELDS = ("left", "right", "feature", "value", "default_left")
_MODEL_FIELDS = {"width", "base", "trees"}
_PUSH_FIELDS = {"target", "compiler", "features", "trials", "model"}


@dataclass(frozen=True)
class Tree:
    """One regression tree: node ``i``'s children (:data:`LEAF` for a leaf), the feature it splits on, its
    threshold or (a leaf) its output, and where a missing feature goes (1: left)."""

    LEAF: ClassVar[int] = LEAF

    left: tuple[int, ...]
    right: tuple[int, ...]
    feature: tuple[int, ...]
    value: tuple[float, ...]
    default_left: tuple[int, ...]

    @classmethod
    def from_obj(cls, obj: Any, width: int) -> Tree:
        obj = _require_map(obj, "a tree")
        if set(obj) != set(_TREE_FIELDS):
            raise InvalidRecord(f"a tree must be a map of exactly {', '.join(_TREE_FIELDS)}")
        columns = [obj[name] for name in _TREE_FIELDS]
        if not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) != 1 or not columns[0]:
            raise InvalidRecord("a tree's fields must be non-empty lists of one length")
        left, right, feature, value, default_left = columns
        n = len(left)
        if not all(_is_int(x) for c in (left, right, feature, default_left) for x in c):
            raise InvalidRecord("a tree's children, features and default directions must be integers")
        if not all(_is_number(v) and math.isfinite(v) and abs(v) <= MAX_VALUE for v in value):
            raise InvalidRecord(f"a tree's values must be finite numbers within ±{MAX_VALUE:g}")
        depth, parents = [0] * n, [0] * n
        for i in range(n):
            if left[i] == LEAF and right[i] == LEAF:
                continue
            if not (i < left[i] < n and i < right[i] < n and left[i] != right[i]):
                raise InvalidRecord(f"node {i} of a tree has children {left[i]}, {right[i]}: they must be two later nodes of its {n}, or both {LEAF}")
            if not 0 <= feature[i] < width or default_left[i] not in (0, 1):
                raise InvalidRecord(f"node {i} of a tree splits on feature {feature[i]} of {width} (default_left {default_left[i]})")
            for child in (left[i], right[i]):
                parents[child] += 1
                depth[child] = depth[i] + 1
        if any(p != 1 for p in parents[1:]) or (n and parents[0] != 0):
            raise InvalidRecord("a tree's nodes must each have one parent (the root none)")
        if max(depth) > MAX_TREE_DEPTH:
            raise InvalidRecord(f"a tree is {max(depth)} levels deep; the limit is {MAX_TREE_DEPTH}")
        return cls(tuple(left), tuple(right), tuple(feature), tuple(float(v) for v in value), tuple(default_left))

    def to_dict(self) -> dict[str, Any]:
        return {"left": list(self.left), "right": list(self.right), "feature": list(self.feature), "value": list(self.value),
                "default_left": list(self.default_left)}  # fmt: skip


@dataclass(frozen=True)
class Trees:
    """A tree ensemble over ``width`` features: ``base`` plus one leaf of each tree."""

    width: int
    base: float
    trees: tuple[Tree, ...]

    @property
    def nodes(self) -> int:
        return sum(len(t.left) for t in self.trees)

    @classmethod
    def from_obj(cls, obj: Any) -> Trees:
        obj = _require_map(obj, "a model")
        if set(obj) != _MODEL_FIELDS:
            raise InvalidRecord("a model must be a map of exactly 'width', 'base' and 'trees'")
        width = int(check_number(obj["width"], "a model's width", low=1, high=MAX_WIDTH, integer=True))
        base = float(check_number(obj["base"], "a model's base", low=-MAX_VALUE, high=MAX_VALUE))
        trees = obj["trees"]
        if not isinstance(trees, list) or not trees:
            raise InvalidRecord("a model's 'trees' must be a non-empty list")
        if len(trees) > MAX_TREES:
            raise PayloadTooLarge(f"a model of {len(trees)} trees; the limit is {MAX_TREES}")
        nodes = sum(len(t.get("left", ())) if isinstance(t, dict) and isinstance(t.get("left"), list) else 0 for t in trees)
        if nodes > MAX_MODEL_NODES:
            raise PayloadTooLarge(f"a model of {nodes} nodes; the limit is {MAX_MODEL_NODES}")
        parsed = []
        for i, tree in enumerate(trees):
            try:
                parsed.append(Tree.from_obj(tree, width))
            except InvalidRecord as exc:
                raise InvalidRecord(f"trees[{i}]: {exc}") from None
        return cls(width, base, tuple(parsed))

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "base": self.base, "trees": [t.to_dict() for t in self.trees]}


@dataclass(frozen=True)
class CostModelEntry:
    """A target's served model: what it predicts from (``compiler``'s ``features``), how many logged trials it
    learned from, and (as stored) who pushed it, whether that pusher was trusted, and when."""

    target: str
    compiler: str
    features: str
    trials: int
    trees: Trees
    pushed_by: str = ""
    verified: bool = False
    at: float = 0.0

    @classmethod
    def from_obj(cls, obj: Any) -> CostModelEntry:
        """A push as it comes over the wire: ``{"target", "compiler", "features", "trials", "model"}``."""
        obj = _require_map(obj, "a cost model")
        if set(obj) != _PUSH_FIELDS:
            raise InvalidRecord(f"a cost model must be a map of exactly {', '.join(sorted(_PUSH_FIELDS))}")
        target = _text(obj, "target")
        check_kind(target_kind(target))
        trials = int(check_number(obj["trials"], "trials", low=0, high=MAX_MODEL_TRIALS, integer=True))
        return cls(target, _text(obj, "compiler"), _text(obj, "features", MAX_FEATURES_CHARS), trials, Trees.from_obj(obj["model"]))

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "compiler": self.compiler, "features": self.features, "trials": self.trials,
                "model": self.trees.to_dict(), "by": self.pushed_by, "verified": self.verified, "at": self.at}  # fmt: skip

    def push_dict(self) -> dict[str, Any]:
        """What a push sends (the server names the pusher and its trust)."""
        return {k: v for k, v in self.to_dict().items() if k in _PUSH_FIELDS}

    @classmethod
    def from_stored(cls, obj: Any) -> CostModelEntry:
        """A stored or served entry (the form :meth:`to_dict` writes), validated again: readers trust no record."""
        obj = _require_map(obj, "a stored cost model")
        entry = cls.from_obj({k: obj.get(k) for k in _PUSH_FIELDS})
        by, verified, at = obj.get("by", ""), obj.get("verified", False), obj.get("at", 0.0)
        if not isinstance(by, str) or not isinstance(verified, bool) or not _is_number(at):
            raise InvalidRecord("a stored cost model's 'by', 'verified' and 'at' must be a string, a boolean and a number")
        return cls(entry.target, entry.compiler, entry.features, entry.trials, entry.trees, by[:256], verified, float(at))


def model_db_key(target: str, compiler: str, features: str) -> bytes:
    return hashlib.sha256(f"{target}\0{compiler}\0{features}".encode()).digest()


class CostModelStore:
    """The ``models`` database of a :class:`~schedhub.registry.Store`: one entry per target, compiler and feature set."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def put(self, entry: CostModelEntry, pushed_by: str, *, verified: bool, txn: lmdb.Transaction | None = None) -> dict[str, Any]:
        """Store ``entry`` as the model of its target, compiler and feature set; a claim does not replace a verified model."""
        db = self.store.dbs["models"]
        db_key = model_db_key(entry.target, entry.compiler, entry.features)
        with self.store.write(txn) as t:
            old = t.get(db_key, db=db)
            if old is not None and not verified and unpackb(old).get("verified") is True:
                return {"stored": False, "reason": "a verified model is served for this target and compiler; a claim does not replace it"}
            stored = CostModelEntry(entry.target, entry.compiler, entry.features, entry.trials, entry.trees, pushed_by or "local", verified, time.time())
            t.put(db_key, packb(stored.to_dict()), db=db)
        return {"stored": True, "trials": entry.trials, "trees": len(entry.trees.trees), "nodes": entry.trees.nodes}

    def get(self, target: str, compiler: str, features: str) -> CostModelEntry | None:
        db = self.store.dbs["models"]
        if db is None:  # a read-only store from before served models
            return None
        with self.store.read() as txn:
            raw = txn.get(model_db_key(target, compiler, features), db=db)
            return None if raw is None else CostModelEntry.from_stored(unpackb(bytes(raw)))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
