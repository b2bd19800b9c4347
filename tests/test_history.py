"""What the registry keeps of a caller's ended work (dead and done jobs, records out of service): a budget per caller."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedhub.registry import DEAD, PENDING, LocalRegistry, NotFound, packb, unpackb
from schedhub.registry._history import KEPT_INDEX, forget_all, kept_bytes
from schedhub.registry._store import RECORDS_OWNED, owned_row

from .conftest import make_record


def miss(workload: int):
    return make_record(workload, 1e-3).identity


def kill(reg: LocalRegistry, workloads: list[int], by: str) -> None:
    """Report each workload's miss as ``by`` and fail its one attempt: a dead job each, oldest first."""
    for w in workloads:
        reg.report_misses([miss(w)], by=by)
        lease = reg.lease("w")[0]
        assert reg.fail(lease.key, lease.lease_id, f"ScheduleError: {w}") == DEAD


def held(reg: LocalRegistry, owner: str) -> int:
    with reg.store.read() as txn:
        return kept_bytes(txn, reg.store.dbs, owner)


def stored(reg: LocalRegistry, state: str) -> set[str]:
    return {job["key"] for job in reg.jobs(state)}


def test_a_callers_dead_jobs_are_kept_within_its_budget_newest_first_and_nobody_elses_go(tmp_path: Path) -> None:
    """A reader whose misses die as fast as workers fail them would fill the store with their workloads: past its budget
    its oldest ended jobs go (and only its own); a job that goes back to work leaves the history it was counted in."""
    with LocalRegistry(tmp_path, sync=False, max_attempts=1) as reg:
        kill(reg, [100], "alice")
        one_job = held(reg, "alice")
        assert one_job > 0
        reg.store.kept_bytes = 3 * one_job + one_job // 2  # room for three of mallory's (the same size as alice's)
        kill(reg, list(range(1, 9)), "mallory")
        newest = {miss(w).key for w in (6, 7, 8)}
        assert stored(reg, DEAD) == newest | {miss(100).key}
        assert 2 * one_job < (mallorys := held(reg, "mallory")) <= reg.store.kept_bytes and held(reg, "alice") == one_job
        assert reg.queue.counts()[DEAD] == 4
        with pytest.raises(NotFound):
            reg.job(miss(1).key)
        with pytest.raises(NotFound, match="history no longer keeps"):
            reg.requeue(miss(1).key)
        assert reg.job(miss(6).key)["last_error"] == "ScheduleError: 6"  # what happened is still there for the kept ones
        assert reg.report_misses([miss(1)], by="mallory")[0]["state"] == PENDING  # a dropped job is a new miss again

        reg.requeue(miss(6).key)  # back at work: no longer history
        assert held(reg, "mallory") == mallorys * 2 // 3 and reg.job(miss(6).key)["state"] == PENDING
        assert "kept" not in reg.job(miss(7).key)  # the row is the store's business


def test_a_pushers_records_taken_out_of_service_are_kept_within_the_same_budget(tmp_path: Path) -> None:
    """A pusher whose claims fail, at the workers' pace, leaves a record out of service each: its oldest go past its budget,
    another pusher's stay, and a record taken out twice is kept once."""
    with LocalRegistry(tmp_path, sync=False) as reg:
        bob = make_record(50, 1e-3)
        reg.put_many([bob], "bob", verified=True)
        reg.quarantine(bob.key, bob.trace_id, "does not match the reference")
        claims = [make_record(w, 1e-3) for w in range(1, 7)]
        reg.put_many(claims, "mallory", verified=True)
        reg.quarantine(claims[0].key, claims[0].trace_id, "first")
        one_record = held(reg, "mallory")
        reg.put_many([claims[0]], "mallory", verified=True)  # pushed again and taken out again
        reg.quarantine(claims[0].key, claims[0].trace_id, "later")  # as long a reason: as many bytes
        assert held(reg, "mallory") == one_record
        reg.store.kept_bytes = 2 * one_record + one_record // 2
        for claim in claims[1:]:
            reg.quarantine(claim.key, claim.trace_id, "does not match the reference")
        out = {(item["by"], item["key"]) for item in reg.quarantined()}
        assert out == {("bob", bob.key), *(("mallory", c.key) for c in claims[-2:])}
        assert one_record < held(reg, "mallory") <= reg.store.kept_bytes


def test_a_format_5_store_gets_each_callers_ended_work_kept_and_trimmed_and_its_records_counted_on_open(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path, sync=False, max_attempts=1) as reg:
        kill(reg, [1, 2, 3, 4], "mallory")
        claim = make_record(9, 1e-3)
        reg.put_many([claim], "mallory", verified=True)
        reg.quarantine(claim.key, claim.trace_id, "bad")
        one_job = held(reg, "mallory") // 5
        store = reg.store
        reg.put_many([make_record(20, 1e-3)], "alice", verified=False)
        with store.read() as txn:
            owned = store.owned_bytes(txn, "alice")
        with store.env.begin(write=True) as txn:  # what a format-5 writer leaves
            txn.put(b"format", b"5", db=store.dbs["meta"])
            txn.delete(KEPT_INDEX, db=store.dbs["meta"])
            txn.delete(RECORDS_OWNED, db=store.dbs["meta"])
            txn.delete(owned_row("alice"), db=store.dbs["meta"])
            forget_all(txn, store.dbs)
            for db in ("queue", "quarantine"):
                for item_id, raw in list(txn.cursor(db=store.dbs[db])):
                    value = unpackb(raw)
                    value.pop("kept", None), value.pop("ended_at", None)
                    txn.put(item_id, packb(value), db=store.dbs[db])
    with LocalRegistry(tmp_path, sync=False, kept_bytes=3 * one_job) as reg:
        assert stored(reg, DEAD) == {miss(w).key for w in (3, 4)} and [q["key"] for q in reg.quarantined()] == [claim.key]
        assert 0 < held(reg, "mallory") <= 3 * one_job
        with reg.store.read() as txn:
            assert reg.store.owned_bytes(txn, "alice") == owned > 0  # each pusher's records in service counted again
        reg.requeue(miss(4).key)
        reg.requeue(miss(3).key)
        with reg.store.read() as txn:
            assert txn.get(b"format", db=reg.store.dbs["meta"]) == b"8"
            assert [row for row, _ in txn.cursor(db=reg.store.dbs["kept"])] == [unpackb(txn.get(f"{claim.key}:{claim.trace_id}".encode(),
                                                                                                     db=reg.store.dbs["quarantine"]))["kept"]]


def test_forget_finds_a_callers_work_a_few_rows_a_read_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader holds the pages it sees from reuse: forget reads the store in short read transactions, and finds every
    row of the caller's across their edges."""
    from schedhub.registry import _forget

    monkeypatch.setattr(_forget, "SCAN_ROWS", 3)
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put_many([make_record(w, 1e-3) for w in range(0, 20, 2)], "alice", verified=False)
        reg.put_many([make_record(w, 1e-3) for w in range(1, 20, 2)], "bob", verified=False)
        reg.report_misses([make_record(w, 1e-3).identity for w in range(100, 107)], by="alice")
        gone = reg.forget("alice")
        assert (gone["records"], gone["jobs"]) == (10, 10 + 7)  # her claims, their verifications, her misses
        assert {r.served.pushed_by for s in reg.summaries() for r in reg.get(s.key)} == {"bob"} and len(reg.summaries()) == 10


def test_other_callers_reporting_an_ended_job_do_not_grow_the_history_it_is_counted_in(tmp_path: Path) -> None:
    """A dead job is its requester's history, its size counted when it ended: a report of it names no new caller in it."""
    with LocalRegistry(tmp_path, sync=False, max_attempts=1) as reg:
        kill(reg, [100], "alice")
        counted = held(reg, "alice")
        with reg.store.read() as txn:
            size = len(txn.get(miss(100).key.encode(), db=reg.store.dbs["queue"]))
        for caller in ("bob", "carol", "x" * 128):
            assert reg.report_misses([miss(100)], by=caller)[0]["callers"] == 1
        with reg.store.read() as txn:
            assert len(txn.get(miss(100).key.encode(), db=reg.store.dbs["queue"])) <= size + 16 and held(reg, "alice") == counted  # demand's digits
