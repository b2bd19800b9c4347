"""Networks compiles report, and the queue refining a network's bottleneck, not each kernel alone (registry/_networks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.registry import (
    DONE,
    PENDING,
    REFINE,
    InvalidRecord,
    LocalRegistry,
    Principal,
    RegistryClient,
    ServerThread,
    TooManyRequests,
    network_id,
)
from schedhub.registry import _networks

from .conftest import FINGERPRINT, TOKEN, clients_by_name, make_record

DEVICE = "znver5"  # conftest's TARGET


def tuned(reg: LocalRegistry, workload: int, secs: float) -> str:
    """A verified record of ``workload`` timed at ``secs``; its key."""
    record = make_record(workload, secs)
    reg.put(record)
    return record.key


def search_done(reg: LocalRegistry, key: str) -> None:
    """A worker leases the kernel's refine job and acks its search."""
    (lease,) = reg.lease("w", 1, fingerprint=FINGERPRINT, kind="llvm", device=DEVICE)
    assert lease.key == key and lease.job["stage"] == REFINE
    assert reg.ack(lease.key, lease.lease_id) == DONE


def test_a_network_reported_again_is_one_network_with_two_reports(local: LocalRegistry) -> None:
    kernels = [("a" * 64, 2), ("b" * 64, 1)]
    first = local.report_network(kernels, by="alice")
    again = local.report_network(list(reversed(kernels)), by="bob")  # the same network, its kernels in another order
    assert first["network"] == again["network"] == network_id(kernels) and again["reports"] == 2
    assert local.stats()["networks"] == 1


def test_the_bottleneck_is_refined_first_and_each_search_lowers_its_claim(local: LocalRegistry) -> None:
    """Scripted: calls × best time / (searches + 1). A (1 call, 10 ms) before B (1 call, 8 ms): 10/2 > 8/2; after A's
    second search 10/3 < 8/2, so B; C (2 calls, 0.1 ms) is under 2% of the network and never worth a search."""
    a, b, c = tuned(local, 1, 10e-3), tuned(local, 2, 8e-3), tuned(local, 3, 0.1e-3)
    local.report_network([(a, 1), (b, 1), (c, 2)], by="alice")
    first = local.refine_bottleneck(FINGERPRINT, "llvm", DEVICE)
    assert first is not None and first["key"] == a and first["searches"] == 1 and first["share"] == pytest.approx(10 / 2 / 18.2, rel=1e-3)
    assert local.job(a)["state"] == PENDING and local.job(a)["stage"] == REFINE
    assert local.refine_bottleneck(FINGERPRINT, "llvm", DEVICE)["key"] == b  # A is on its way: nothing to add to it
    search_done(local, a)
    search_done(local, b)
    assert local.job(a)["searches"] == 2
    picks = []
    while (pick := local.refine_bottleneck(FINGERPRINT, "llvm", DEVICE)) is not None:
        picks.append(pick["key"])
        search_done(local, pick["key"])
    assert c not in picks and picks.count(a) + 2 <= _networks.MAX_SEARCHES + 1 and picks.count(b) + 2 <= _networks.MAX_SEARCHES + 1
    assert local.job(a)["searches"] == local.job(b)["searches"] == _networks.MAX_SEARCHES  # refinement ends


def test_a_worker_is_given_only_kernels_it_can_tune(local: LocalRegistry) -> None:
    a = tuned(local, 1, 10e-3)
    local.report_network([(a, 1)], by="alice")
    assert local.refine_bottleneck("another compiler", "llvm", DEVICE) is None
    assert local.refine_bottleneck(FINGERPRINT, "cuda", "sm_90") is None
    assert local.refine_bottleneck(FINGERPRINT, "llvm", "znver1") is None
    assert local.refine_bottleneck(FINGERPRINT, "llvm", DEVICE)["key"] == a


def test_unverified_kernels_and_unknown_keys_are_not_refined(local: LocalRegistry) -> None:
    claim = make_record(5, 10e-3)
    local.put(claim, "mallory", verified=False)
    local.report_network([(claim.key, 8), ("f" * 64, 8)], by="mallory")
    assert local.refine_bottleneck(FINGERPRINT, "llvm", DEVICE) is None


def test_networks_take_turns(local: LocalRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search reads :data:`SCAN` networks after the last one it read, so every network's bottleneck comes up."""
    monkeypatch.setattr(_networks, "SCAN", 1)
    keys = [tuned(local, w, 1e-3 * w) for w in (1, 2, 3)]
    for key in keys:
        local.report_network([(key, 1)], by="alice")
    picked = {local.refine_bottleneck(FINGERPRINT, "llvm", DEVICE)["key"] for _ in keys}
    assert picked == set(keys)


@pytest.mark.parametrize("kernels", [[], [{"key": "a" * 64}], [{"key": "A" * 64, "calls": 1}], [{"key": "a" * 63, "calls": 1}],
                                     [{"key": "a" * 64, "calls": 0}], [{"key": "a" * 64, "calls": True}], [{"key": "a" * 64, "calls": 1 << 21}],
                                     [{"key": "a" * 64, "calls": 1, "extra": 1}], [{"key": f"{i:064x}", "calls": 1} for i in range(513)], "kernels"])  # fmt: skip
def test_a_malformed_network_is_refused_by_what_is_wrong(kernels: object) -> None:
    with pytest.raises(InvalidRecord):
        _networks.parse_kernels(kernels)


def test_a_caller_keeps_a_bounded_number_of_networks(local: LocalRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_networks, "MAX_PER_CALLER", 2)
    for i in range(2):
        local.report_network([(f"{i:064x}", 1)], by="alice")
    local.report_network([(f"{0:064x}", 1)], by="alice")  # one it keeps already: counted, not refused
    with pytest.raises(TooManyRequests, match="keeps 2 networks"):
        local.report_network([(f"{9:064x}", 1)], by="alice")
    local.report_network([(f"{9:064x}", 1)], by="bob")  # another caller's own bound
    assert local.stats()["networks"] == 3


def test_over_http_a_reader_reports_and_only_a_worker_requeues(tmp_path: Path) -> None:
    tokens = {TOKEN: Principal("admin", "admin"), "r-token": Principal("reader", "read"), "w-token": Principal("worker", "worker")}
    with ServerThread(tmp_path / "served", tokens=tokens, sync=False) as srv, clients_by_name(srv.url, tokens) as clients:
        key = make_record(1, 1e-3).key
        clients["admin"].put(make_record(1, 1e-3))
        answer = clients["reader"].report_network([(key, 3)])
        assert answer == {"network": network_id([(key, 3)]), "kernels": 1, "reports": 1}
        with pytest.raises(Exception, match="403|worker"):
            clients["reader"].refine_bottleneck(FINGERPRINT, "llvm", DEVICE)
        pick = clients["worker"].refine_bottleneck(FINGERPRINT, "llvm", DEVICE)
        assert pick is not None and pick["key"] == key and pick["calls"] == 3
        with RegistryClient(srv.url, token="r-token") as reader, pytest.raises(InvalidRecord):
            reader._call("POST", "/v1/networks", {"kernels": [{"key": "zz", "calls": 1}]}, idempotent=True)


def test_a_compile_reports_its_modules_kernels_once_a_session(tmp_path: Path) -> None:
    import tvm

    from schedhub.hooks import use
    from schedhub.tuner.networks import models

    cpu = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    mod, _, _ = models.export("mlp", batch=2, features=16, hidden=16)
    kernels = [(k.identity.key, k.calls) for k in models.kernels(mod, cpu, NO_REWRITES)]
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        with use(reg, cpu, cache=tmp_path / "cache", transfer=False):
            tvm.compile(mod, cpu)
            tvm.compile(mod, cpu)  # the same module again: not reported again
        assert reg.stats()["networks"] == 1
        assert reg.report_network(kernels, by="check")["reports"] == 2  # the hook reported exactly these kernels and calls, once
        with use(reg, cpu, cache=tmp_path / "cache", transfer=False):
            tvm.compile(mod, cpu)  # a new session on this machine: its kernel cache says the module was reported
        with use(reg, cpu, cache=tmp_path / "other machine", transfer=False):
            tvm.compile(mod, cpu)  # another machine's cache: reported
        assert reg.report_network(kernels, by="check")["reports"] == 4
        with use(reg, cpu, cache=tmp_path / "cache", transfer=False, report_misses=False):
            tvm.compile(models.export("mlp", batch=4, features=16, hidden=16)[0], cpu)
        assert reg.stats()["networks"] == 1  # a session that reports nothing reports no network either


def test_a_compile_named_reports_its_network_under_that_name_and_a_bad_name_is_refused_before_anything_opens(tmp_path: Path) -> None:
    import tvm

    from schedhub.hooks import use
    from schedhub.tuner.networks import models

    cpu = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    mod, _, _ = models.export("mlp", batch=2, features=16, hidden=16)
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        with use(reg, cpu, cache=tmp_path / "cache", transfer=False):
            tvm.compile(mod, cpu)
        with use(reg, cpu, cache=tmp_path / "cache", transfer=False, name="my mlp"):
            tvm.compile(mod, cpu)  # reported on this machine already, unnamed: the name is sent
        (network,) = reg.recent_networks()
        assert (network["name"], network["reports"], network["kernels"]) == ("my mlp", 2, len(models.kernels(mod, cpu)))
    for bad in ("", " padded ", "a\nb", "x" * 81):
        with pytest.raises(ValueError, match="name"):
            with use(tmp_path / "never opened", cpu, name=bad):
                pass
    assert not (tmp_path / "never opened").exists()


@pytest.mark.parametrize(("name", "goal"), [(3, None), ("", None), ("tab\there", None), (None, {"label": "x"}), (None, {"label": "x", "secs": 0}),
                                            (None, {"label": "x", "secs": float("nan")}), (None, {"label": "x", "secs": True}),
                                            (None, {"label": "", "secs": 1.0}), (None, {"label": "x", "secs": 1.0, "more": 1}), (None, [1])])  # fmt: skip
def test_a_malformed_name_or_goal_is_refused_and_nothing_is_kept(name: object, goal: object, local: LocalRegistry) -> None:
    with pytest.raises(InvalidRecord):
        local.report_network([(f"{1:064x}", 1)], by="alice", name=name, goal=goal)  # type: ignore[arg-type]
    assert local.stats()["networks"] == 0 and local.recent_networks() == []
