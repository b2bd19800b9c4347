"""A key's records rank by flushed-cache time where every one of them has one, never a flushed time against a warm one;
the claim, its verification, a re-push and the wire all carry it. (Timing itself: test_tuner.py's flushed tests.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from schedhub.registry import FLUSHED_SECS, CallerBounds, InvalidRecord, RegistryError, LocalRegistry, Principal, RegistryClient, Served, ServerThread

from .conftest import clients_by_name, make_record

ROLES = {"alice-tok": Principal("alice"), "w1-tok": Principal("w1", "worker"), "w2-tok": Principal("w2", "worker"), "reader-tok": Principal("reader", "read")}


def timed(variant: int, warm_ms: float, flushed_ms: float | None = None):  # type: ignore[no-untyped-def]
    """A record of one workload, schedule ``variant``, claiming ``warm_ms`` (and ``flushed_ms`` on flushed caches)."""
    provenance = {"host_cpu": "test", **({FLUSHED_SECS: flushed_ms * 1e-3} if flushed_ms is not None else {})}
    return make_record(5, warm_ms * 1e-3, variant, provenance=provenance)


def order(reg: LocalRegistry | RegistryClient) -> list[str]:
    return [r.trace_id for r in reg.get(timed(0, 1).key)]


def test_verified_records_rank_by_flushed_time_only_once_every_one_has_one(local: LocalRegistry) -> None:
    fast_warm, fast_flushed = timed(0, 1.0, 3.0), timed(1, 1.5, 2.0)  # ResNet-18's stage-4 convolution: warm and network disagree
    local.put(fast_warm)
    local.put(fast_flushed)
    assert order(local) == [fast_flushed.trace_id, fast_warm.trace_id]
    assert local.get(fast_warm.key)[0].served.verified_flushed_secs == pytest.approx(2e-3)
    older = timed(2, 0.5)  # verified before flushed times were taken: the key goes back to warm times
    local.put(older)
    assert order(local) == [older.trace_id, fast_warm.trace_id, fast_flushed.trace_id]
    assert local.summaries()[0].best_secs == pytest.approx(0.5e-3 * 1.005)  # the listing's best time stays warm
    local.put(timed(2, 0.6, 2.5))  # a trusted re-push gives it the flushed time it lacked, keeping its warm one
    assert order(local) == [fast_flushed.trace_id, older.trace_id, fast_warm.trace_id]
    served = local.get(older.key)[1].served
    assert served.verified_secs == pytest.approx(0.5e-3 * 1.005) and served.verified_flushed_secs == pytest.approx(2.5e-3)


def test_a_flushed_time_out_of_bounds_is_no_claim(local: LocalRegistry) -> None:
    bad = make_record(5, 1e-3, provenance={FLUSHED_SECS: -1.0})
    assert bad.flushed_secs is None
    local.put(bad)
    assert local.get(bad.key)[0].served.verified_flushed_secs == 0.0


@pytest.fixture
def as_(tmp_path: Path) -> Iterator[dict[str, RegistryClient]]:
    with ServerThread(tmp_path / "flushed", tokens=ROLES, sync=False, bounds=CallerBounds()) as srv:
        with clients_by_name(srv.url, ROLES) as clients:
            yield clients


def test_a_verifier_s_flushed_time_ranks_a_claim_and_one_far_over_its_flushed_claim_is_refused(as_: dict[str, RegistryClient]) -> None:
    as_["w1"].put(timed(0, 1.0, 3.0))
    honest, inflated = timed(1, 1.5, 2.0), timed(2, 1.2, 0.1)
    as_["alice"].put(honest)
    as_["alice"].put(inflated)
    leases = {lease.job["trace_id"]: lease for lease in as_["w2"].lease("v", max_jobs=5, lease_secs=60, tasks=("verify",))}
    assert as_["w2"].ack(leases[inflated.trace_id].key, leases[inflated.trace_id].lease_id,
                         {"run_secs": [1.2e-3], "flushed_secs": [2.2e-3], "reason": "timed"}) == "refused"  # its warm claim held, its flushed did not
    assert as_["w2"].ack(leases[honest.trace_id].key, leases[honest.trace_id].lease_id,
                         {"run_secs": [1.6e-3], "flushed_secs": [2.1e-3], "reason": "timed"}) == "verified"
    served = as_["reader"].get(honest.key)
    assert [r.trace_id for r in served][0] == honest.trace_id  # 2.1 ms flushed before 3.0, though 1.6 ms warm after 1.0
    assert served[0].served.verified_flushed_secs == pytest.approx(2.1e-3) and served[0].served.verified_by.startswith("w2")
    assert inflated.trace_id in {q["trace_id"] for q in as_["reader"].quarantined()}


@pytest.mark.parametrize("flushed", [[-1.0], ["fast"], [], [1e9], "1e-3"])
def test_a_verdict_s_flushed_times_are_checked_at_the_door(as_: dict[str, RegistryClient], flushed: object) -> None:
    as_["alice"].put(timed(1, 1.0))
    lease = as_["w2"].lease("v", max_jobs=1, lease_secs=60, tasks=("verify",))[0]
    body = {"lease_id": lease.lease_id, "verdict": {"run_secs": [1e-3], "flushed_secs": flushed, "reason": "timed"}}
    answer = httpx.post(f"{as_['w2'].url}/v1/queue/{lease.key}/ack", json=body, headers={"Authorization": "Bearer w2-tok"})
    assert answer.status_code == 400 and "flushed_secs" in answer.text


@pytest.mark.parametrize("vfmean", [-1.0, float("nan"), "2e-3", True, 1e9])
def test_a_hostile_server_s_flushed_time_is_refused(vfmean: object) -> None:
    with pytest.raises(InvalidRecord, match="vfmean"):
        Served.from_obj({"tid": "t", "by": "a", "vby": "w", "vmean": 1e-3, "vfmean": vfmean})


def test_a_network_s_estimate_takes_a_round_s_times_in_the_measure_its_records_rank_by() -> None:
    """A round's best and default, as a network's tuning sums them: flushed where the default and every record were
    timed so (the record the registry serves is the best flushed, not the best warm), else warm."""
    from schedhub.tuner.workloads.search import TuneResult

    records = [timed(0, 1.0, 3.0), timed(1, 1.5, 2.0)]

    def result(records: list, untuned_flushed: float) -> TuneResult:  # type: ignore[type-arg]
        return TuneResult(records[0].identity, records, 4e-3, 16, 0, 1.0, [], [], [], untuned_flushed_secs=untuned_flushed)

    assert result(records, 5e-3).ranked_times() == pytest.approx((2e-3, 5e-3))
    assert result(records, 0.0).ranked_times() == pytest.approx((1e-3 * 1.005, 4e-3))  # the default untimed so: warm, both
    assert result([timed(2, 0.9), *records], 5e-3).ranked_times() == pytest.approx((0.9e-3 * 1.005, 4e-3))
    older = result(records, 5e-3)
    older.retimed = [timed(3, 1.2, 1.1)]  # an older record of the key, re-timed by this job: faster flushed than its own
    assert older.ranked_times() == pytest.approx((1.1e-3, 5e-3))


def test_another_pusher_s_flushed_claim_neither_verifies_nor_reranks_a_record(as_: dict[str, RegistryClient]) -> None:
    """Only a worker, an admin or a store's owner sets a verified flushed time: a push token re-pushing someone's
    record with a flattering flushed claim, or with no token at all, changes nothing of what is served."""
    slow_flushed, fast_flushed = timed(0, 1.0), timed(1, 1.5)
    as_["w1"].put(slow_flushed)
    as_["w1"].put(fast_flushed)
    before = order(as_["reader"])
    as_["alice"].put(timed(0, 1.0, 0.001))  # the same trace, claimed 1 µs on flushed caches
    with pytest.raises(RegistryError):
        RegistryClient(as_["reader"].url).put(timed(1, 1.5, 0.001))
    served = as_["reader"].get(slow_flushed.key)
    assert order(as_["reader"]) == before and all(r.served.verified_flushed_secs == 0.0 for r in served)
