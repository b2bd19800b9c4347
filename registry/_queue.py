"""The durable miss queue: workloads the compile hook could not find, waiting to be tuned.

One job per key (reports of a known key raise its demand). Workers lease jobs; a lease that is
neither acked nor renewed expires and the job returns to the queue, so a killed worker loses
nothing. Failures are retried up to ``max_attempts`` leases, then the job is dead with its last
error. Pending jobs are served most-demanded first, then oldest first.

Index layout (``queue_idx``): ``P | inverted demand | seq | key`` for pending jobs and
``L | lease expiry (ms) | key`` for leased ones, so leasing and reclaiming are range scans.
"""

from __future__ import annotations

import secrets
import struct
import time
from dataclasses import dataclass
from typing import Any

import lmdb

from ._errors import LeaseLost, NotFound
from ._keys import target_kind
from ._records import Identity, packb, unpackb
from ._store import Store

PENDING, LEASED, DONE, DEAD = "pending", "leased", "done", "dead"
STATES = (PENDING, LEASED, DONE, DEAD)
DEFAULT_MAX_ATTEMPTS = 3
_U32, _U64 = struct.Struct(">I"), struct.Struct(">Q")


@dataclass(frozen=True)
class Lease:
    key: str
    lease_id: str
    expires: float
    job: dict[str, Any]


class MissQueue:
    """Queue operations over a :class:`Store`'s environment; every method takes an optional txn."""

    def __init__(self, store: Store, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.store = store
        self.max_attempts = max_attempts
        self._jobs = store.dbs["queue"]
        self._idx = store.dbs["queue_idx"]

    # -- helpers ---------------------------------------------------------------------------

    def _get(self, txn: lmdb.Transaction, key: str) -> dict[str, Any] | None:
        raw = txn.get(key.encode(), db=self._jobs)
        return unpackb(raw) if raw is not None else None

    def _index_key(self, job: dict[str, Any]) -> bytes | None:
        key = job["key"].encode()
        if job["state"] == PENDING:
            return b"P" + _U32.pack(0xFFFFFFFF - min(job["demand"], 0xFFFFFFFF)) + _U64.pack(job["seq"]) + key
        if job["state"] == LEASED:
            return b"L" + _U64.pack(int(job["lease_expires"] * 1000)) + key
        return None

    def _save(self, txn: lmdb.Transaction, job: dict[str, Any], old_index: bytes | None) -> None:
        new_index = self._index_key(job)
        if old_index is not None and old_index != new_index:
            txn.delete(old_index, db=self._idx)
        if new_index is not None:
            txn.put(new_index, b"", db=self._idx)
        txn.put(job["key"].encode(), packb(job), db=self._jobs)

    def _set_state(self, txn: lmdb.Transaction, job: dict[str, Any], state: str, **changes: Any) -> None:
        old = self._index_key(job)
        job.update(state=state, **changes)
        if state != LEASED:
            job.update(lease_id="", lease_owner="", lease_expires=0.0)
        self._save(txn, job, old)

    def _leased_job(self, txn: lmdb.Transaction, key: str, lease_id: str) -> dict[str, Any]:
        job = self._get(txn, key)
        if job is None:
            raise NotFound(f"no queue job for key {key}")
        if job["state"] != LEASED or not secrets.compare_digest(job["lease_id"], lease_id):
            raise LeaseLost(f"lease {lease_id[:8]}… on {key[:12]}… is no longer held (job is {job['state']}); drop this work")
        return job

    # -- operations ------------------------------------------------------------------------

    def report(self, identity: Identity, count: int = 1, *, txn: lmdb.Transaction | None = None) -> dict[str, Any]:
        """Record demand for a workload; the first report creates its job."""
        now = time.time()
        with self.store.write(txn) as t:
            has_records = t.get(identity.key.encode(), db=self.store.dbs["records"]) is not None
            job = self._get(t, identity.key)
            if job is None:
                job = {
                    **identity.to_dict(), "kind": target_kind(identity.target), "demand": 0,
                    "state": DONE if has_records else PENDING, "attempts": 0, "first_seen": now,
                    "seq": self.store.next_seq(t, b"queue_seq"), "last_error": "",
                    "lease_id": "", "lease_owner": "", "lease_expires": 0.0,
                }  # fmt: skip
                old = None
            else:
                old = self._index_key(job)
                if job["state"] == DONE and not has_records:  # its records were quarantined
                    job.update(state=PENDING, attempts=0)
            job["demand"] += max(1, count)
            job["last_seen"] = now
            self._save(t, job, old)
            return {"key": job["key"], "state": job["state"], "demand": job["demand"]}

    def lease(
        self, worker: str, max_jobs: int = 1, lease_secs: float = 300.0, *, fingerprint: str | None = None,
        kind: str | None = None, txn: lmdb.Transaction | None = None,
    ) -> list[Lease]:
        """Hand out up to ``max_jobs`` pending jobs, most demanded first, reclaiming expired leases first.

        ``fingerprint`` and ``kind`` restrict the jobs to those a worker can do: its compiler (a
        schedule found by another compiler lands under a key nobody asks for) and its target kind.
        """
        now = time.time()
        with self.store.write(txn) as t:
            self._reclaim_expired(t, now)
            taken: list[dict[str, Any]] = []
            cursor = t.cursor(db=self._idx)
            if cursor.set_range(b"P"):
                for idx_key in cursor.iternext(values=False):
                    if not idx_key.startswith(b"P") or len(taken) >= max_jobs:
                        break
                    job = self._get(t, idx_key[13:].decode())
                    if (fingerprint is None or job["fingerprint"] == fingerprint) and (kind is None or job["kind"] == kind):
                        taken.append(job)
            leases = []
            for job in taken:
                lease_id = secrets.token_hex(16)
                self._set_state(t, job, LEASED, attempts=job["attempts"] + 1, lease_id=lease_id,
                                lease_owner=worker, lease_expires=now + lease_secs)  # fmt: skip
                leases.append(Lease(job["key"], lease_id, job["lease_expires"], job))
            return leases

    def _reclaim_expired(self, txn: lmdb.Transaction, now: float) -> None:
        cursor = txn.cursor(db=self._idx)
        expired = []
        if cursor.set_range(b"L"):
            for idx_key in cursor.iternext(values=False):
                if not idx_key.startswith(b"L") or _U64.unpack(idx_key[1:9])[0] > now * 1000:
                    break
                expired.append(idx_key[9:].decode())
        for key in expired:
            job = self._get(txn, key)
            error = f"lease held by {job['lease_owner']!r} expired (attempt {job['attempts']})"
            state = DEAD if job["attempts"] >= self.max_attempts else PENDING
            self._set_state(txn, job, state, last_error=error)

    def renew(self, key: str, lease_id: str, lease_secs: float = 300.0, *, txn: lmdb.Transaction | None = None) -> float:
        """Extend a held lease (a worker's heartbeat); LeaseLost once it was reclaimed."""
        with self.store.write(txn) as t:
            job = self._leased_job(t, key, lease_id)
            self._set_state(t, job, LEASED, lease_expires=time.time() + lease_secs)
            return job["lease_expires"]

    def ack(self, key: str, lease_id: str, *, txn: lmdb.Transaction | None = None) -> None:
        with self.store.write(txn) as t:
            self._set_state(t, self._leased_job(t, key, lease_id), DONE, last_error="")

    def fail(self, key: str, lease_id: str, error: str, *, txn: lmdb.Transaction | None = None) -> str:
        """Give a job back after an error; dead once it used its attempts. Returns the new state."""
        with self.store.write(txn) as t:
            job = self._leased_job(t, key, lease_id)
            state = DEAD if job["attempts"] >= self.max_attempts else PENDING
            self._set_state(t, job, state, last_error=error[:4000])
            return state

    def requeue(self, key: str, *, txn: lmdb.Transaction | None = None) -> None:
        """Put a dead or done job back to pending with fresh attempts (an operator's action)."""
        with self.store.write(txn) as t:
            job = self._get(t, key)
            if job is None:
                raise NotFound(f"no queue job for key {key}")
            self._set_state(t, job, PENDING, attempts=0)

    def satisfy(self, key: str, *, txn: lmdb.Transaction | None = None) -> None:
        """A record arrived for the key: a pending job for it has nothing left to do."""
        with self.store.write(txn) as t:
            job = self._get(t, key)
            if job is not None and job["state"] == PENDING:
                self._set_state(t, job, DONE)

    def get(self, key: str) -> dict[str, Any]:
        with self.store.read() as t:
            job = self._get(t, key)
        if job is None:
            raise NotFound(f"no queue job for key {key}")
        return job

    def jobs(self, state: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        out = []
        with self.store.read() as t:
            for _, raw in t.cursor(db=self._jobs):
                job = unpackb(raw)
                if state is None or job["state"] == state:
                    out.append(job)
                    if len(out) >= limit:
                        break
        return out

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        with self.store.read() as t:
            for _, raw in t.cursor(db=self._jobs):
                counts[unpackb(raw)["state"]] += 1
        return counts
