"""Served cost models: stored per target and compiler, pushed only by trusted workers, validated both ways (no TVM)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from schedhub.registry import (
    CostModelEntry,
    Forbidden,
    InvalidRecord,
    LocalRegistry,
    PayloadTooLarge,
    Principal,
    RegistryClient,
    ServerThread,
    Trees,
    Unauthorized,
    packb,
)

from .conftest import TARGET, clients_by_name

COMPILER = "tvm=0.27;build-a"
FEATURES = "per-store-sum-max:164+log2-flops/1"
TREE = {"left": [1, -1, -1], "right": [2, -1, -1], "feature": [3, 0, 0], "value": [0.5, -1.0, 1.0], "default_left": [1, 0, 0]}
MODEL = {"width": 4, "base": 0.5, "trees": [TREE, TREE]}
TOKENS = {"w-tok": Principal("w", "worker"), "p-tok": Principal("p", "push"), "r-tok": Principal("r", "read")}


def entry(trials: int = 100, model: dict[str, Any] = MODEL, target: str = TARGET) -> CostModelEntry:
    return CostModelEntry.from_obj({"target": target, "compiler": COMPILER, "features": FEATURES, "trials": trials, "model": model})


def test_a_store_serves_one_model_per_target_compiler_and_feature_set(local: LocalRegistry) -> None:
    assert local.cost_model(TARGET, COMPILER, FEATURES) is None
    assert local.push_cost_model(entry(100), "w")["stored"]
    assert local.push_cost_model(entry(300), "w")["stored"]  # a newer training replaces it
    served = local.cost_model(TARGET, COMPILER, FEATURES)
    assert served is not None and served.trials == 300 and served.pushed_by == "w" and served.verified and served.trees == Trees.from_obj(MODEL)
    assert local.cost_model(TARGET, "tvm=0.28;build-b", FEATURES) is None  # another compiler computes other features
    assert local.cost_model(TARGET, COMPILER, "other-features/1") is None
    refused = local.push_cost_model(entry(999), "mallory", verified=False)  # a claim never replaces a verified model
    assert not refused["stored"] and local.cost_model(TARGET, COMPILER, FEATURES).trials == 300  # type: ignore[union-attr]
    assert local.stats()["cost_models"] == 1


def test_only_a_worker_pushes_a_model_over_http_and_anyone_reads_it(tmp_path: Any) -> None:
    with ServerThread(tmp_path / "served", tokens=TOKENS, sync=False) as srv, clients_by_name(srv.url, TOKENS) as by:
        with RegistryClient(srv.url, timeout=5) as anonymous:
            assert anonymous.cost_model(TARGET, COMPILER, FEATURES) is None  # 404: none served
            with pytest.raises(Unauthorized) as no_token:
                anonymous.push_cost_model(entry())
            assert not isinstance(no_token.value, Forbidden)  # 401: who is asking, not what they may do
            for name in ("p", "r"):  # a push token's model would be a claim no one can check
                with pytest.raises(Forbidden):
                    by[name].push_cost_model(entry())
            assert by["w"].push_cost_model(entry(250)) == {"stored": True, "trials": 250, "trees": 2, "nodes": 6}
            served = anonymous.cost_model(TARGET, COMPILER, FEATURES)
            assert served is not None and (served.trials, served.pushed_by, served.verified) == (250, "w", True)
            assert served.trees == Trees.from_obj(MODEL)
            assert anonymous.stats()["cost_models"] == 1


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(tmp_path_factory.mktemp("models") / "served", tokens=TOKENS, sync=False) as srv:
        yield srv


def bad_models() -> list[tuple[str, Any, type[Exception]]]:
    """A model with one thing wrong, and what a reader must raise for it."""
    cases: list[tuple[str, Any, type[Exception]]] = [
        ("a loop", {"left": [0, -1, -1]}, InvalidRecord),
        ("a node with two parents", {"left": [1, -1, -1], "right": [1, -1, -1]}, InvalidRecord),
        ("an unreachable node", {"left": [1, -1, -1, -1], "right": [2, -1, -1, -1], "feature": [3, 0, 0, 0], "value": [0, 0, 0, 0], "default_left": [0, 0, 0, 0]}, InvalidRecord),
        ("a child past the end", {"right": [3, -1, -1]}, InvalidRecord),
        ("a feature past the width", {"feature": [4, 0, 0]}, InvalidRecord),
        ("a negative feature", {"feature": [-1, 0, 0]}, InvalidRecord),
        ("an infinite threshold", {"value": [float("inf"), 0, 0]}, InvalidRecord),
        ("a huge leaf", {"value": [0, 1e300, 0]}, InvalidRecord),
        ("a default direction of 2", {"default_left": [2, 0, 0]}, InvalidRecord),
        ("a boolean child", {"left": [True, -1, -1]}, InvalidRecord),
        ("ragged fields", {"value": [0.5, 1.0]}, InvalidRecord),
        ("a missing field", {"feature": None}, InvalidRecord),
    ]
    out = []
    for label, change, error in cases:
        tree = {k: v for k, v in {**TREE, **change}.items() if v is not None}
        out.append((label, {**MODEL, "trees": [tree]}, error))
    deep = {"left": [i + 1 for i in range(40)] + [-1] * 41, "right": [41 + i for i in range(40)] + [-1] * 41}
    chain = {**deep, "feature": [0] * 81, "value": [0.0] * 81, "default_left": [0] * 81}
    # a chain 40 levels deep: node i's right child 41+i is a leaf
    out += [
        ("a tree 40 levels deep", {**MODEL, "trees": [chain]}, InvalidRecord),
        ("no trees", {**MODEL, "trees": []}, InvalidRecord),
        ("too many trees", {**MODEL, "trees": [TREE] * 5000}, PayloadTooLarge),
        ("too many nodes", {**MODEL, "trees": [{k: v * 70_000 for k, v in TREE.items()}] * 4}, PayloadTooLarge),
        ("a width of 0", {**MODEL, "width": 0}, InvalidRecord),
        ("a base of NaN", {**MODEL, "base": float("nan")}, InvalidRecord),
        ("an extra field", {**MODEL, "pickle": "x"}, InvalidRecord),
        ("not a map", "\x80\x04 a pickle", InvalidRecord),
    ]
    return out


@pytest.mark.parametrize("label, model, error", bad_models(), ids=[c[0] for c in bad_models()])
def test_a_malformed_model_is_refused_by_the_server_with_4xx_and_by_a_reader(served: ServerThread, label: str, model: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        entry(model=model)
    target = TARGET.replace("znver5", "znver4")  # a target no test stores a model for
    body = {"target": target, "compiler": COMPILER, "features": FEATURES, "trials": 1, "model": model}
    answer = httpx.put(f"{served.url}/v1/models", content=packb(body), headers={"authorization": "Bearer w-tok", "content-type": "application/msgpack"})
    assert answer.status_code in (400, 413), answer.text
    with RegistryClient(served.url, timeout=5) as anonymous:
        assert anonymous.cost_model(target, COMPILER, FEATURES) is None  # nothing was stored


@pytest.mark.parametrize("query", [
    {},
    {"target": TARGET, "compiler": COMPILER},
    {"target": "llvm", "compiler": COMPILER, "features": FEATURES},  # a kind, not a canonical target
    {"target": TARGET, "compiler": "x" * 5000, "features": FEATURES},
    {"target": TARGET, "compiler": COMPILER, "features": "f\x00"},
])  # fmt: skip
def test_a_lookup_without_a_whole_canonical_name_is_a_400(served: ServerThread, query: dict[str, str]) -> None:
    answer = httpx.get(f"{served.url}/v1/models", params=query)
    assert answer.status_code == 400, answer.text


def test_a_push_of_another_shape_is_refused(local: LocalRegistry) -> None:
    good = {"target": TARGET, "compiler": COMPILER, "features": FEATURES, "trials": 1, "model": MODEL}
    for change in ({"target": "not a target"}, {"trials": -1}, {"trials": 1.5}, {"compiler": ""}, {"features": "f" * 300}, {"extra": 1}):
        with pytest.raises((InvalidRecord, PayloadTooLarge)):
            CostModelEntry.from_obj({**copy.deepcopy(good), **change})
