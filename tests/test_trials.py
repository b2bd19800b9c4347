"""The measurement log: every trial a tuner measured, bounded per key and pusher, paged, trust-marked.

Real LMDB stores and a real server with tokens of each role; the hostile bodies are in test_trust.py.
"""

from __future__ import annotations

import json
from itertools import islice
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedhub.registry import (
    CallerBounds, Forbidden, InvalidRecord, LocalRegistry, PayloadTooLarge, Principal, RegistryClient, ServerThread, Trial, TrialLog, packb, unpackb,
)  # fmt: skip
from schedhub.registry._trials import MAX_PUSHERS_PER_KEY, MAX_TRIALS_PER_ENTRY, MAX_TRIALS_PER_PUSH, iter_pages

from .conftest import TARGET, UNCHECKED_TRACE, clients_by_name, make_record, of_structure

TOKENS = {"alice-tok": Principal("alice"), "w1-tok": Principal("w1", "worker"), "reader-tok": Principal("reader", "read")}


def trace(variant: int) -> str:
    return json.dumps([[["GetSBlock", [], ["matmul", "main"], ["b0"]], ["Split", ["l1", "None", variant], [], ["l2", "l3"]]], []])


def log_of(workload: int, variants: range, secs: float = 1e-3) -> TrialLog:
    return TrialLog(make_record(workload, secs).identity, [Trial(trace(v), secs * (1 + v / 10)) for v in variants])


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path / "trials", tokens=TOKENS, sync=False) as s:
        yield s


@pytest.fixture
def as_(srv: ServerThread) -> Iterator[dict[str, RegistryClient]]:
    with clients_by_name(srv.url, TOKENS) as clients:
        yield clients


def test_a_push_reads_back_merged_by_trace_and_bounded_to_the_newest(local: LocalRegistry) -> None:
    assert local.push_trials(log_of(1, range(0, 40)), "w")["trials"] == 40
    again = TrialLog(log_of(1, range(0)).identity, [Trial(trace(5), 9.0), *log_of(1, range(40, 70)).trials])
    assert local.push_trials(again, "w")["trials"] == MAX_TRIALS_PER_ENTRY  # 40 + 31 new distinct, the oldest dropped
    (entry,) = local.iter_trial_logs()
    assert entry.identity == log_of(1, range(0)).identity and entry.pushed_by == "w" and entry.verified
    secs = {t.trace: t.secs for t in entry.trials}
    assert len(secs) == MAX_TRIALS_PER_ENTRY and secs[trace(5)] == 9.0  # pushed again: its newer time, kept as newest
    assert trace(69) in secs and trace(0) not in secs and trace(6) not in secs  # 0..6 were the oldest
    assert local.stats()["trial_logs"] == 1


def test_roles_and_trust_over_http(as_: dict[str, RegistryClient]) -> None:
    with pytest.raises(Forbidden):
        as_["reader"].push_trials(log_of(2, range(3)))
    as_["alice"].push_trials(log_of(2, range(3)))
    as_["w1"].push_trials(log_of(2, range(3, 8)))
    logs = {log.pushed_by: log for log in as_["reader"].iter_trial_logs()}  # reads are open to any token
    assert set(logs) == {"alice", "w1"} and not logs["alice"].verified and logs["w1"].verified
    assert [t.trace for t in logs["w1"].trials] == [trace(v) for v in range(3, 8)]
    assert [log.pushed_by for log in as_["reader"].iter_trial_logs(verified_only=True)] == ["w1"]


def test_a_stored_trial_that_a_newer_check_refuses_costs_readers_only_itself(tmp_path: Path, as_: dict[str, RegistryClient]) -> None:
    """A trial stored before one of today's checks existed is left out of its entry, an entry left with none is left
    out of its page, and the rest of the log is read as before: one bad trial once failed every page that held it."""
    for w in (1, 2, 3):
        as_["w1"].push_trials(log_of(w, range(3)))
    with LocalRegistry(tmp_path / "trials", sync=False) as local:
        with local.store.write() as txn:  # as a registry without the object-graph check kept them
            for raw_key, raw in list(txn.cursor(db=local.store.dbs["trials"])):
                entry = unpackb(raw)
                doomed = 1 if entry["identity"]["key"] == make_record(1, 1e-3).key else 3 if entry["identity"]["key"] == make_record(2, 1e-3).key else 0
                for trial in entry["trials"][:doomed]:
                    trial["trace"] = UNCHECKED_TRACE
                entry["checked"] = "an older version's checks"  # what it stamped: its checks were not today's
                txn.put(raw_key, packb(entry), db=local.store.dbs["trials"])
        for reader in (as_["reader"], local):
            logs = {log.key: [t.trace for t in log.trials] for log in reader.iter_trial_logs()}
            assert logs == {make_record(1, 1e-3).key: [trace(1), trace(2)], make_record(3, 1e-3).key: [trace(v) for v in range(3)]}


def test_paging_visits_every_entry_once(as_: dict[str, RegistryClient]) -> None:
    for w in range(7):
        as_["w1"].push_trials(log_of(100 + w, range(2)))
    first, cursor, more = as_["reader"].trial_logs(limit=3)
    assert len(first) == 3 and more and cursor
    keys = [log.key for log in as_["reader"].iter_trial_logs(page=2)]
    assert len(keys) == 7 and len(set(keys)) == 7 and keys[:3] == [log.key for log in first]
    with pytest.raises(InvalidRecord):
        as_["reader"].trial_logs(after="not hex")


def test_a_targets_logs_are_read_from_its_index_and_a_page_reads_a_bounded_number_of_entries(
        as_: dict[str, RegistryClient], srv: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from schedhub.registry import _trials

    other = TARGET.replace("znver5", "znver4")
    for w in range(12):
        identity = make_record(200 + w, 1e-3, target=other if w % 4 == 1 else TARGET).identity
        as_["alice" if w % 4 == 1 else "w1"].push_trials(TrialLog(identity, [Trial(trace(w), 1e-3)]))
    mine = {make_record(200 + w, 1e-3, target=other).key for w in (1, 5, 9)}
    assert {log.key for log in as_["reader"].iter_trial_logs(target=other, page=1)} == mine
    assert [log.key for log in as_["reader"].iter_trial_logs(target=other, verified_only=True)] == []  # alice's are claims
    assert len(list(as_["reader"].iter_trial_logs(target=TARGET))) == 9
    loaded = []
    real = _trials.unpackb
    monkeypatch.setattr(_trials, "unpackb", lambda raw: loaded.append(1) or real(raw))
    assert len(as_["reader"].trial_logs(target=other)[0]) == 3 and len(loaded) == 3  # the target's entries only
    monkeypatch.setattr(_trials, "MAX_PAGE_SCAN", 5)
    loaded.clear()
    logs, cursor, more = as_["reader"].trial_logs(verified_only=True, limit=100)  # the claims read count toward the bound
    assert len(loaded) == 5 and more and len(logs) < 5
    assert {log.key for log in as_["reader"].iter_trial_logs(verified_only=True)} == {make_record(200 + w, 1e-3).key for w in range(12) if w % 4 != 1}
    for bad in ("llvm", "{" + "x" * 5000):
        with pytest.raises(InvalidRecord, match="canonical target"):
            as_["reader"].trial_logs(target=bad)


def test_a_structures_logs_are_read_from_their_own_index_and_nothing_of_the_targets_other_logs(
        as_: dict[str, RegistryClient], srv: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """What a search's cost model starts from (tuner.workloads.logmodel): one structure's entries on one target, read from
    ``trials_by_structure``; the target's other structures and other targets' entries of the structure are not loaded."""
    from schedhub.registry import _trials

    other = TARGET.replace("znver5", "znver4")
    placed = {(w, rank, tgt): of_structure(w, rank, tgt) for w in range(6) for rank in (2, 3) for tgt in (TARGET, other)}
    for (w, _rank, _tgt), identity in placed.items():
        as_["w1"].push_trials(TrialLog(identity, [Trial(trace(w), 1e-3)]))
    as_["alice"].push_trials(TrialLog(placed[(0, 3, TARGET)], [Trial(trace(9), 1e-3)]))  # a claim beside w1's entry
    wanted = placed[(0, 3, TARGET)].structure
    assert len({identity.structure for identity in placed.values()}) == 2  # a structure id names a target kind, not a CPU
    mine = {placed[(w, 3, TARGET)].key for w in range(6)}
    assert {log.key for log in as_["reader"].iter_trial_logs(target=TARGET, structure=wanted, page=1)} == mine
    assert len(list(as_["reader"].iter_trial_logs(target=TARGET, structure=wanted, page=2))) == 7  # alice's claim too, once
    assert len(list(as_["reader"].iter_trial_logs(target=TARGET, structure=wanted, verified_only=True))) == 6
    loaded = []
    real = _trials.unpackb
    monkeypatch.setattr(_trials, "unpackb", lambda raw: loaded.append(1) or real(raw))
    assert len(as_["reader"].trial_logs(target=other, structure=wanted)[0]) == 6 and len(loaded) == 6  # that target's, that structure's
    for bad, why in (({"structure": wanted}, "needs 'target'"), ({"structure": "AB" * 32, "target": TARGET}, "structure id"),
                     ({"structure": wanted[:-1], "target": TARGET}, "structure id")):  # fmt: skip
        with pytest.raises(InvalidRecord, match=why):
            as_["reader"].trial_logs(**bad)


def test_an_entry_leaves_the_structure_index_when_it_is_dropped_or_evicted(local: LocalRegistry) -> None:
    identity = of_structure(1, 3)

    def rows() -> int:
        with local.store.read() as txn:
            return txn.stat(local.store.dbs["trials_by_structure"])["entries"]

    for i in range(MAX_PUSHERS_PER_KEY):
        local.push_trials(TrialLog(identity, [Trial(trace(1), 1e-3)]), f"p{i}", verified=False)
    local.push_trials(TrialLog(identity, [Trial(trace(1), 1e-3)]), "w", verified=True)  # evicts p0's claim
    assert rows() == MAX_PUSHERS_PER_KEY
    assert local.forget("p1")["trial_logs"] == 1 and rows() == MAX_PUSHERS_PER_KEY - 1
    found = local.trial_logs(target=TARGET, structure=identity.structure)[0]
    assert sorted(log.pushed_by for log in found) == sorted(["w", *(f"p{i}" for i in range(2, MAX_PUSHERS_PER_KEY))])


def test_a_key_holds_a_bounded_number_of_pushers_and_a_worker_evicts_the_oldest_claim(local: LocalRegistry) -> None:
    for i in range(MAX_PUSHERS_PER_KEY):
        local.push_trials(log_of(3, range(2)), f"p{i}", verified=False)
    with pytest.raises(Forbidden, match="trial logs of"):
        local.push_trials(log_of(3, range(2)), "latecomer", verified=False)
    local.push_trials(log_of(3, range(2)), "worker", verified=True)
    names = [log.pushed_by for log in local.iter_trial_logs()]
    assert "p0" not in names and "worker" in names and len(names) == MAX_PUSHERS_PER_KEY
    with local.store.read() as txn:  # the evicted claim left its target's index too
        assert txn.stat(local.store.dbs["trials_by_target"])["entries"] == MAX_PUSHERS_PER_KEY


@pytest.mark.parametrize("bad, error", [
    ({"trace": "not json", "secs": 1e-3}, InvalidRecord),
    ({"trace": trace(1), "secs": float("nan")}, InvalidRecord),
    ({"trace": trace(1), "secs": 0}, InvalidRecord),
    ({"trace": trace(1), "secs": 1e-3, "extra": 1}, InvalidRecord),
    ({"trace": json.dumps([[["Annotate", ["b0"], ["pragma_import_c", "x"], []]], []]), "secs": 1e-3}, InvalidRecord),
    ({"trace": "[" + " " * (600 << 10) + "]", "secs": 1e-3}, PayloadTooLarge),
])  # fmt: skip
def test_a_bad_trial_is_refused_with_its_index_and_nothing_is_stored(as_: dict[str, RegistryClient], bad: dict, error: type) -> None:
    body = log_of(4, range(2))
    with pytest.raises(error, match=r"trials\[2\]"):
        as_["w1"]._call("POST", "/v1/trials", {"identity": body.identity.to_dict(), "trials": [t.to_dict() for t in body.trials] + [bad]})
    assert as_["reader"].stats()["trial_logs"] == 0


def test_a_push_over_its_trial_limit_is_refused(as_: dict[str, RegistryClient]) -> None:
    with pytest.raises(PayloadTooLarge, match="trials in one push"):
        as_["w1"].push_trials(log_of(5, range(MAX_TRIALS_PER_PUSH + 1)))


def test_paging_stops_on_a_cursor_that_does_not_advance() -> None:
    pages = {"": ([log_of(6, range(1))], "aa", True), "aa": ([log_of(7, range(1))], "aa", True)}  # a hostile server's loop
    logs = list(islice(iter_pages(lambda after, limit, verified_only, target, structure: pages[after], verified_only=False, page=10), 10))
    assert len(logs) == 2  # without the guard: 10, and without islice a hang


def test_a_pusher_holds_a_bounded_number_of_bytes_of_unverified_log(tmp_path: Path) -> None:
    """A key holds 8 pushers' entries of up to 2 MiB, but a pusher may name any number of keys: a push token could fill
    the disk, and a full LMDB map fails every write for everyone. Its unverified entries are counted as stored (a merge
    replaces its entry, a worker's eviction frees it) and bounded; a worker's entries are not."""
    from schedhub.registry import TooManyRequests
    from schedhub.registry._counts import read_count
    from schedhub.registry._trials import claimed_row

    def claimed(reg: LocalRegistry, who: bytes) -> int:
        with reg.store.read() as txn:
            return read_count(txn, reg.store.dbs["meta"], claimed_row(who))

    with LocalRegistry(tmp_path / "local", sync=False) as local:
        local.push_trials(log_of(1, range(2)), "alice", verified=False)
        one = claimed(local, b"alice")
        local.push_trials(log_of(1, range(2, 4)), "alice", verified=False)  # merged into its entry: counted once, at its new size
        with local.store.read() as txn:
            assert claimed(local, b"alice") == len(txn.get(log_of(1, range(1)).key.encode() + b"\0alice", db=local.store.dbs["trials"])) > one
        for i in range(MAX_PUSHERS_PER_KEY - 1):
            local.push_trials(log_of(1, range(2)), f"p{i}", verified=False)
        local.push_trials(log_of(1, range(2)), "w", verified=True)  # evicts the oldest claim: alice's
        assert claimed(local, b"alice") == 0 and claimed(local, b"w") == 0
    with ServerThread(tmp_path / "srv", tokens=TOKENS, sync=False, bounds=CallerBounds(claimed_log_bytes=one * 3 // 2)) as s, clients_by_name(s.url, TOKENS) as as_:
        as_["alice"].push_trials(log_of(1, range(2)))
        with pytest.raises(TooManyRequests, match="unverified measurement log"):
            as_["alice"].push_trials(log_of(2, range(2)))
        assert [log.key for log in as_["reader"].trial_logs()[0]] == [log_of(1, range(1)).key]  # nothing of it stored
        as_["alice"].push_trials(log_of(1, range(1)))  # its own entry again: within
        for w in range(2, 5):
            as_["w1"].push_trials(log_of(w, range(2)))  # verified: not bounded


def test_an_entry_is_checked_when_stored_and_read_back_without_its_traces_parsed_again(tmp_path: Path, as_: dict[str, RegistryClient],
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Every page re-parsed every trace it held (in a thread, under the GIL): four clients paging 10 MB pages kept /healthz
    waiting 2.8-3.4 s. A trace is checked on its way in; the store reads back its own stamped entries without the checks,
    and a client, which trusts no server's stamp, checks what it is served."""
    from schedhub.registry import _records, _trials

    as_["w1"].push_trials(log_of(1, range(3)))
    parsed: list[str] = []
    real = _records.trace_field
    monkeypatch.setattr(_trials, "trace_field", lambda obj: parsed.append(obj["trace"]) or real(obj))
    with LocalRegistry(tmp_path / "trials", sync=False) as local:
        assert [len(log.trials) for log in local.iter_trial_logs()] == [3] and parsed == []
    served = as_["reader"]._call("GET", "/v1/trials")["items"]
    served[0]["checked"] = _trials.CHECKED_BY  # a hostile server's stamp
    served[0]["trials"][0]["trace"] = UNCHECKED_TRACE
    assert [len(log.trials) for log in _trials.stored_logs(served)] == [2] and len(parsed) == 3  # each checked, the bad one left out

