"""An admin's "forget this caller": what a token left behind, taken out after the token is revoked.

A revoked token's work stays: claims awaiting verification, miss reports that workers will spend searches on,
an unverified measurement log (up to a pusher's bound), its ended work. :func:`forget` finds all of it in read
transactions (which never hold up a writer) and takes it out in write transactions of at most :data:`BATCH`
items each, so a server goes on answering between them. Its verified records stay unless asked: a trusted worker
measured them, and other callers may be served them now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from ._history import trim
from ._queue import MissQueue, requester, turn_row
from ._records import unpackb
from ._store import Store
from ._trials import TrialStore

BATCH = 500  # items a write transaction takes out
SCAN_ROWS = 10_000  # rows a read transaction looks at
FORGOTTEN = ("records", "complaints", "jobs", "jobs_handed_over", "trial_logs", "kept")

#: One write transaction's share of the work: given the transaction, it adds what it took out to the counts.
Step = Callable[[lmdb.Transaction, dict[str, int]], None]


def forget_steps(store: Store, queue: MissQueue, trials: TrialStore, name: str, *, verified: bool = False) -> Iterator[Step]:
    """The steps that take out ``name``'s records (its claims; with ``verified`` its verified records too) and its
    complaints, the queue jobs it asked for (miss reports, claims' verifications, complaints; a miss that others
    reported too passes to the next of them), its measurement log and its ended work."""
    mine = _records_of(store, name, verified)
    for start in range(0, len(mine), BATCH):
        yield lambda txn, counts, keys=mine[start : start + BATCH]: _take_records(store, txn, keys, name, verified, counts)
    jobs = _scan(store, "queue", lambda job_id, raw: requester(job := unpackb(raw)) == name or name in job.get("asked_by", ()))
    for start in range(0, len(jobs), BATCH):
        yield lambda txn, counts, ids=jobs[start : start + BATCH]: _hand_over(queue, txn, ids, name, counts)
    logs = _scan(store, "trials", lambda db_key, raw: db_key.split(b"\0", 1)[-1] == name.encode())
    for start in range(0, len(logs), BATCH):
        yield lambda txn, counts, rows=logs[start : start + BATCH]: _count(counts, "trial_logs", sum(trials.drop(row, txn=txn) for row in rows))
    yield lambda txn, counts: _count(counts, "kept", trim(txn, store.dbs, name, 0, store.drop_kept))
    yield lambda txn, counts: txn.delete(turn_row(name), db=store.dbs["meta"])  # its place in the queue's rotation


def forget(store: Store, queue: MissQueue, trials: TrialStore, name: str, *, verified: bool = False) -> dict[str, int]:
    """Take out what ``name`` left behind (:func:`forget_steps`), a write transaction a step; what went, by kind."""
    counts = dict.fromkeys(FORGOTTEN, 0)
    for step in forget_steps(store, queue, trials, name, verified=verified):
        with store.write() as txn:
            step(txn, counts)
    return counts


def _hand_over(queue: MissQueue, txn: lmdb.Transaction, ids: list[bytes], name: str, counts: dict[str, int]) -> None:
    for job_id in ids:
        outcome = queue.hand_over(job_id.decode(), name, txn=txn)
        counts["jobs"] += outcome == "dropped"
        counts["jobs_handed_over"] += outcome == "handed over"


def _count(counts: dict[str, int], kind: str, taken: int) -> None:
    counts[kind] += taken


def _scan(store: Store, db: str, matches: Callable[[bytes, bytes], bool]) -> list[bytes]:
    """The keys of ``db`` whose rows match, read :data:`SCAN_ROWS` rows a read transaction: a reader holds the pages it
    sees from reuse, so one transaction over a large store would let the file grow under the writes meanwhile."""
    if store.dbs[db] is None:  # a read-only store from before it
        return []
    found: list[bytes] = []
    start = b""
    while True:
        with store.read() as txn:
            cursor = txn.cursor(db=store.dbs[db])
            more = cursor.set_range(start)
            for _ in range(SCAN_ROWS):
                if not more:
                    return found
                key = bytes(cursor.key())
                if matches(key, bytes(cursor.value())):
                    found.append(key)
                more = cursor.next()
            start = key + b"\0"  # the first key after it


def _is_mine(entry: dict[str, Any], name: str, verified: bool) -> bool:
    return entry.get("by") == name and (verified or not entry.get("vby"))


def _records_of(store: Store, name: str, verified: bool) -> list[bytes]:
    """Keys with an entry of ``name``'s to take out, or one it complained about."""
    return _scan(store, "records", lambda _, raw: any(_is_mine(e, name, verified) or name in e.get("complaints", []) for e in unpackb(raw)["entries"]))


def _take_records(store: Store, txn: lmdb.Transaction, keys: list[bytes], name: str, verified: bool, counts: dict[str, int]) -> None:
    for key in keys:
        records, complaints = store.withdraw(txn, key.decode(), lambda entry: _is_mine(entry, name, verified), complainant=name)
        counts["records"] += records
        counts["complaints"] += complaints
