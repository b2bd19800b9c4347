"""The miss queue: dedup with demand, leases that expire, capped retries, dead letters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schedhub.registry import DEAD, DONE, LEASED, PENDING, REFINE, VERIFY, Identity, InvalidRecord, LeaseLost, LocalRegistry, canonical_target, record_key, task_label

from .conftest import make_record


def miss(workload: int):
    return make_record(workload, 1e-3).identity


def test_a_key_reported_twice_is_one_job_with_demand_two(local: LocalRegistry) -> None:
    local.report_misses([miss(1)])
    local.report_misses([miss(1), miss(2)])
    jobs = {j["key"]: j for j in local.jobs()}
    assert len(jobs) == 2
    assert jobs[miss(1).key]["demand"] == 2 and jobs[miss(2).key]["demand"] == 1


def test_a_callers_jobs_go_in_the_order_it_reported_them(local: LocalRegistry) -> None:
    """The compile hook reports a compile's misses costliest first: one caller's demand does not reorder them."""
    local.report_misses([miss(1), miss(2), miss(2), miss(3)])
    assert [l.key for l in local.lease("w", max_jobs=3, lease_secs=60)] == [miss(1).key, miss(2).key, miss(3).key]
    assert local.lease("w", 5) == []


def test_callers_take_turns_and_the_most_demanded_of_a_turn_goes_first(local: LocalRegistry) -> None:
    """A caller's backlog (a CI run whose compiles missed a new model's every kernel) holds another caller's misses back by
    one of its own each, not all of them; a caller that starts reporting later starts at the queue's clock, not ahead."""
    ci, dev = [miss(10 + i) for i in range(5)], [miss(20 + i) for i in range(2)]
    local.report_misses(ci * 2, by="ci")  # demand 2 each
    local.report_misses(dev, by="dev")
    assert [l.key for l in local.lease("w", max_jobs=4, lease_secs=60)] == [ci[0].key, dev[0].key, ci[1].key, dev[1].key]
    local.report_misses([miss(30)], by="late")
    assert [l.key for l in local.lease("w", max_jobs=4, lease_secs=60)] == [ci[2].key, miss(30).key, ci[3].key, ci[4].key]


def test_a_miss_another_caller_asks_for_comes_up_at_its_first_turn(local: LocalRegistry) -> None:
    """A developer's compile misses a kernel that a CI run queued last of four: it comes up at the developer's first turn,
    not behind the CI's other three."""
    ci = [miss(40 + i) for i in range(4)]
    local.report_misses(ci, by="ci")
    local.report_misses([ci[3]], by="dev")
    assert [l.key for l in local.lease("w", max_jobs=4, lease_secs=60)] == [ci[3].key, ci[0].key, ci[1].key, ci[2].key]


def test_a_worker_leases_only_jobs_for_its_compiler_and_target_kind(local: LocalRegistry, client) -> None:
    from .conftest import FINGERPRINT, TARGET

    gpu = canonical_target({"kind": "cuda", "arch": "sm_90", "keys": ["cuda", "gpu"]})
    ours, other_compiler, on_gpu = miss(1), make_record(2, 1e-3).identity, make_record(3, 1e-3, target=gpu).identity
    other_compiler = Identity.from_obj({**other_compiler.to_dict(), "fingerprint": "tvm=0.99", "key": record_key("tvm=0.99", TARGET, other_compiler.workload)})
    for reg in (local, client):  # in process and over HTTP
        reg.report_misses([on_gpu, other_compiler, ours, ours])
        leases = reg.lease("cpu-worker", max_jobs=5, lease_secs=60, fingerprint=FINGERPRINT, kind="llvm")
        assert [l.key for l in leases] == [ours.key]
        assert {l.key for l in reg.lease("anyone", max_jobs=5, lease_secs=60)} == {on_gpu.key, other_compiler.key}


def test_a_worker_leases_only_jobs_for_its_device_model_or_a_generic_one(local: LocalRegistry, client) -> None:
    """A kernel built for another CPU may not run here (AVX-512 on a CPU without it) and would be timed on the wrong model."""
    targets = {cpu: canonical_target({"kind": "llvm", **({"mcpu": cpu} if cpu else {}), "keys": ["cpu"]}) for cpu in ("znver3", "skylake-avx512", "")}
    jobs = {cpu: make_record(10 + i, 1e-3, target=t).identity for i, (cpu, t) in enumerate(targets.items())}
    gpus = {arch: make_record(20 + i, 1e-3, target=canonical_target({"kind": "cuda", "arch": arch})).identity for i, arch in enumerate(("sm_90", "sm_80"))}
    for reg in (local, client):  # in process and over HTTP
        reg.report_misses([*jobs.values(), *gpus.values()])
        assert {l.key for l in reg.lease("zen", max_jobs=9, lease_secs=60, kind="llvm", device="znver3")} == {jobs["znver3"].key, jobs[""].key}
        assert [l.key for l in reg.lease("h100", max_jobs=9, lease_secs=60, kind="cuda", device="sm_90")] == [gpus["sm_90"].key]
        assert {l.key for l in reg.lease("anyone", max_jobs=9, lease_secs=60)} == {jobs["skylake-avx512"].key, gpus["sm_80"].key}
    with pytest.raises(Exception, match="device"):
        client.lease("zen", device="znver3\x00")  # control characters are refused like any other text field


def test_a_worker_naming_its_compiler_kind_and_device_gets_its_jobs_and_its_kinds_generic_ones_most_demanded_first(local: LocalRegistry) -> None:
    """Such a lease reads the queue's rows of the worker's fit and of its kind's generic target, merged in lease order, and
    none of the jobs it cannot take, however many are queued before (here: another compiler's, more demanded)."""
    from .conftest import FINGERPRINT

    zen, generic = (canonical_target({"kind": "llvm", **({"mcpu": cpu} if cpu else {}), "keys": ["cpu"]}) for cpu in ("znver3", ""))
    elsewhere = make_record(30, 1e-3, target=zen).identity
    elsewhere = Identity.from_obj({**elsewhere.to_dict(), "fingerprint": "tvm=0.99", "key": record_key("tvm=0.99", zen, elsewhere.workload)})
    ours = {(t, w): make_record(w, 1e-3, target=t).identity for t, w in ((zen, 31), (generic, 32), (zen, 33), (generic, 34))}
    local.report_misses([elsewhere] * 9)
    for caller, (demand, identity) in enumerate(zip((1, 3, 2, 1), ours.values())):
        local.report_misses([identity] * demand, by=f"caller{caller}")  # each its caller's first: one turn
    leased = local.lease("zen", max_jobs=9, lease_secs=60, fingerprint=FINGERPRINT, kind="llvm", device="znver3")
    assert [l.key for l in leased] == [ours[generic, 32].key, ours[zen, 33].key, ours[zen, 31].key, ours[generic, 34].key]  # by demand, then age
    assert [j["key"] for j in local.jobs("pending")] == [elsewhere.key]


def test_an_unacked_lease_comes_back_after_expiry(local: LocalRegistry) -> None:
    local.report_misses([miss(1)])
    first = local.lease("doomed-worker", lease_secs=0.2)[0]
    assert local.lease("other", lease_secs=60) == []  # still held
    time.sleep(0.3)
    second = local.lease("other", lease_secs=60)[0]
    assert second.key == first.key and second.lease_id != first.lease_id
    assert second.job["attempts"] == 2 and "expired" in second.job["last_error"]
    with pytest.raises(LeaseLost):
        local.ack(first.key, first.lease_id)  # the dead worker's lease is gone
    local.ack(second.key, second.lease_id)
    assert local.jobs(DONE)[0]["key"] == first.key


def test_renew_keeps_a_lease_alive(local: LocalRegistry) -> None:
    local.report_misses([miss(1)])
    lease = local.lease("w", lease_secs=0.3)[0]
    for _ in range(3):
        time.sleep(0.15)
        local.renew(lease.key, lease.lease_id, lease_secs=0.3)
    assert local.lease("other") == []
    assert local.jobs(LEASED)[0]["lease_owner"] == "w"


def test_failures_retry_then_dead_letter_with_last_error(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path, sync=False, max_attempts=2) as reg:
        reg.report_misses([miss(1)])
        lease = reg.lease("w")[0]
        assert reg.fail(lease.key, lease.lease_id, "ScheduleError: first") == PENDING
        lease = reg.lease("w")[0]
        assert reg.fail(lease.key, lease.lease_id, "ScheduleError: second") == DEAD
        assert reg.lease("w") == []
        dead = reg.jobs(DEAD)[0]
        assert dead["last_error"] == "ScheduleError: second" and dead["attempts"] == 2
        reg.requeue(lease.key)
        assert reg.lease("w")[0].job["attempts"] == 1


def test_expired_leases_also_count_toward_the_cap(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path, sync=False, max_attempts=2) as reg:
        reg.report_misses([miss(1)])
        reg.lease("a", lease_secs=0.05)
        time.sleep(0.1)
        reg.lease("b", lease_secs=0.05)
        time.sleep(0.1)
        assert reg.lease("c") == []
        assert reg.jobs(DEAD)[0]["last_error"].startswith("lease held by 'b' expired")


def test_a_pushed_record_satisfies_a_pending_miss_and_quarantine_reopens_it(local: LocalRegistry) -> None:
    rec = make_record(1, 1e-3)
    local.report_misses([rec.identity])
    local.put(rec)
    assert local.jobs(DONE)[0]["key"] == rec.key
    local.quarantine(rec.key, rec.trace_id, "trace failed to apply")
    assert local.report_misses([rec.identity])[0]["state"] == PENDING


def test_a_first_pass_ack_requeues_the_job_for_refinement_after_every_first_pass(local: LocalRegistry, client) -> None:
    """A model's misses all get a measured schedule before any of them gets a full search; the search is not lost."""
    for n, reg in enumerate((local, client)):  # in process and over HTTP
        popular, other, late = miss(100 * n + 1), miss(100 * n + 2), miss(100 * n + 3)
        reg.report_misses([popular, popular, popular, other])
        first = reg.lease("w", max_jobs=1, lease_secs=60)[0]
        assert first.key == popular.key and first.job["stage"] == ""
        reg.put(make_record(100 * n + 1, 1e-3))  # the first pass pushed its best while holding the lease
        assert reg.ack(first.key, first.lease_id, refine=True) == REFINE
        reg.report_misses([late])  # a miss that arrives later still gets its first pass before the refinement
        order = [l.key for l in reg.lease("w", max_jobs=5, lease_secs=60)]
        assert order == [other.key, late.key, popular.key]
        refine = {j["key"]: j for j in reg.jobs(LEASED)}[popular.key]
        assert refine["stage"] == REFINE and refine["attempts"] == 1 and refine["demand"] == 3
        assert task_label(refine) == "tune (refine)" and task_label({**refine, "stage": ""}) == "tune"  # as `schedhub queue` and the dashboard list it


def test_a_refine_job_survives_a_push_and_closes_with_its_ack(local: LocalRegistry) -> None:
    rec = make_record(1, 1e-3)
    local.report_misses([rec.identity])
    lease = local.lease("w")[0]
    local.put(rec)
    local.ack(lease.key, lease.lease_id, refine=True)
    local.put(make_record(1, 5e-4))  # another push: the search is still owed
    assert local.jobs(PENDING)[0]["stage"] == REFINE
    lease = local.lease("w")[0]
    assert local.ack(lease.key, lease.lease_id, refine=True) == DONE  # one full search is enough
    assert local.jobs(DONE)[0]["key"] == rec.key and local.lease("w") == []


def test_refine_is_refused_on_a_verification_and_when_not_a_boolean(local: LocalRegistry, client) -> None:
    rec = make_record(1, 1e-3)
    local.put(rec)
    local.queue.enqueue_verify(rec, "someone", "a claim")
    lease = local.lease("w", tasks=(VERIFY,))[0]
    with pytest.raises(InvalidRecord, match="refine"):
        local.ack(lease.key, lease.lease_id, refine=True)
    client.report_misses([miss(2)])
    lease = client.lease("w")[0]
    with pytest.raises(InvalidRecord, match="refine"):
        client._call("POST", f"/v1/queue/{lease.key}/ack", {"lease_id": lease.lease_id, "refine": "yes"})
    assert client.jobs(LEASED)[0]["key"] == lease.key  # nothing changed


def test_the_queue_survives_reopening(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path) as reg:
        reg.report_misses([miss(1), miss(2)])
        held = reg.lease("w", lease_secs=600)[0]
    with LocalRegistry(tmp_path) as reg:
        assert reg.stats()["queue"] == {PENDING: 1, LEASED: 1, DONE: 0, DEAD: 0}
        reg.ack(held.key, held.lease_id)


def _every_state(reg: LocalRegistry) -> None:
    """Jobs in every state a caller can see, an expired lease among them (stored leased, seen pending)."""
    reg.report_misses([miss(w) for w in range(40)])
    reg.put(make_record(3, 1e-3))  # done
    for _lease in reg.lease("w", max_jobs=4, lease_secs=60):  # leased
        pass
    dead = reg.lease("w", max_jobs=2, lease_secs=60)
    for lease in dead:
        for _ in range(3):
            if reg.fail(lease.key, lease.lease_id, "ScheduleError") == DEAD:
                break
            lease = next(l for l in reg.lease("w", max_jobs=40, lease_secs=60) if l.key == lease.key)
    reg.lease("w", max_jobs=3, lease_secs=0.01)  # expire: seen as given back
    time.sleep(0.05)


def test_listings_by_state_and_counts_read_the_state_index_and_agree_with_a_whole_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of one state and the counts no longer read every job (a public /v1/stats or
    /v1/queue?state=dead read the whole queue, 0.4 s at 100k small jobs, per request)."""
    from schedhub.registry import _queue

    with LocalRegistry(tmp_path, sync=False, max_attempts=1) as reg:
        _every_state(reg)
        every = reg.jobs()
        seen = {s: [j for j in every if j["state"] == s] for s in (PENDING, LEASED, DONE, DEAD)}
        assert all(seen.values()) and reg.stats()["queue"] == {s: len(v) for s, v in seen.items()}
        for state, wanted in seen.items():
            assert reg.jobs(state) == wanted
            pages, after = [], ""
            while page := reg.jobs(state, limit=2, after=after):
                pages += page
                after = page[-1]["key"]
            assert pages == wanted, state
        unpacked = []
        real = _queue.unpackb
        monkeypatch.setattr(_queue, "unpackb", lambda raw: unpacked.append(1) or real(raw))
        assert [j["key"] for j in reg.jobs(DEAD, limit=1)] == [seen[DEAD][0]["key"]]
        assert len(unpacked) <= 1 + 3  # the page and the expired leases, not the 40 jobs
        unpacked.clear()
        reg.stats()
        assert len(unpacked) <= 3


def test_a_store_from_before_the_state_index_gets_it_on_open(tmp_path: Path) -> None:
    from schedhub.registry import _store

    with LocalRegistry(tmp_path, sync=False, max_attempts=1) as reg:
        _every_state(reg)
        before = {s: reg.jobs(s) for s in (PENDING, LEASED, DONE, DEAD)} | {"counts": reg.stats()["queue"]}
        store = reg.store
        with store.env.begin(write=True) as txn:  # as a store written before the index was
            txn.drop(store.dbs["queue_state"], delete=False)
            txn.delete(_store.QUEUE_STATES, db=store.dbs["meta"])
            for s in (PENDING, LEASED, DONE, DEAD):
                txn.delete(_store.queue_count_row(s), db=store.dbs["meta"])
        assert reg.stats()["queue"] == before["counts"]  # read by a scan meanwhile
    with LocalRegistry(tmp_path, sync=False, max_attempts=1) as reg:
        assert {s: reg.jobs(s) for s in (PENDING, LEASED, DONE, DEAD)} | {"counts": reg.stats()["queue"]} == before
        with reg.store.read() as txn:
            assert reg.store.indexed(txn, _store.QUEUE_STATES)
