"""The LMDB store: top-k per key, idempotent pushes, change feed, log, quarantine, reopen."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from schedhub.registry import KeyPage, LocalRegistry, Record, RegistryError, Store, StoreFormatError, packb, unpackb

from .conftest import TARGET, make_record, store_unchecked


def miss(workload: int):  # type: ignore[no-untyped-def]
    return make_record(workload, 1e-3).identity


def test_top_k_keeps_the_fastest_best_first(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path, sync=False, top_k=3) as reg:
        times = [5.0, 1.0, 4.0, 2.0, 6.0]
        results = [reg.put(make_record(7, t * 1e-3, variant=i)) for i, t in enumerate(times)]
        assert [r.kept for r in results] == [True, True, True, True, False]
        kept = reg.get(make_record(7, 1).key)
        assert [round(r.mean_secs * 1e3 / 1.005, 6) for r in kept] == [1.0, 2.0, 4.0]


def test_the_same_trace_twice_is_one_entry_with_its_best_time(local: LocalRegistry) -> None:
    local.put(make_record(1, 3e-3))
    local.put(make_record(1, 1e-3))
    local.put(make_record(1, 2e-3))
    records = local.get(make_record(1, 1).key)
    assert len(records) == 1
    assert records[0].run_secs[0] == pytest.approx(1e-3)
    assert local.stats()["measurements"] == 3  # every measurement is logged


def test_records_come_back_byte_identical(local: LocalRegistry) -> None:
    rec = make_record(3, 1e-3, provenance={"host_cpu": "znver5", "trials": 64})
    local.put(rec)
    assert local.get_raw(rec.key) == [rec.to_bytes()]


def test_change_feed_pages_and_filters(local: LocalRegistry) -> None:
    for w in range(10):
        local.put(make_record(w, 1e-3, op="fused_dense" if w % 2 else "fused_conv"))
    feed = local.summaries()
    assert [s.seq for s in feed] == sorted(s.seq for s in feed) and len(feed) == 10
    page = local.summaries(since=feed[3].seq, limit=4)
    assert [s.key for s in page] == [s.key for s in feed[4:8]]
    assert {s.op for s in local.summaries(op="fused_dense")} == {"fused_dense"}
    assert len(local.summaries(op="fused_dense")) == 5
    assert local.summaries(target="cuda") == []
    assert len(local.summaries(target="llvm")) == 10
    # a push that changes a key's records moves it to the head of the feed; a repeat that does not, stays
    local.put(make_record(0, 0.5e-3, variant=1))
    assert local.summaries()[-1].key == make_record(0, 1).key
    local.put(make_record(5, 9.0, variant=0))
    assert local.summaries()[-1].key == make_record(0, 1).key
    assert [s.key for _, raws in local.iter_served(page=3) for s in [_]] == [s.key for s in local.summaries()]


def test_quarantine_takes_one_record_out(local: LocalRegistry) -> None:
    good, bad = make_record(4, 2e-3, variant=0), make_record(4, 1e-3, variant=1)
    local.put_many([good, bad])
    assert local.quarantine(bad.key, bad.trace_id, "ScheduleError: no block") is True
    assert [r.trace_id for r in local.get(bad.key)] == [good.trace_id]
    assert local.quarantine(bad.key, bad.trace_id, "again") is False
    assert local.quarantine(good.key, good.trace_id, "also bad") is True
    assert local.get(good.key) == [] and local.summaries() == []
    assert local.stats()["quarantined"] == 2


def test_reopen_sees_everything_and_readonly_refuses_writes(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path) as reg:
        reg.put_many([make_record(w, 1e-3) for w in range(20)])
    with LocalRegistry(tmp_path, readonly=True) as reg:
        assert reg.stats()["keys"] == 20
        with pytest.raises(RegistryError, match="read-only"):
            reg.put(make_record(99, 1e-3))


def test_a_store_of_another_format_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path) as store, store.write() as txn:
        txn.put(b"format", b"999", db=store.dbs["meta"])
    with pytest.raises(StoreFormatError, match="format"):
        Store(tmp_path)


def test_a_process_that_opened_the_store_before_a_newer_one_upgraded_it_writes_nothing(tmp_path: Path) -> None:
    """A format-7 process that opened the store before a format-8 one upgraded it kept writing trial logs that never
    entered the new index, whose flag said it was whole: every write reads the format again in its transaction."""
    from schedhub.registry import Trial, TrialLog

    with LocalRegistry(tmp_path, sync=False) as old:
        old.put(make_record(1, 1e-3))
        with old.store.env.begin(write=True) as txn:  # what a newer schedhub's upgrade leaves, from another process
            txn.put(b"format", b"9", db=old.store.dbs["meta"])
        with pytest.raises(StoreFormatError, match="upgraded to store format b'9' while this process had it open.*nothing was written"):
            old.put(make_record(2, 1e-3))
        log = TrialLog(make_record(3, 1e-3).identity, [Trial(make_record(3, 1e-3).trace, [1e-3])])
        with pytest.raises(StoreFormatError, match="nothing was written"):
            old.push_trials(log, "w", verified=True)
        assert old.summaries() and len(old.summaries()) == 1


@pytest.mark.parametrize("readonly", [True, False])
def test_a_file_that_is_no_lmdb_store_is_refused_with_its_reason(tmp_path: Path, readonly: bool) -> None:
    (tmp_path / "data.mdb").write_bytes(b"not an LMDB file" * 4096)
    with pytest.raises(StoreFormatError, match="could not be opened as a schedhub store: InvalidError"):
        Store(tmp_path, readonly=readonly)
    assert (tmp_path / "data.mdb").read_bytes() == b"not an LMDB file" * 4096  # left as it was
    (tmp_path / "data.mdb").unlink()
    with Store(tmp_path) as store:  # nothing of the refused file stayed open in this process
        assert store.stats()["keys"] == 0


@pytest.mark.parametrize("readonly", [True, False])
def test_another_programs_lmdb_is_refused_and_left_as_it_was(tmp_path: Path, readonly: bool) -> None:
    import lmdb

    with lmdb.open(str(tmp_path)) as env, env.begin(write=True) as txn:
        txn.put(b"session:42", b"someone else's data")
    with pytest.raises(StoreFormatError, match="not a schedhub store .*session:42.*nothing was written"):
        Store(tmp_path, readonly=readonly)
    with lmdb.open(str(tmp_path), readonly=True) as env, env.begin() as txn:
        assert list(txn.cursor()) == [(b"session:42", b"someone else's data")]  # no database of ours was added


def test_records_decode_from_what_the_store_holds(local: LocalRegistry) -> None:
    recs = [make_record(w, (w + 1) * 1e-4) for w in range(5)]
    local.put_many(recs)
    found = local.lookup([r.key for r in recs] + ["0" * 64])
    assert set(found) == {r.key for r in recs}
    assert all(isinstance(v[0], Record) for v in found.values())


def test_entries_stored_before_trust_existed_read_as_claims_and_take_every_new_operation(local: LocalRegistry) -> None:
    from schedhub.registry import packb, unpackb

    old, new = make_record(9, 2e-3), make_record(9, 1e-3, variant=1)
    local.put(old, "tuner")
    with local.store.write() as txn:  # the entry as the store kept it before: no verifier, no complaints
        value = unpackb(txn.get(old.key.encode(), db=local.store.dbs["records"]))
        value["entries"] = [{k: e[k] for k in ("rec", "mean", "tid", "at", "by")} for e in value["entries"]]
        txn.put(old.key.encode(), packb(value), db=local.store.dbs["records"])
    (legacy,) = local.get(old.key)
    assert not legacy.served.verified and legacy.served.complaints == 0
    assert local.complain(old.key, old.trace_id, "it failed", "client")["complaints"] == 1
    local.put(new, "alice", verified=False)
    assert [r.trace_id for r in local.get(old.key)] == [new.trace_id, old.trace_id]  # two claims, by claimed time
    assert local.store.verdict(old.key, old.trace_id, "w", [2.1e-3], "timed", 2.0) == "verified"
    assert [r.trace_id for r in local.get(old.key)] == [old.trace_id, new.trace_id]


def test_a_listing_reads_no_more_of_the_feed_than_its_page_or_its_scan_bound(local: LocalRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """An op's keys page from the op's own feed, an op's keys of a kind or target from their own, and a
    target filter that matches little stops at the scan bound with a cursor past what it read: before,
    each page of an op read every key of the op, a target that matched nothing read the whole store
    (~0.3 s a request at 100k keys), and an op of a kind it lacked read the op's feed a scan bound a page."""
    from schedhub.registry import _store

    for w in range(60):
        local.put(make_record(w, 1e-3, op="fused_dense" if w % 3 else "fused_conv"))
    local.put(make_record(1, 0.5e-3, variant=1))  # moved to the head of both feeds
    feed = local.summaries()
    dense = [s for s in feed if s.op == "fused_dense"]
    loaded = []
    real = _store.unpackb
    monkeypatch.setattr(_store, "unpackb", lambda raw: loaded.append(1) or real(raw))
    page = local.store.page(op="fused_dense", since=dense[9].seq, limit=5)
    assert page.items == dense[10:15] and page.more and page.next == dense[14].seq
    assert len(loaded) == 5  # the page's keys only
    assert local.summaries(op="fused_dense", limit=3, newest=True) == dense[-3:]
    assert local.summaries(op="fused_conv", limit=100, newest=True) == [s for s in feed if s.op == "fused_conv"]
    loaded.clear()  # an op of a kind or target no key of the op has: nothing read, not a page per scan bound
    assert local.store.page(op="fused_dense", target="cuda", limit=1000, scan=7) == KeyPage([], 0, False) and loaded == []
    loaded.clear()
    assert local.store.page(target="cuda", limit=1000, scan=7) == KeyPage([], 0, False) and loaded == []  # no key of that kind
    assert [s.key for s in local.store.page(target="llvm", since=feed[20].seq, limit=1000, scan=7).items] == [s.key for s in feed[21:28]]
    assert local.summaries(target=feed[0].target, since=feed[20].seq, limit=4) == feed[21:25]
    assert local.summaries(target=feed[0].target.replace("}", ', "x": 1}'), limit=4) == []
    cuda = '{"arch": "sm_90", "kind": "cuda"}'
    for w in range(60, 66):  # an op's keys of another kind, behind 60 of this kind
        local.put(make_record(w, 1e-3, op="fused_dense", target=cuda))
    on_cuda = local.summaries(target=cuda)
    for target in ("cuda", cuda):
        loaded.clear()
        page = local.store.page(op="fused_dense", target=target, limit=4, scan=7)
        assert page.items == on_cuda[:4] and page.more and page.next == on_cuda[3].seq and len(loaded) == 4
        assert local.store.page(op="fused_dense", target=target, since=page.next, limit=4, scan=7).items == on_cuda[4:]
        assert local.summaries(op="fused_dense", target=target, limit=2, newest=True) == on_cuda[-2:]
    assert local.summaries(op="fused_dense", target="llvm") == dense


def test_a_store_from_before_the_op_feed_gets_it_on_open_and_reads_the_old_index_until_then(tmp_path: Path) -> None:
    from schedhub.registry import _store

    with LocalRegistry(tmp_path, sync=False) as reg:
        for w in range(20):
            reg.put(make_record(w, 1e-3, op="fused_dense" if w % 2 else "fused_conv"))
        wanted = reg.summaries(op="fused_dense")
        with reg.store.env.begin(write=True) as txn:  # as a store written before the op feed was
            txn.drop(reg.store.dbs["op_feed"], delete=False)
            txn.delete(_store.OP_FEED, db=reg.store.dbs["meta"])
        assert reg.summaries(op="fused_dense") == wanted and reg.summaries(op="fused_dense", limit=2, newest=True) == wanted[-2:]
    with LocalRegistry(tmp_path, sync=False) as reg:
        assert reg.summaries(op="fused_dense") == wanted and reg.summaries(op="fused_dense", limit=2, newest=True) == wanted[-2:]
        with reg.store.read() as txn:
            assert reg.store.indexed(txn, _store.OP_FEED)


@pytest.mark.parametrize("older", [b"1", b"2", b"3"])
def test_an_older_format_store_is_upgraded_with_its_new_indexes_rebuilt(tmp_path: Path, older: bytes) -> None:
    """Format 1 knew nothing of op_feed, queue_state, target_feed or trials_by_target, format 2 nothing of
    the last two, format 3 nothing of target_feed's rows by op: a store an older schedhub wrote after a
    newer one indexed it is re-indexed on upgrade, and the new format keeps the older one from writing again."""
    from schedhub.registry import Trial, TrialLog, _store

    other = TARGET.replace("znver5", "znver4")
    with LocalRegistry(tmp_path, sync=False) as reg:
        for w in range(6):
            reg.put(make_record(w, 1e-3, op="fused_dense", target=other if w % 2 else TARGET))
        reg.report_misses([make_record(w, 1e-3).identity for w in range(6, 9)])
        reg.push_trials(TrialLog(make_record(1, 1e-3, target=other).identity, [Trial(make_record(1, 1e-3).trace, 1e-3)]), "w")
        unchecked = make_record(0, 1e-3, op="fused_dense")
        if older == b"1":  # and a record that today's checks refuse (the store once failed to open), kept before its structure was described
            store_unchecked(tmp_path, unchecked)
            with reg.store.write() as txn:
                value = unpackb(txn.get(unchecked.key.encode(), db=reg.store.dbs["records"]))
                txn.put(unchecked.key.encode(), packb({k: v for k, v in value.items() if k not in ("st", "wid", "dims", "fp")}), db=reg.store.dbs["records"])
        store = reg.store
        with store.env.begin(write=True) as txn:  # what an older writer leaves: the indexes it does not know stale
            txn.put(b"format", older, db=store.dbs["meta"])
            if older == b"3":  # its target_feed rows, without those by op
                rows = txn.cursor(db=store.dbs["target_feed"])
                while rows.first() and rows.key()[:1] in b"KT":
                    rows.delete()
            else:
                txn.drop(store.dbs["target_feed"], delete=False)
                txn.drop(store.dbs["trials_by_target"], delete=False)
                txn.drop(store.dbs["agg_rank"], delete=False)
            if older == b"1":
                txn.drop(store.dbs["op_feed"], delete=False)
                txn.drop(store.dbs["queue_state"], delete=False)
                txn.put(_store.queue_count_row("dead"), struct.pack(">q", 5), db=store.dbs["meta"])
                txn.put(b"op\0ghost", struct.pack(">q", 3), db=store.dbs["agg"])  # format 1 was written before agg and by_struct too
                txn.put(b"\xab" * 64, b"\x80", db=store.dbs["by_struct"])
        assert store.summaries(op="fused_dense", target=other) == []  # stale: the flags still say indexed
        assert older == b"3" or (store.summaries(target=other) == [] and reg.trial_logs(target=other)[0] == [])
    with LocalRegistry(tmp_path, sync=False) as reg:
        assert len(reg.summaries(op="fused_dense")) == 6 and len(reg.jobs("pending")) == 3
        assert [s.key for s in reg.summaries(target=other)] == [make_record(w, 1e-3, target=other).key for w in (1, 3, 5)]
        assert [s.key for s in reg.summaries(op="fused_dense", target=other)] == [make_record(w, 1e-3, target=other).key for w in (1, 3, 5)]
        assert len(reg.summaries(op="fused_dense", target="llvm")) == 6
        assert len(reg.summaries(target="llvm")) == 6
        assert [log.key for log in reg.trial_logs(target=other)[0]] == [make_record(1, 1e-3, target=other).key]
        assert reg.stats()["queue"] == {"pending": 3, "leased": 0, "done": 0, "dead": 0}
        assert reg.store.aggregates(top=1)["target"] == {other: 3}  # a tie: by name
        assert reg.store.aggregates()["op"] == {"fused_dense": 6}
        with reg.store.read() as txn:
            assert txn.stat(reg.store.dbs["by_struct"])["entries"] == 6 and reg.stats()["coverage"]["targets"] == 2
        assert (unchecked.key in reg.lookup([unchecked.key], refused=(refused := []))) == (older != b"1") and len(refused) == (older == b"1")  # left out of reads
        with reg.store.read() as txn:
            assert txn.get(b"format", db=reg.store.dbs["meta"]) == _store.STORE_FORMAT == b"8"


def test_a_format_4_store_gets_its_pending_verifications_ranked_by_requester(tmp_path: Path) -> None:
    """Format 4 ranked a pending verification by its demand alone, counted no requester's claims, kept no queue_fit and
    counted no pusher's unverified log: on upgrade its queue indexes are rebuilt (an index row left in the old layout
    would hand out a job twice, a job missing from queue_fit none) and the counts made."""
    from schedhub.registry import Trial, TrialLog, _store
    from schedhub.registry._counts import read_count
    from schedhub.registry._trials import TRIALS_CLAIMED, claimed_row

    with LocalRegistry(tmp_path, sync=False) as reg:
        claims = [make_record(10 + i, 1e-3) for i in range(3)]
        reg.put_many(claims, "mallory", verified=False)
        reg.put_many([make_record(20, 1e-3)], "alice", verified=False)
        reg.push_trials(TrialLog(claims[0].identity, [Trial(claims[0].trace, 1e-3)]), "mallory", verified=False)
        store = reg.store
        with store.read() as txn:
            logged = read_count(txn, store.dbs["meta"], claimed_row(b"mallory"))
        with store.env.begin(write=True) as txn:  # what a format-4 writer leaves
            txn.put(b"format", b"4", db=store.dbs["meta"])
            txn.delete(_store.QUEUE_ORDER, db=store.dbs["meta"])
            for row in [k for k, _ in txn.cursor(db=store.dbs["queue_idx"]) if k.startswith(b"V")]:
                demand = unpackb(txn.get(row[17:], db=store.dbs["queue"]))["demand"]
                txn.delete(row, db=store.dbs["queue_idx"])  # format 4's row: a 4-byte rank, the demand's
                txn.put(b"V" + struct.pack(">I", 0xFFFFFFFF - demand) + row[9:], b"", db=store.dbs["queue_idx"])
            txn.delete(TRIALS_CLAIMED, db=store.dbs["meta"])
            rows = txn.cursor(db=store.dbs["meta"])
            for counted in (b"queue_awaiting:", b"trials_claimed:"):
                while rows.set_range(counted) and rows.key().startswith(counted):
                    rows.delete()
            txn.drop(store.dbs["queue_fit"], delete=False)
            for job_id, raw in txn.cursor(db=store.dbs["queue"]):
                job = unpackb(raw)
                txn.put(job_id, packb({k: v for k, v in job.items() if k not in ("requester", "ordinal")}), db=store.dbs["queue"])
    with LocalRegistry(tmp_path, sync=False) as reg:
        assert reg.queue.awaiting("mallory") == 3 and reg.queue.awaiting("alice") == 1
        with reg.store.read() as txn:
            assert read_count(txn, reg.store.dbs["meta"], claimed_row(b"mallory")) == logged > 0  # bytes of unverified log, as pushed
        from schedhub.registry._keys import target_device

        fits = {"fingerprint": claims[0].identity.fingerprint, "kind": "llvm", "device": target_device(TARGET)}  # as a worker leases
        leased = [lease.job["record_key"] for lease in reg.lease("w", max_jobs=10, lease_secs=60, tasks=("verify",), **fits)]
        assert sorted(leased) == sorted(r.key for r in [*claims, make_record(20, 1e-3)])  # each once
        assert reg.lease("w", max_jobs=10, lease_secs=60, tasks=("verify",)) == []
        with reg.store.read() as txn:
            assert txn.get(b"format", db=reg.store.dbs["meta"]) == b"8"


def test_a_format_7_store_gets_its_trial_logs_indexed_by_structure_on_open(tmp_path: Path) -> None:
    """Format 7 kept no ``trials_by_structure``: on upgrade every log entry is put in it, so a search's cost model finds
    the entries a format-7 writer logged (a stale index would hide them), and format 8 keeps that writer out."""
    from schedhub.registry import Trial, TrialLog, _store

    identities = [make_record(w, 1e-3).identity for w in range(3)]
    with LocalRegistry(tmp_path, sync=False) as reg:
        for identity in identities:
            reg.push_trials(TrialLog(identity, [Trial(make_record(0, 1e-3).trace, 1e-3)]), "w")
        with reg.store.env.begin(write=True) as txn:  # what a format-7 writer leaves: no rows, no flag
            txn.put(b"format", b"7", db=reg.store.dbs["meta"])
            txn.delete(_store.TRIALS_BY_STRUCTURE, db=reg.store.dbs["meta"])
            txn.drop(reg.store.dbs["trials_by_structure"], delete=False)
    with LocalRegistry(tmp_path, sync=False) as reg:
        found = reg.trial_logs(target=TARGET, structure=identities[0].structure)[0]
        assert sorted(log.key for log in found) == sorted(identity.key for identity in identities)
        with reg.store.read() as txn:
            assert reg.store.indexed(txn, _store.TRIALS_BY_STRUCTURE) and txn.get(b"format", db=reg.store.dbs["meta"]) == b"8"


def test_a_format_6_store_gets_its_pending_tune_jobs_ranked_by_callers_and_turns(tmp_path: Path) -> None:
    """Format 6 ranked a pending tune job by its demand alone, in a 4-byte rank: on upgrade each job gets its turn among
    its requester's (oldest first) and the queue's order is rebuilt, so jobs queued before it and after sort by one rule."""
    from schedhub.registry import _store

    ci, dev, late = [miss(30 + i) for i in range(3)], miss(40), miss(41)
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.report_misses(ci * 2, by="ci")  # demand 2 each
        reg.report_misses([dev], by="dev")
        store = reg.store
        with store.env.begin(write=True) as txn:  # what a format-6 writer leaves
            txn.put(b"format", b"6", db=store.dbs["meta"])
            for db in ("queue_idx", "queue_fit"):
                txn.drop(store.dbs[db], delete=False)
            for job_id, raw in list(txn.cursor(db=store.dbs["queue"])):
                job = {k: v for k, v in unpackb(raw).items() if k not in ("asked_by", "turn")}
                txn.put(job_id, packb(job), db=store.dbs["queue"])
                txn.put(b"P" + struct.pack(">I", 0xFFFFFFFF - job["demand"]) + struct.pack(">Q", job["seq"]) + job_id, b"", db=store.dbs["queue_idx"])
            rows = txn.cursor(db=store.dbs["meta"])
            while rows.set_range(b"queue_turn:") and rows.key().startswith(b"queue_turn:"):
                rows.delete()
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.report_misses([late], by="late")
        assert sorted(job["callers"] for job in reg.jobs("pending")) == [1] * 5  # a job queued before counts its requester
        leased = [lease.key for lease in reg.lease("w", max_jobs=5, lease_secs=60)]
        assert leased == [ci[0].key, dev.key, late.key, ci[1].key, ci[2].key]  # each requester's first, the most demanded of them first
        with reg.store.read() as txn:
            assert txn.get(b"format", db=reg.store.dbs["meta"]) == _store.STORE_FORMAT


def test_each_pushers_bytes_of_records_in_service_are_counted_through_every_way_in_and_out(tmp_path: Path) -> None:
    """The count a pusher's bound is checked against: kept in step with pushes, a pusher's claims past its share, evictions
    from the top-k, a faster re-push, quarantine and withdrawal, and equal to a count from scratch."""
    from collections import Counter

    def counted(reg: LocalRegistry) -> dict[str, int]:
        with reg.store.read() as txn:
            return {who: reg.store.owned_bytes(txn, who) for who in ("alice", "bob", "w") if reg.store.owned_bytes(txn, who)}

    def recount(reg: LocalRegistry) -> dict[str, int]:
        owned: Counter[str] = Counter()
        with reg.store.read() as txn:
            for _, raw in txn.cursor(db=reg.store.dbs["records"]):
                for entry in unpackb(raw)["entries"]:
                    owned[entry["by"]] += len(entry["rec"])
        return dict(owned)

    with LocalRegistry(tmp_path, sync=False, top_k=3) as reg:
        reg.put_many([make_record(1, t * 1e-3, variant=v) for v, t in enumerate((5, 4, 3))], "alice", verified=False)  # past her share of 1 claim a key
        reg.put_many([make_record(1, t * 1e-3, variant=10 + v) for v, t in enumerate((2, 1, 0.5))], "w", verified=True)  # evicts
        reg.put_many([make_record(2, 1e-3), make_record(3, 1e-3)], "bob", verified=False)
        reg.put_many([make_record(2, 0.5e-3)], "bob", verified=False)  # faster: replaces its bytes
        assert counted(reg) == recount(reg) and set(counted(reg)) == {"w", "bob"}
        reg.quarantine(make_record(2, 1e-3).key, make_record(2, 1e-3).trace_id, "bad")
        reg.forget("w", verified=True)
        assert counted(reg) == recount(reg) == {"bob": len(make_record(3, 1e-3).to_bytes())}


def test_decoded_values_are_reused_only_while_the_stored_bytes_are_the_same() -> None:
    from schedhub.registry._decoded import DecodedValues

    decoded: list[bytes] = []
    values = DecodedValues(lambda data: decoded.append(data) or data.upper(), max_values=2)
    assert values.get("a", b"x") == b"X" and values.get("a", memoryview(b"x")) == b"X"
    assert decoded == [b"x"]  # the second read found the same bytes
    assert values.get("a", b"y") == b"Y" and decoded == [b"x", b"y"]  # rewritten: decoded again
    values.get("b", b"z")
    values.get("c", b"w")  # past two values the oldest goes
    values.get("a", b"y")
    assert decoded == [b"x", b"y", b"z", b"w", b"y"]


def test_a_read_after_a_write_by_another_handle_sees_the_new_entries(tmp_path: Path) -> None:
    """Reads keep decoded values: a value rewritten elsewhere (another process's handle writes the same file) is read anew."""
    first = make_record(1, 2e-3)
    with LocalRegistry(tmp_path / "s", sync=False) as reader:
        reader.put(first)
        assert [r.trace_id for r in reader.lookup([first.key])[first.key]] == [first.trace_id]
        better = make_record(1, 1e-3, variant=1)
        with LocalRegistry(tmp_path / "s", sync=False) as writer:
            writer.put(better)
        assert [r.trace_id for r in reader.lookup([first.key])[first.key]] == [better.trace_id, first.trace_id]
