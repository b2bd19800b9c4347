"""The reliability suite, registry side: each attack of the hostile review, re-run against a real
server on 127.0.0.1 with tokens of every role. (Hook-side attacks: test_trust_hook.py; Ray and the
worker: test_tuner.py; kill -9 cycles and the 10,000-case schemathesis run: -m slow.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from schedhub.registry import (
    SCHEMA_VERSION, CallerBounds, Forbidden, InvalidRecord, LeaseLost, LocalRegistry, Principal, Record, RefusedRecord, RegistryClient, RegistryError,
    ServerThread, TooManyRequests, canonical_target, record_key, verify_job_id,
)  # fmt: skip

from .conftest import clients_by_name, FINGERPRINT, make_record, store_unchecked

ROLES = {"admin-tok": Principal("root", "admin"), "alice-tok": Principal("alice"), "bob-tok": Principal("bob"),
         "w1-tok": Principal("w1", "worker"), "w2-tok": Principal("w2", "worker"), "reader-tok": Principal("reader", "read")}  # fmt: skip


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path / "trust", tokens=ROLES, sync=False, bounds=CallerBounds(complaints_per_minute=5, misses_per_minute=8), body_timeout=1.0, header_timeout=1.0) as s:
        yield s


@pytest.fixture
def as_(srv: ServerThread) -> Iterator[dict[str, RegistryClient]]:
    with clients_by_name(srv.url, ROLES) as clients:
        yield clients


# -- 1. poisoning, overwriting, evicting, quarantining ------------------------------------------


def test_a_claim_never_outranks_a_verified_record_and_awaits_verification(as_: dict[str, RegistryClient]) -> None:
    honest, poison = make_record(1, 1e-3), make_record(1, 1e-10, variant=1)  # the review's 89.7x-slow trace claimed 1e-10 s
    assert as_["w1"].put(honest).verified
    result = as_["alice"].put(poison)
    assert result.kept and not result.verified and result.needs_verification
    served = as_["reader"].get(honest.key)
    assert [r.trace_id for r in served] == [honest.trace_id, poison.trace_id]  # verified first, whatever the claim
    assert served[0].served.verified_by == "w1" and served[1].served.pushed_by == "alice" and not served[1].served.verified
    lease = as_["w2"].lease("v", max_jobs=5, lease_secs=60, tasks=("verify",))[0]
    assert lease.job["task"] == "verify" and lease.job["trace_id"] == poison.trace_id and lease.job["pusher"] == "alice"
    assert lease.job["trace"] == poison.trace and lease.job["identity"]["key"] == poison.key


def test_a_claim_re_measured_far_slower_is_refused_and_its_pusher_named(as_: dict[str, RegistryClient]) -> None:
    honest, poison, fair = make_record(1, 1e-3), make_record(1, 1e-10, variant=1), make_record(1, 2e-3, variant=2)
    as_["w1"].put(honest)
    as_["alice"].put(poison)
    as_["bob"].put(fair)
    leases = {l.job["trace_id"]: l for l in as_["w2"].lease("v", max_jobs=5, lease_secs=60, tasks=("verify",))}
    assert as_["w2"].ack(leases[poison.trace_id].key, leases[poison.trace_id].lease_id, {"run_secs": [9e-5], "reason": "timed"}) == "refused"
    assert as_["w2"].ack(leases[fair.trace_id].key, leases[fair.trace_id].lease_id, {"run_secs": [2.4e-3], "reason": "timed"}) == "verified"
    served = as_["reader"].get(honest.key)
    assert [r.trace_id for r in served] == [honest.trace_id, fair.trace_id]
    assert served[1].served.verified_by == "w2/v" and served[1].served.verified_secs == pytest.approx(2.4e-3)
    refused = as_["reader"].quarantined()
    assert len(refused) == 1 and refused[0]["by"] == "alice" and "re-measured 90 µs" in refused[0]["reason"]


def test_a_pusher_cannot_overwrite_evict_or_quarantine_anothers_records(as_: dict[str, RegistryClient]) -> None:
    mine = make_record(2, 2e-3, provenance={"host_cpu": "alice-box"})
    as_["alice"].put(mine)
    stolen = Record.from_obj(mine.to_dict() | {"run_secs": [1e-9], "provenance": {"host_cpu": "bob-box"}})
    as_["bob"].put(stolen)  # same trace, lower claim, new provenance
    (entry,) = as_["reader"].get(mine.key)
    assert entry.served.pushed_by == "alice" and entry.run_secs == mine.run_secs and entry.provenance["host_cpu"] == "alice-box"
    for variant in range(1, 9):  # bob floods the key with faster claims
        as_["bob"].put(make_record(2, 1e-6 * variant, variant=variant))
    served = as_["reader"].get(mine.key)
    assert mine.trace_id in {r.trace_id for r in served}
    assert sum(r.served.pushed_by == "bob" for r in served) == 2  # a pusher's share of unverified claims
    with pytest.raises(Forbidden):
        as_["bob"].quarantine(mine.key, mine.trace_id, "I say so")
    status = as_["bob"].complain(mine.key, mine.trace_id, "fails here")
    assert status is not None and status["complaints"] == 1
    assert mine.trace_id in {r.trace_id for r in as_["reader"].get(mine.key)}  # a complaint is not a verdict
    assert as_["root"].quarantine(mine.key, mine.trace_id, "confirmed by hand")
    assert mine.trace_id not in {r.trace_id for r in as_["reader"].get(mine.key)}


def test_a_stored_record_that_a_newer_check_refuses_costs_readers_only_itself_and_a_complaint_takes_it_out(
        tmp_path: Path, as_: dict[str, RegistryClient]) -> None:  # fmt: skip
    """A record stored before one of today's checks existed (here: an object graph TVM would load unchecked) is left
    out of every read, named to the reader, and costs no other record of its answer; its first complaint takes it
    out of service on the registry's own check, as no complainer's word could."""
    good, doomed, other, lone = make_record(1, 1e-3), make_record(1, 2e-3, variant=1), make_record(2, 1e-3), make_record(3, 1e-3)
    as_["w1"].put_many([good, doomed, other, lone])
    for record in (doomed, lone):
        store_unchecked(tmp_path / "trust", record)
    keys = [good.key, other.key, lone.key]
    with LocalRegistry(tmp_path / "trust", sync=False) as local:  # the embedded registry reads the same store
        for reader in (as_["reader"], local):
            refused: list[RefusedRecord] = []
            found = reader.lookup(keys, refused=refused)
            assert {k: [r.trace_id for r in v] for k, v in found.items()} == {good.key: [good.trace_id], other.key: [other.trace_id]}
            assert {(r.key, r.trace_id) for r in refused} == {(doomed.key, doomed.trace_id), (lone.key, lone.trace_id)}
            assert all("object graph" in r.reason for r in refused)
            listed = {s.key: [r.trace_id for r in v] for s, v in reader.iter_served(refused=refused)}
            assert listed[good.key] == [good.trace_id] and listed[other.key] == [other.trace_id] and len(refused) == 4
            with_candidates, _ = reader.lookup_with_candidates([good.identity, lone.identity], refused=refused)
            assert list(with_candidates) == [good.key] and len(refused) == 6  # the lone key reads as a miss
    status = as_["alice"].complain(lone.key, lone.trace_id, "left out: an object graph")
    assert status is not None and status["quarantined"] and "verify_job" not in status
    assert as_["reader"].lookup(keys, refused=(after := [])).keys() == {good.key, other.key}
    assert [r.trace_id for r in after] == [doomed.trace_id]  # the lone one is out of service; the other awaits its complaint
    (item,) = as_["root"].quarantined()
    assert item["trace_id"] == lone.trace_id and item["reason"].startswith("fails the registry's checks")
    assert "verify_job" in as_["alice"].complain(other.key, other.trace_id, "slow")  # a record that passes is verified, not judged


def test_roles_bound_each_call(as_: dict[str, RegistryClient], srv: ServerThread) -> None:
    rec = make_record(3, 1e-3)
    with pytest.raises(Forbidden):
        as_["reader"].put(rec)
    as_["reader"].report_misses([rec.identity])  # compiling clients report misses with read tokens
    for who in ("reader", "alice"):
        with pytest.raises(Forbidden):
            as_[who].lease("x", lease_secs=10)
    with pytest.raises(Forbidden):
        as_["w1"].requeue(rec.key)
    with RegistryClient(srv.url, token="", timeout=5) as anon:
        assert anon.get(rec.key) == []  # reads stay open
        with pytest.raises(Exception, match="Bearer"):
            anon.report_misses([rec.identity])


def test_a_token_deleted_from_the_token_file_is_refused_without_a_restart(tmp_path: Path) -> None:
    """Revoking a token is deleting its line: the server reads the file again when it changes. An edit that does not parse
    leaves the tokens in force; a file left without tokens accepts none, and never opens the registry to anyone."""
    from schedhub.registry import TokenFile, Unauthorized

    path = tmp_path / "tokens"
    path.write_text("alice alice-tok push\nroot admin-tok admin\n")
    with ServerThread(tmp_path / "reg", tokens=TokenFile(path, env={}, check_secs=0), sync=False) as srv, \
            clients_by_name(srv.url, {"alice-tok": Principal("alice"), "bob-tok": Principal("bob"), "": Principal("anonymous")}) as as_:  # fmt: skip
        assert as_["alice"].put(make_record(1, 1e-3)).kept
        path.write_text("bob bob-tok push\nroot admin-tok admin\n")
        with pytest.raises(Unauthorized, match="not accepted"):
            as_["alice"].put(make_record(2, 1e-3))
        assert as_["bob"].put(make_record(3, 1e-3)).kept
        path.write_text("bob bob-tok push\nthis line has four words\n")  # does not parse: the tokens before stay
        assert as_["bob"].put(make_record(4, 1e-3)).kept
        path.write_text("# everyone revoked\n")
        for who in ("bob", "anonymous"):
            with pytest.raises(Unauthorized):
                as_[who].put(make_record(5, 1e-3))
        assert as_["anonymous"].get(make_record(3, 1e-3).key)  # reads stay open


def test_an_admin_forgets_what_a_revoked_caller_left_behind_and_nothing_of_anyone_elses(as_: dict[str, RegistryClient], tmp_path: Path) -> None:
    """After revoking a token, its claims, the jobs it asked for, its measurement log and its ended work can be taken out;
    its verified records only when asked; another caller's records, jobs and logs stay as they were, and a miss another
    caller reported too passes to them."""
    from schedhub.registry import Trial, TrialLog
    from schedhub.registry._history import kept_bytes
    from schedhub.registry._trials import claimed_row
    from schedhub.registry._counts import read_count
    from schedhub.registry._queue import turn_row

    shared, own, bad = make_record(1, 1e-3), make_record(2, 1e-3), make_record(3, 1e-3)
    as_["w1"].put(shared)  # verified, w1's
    as_["alice"].put_many([make_record(1, 2e-3, variant=1), own, bad])  # three claims, one beside w1's record
    as_["alice"].report_misses([make_record(4, 1e-3).identity, make_record(5, 1e-3).identity])
    as_["alice"].push_trials(TrialLog(own.identity, [Trial(own.trace, 1e-3)]))
    as_["root"].quarantine(bad.key, bad.trace_id, "bad")  # out of service: alice's ended work
    as_["bob"].put(make_record(6, 1e-3))
    as_["bob"].report_misses([make_record(7, 1e-3).identity, make_record(4, 1e-3).identity])  # 4: alice's, bob's too
    as_["alice"].report_misses([make_record(7, 1e-3).identity])  # bob's, alice's too
    as_["bob"].push_trials(TrialLog(own.identity, [Trial(own.trace, 2e-3)]))
    as_["alice"].complain(shared.key, shared.trace_id, "did not replay here")  # a complaint: noted on w1's record, verification queued
    assert as_["bob"].get(shared.key)[0].served.complaints == 1
    before = {"jobs": as_["root"].jobs(), "bob": as_["bob"].get(make_record(6, 1e-3).key)}
    held = as_["w2"].lease("w2", max_jobs=10, lease_secs=60, tasks=("tune",))
    assert {lease.job["requester"] for lease in held} == {"alice", "bob"}

    with pytest.raises(Forbidden):
        as_["w1"].forget("alice")
    gone = as_["root"].forget("alice")
    assert gone == {"records": 2, "complaints": 1, "jobs": 5, "jobs_handed_over": 1, "trial_logs": 1, "kept": 1}  # 2 claims in service;
    #   3 claims and 1 complaint verifying, 1 miss taken out, 1 handed over
    assert [(r.served.pushed_by, r.served.complaints) for r in as_["root"].get(shared.key)] == [("w1", 0)] and as_["root"].get(own.key) == []
    jobs = {j["key"]: j for j in as_["root"].jobs()}
    assert set(jobs) == {j["key"] for j in before["jobs"] if j["requester"] != "alice"} | {make_record(4, 1e-3).key}
    assert [(jobs[make_record(w, 1e-3).key]["requester"], jobs[make_record(w, 1e-3).key]["callers"]) for w in (4, 7)] == [("bob", 1), ("bob", 1)]
    assert as_["root"].get(make_record(6, 1e-3).key) == before["bob"]
    assert [log.pushed_by for log in as_["root"].trial_logs()[0]] == ["bob"]
    assert as_["root"].quarantined() == []
    with LocalRegistry(tmp_path / "trust", sync=False) as reg, reg.store.read() as txn:
        assert reg.queue.awaiting("alice") == reg.queue.awaiting("alice", "tune") == 0 < reg.queue.awaiting("bob")
        assert read_count(txn, reg.store.dbs["meta"], claimed_row(b"alice")) == kept_bytes(txn, reg.store.dbs, "alice") == 0
        assert read_count(txn, reg.store.dbs["meta"], turn_row("alice")) == 0 < read_count(txn, reg.store.dbs["meta"], turn_row("bob"))
    for lease in held:  # a worker tuning one of alice's misses is told to drop it, as if its lease were lost
        if lease.job["requester"] == "alice" and lease.key != make_record(4, 1e-3).key:
            with pytest.raises(LeaseLost, match="gone"):
                as_["w2"].renew(lease.key, lease.lease_id, 60)
        else:
            as_["w2"].ack(lease.key, lease.lease_id)
    assert as_["root"].forget("w1") == dict.fromkeys(("records", "complaints", "jobs", "jobs_handed_over", "trial_logs", "kept"), 0)  # a verified record stays unless asked
    assert as_["root"].forget("w1", verified=True)["records"] == 1 and as_["root"].get(shared.key) == []


def test_a_pusher_owns_a_bounded_number_of_bytes_of_records_in_service(tmp_path: Path) -> None:
    """Claims that verify stay in service, so a push token could fill the store at the workers' pace (a workload may hold
    512 KiB): a pusher's records in service are bounded in bytes; a push past it stores nothing; a record that leaves
    service frees its room; a worker's pushes are not bounded."""
    one = len(make_record(1, 1e-3).to_bytes())
    with ServerThread(tmp_path / "reg", tokens=ROLES, sync=False, bounds=CallerBounds(records_bytes=3 * one + one // 2)) as srv, \
            clients_by_name(srv.url, ROLES) as as_:  # fmt: skip
        as_["alice"].put_many([make_record(w, 1e-3) for w in (1, 2)])
        with pytest.raises(TooManyRequests, match="bytes of records in service"):
            as_["alice"].put_many([make_record(w, 1e-3) for w in (3, 4)])  # one would fit, two do not: neither is stored
        assert as_["alice"].get(make_record(3, 1e-3).key) == []
        as_["alice"].put(make_record(3, 1e-3))
        with pytest.raises(TooManyRequests):
            as_["alice"].put(make_record(4, 1e-3))
        assert as_["alice"].put(make_record(3, 1e-3)).kept  # the same record again adds nothing: taken
        as_["root"].quarantine(make_record(1, 1e-3).key, make_record(1, 1e-3).trace_id, "bad")
        assert as_["alice"].put(make_record(4, 1e-3)).kept
        as_["w1"].put_many([make_record(w, 1e-3) for w in range(10, 20)])
        assert len(as_["bob"].lookup([make_record(w, 1e-3).key for w in range(10, 20)])) == 10


def test_what_each_caller_holds_is_listed_by_name_a_page_at_a_time(as_: dict[str, RegistryClient], srv: ServerThread) -> None:
    """The counts each caller's bounds are checked against, for an operator looking for who fills the registry."""
    from schedhub.registry import Trial, TrialLog

    claims = [make_record(w, 1e-3) for w in (1, 2)]
    as_["alice"].put_many(claims)
    as_["root"].quarantine(claims[0].key, claims[0].trace_id, "bad")
    as_["reader"].report_misses([make_record(w, 1e-3).identity for w in (3, 4, 5)])
    as_["bob"].push_trials(TrialLog(claims[1].identity, [Trial(claims[1].trace, 1e-3)]))
    as_["w1"].put(make_record(6, 1e-3))
    first, more = as_["reader"].callers(limit=2)
    assert [c["name"] for c in first] == ["alice", "bob"] and more
    rest, more = as_["reader"].callers(after="bob", limit=2)
    assert [c["name"] for c in rest] == ["reader", "w1"] and not more
    alice, bob, reader, w1 = *first, *rest
    assert alice["records_bytes"] == len(claims[1].to_bytes()) and alice["claims_awaiting"] == 2 and alice["kept_bytes"] > 0
    assert reader["misses_awaiting"] == 3 and bob["claimed_log_bytes"] > 0 and w1["records_bytes"] == len(make_record(6, 1e-3).to_bytes())
    assert alice["misses_awaiting"] == bob["records_bytes"] == w1["claimed_log_bytes"] == 0
    assert httpx.get(f"{srv.url}/v1/callers").json()["bounds"]["records_bytes"] == CallerBounds().records_bytes
    assert httpx.get(f"{srv.url}/v1/callers", params={"after": "x" * 129}).status_code == 400


def test_reported_misses_are_rate_limited_per_caller(as_: dict[str, RegistryClient]) -> None:
    """Each reported miss adds demand (the queue hands out the most demanded first) and a new one a job holding its
    workload, so one token holder reporting without end would decide what the workers tune and fill the store."""
    misses = [make_record(100 + i, 1e-3).identity for i in range(6)]
    as_["reader"].report_misses(misses)
    with pytest.raises(TooManyRequests, match="over 8 reported misses a minute"):
        as_["reader"].report_misses(misses[:3])  # 9 > 8: nothing of it is queued
    as_["reader"].report_misses(misses[:2])  # 8: within
    assert [r["demand"] for r in as_["alice"].report_misses(misses[:1])] == [3]  # per caller
    assert sum(job["demand"] for job in as_["root"].jobs()) == 6 + 2 + 1


def test_a_miss_two_callers_wait_for_is_tuned_before_one_that_one_caller_reports_again_and_again(as_: dict[str, RegistryClient]) -> None:
    """Demand is one caller's to raise (within its rate limit): within a turn the queue hands out what the most callers asked
    for first, then the most demanded, so one token cannot put its own misses ahead of what its colleagues wait for."""
    pushed, shared, plain = (make_record(300 + i, 1e-3).identity for i in range(3))
    as_["reader"].report_misses([pushed] * 6 + [plain])  # the reader's turns 1 and 2
    assert [r["callers"] for r in as_["alice"].report_misses([shared, plain])] == [1, 2]  # alice's 1 and 2
    assert [r["callers"] for r in as_["bob"].report_misses([shared, shared])] == [2, 2]  # a caller counts once
    jobs = {job["key"]: job for job in as_["root"].jobs("pending")}
    assert [(jobs[m.key]["callers"], jobs[m.key]["demand"]) for m in (pushed, shared, plain)] == [(1, 6), (2, 3), (2, 2)]
    assert "asked_by" not in jobs[shared.key] and "turn" in jobs[shared.key]  # who asked is counted, not listed
    leased = [lease.key for lease in as_["w1"].lease("t", max_jobs=3, lease_secs=60, tasks=("tune",))]
    assert leased == [shared.key, pushed.key, plain.key]  # the first turn: most callers, then most demand; then the second


def test_tokens_that_ask_for_the_same_misses_take_their_own_turns_not_everyones(as_: dict[str, RegistryClient]) -> None:
    """A kernel several callers want comes up at the first turn any of them spent on it, but asking together buys no more:
    two tokens reporting the same backlog hold another caller's misses back by one job each, as one token would."""
    backlog, own = [make_record(500 + i, 1e-3).identity for i in range(5)], [make_record(520 + i, 1e-3).identity for i in range(2)]
    as_["alice"].report_misses(backlog)
    as_["bob"].report_misses(backlog)
    as_["reader"].report_misses(own)
    leased = [lease.key for lease in as_["w1"].lease("t", max_jobs=7, lease_secs=60, tasks=("tune",))]
    assert leased == [backlog[0].key, own[0].key, backlog[1].key, own[1].key, *(m.key for m in backlog[2:])]


def test_pending_jobs_are_listed_in_the_order_workers_get_them_a_page_at_a_time(srv: ServerThread, as_: dict[str, RegistryClient]) -> None:
    """What a caller sees of when its misses come up: verifications first, then the callers' turns, as the leases go."""
    ci, dev, claim = [make_record(400 + i, 1e-3).identity for i in range(4)], [make_record(410 + i, 1e-3).identity for i in range(2)], make_record(420, 1e-3)
    as_["reader"].report_misses(ci)
    as_["alice"].report_misses(dev)
    as_["bob"].put(claim)  # a claim: its verification goes first
    expected = [verify_job_id(claim.key, claim.trace_id), ci[0].key, dev[0].key, ci[1].key, dev[1].key, ci[2].key, ci[3].key]
    assert [job["key"] for job in as_["root"].jobs_in_lease_order()] == expected
    paged, after = [], ""
    while True:
        page = httpx.get(f"{srv.url}/v1/queue", params={"order": "lease", "limit": 2, **({"after": after} if after else {})}).json()
        paged += [job["key"] for job in page["jobs"]]
        if not (after := page["next"]):
            break
    assert paged == expected
    for bad in ({"order": "lease", "after": "zz"}, {"order": "lease", "after": "56" + "00" * 16 + "zz" * 32}, {"order": "fastest"},
                {"order": "lease", "state": "dead"}):  # fmt: skip
        assert httpx.get(f"{srv.url}/v1/queue", params=bad).status_code == 400, bad
    leased = as_["w1"].lease("t", max_jobs=10, lease_secs=60, tasks=("verify", "tune"))
    assert [lease.key for lease in leased] == expected


def test_complaints_are_rate_limited(as_: dict[str, RegistryClient]) -> None:
    rec = make_record(4, 1e-3)
    as_["w1"].put(rec)
    for _ in range(5):
        as_["reader"].complain(rec.key, rec.trace_id, "again")
    with pytest.raises(TooManyRequests):
        as_["reader"].complain(rec.key, rec.trace_id, "and again")
    assert as_["alice"].complain(rec.key, rec.trace_id, "mine") is not None  # per caller
    (entry,) = as_["reader"].get(rec.key)
    assert entry.served.complaints == 2  # one per complainant


def test_a_pusher_holds_a_bounded_number_of_claims_awaiting_verification(tmp_path: Path) -> None:
    """Every claim queues a verification that a worker leases before any tuning: without a bound one push token
    could queue claims by the thousand and hold every worker. Past it a push answers 429 and stores nothing of
    itself; a verdict makes room again; a worker's pushes (verified) and another pusher's claims are not held back."""
    with ServerThread(tmp_path / "bounded", tokens=ROLES, sync=False, bounds=CallerBounds(claims_awaiting=3)) as s, clients_by_name(s.url, ROLES) as as_:
        first = [make_record(200 + i, 1e-3) for i in range(2)]
        as_["alice"].put_many(first)
        more = [make_record(210 + i, 1e-3) for i in range(2)]
        with pytest.raises(TooManyRequests, match="would give 'alice' more than 3 records awaiting verification") as raised:
            as_["alice"].put_many(more)  # the second would be the fourth: neither is stored
        assert raised.value.stored == 0 and as_["reader"].lookup([r.key for r in more]) == {}
        assert as_["alice"].put(more[0]).needs_verification  # the third
        assert as_["alice"].put_many(first)[0].kept  # a claim already held is no new one
        with pytest.raises(TooManyRequests):
            as_["alice"].put(more[1])
        as_["bob"].put(make_record(220, 1e-3))  # per pusher
        assert all(r.verified for r in as_["w1"].put_many([make_record(230 + i, 1e-3) for i in range(5)]))  # verified: nothing to queue
        jobs = [j for j in as_["root"].jobs("pending") if j["task"] == "verify"]
        assert sorted(j["requester"] for j in jobs) == ["alice", "alice", "alice", "bob"]
        lease = next(l for l in as_["w2"].lease("v", max_jobs=5, lease_secs=60, tasks=("verify",)) if l.job["requester"] == "alice")
        as_["w2"].ack(lease.key, lease.lease_id, {"run_secs": [1e-3], "reason": ""})
        assert as_["alice"].put(more[1]).needs_verification  # a verdict made room for one


def test_a_caller_holds_a_bounded_number_of_misses_awaiting_tuning_and_of_complaints_awaiting_verification(tmp_path: Path) -> None:
    """A reported miss stores a job holding its workload (up to 512 KiB) and costs a worker a search; a complaint costs one a
    verification. The rate limits bound how fast one caller asks; these bound how much work it may have waiting."""
    with ServerThread(tmp_path / "bounded", tokens=ROLES, sync=False, bounds=CallerBounds(misses_awaiting=3, claims_awaiting=2)) as s, clients_by_name(s.url, ROLES) as as_:
        misses = [make_record(600 + i, 1e-3).identity for i in range(5)]
        as_["reader"].report_misses(misses[:3])
        with pytest.raises(TooManyRequests, match="'reader' has 3 reported misses awaiting tuning"):
            as_["reader"].report_misses(misses[3:4])
        assert as_["reader"].report_misses(misses[:1])[0]["demand"] == 2  # demand for a job already queued is no new job
        as_["alice"].report_misses(misses[3:4])  # per caller
        (lease,) = as_["w1"].lease("t", max_jobs=1, lease_secs=60, tasks=("tune",))
        assert lease.key == misses[0].key  # the most demanded
        as_["w1"].put(make_record(600, 1e-3))
        as_["w1"].ack(lease.key, lease.lease_id)
        as_["reader"].report_misses(misses[4:])  # tuned: room for one
        assert {j["key"] for j in as_["root"].jobs("pending")} == {m.key for m in misses[1:]}

        records = [make_record(700 + i, 1e-3) for i in range(4)]
        as_["w1"].put_many(records)
        for rec in records[:2]:
            as_["reader"].complain(rec.key, rec.trace_id, "fails here")
        with pytest.raises(TooManyRequests, match="would give 'reader' more than 2 records awaiting verification"):
            as_["reader"].complain(records[2].key, records[2].trace_id, "fails here")
        (entry,) = as_["reader"].get(records[2].key)
        assert entry.served.complaints == 0  # nothing of it noted
        as_["alice"].complain(records[2].key, records[2].trace_id, "fails here")  # per caller
        as_["reader"].complain(records[2].key, records[2].trace_id, "me too")  # its verification is queued already: no new job
        assert as_["root"].job(verify_job_id(records[2].key, records[2].trace_id))["demand"] == 2


def test_verifications_are_leased_by_requester_in_turn_and_do_not_hold_tuning_back_for_ever(local: LocalRegistry) -> None:
    """One pusher's backlog of claims goes in turn with another's (everyone's first, then everyone's second), and
    after a streak of verifications a pending tune job goes first."""
    from schedhub.registry import VERIFY_STREAK

    flood = [make_record(300 + i, 1e-3) for i in range(VERIFY_STREAK + 4)]
    local.put_many(flood, "mallory", verified=False)
    late = make_record(400, 1e-3)
    local.put_many([late], "alice", verified=False)
    local.report_misses([make_record(500, 1e-3).identity])
    assert local.queue.awaiting("mallory") == len(flood) and local.queue.awaiting("alice") == 1
    order = []
    while leases := local.lease("w", max_jobs=1, lease_secs=60, tasks=("tune", "verify")):
        job = leases[0].job
        order.append(job.get("record_key", job["key"]))
    assert order[:2] == [flood[0].key, late.key]  # alice's first claim before mallory's second
    assert order[VERIFY_STREAK] == make_record(500, 1e-3).key  # the tune job's turn: after VERIFY_STREAK verifications
    assert order[VERIFY_STREAK + 1 :] == [r.key for r in flood[VERIFY_STREAK - 1 :]]
    assert local.queue.awaiting("mallory") == len(flood)  # leased still awaits its verdict


# -- 4. queue state -------------------------------------------------------------------------------


def test_leases_belong_to_their_holder_and_are_never_listed(as_: dict[str, RegistryClient], srv: ServerThread) -> None:
    miss = make_record(5, 1e-3).identity
    as_["reader"].report_misses([miss])
    lease = as_["w1"].lease("a", lease_secs=60)[0]
    listing = httpx.get(f"{srv.url}/v1/queue").text + httpx.get(f"{srv.url}/v1/queue/{miss.key}").text
    assert lease.lease_id not in listing and "lease_id" not in listing
    with pytest.raises(LeaseLost):
        as_["w2"].renew(lease.key, lease.lease_id, 60)
    with pytest.raises(LeaseLost):
        as_["w2"].ack(lease.key, lease.lease_id)
    as_["w1"].ack(lease.key, lease.lease_id)


@pytest.mark.parametrize("secs", ["1e15", "NaN", "Infinity", "-Infinity", "1e300", "0", "-1"])
def test_renew_and_lease_times_are_bounded(as_: dict[str, RegistryClient], srv: ServerThread, secs: str) -> None:
    as_["reader"].report_misses([make_record(6, 1e-3).identity])
    lease = as_["w1"].lease("a", lease_secs=60)[0]
    headers = {"authorization": "Bearer w1-tok", "content-type": "application/json"}
    body = f'{{"lease_id": "{lease.lease_id}", "lease_secs": {secs}}}'
    assert httpx.post(f"{srv.url}/v1/queue/{lease.key}/renew", content=body, headers=headers).status_code == 400
    body = f'{{"worker": "x", "lease_secs": {secs}}}'
    assert httpx.post(f"{srv.url}/v1/queue/lease", content=body, headers=headers).status_code == 400


def test_an_expired_lease_reads_as_given_back_and_cannot_be_revived(as_: dict[str, RegistryClient]) -> None:
    as_["reader"].report_misses([make_record(7, 1e-3).identity])
    lease = as_["w1"].lease("a", lease_secs=0.3)[0]
    time.sleep(0.4)
    job = as_["reader"].jobs()[0]
    assert job["state"] == "pending" and "expired" in job["last_error"]  # before anyone leases again
    with pytest.raises(LeaseLost):
        as_["w1"].renew(lease.key, lease.lease_id, 60)


def test_release_gives_a_job_back_without_spending_an_attempt(as_: dict[str, RegistryClient]) -> None:
    as_["reader"].report_misses([make_record(8, 1e-3).identity])
    lease = as_["w1"].lease("a", lease_secs=60)[0]
    as_["w1"].release(lease.key, lease.lease_id, "SIGTERM")
    job = as_["reader"].job(lease.key)
    assert job["state"] == "pending" and job["attempts"] == 0 and "SIGTERM" in job["last_error"]


def test_a_jobs_args_info_comes_from_its_workload_not_from_a_report(as_: dict[str, RegistryClient]) -> None:
    honest = make_record(9, 1e-3).identity
    lying = honest.to_dict() | {"args_info": [["TENSOR", "float32", [1, 1]]]}
    with pytest.raises(InvalidRecord, match="args_info"):
        as_["reader"]._call("POST", "/v1/misses", {"misses": [lying]})
    as_["reader"].report_misses([honest])
    assert as_["reader"].job(honest.key)["args_info"] == [["TENSOR", "float32", [9, 64]]]


# -- 5. no 5xx on hostile input -------------------------------------------------------------------


def _identity_body(op: str = "fused_op", kind: str = "llvm") -> dict:
    target = canonical_target({"kind": kind})
    text = "@T.prim_func\ndef main(arg0: T.Buffer((4, 64), 'float32')): pass\n"
    return {"key": record_key(FINGERPRINT, target, text), "schema": SCHEMA_VERSION, "fingerprint": FINGERPRINT, "target": target,
            "workload": text, "op": op, "args_info": [["TENSOR", "float32", [4, 64]]]}  # fmt: skip


def _hostile_requests() -> list[tuple[str, str, bytes, str]]:
    rec = make_record(10, 1e-3).to_dict()
    deep_json = b"[" * 100_000 + b"]" * 100_000
    deep_msgpack = b"\x91" * 100_000 + b"\x00"
    cases = []
    for method, path in (("PUT", f"/v1/records/{rec['key']}"), ("POST", "/v1/records"), ("POST", "/v1/lookup"), ("POST", "/v1/misses"),
                         ("POST", "/v1/queue/lease"), ("POST", f"/v1/queue/{rec['key']}/renew"), ("POST", f"/v1/records/{rec['key']}/complaints"), ("POST", "/v1/trials")):  # fmt: skip
        cases += [(method, path, deep_json, "application/json"), (method, path, deep_msgpack, "application/msgpack")]
    huge = 2**64
    for body in (
        {"records": [rec | {"args_info": [["TENSOR", "float32", [huge, 64]]]}]},
        {"records": [rec | {"provenance": {"trials": huge}}]},
        {"records": [rec | {"provenance": {"x": -huge * huge}}]},
        {"misses": [_identity_body(op="é" * 600)]},
        {"misses": [_identity_body(op="fused\x00op")]},
        {"misses": [_identity_body(kind="k" * 600)]},
        {"misses": [_identity_body() | {"key": _identity_body()["key"] + "\n"}]},
        {"records": [rec | {"run_secs": [1e308, 1e308]}]},
        {"keys": [rec["key"]], "top": huge},
        {"identity": _identity_body(), "trials": [{"trace": rec["trace"], "secs": huge}]},
        {"identity": _identity_body(), "trials": [{"trace": rec["trace"], "secs": 1e-3}] * 10_000},
        {"identity": _identity_body() | {"key": "0" * 64}, "trials": [{"trace": rec["trace"], "secs": 1e-3}]},
        {"identity": _identity_body(), "trials": {"trace": rec["trace"]}},
    ):
        path = "/v1/lookup" if "keys" in body else "/v1/records" if "records" in body else "/v1/trials" if "trials" in body else "/v1/misses"
        cases.append(("POST", path, json.dumps(body).encode(), "application/json"))
    for query in ("since=-2", f"since={huge}", "limit=0", "limit=abc", f"limit={huge}", "op=" + "é" * 600, "op=a%00b", "target=" + "x" * 9000):
        cases.append(("GET", f"/v1/records?{query}", b"", ""))
    cases += [("GET", f"/v1/records/{rec['key']}%0A", b"", ""), ("GET", "/v1/queue?state=bogus", b"", ""), ("GET", "/v1/queue?after=zz", b"", "")]
    cases += [("GET", f"/v1/trials?{q}", b"", "") for q in ("cursor=zz", "cursor=" + "ab" * 600, "limit=0", f"limit={huge}", "verified=yes")]
    return cases


def test_hostile_inputs_answer_4xx_never_5xx(srv: ServerThread, as_: dict[str, RegistryClient]) -> None:
    statuses = []
    with httpx.Client(base_url=srv.url, headers={"authorization": "Bearer admin-tok"}, timeout=10) as http:
        for method, path, body, ctype in _hostile_requests():
            r = http.request(method, path, content=body, headers={"content-type": ctype} if ctype else None)
            statuses.append((r.status_code, method, path[:40]))
            assert 400 <= r.status_code < 500, (r.status_code, method, path[:60], r.text[:200])
        assert http.get("/healthz").json()["ok"]
    stats = as_["reader"].stats()
    assert stats["keys"] == 0 and stats["trial_logs"] == 0  # none of it was stored


def test_claims_never_take_a_verified_transfer_from_a_default_trust_client(as_: dict[str, RegistryClient]) -> None:
    """One push token's claims, on the missed key itself and at the four nearest shapes, left a verified transfer out
    of the answer (the hook then dropped the claims: a plain miss). Candidates are chosen by the caller's trust."""
    from .test_transfer import record as shaped  # same structure at another number of rows

    wanted, verified = shaped(32), shaped(256)
    as_["w1"].put(verified)  # a worker's: verified
    as_["alice"].put_many([shaped(32, secs=1e-9), *(shaped(rows) for rows in (30, 31, 33, 34))])  # claims: the key itself and nearer shapes
    for trust in ("verified", ["bob"]):
        found, near = as_["reader"].lookup_with_candidates([wanted.identity], per_key=4, trust=trust)
        assert [r.served.pushed_by for r in found[wanted.key]] == ["alice"]  # the claim is answered, as it is
        assert [(c.record.key, c.record.served.verified) for c in near[wanted.key]] == [(verified.key, True)]
    found, near = as_["reader"].lookup_with_candidates([wanted.identity], per_key=4, trust="any")
    assert wanted.key in found and wanted.key not in near  # a caller that serves claims has its record
    found, near = as_["reader"].lookup_with_candidates([shaped(64).identity], per_key=4, trust=["alice"])
    assert [c.record.identity.args_info[0][2][0] for c in near[shaped(64).key]] == [34, 33, 32, 31]  # alice's claims serve alice's readers


def test_a_lookup_states_a_trust_the_server_understands(srv: ServerThread) -> None:
    for trust in ("everyone", ["x"] * 65, [""], [1], {"a": 1}):
        answer = httpx.post(f"{srv.url}/v1/lookup", json={"keys": [], "trust": trust})
        assert answer.status_code == 400 and "'trust' must be" in answer.json()["message"]


def test_untrusted_callers_cannot_fill_the_store_whatever_their_number(tmp_path: Path) -> None:
    """Each caller's bounds hold, but 20 tokens' worth of them filled a 64 GiB map. Past its share of the map (here 50%
    of 4 MiB) no untrusted caller adds anything, and a worker's verified records still go in."""
    from .test_transfer import record as shaped

    roles = {"a-tok": Principal("a"), "b-tok": Principal("b"), "w-tok": Principal("w", "worker")}
    with (LocalRegistry(tmp_path / "small", map_size=4 << 20, sync=False),  # the first handle in a process sizes the map
          ServerThread(tmp_path / "small", tokens=roles, sync=False, bounds=CallerBounds(unverified_percent=50)) as s, clients_by_name(s.url, roles) as by):
        refused, n = None, 0
        while refused is None and n < 200:
            big = _big_record(10_000 + n, 0, 60_000)
            try:
                by["a" if n % 2 else "b"].put(big)  # two tokens, each well within its own bounds
            except TooManyRequests as exc:
                refused = exc
            n += 1
        assert refused is not None and "keeps the rest" in str(refused) and n > 10
        with pytest.raises(TooManyRequests, match="keeps the rest"):  # the other token alike
            by["a" if n % 2 else "b"].put(_big_record(10_000 + n, 0, 60_000))
        by["w"].put(shaped(8))  # the workers' share is left
        assert by["w"].get(shaped(8).key)


def test_the_untrusted_share_holds_under_concurrent_writers_and_lifts_when_their_data_goes(tmp_path: Path) -> None:
    """12 untrusted pushers at once took a 64 MiB map to 98.6% when the share was checked before the write transaction,
    and a worker's pushes then got 507; an admin who forgot every caller left the store reading 87% (its high-water mark)
    and every untrusted caller refused. The share is checked inside the write, each request's own bytes counted, on the
    data the store holds."""
    names = [f"u{i}" for i in range(12)]
    roles = {f"{n}-tok": Principal(n) for n in names} | {"w-tok": Principal("w", "worker"), "adm-tok": Principal("root", "admin")}
    with (LocalRegistry(tmp_path / "small", map_size=8 << 20, sync=False) as local,
          ServerThread(tmp_path / "small", tokens=roles, sync=False, bounds=CallerBounds(unverified_percent=50, claims_awaiting=1000)) as s,
          clients_by_name(s.url, roles) as by):  # fmt: skip
        refused = []

        def push(i: int) -> None:
            for n in range(30):
                try:
                    by[names[i]].put(_big_record(20_000 + 100 * i + n, 0, 60_000))
                except TooManyRequests:
                    refused.append(i)
                    return

        with ThreadPoolExecutor(12) as pool:
            list(pool.map(push, range(12)))
        assert refused and local.store.held() <= 0.5 + 0.02, local.store.held()
        for n in range(8):  # the workers' share is left, whole
            by["w"].put(_big_record(30_000 + n, 0, 60_000))
        with pytest.raises(TooManyRequests, match="keeps the rest"):
            by["u0"].put(_big_record(40_000, 0, 60_000))
        for name in names:
            by["root"].forget(name)
        assert local.store.held() < 0.4 and local.store.filled() > 0.5  # the file keeps its size; the data is gone
        by["u0"].put(_big_record(40_001, 0, 60_000))  # the share lifted


# -- 3. one request cannot stall the others -------------------------------------------------------


def test_lookup_collapses_duplicate_keys(as_: dict[str, RegistryClient]) -> None:
    rec = make_record(11, 1e-3)
    as_["w1"].put(rec)
    answer = as_["reader"]._call("POST", "/v1/lookup", {"keys": [rec.key] * 4096})
    assert list(answer["records"]) == [rec.key] and answer["missing"] == []


def _big_record(workload: int, variant: int, size: int) -> Record:
    rec = make_record(workload, 1e-3 * (variant + 1), variant=variant)
    text = rec.identity.workload + "#" * size + "\n"
    return Record.from_obj(rec.to_dict() | {"workload": text, "key": record_key(FINGERPRINT, rec.identity.target, text)})


def test_a_large_lookup_is_paged_and_does_not_stall_other_requests(srv: ServerThread, as_: dict[str, RegistryClient]) -> None:
    records = [_big_record(w, v, 480_000) for w in range(10) for v in range(8)]  # ~38 MB of records in one answer
    for w in range(10):
        as_["w1"].put_many(records[w * 8 : (w + 1) * 8])
    keys = list(dict.fromkeys(r.key for r in records))
    first = as_["reader"]._call("POST", "/v1/lookup", {"keys": keys})
    assert first["truncated"] and len(first["records"]) + len(first["truncated"]) == 10  # over 32 MiB: the rest to ask again
    found: list[dict] = []
    with ThreadPoolExecutor(3) as pool:  # heavy lookups side by side, answered in full by paging
        worst = _worst_healthz_during(srv, lambda: found.extend(pool.map(lambda _: as_["reader"].lookup(keys), range(3))))
    assert len(found) == 3 and all(len(f) == 10 and all(len(v) == 8 for v in f.values()) for f in found)
    assert worst < 1.0, f"/healthz waited {worst:.2f} s behind the lookups"  # the review saw 9 s


def _worst_healthz_during(srv: ServerThread, work: Callable[[], object]) -> float:
    """The longest /healthz took while ``work`` ran beside it."""
    stop, worst = threading.Event(), [0.0]

    def probe() -> None:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            while not stop.is_set():
                start = time.perf_counter()
                http.get("/healthz")
                worst[0] = max(worst[0], time.perf_counter() - start)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        work()
    finally:
        stop.set()
        prober.join()
    return worst[0]


def _long_trace_record(workload: int, variant: int, instructions: int = 8000) -> Record:
    """A record of ~470 KB, most of it its trace: JSON text that a JSON answer escapes quote by quote."""
    insts = [["GetSBlock", [], ["matmul", "main"], ["b0"]]] + [["Split", [f"l{i}", "None", 4 + variant], [], [f"l{i}a", f"l{i}b"]] for i in range(instructions)]
    return Record.from_obj(make_record(workload, 1e-3 * (variant + 1)).to_dict() | {"trace": json.dumps([insts, []])})


@pytest.mark.slow  # ~13 s; on this machine kind 79b1ba9 kept /healthz under 0.5 s too (0.23-0.33 s), so it does not tell them apart here
def test_json_lookups_of_large_distinct_keys_do_not_stall_other_requests(srv: ServerThread, as_: dict[str, RegistryClient]) -> None:
    """A JSON answer renders every record: encoded off the event loop once large (on it, /healthz waited 5.4 s)."""
    records = [_long_trace_record(w, v) for w in range(100, 116) for v in range(8)]
    for w in range(16):
        as_["w1"].put_many(records[w * 8 : (w + 1) * 8])
    keys = list(dict.fromkeys(r.key for r in records))
    groups = [keys[i:] + keys[:i] for i in range(0, 16, 4)]  # each from another key on: ~32 MiB of records an answer, the rest truncated

    def json_lookup(group: list[str]) -> bytes:  # parsed after the timing: the server shares this process's GIL
        return httpx.post(f"{srv.url}/v1/lookup", json={"keys": group}, timeout=60).content

    bodies: list[bytes] = []
    worst = _worst_healthz_during(srv, lambda: bodies.extend(ThreadPoolExecutor(4).map(json_lookup, groups)))
    answers = [json.loads(b) for b in bodies]
    assert all(a["records"] and a["truncated"] and len(a["records"]) + len(a["truncated"]) == 16 for a in answers)
    assert worst < 0.5, f"/healthz waited {worst:.2f} s behind 4 JSON lookups"


def test_many_small_lookups_answered_on_the_loop_agree_with_large_ones(as_: dict[str, RegistryClient]) -> None:
    """The read path answers small reads on the event loop and large ones in a thread: both give the same records."""
    small = [make_record(w, 1e-3) for w in range(200, 210)]
    large = [_big_record(w, v, 60_000) for w in range(210, 215) for v in range(8)]  # 5 keys x ~480 KB: past the loop's share
    as_["w1"].put_many(small)
    for w in range(5):
        as_["w1"].put_many(large[w * 8 : (w + 1) * 8])
    keys = [r.key for r in small] + list(dict.fromkeys(r.key for r in large))
    each = {k: v for key in keys for k, v in as_["reader"].lookup([key]).items()}
    whole = as_["reader"].lookup(keys)
    assert {k: [r.trace_id for r in v] for k, v in whole.items()} == {k: [r.trace_id for r in v] for k, v in each.items()}
    assert len(whole) == 15 and all(len(whole[r.key]) == 8 for r in large)


# -- 6. read timeouts ----------------------------------------------------------------------------


def _raw(srv: ServerThread, data: bytes) -> socket.socket:
    sock = socket.create_connection((srv.host, srv.port), timeout=10)
    sock.sendall(data)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
        return True, got
    except (TimeoutError, socket.timeout):
        return False, got
    except ConnectionResetError:
        return True, got


def test_a_body_shorter_than_its_length_is_cut_off(srv: ServerThread) -> None:
    head = "POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
    sock = _raw(srv, head + b'{"keys": [')
    start = time.monotonic()
    sock.settimeout(5)
    answer = sock.recv(4096)
    assert b" 408 " in answer.split(b"\r\n")[0] and time.monotonic() - start < 4
    sock.close()


def test_slowloris_connections_are_closed(srv: ServerThread) -> None:
    socks = [_raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(100)]
    time.sleep(1.5)
    closed = [_closed_within(s, 3.0)[0] for s in socks]
    for s in socks:
        s.close()
    assert all(closed), f"{closed.count(False)} of 100 half-sent requests still open"
    assert httpx.get(f"{srv.url}/healthz").json()["ok"]


def test_a_second_store_handle_in_one_process_shares_the_environment(tmp_path: Path) -> None:
    from schedhub.registry import LocalRegistry

    rec = make_record(12, 1e-3)
    with LocalRegistry(tmp_path) as first, LocalRegistry(tmp_path) as second:
        first.put(rec)
        assert [r.trace_id for r in second.get(rec.key)] == [rec.trace_id]
    with LocalRegistry(tmp_path) as again:  # both closed: the environment reopens
        assert again.exists(rec.key)


def test_a_token_file_is_read_line_by_line_and_a_bad_line_is_named(tmp_path: Path) -> None:
    from schedhub.registry._auth import MAX_NAME, load_tokens

    good = tmp_path / "tokens"
    good.write_text("# team registry\nalice a-tok\nw1 w-tok worker  # the GPU box\nbare-tok\n\n")
    tokens = load_tokens(good, env={"SCHEDHUB_TOKEN": " root-tok "})
    assert {t: (p.name, p.role) for t, p in tokens.items()} == {
        "root-tok": ("default", "admin"), "a-tok": ("alice", "push"), "w-tok": ("w1", "worker"), "bare-tok": ("token4", "push")}
    for line, why in ((f"{'n' * (MAX_NAME + 1)} tok", "name"), ("bob tok boss", "unknown role"), ("a b c d", "expected"),
                      ("ev\x1bil tok", "control characters")):  # fmt: skip
        bad = tmp_path / "bad"
        bad.write_text(f"alice a-tok\n{line}\n")
        with pytest.raises(RegistryError, match=rf"{bad}:2: .*{why}"):
            load_tokens(bad, env={})
