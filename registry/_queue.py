"""The durable miss queue: workloads the compile hook could not find, waiting to be tuned.

One job per key (reports of a known key raise its demand). Workers lease jobs; a lease that is
neither acked nor renewed expires and the job returns to the queue, so a killed worker loses
nothing. Failures are retried up to ``max_attempts`` leases, then the job is dead with its last
error.

Pending tune jobs are served by *turn*, then asked for by the most callers, then most demanded,
then oldest first. Turns take the callers in rotation (start-time fair queuing): each caller who
asks for a job spends a turn on it, one past the later of its last turn and the turn of the last
tune job leased (the queue's clock), and the job is served at the earliest turn spent on it. So a
caller's jobs keep the order it reported them in (the compile hook reports a compile's misses
costliest first); another caller's first miss waits behind one of theirs, not all (a token whose
compiles miss by the thousand, a CI run of a new model, cannot hold back everyone else's misses
until its last is tuned); a caller that was idle starts at the clock, not ahead of it; a kernel
several callers want comes up at the first of their turns; and no set of tokens can put their jobs
ahead of everyone's, only spend their own turns. Demand comes last because it is one caller's to
raise: a token that reports its own misses again and again, within its rate limit, would otherwise
put them ahead of everyone else's. A job remembers who asked (``asked_by``, at most
:data:`MAX_CALLERS` names; the count is public, the names are not), so a job whose requester is
forgotten passes to the next caller who asked (:meth:`MissQueue.hand_over`) instead of leaving with it.

Two tasks share the queue: ``tune`` (one job per missed key; its job id is the key) and
``verify`` (one job per pushed claim or complaint: replay, check and re-measure one record; its
job id is :func:`verify_job_id`). Verification jobs are leased before tuning jobs, but not for ever:
after :data:`VERIFY_STREAK` verification leases in a row, a tune job that suits the worker goes first.
So a token holder who pushes claims by the thousand cannot stop every miss from being tuned.

Each job belongs to its *requester* (the first reporter of a miss, the pusher of a claim, the caller behind
a complaint), who has a count of jobs of each task awaiting work (pending or leased; :meth:`MissQueue.awaiting`),
which a server bounds (``limit``). A verification's *ordinal* is that count when it was queued, and pending
verifications are leased by ordinal first, then by demand and age: everyone's first claim, then everyone's
second, so one requester's backlog does not hold back another's.

A tune job goes through the queue in up to two stages. A worker's *first pass* measures what is
cheap to try (the registry's transfers and the cost model's synthesized schedules), pushes the best
and acks with ``refine``: the job is pending again in the ``refine`` stage, leased only after every
job still waiting for its first pass, so a model's misses all get a measured schedule before any
of them gets a full search. Acking a refine job (or any job without ``refine``) closes it.

A lease belongs to the token that took it: renew, ack, fail and release need the lease id *and*
the same holder, lease ids are never listed, and an expired lease is reported (and treated) as
given back on every read, not only when the next worker leases.

Index layout (``queue_idx``): ``V|P|R | rank (8 bytes) | seq | id`` for pending verify, tune and refine jobs (a
tune job's rank is its turn, its inverted callers and its inverted demand, a verification's its ordinal, then its
inverted demand: :func:`_rank`)
and ``L | lease expiry (ms) | id`` for leased ones, so leasing and reclaiming are range scans. ``queue_fit``
holds each pending job's ``queue_idx`` row again with the job's *fit* after the lane (:func:`fit`: 8 bytes of a
digest of its compiler fingerprint, target kind and device model), so a worker that names all three reads the
jobs it can take and no others: a queue holding jobs for compilers or devices no worker has (anyone may report
a miss for any fingerprint) costs its leases nothing. ``queue_state`` (``state | NUL | id``) and the per-state
counts in ``meta`` make a listing by state and the counts cost their page, not the queue.
"""

from __future__ import annotations

import hashlib
import heapq
import secrets
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lmdb

from ._errors import InvalidRecord, LeaseLost, NotFound, TooManyRequests
from ._keys import target_device, target_kind
from ._records import Identity, Record, packb, unpackb
from ._counts import COUNT, add_count, drop_counts, read_count
from ._history import ENDED, JOB, requester
from ._store import QUEUE_ORDER, QUEUE_STATES, Store, queue_state_row

PENDING, LEASED, DONE, DEAD = "pending", "leased", *ENDED
STATES = (PENDING, LEASED, DONE, DEAD)
TUNE, VERIFY = "tune", "verify"
TASKS = (TUNE, VERIFY)
REFINE = "refine"  # the stage of a tune job whose first pass is pushed: a full search is left to do
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_TOLERANCE = 2.0  # a claim re-measured slower than this many times its claimed time is refused
MAX_LEASE_SECS = 86400.0
VERIFY_STREAK = 8  # verification leases in a row, after which a pending tune job that suits the worker goes first
AWAITING = (PENDING, LEASED)  # the states in which a job counts against its requester
_STREAK_ROW = b"queue:verify_streak"  # meta: verification leases since the last tune lease
_PRIVATE = ("lease_id", "lease_holder", "kept", "asked_by")
MAX_CALLERS = 64  # distinct callers a job remembers asking for it (its count stops there: past any job's but the most wanted's)
_SUMMARY_DROP = ("workload", "trace", "args_info")


def verify_job_id(key: str, trace_id: str) -> str:
    """The queue id of the verification of one record (64 hex characters, like a key)."""
    return hashlib.sha256(f"verify\0{key}\0{trace_id}".encode()).hexdigest()


_AWAITING_ROWS = b"queue_awaiting:"  # the prefix of every requester's counts in ``meta``


def callers(job: dict[str, Any]) -> int:
    """How many distinct callers asked for a job (its requester alone, for a job queued before they were counted)."""
    return len(job.get("asked_by") or ()) or 1


def awaiting_row(task: str, requester: str) -> bytes:
    """The ``meta`` row counting a requester's jobs of ``task`` pending or leased."""
    return _AWAITING_ROWS + task.encode() + b"\0" + requester.encode()


_U64 = struct.Struct(">Q")
_LANES = ((b"V", VERIFY), (b"P", TUNE), (b"R", TUNE))  # queue_idx's pending lanes in lease order: verifications, first passes, refinements
_LANE_PREFIXES = tuple(prefix for prefix, _ in _LANES)
_TURN_ROWS = b"queue_turn:"  # meta: the prefix of each requester's last tune job turn
_CLOCK_ROW = b"queue:clock"  # meta: the turn of the last tune job leased
MAX_TURN = 2**44 - 1  # what a rank holds of a turn (a million jobs a day for 48,000 years)


def turn_row(requester: str) -> bytes:
    """The ``meta`` row holding the turn a requester's latest tune job was given."""
    return _TURN_ROWS + requester.encode()


@dataclass(frozen=True)
class Lease:
    key: str
    lease_id: str
    expires: float
    job: dict[str, Any]


class MissQueue:
    """Queue operations over a :class:`Store`'s environment; every method takes an optional txn."""

    def __init__(self, store: Store, max_attempts: int = DEFAULT_MAX_ATTEMPTS, tolerance: float = DEFAULT_TOLERANCE) -> None:
        self.store = store
        self.max_attempts = max_attempts
        self.tolerance = tolerance
        self._jobs = store.dbs["queue"]
        self._idx = store.dbs["queue_idx"]
        self._states = store.dbs["queue_state"]
        self._fit = store.dbs["queue_fit"]
        if not store.readonly:
            self._index_order()

    def _index_order(self) -> None:
        """Rebuild ``queue_idx``, ``queue_fit`` and the requesters' counts of a store from before verifications were
        ranked by ordinal and tune jobs by turn and callers (once, on open; a verification queued then has ordinal 0 and its
        record's pusher as requester, a tune job its requester as its one caller and its place among its requester's jobs
        awaiting work, oldest first, as its turn)."""
        with self.store.write() as t:
            meta = self.store.dbs["meta"]
            if t.get(QUEUE_ORDER, db=meta) is not None:
                return
            t.drop(self._idx, delete=False)
            t.drop(self._fit, delete=False)
            drop_counts(t, meta, _AWAITING_ROWS)
            self._take_turns(t)
            for _, raw in t.cursor(db=self._jobs):
                job = unpackb(raw)
                index = self._index_key(job)
                if index is not None:
                    t.put(index, b"", db=self._idx)
                if (fitting := _fit_row(job, index)) is not None:
                    t.put(fitting, b"", db=self._fit)
                if job["state"] in AWAITING:
                    add_count(t, meta, awaiting_row(job.get("task", TUNE), requester(job)), +1)
            t.put(QUEUE_ORDER, b"1", db=meta)

    def _take_turns(self, txn: lmdb.Transaction) -> None:
        """Give each tune job awaiting work that has no turn (queued before tune jobs had one) its turn after its requester's
        jobs queued before it, oldest first."""
        waiting = [job for _, raw in txn.cursor(db=self._jobs)
                   if (job := unpackb(raw)).get("task", TUNE) == TUNE and job["state"] in AWAITING and "turn" not in job]  # fmt: skip
        for job in sorted(waiting, key=lambda j: j["seq"]):
            job["turn"] = self._next_turn(txn, requester(job))
            txn.put(job["key"].encode(), packb(job), db=self._jobs)

    def _next_turn(self, txn: lmdb.Transaction, who: str) -> int:
        """The turn of a tune job ``who`` queues now: one past the later of its last turn and the queue's clock."""
        meta = self.store.dbs["meta"]
        turn = min(max(read_count(txn, meta, turn_row(who)), read_count(txn, meta, _CLOCK_ROW)) + 1, MAX_TURN)
        txn.put(turn_row(who), COUNT.pack(turn), db=meta)
        return turn

    # -- helpers ---------------------------------------------------------------------------

    def _get(self, txn: lmdb.Transaction, key: str) -> dict[str, Any] | None:
        raw = txn.get(key.encode(), db=self._jobs)
        return unpackb(raw) if raw is not None else None

    def _index_key(self, job: dict[str, Any]) -> bytes | None:
        key = job["key"].encode()
        if job["state"] == PENDING:
            return _pending_prefix(job) + _U64.pack(_rank(job)) + _U64.pack(job["seq"]) + key
        if job["state"] == LEASED:
            return b"L" + _U64.pack(int(job["lease_expires"] * 1000)) + key
        return None

    def _save(self, txn: lmdb.Transaction, job: dict[str, Any], old_index: bytes | None) -> None:
        job_id = job["key"].encode()
        stored = self._stored_state(txn, job_id)
        if job.get("task", TUNE) == TUNE and job["state"] in AWAITING and stored not in AWAITING:  # queued, or back at work
            job["turn"] = self._next_turn(txn, requester(job))
        new_index = self._index_key(job)
        if old_index is not None and old_index != new_index:
            self._unindex(txn, job, old_index)
        if new_index is not None:
            txn.put(new_index, b"", db=self._idx)
            if (new_fit := _fit_row(job, new_index)) is not None:
                txn.put(new_fit, b"", db=self._fit)
        if (stored in AWAITING) != (job["state"] in AWAITING):
            add_count(txn, self.store.dbs["meta"], awaiting_row(job.get("task", TUNE), requester(job)), +1 if job["state"] in AWAITING else -1)
        self.store.move_queue_job(txn, job_id, stored, job["state"])
        if stored in ENDED and job["state"] not in ENDED:  # back at work: no longer its requester's history
            self.store.unkeep(txn, job)
        if job["state"] in ENDED and stored not in ENDED:  # ended: kept in its requester's history, within its budget
            job["ended_at"] = time.time()
            self.store.keep(txn, requester(job), JOB, job_id, job)
        else:
            txn.put(job_id, packb(job), db=self._jobs)

    def _unindex(self, txn: lmdb.Transaction, job: dict[str, Any], index: bytes) -> None:
        """Delete a job's ``queue_idx`` row ``index`` and its ``queue_fit`` row (a job's fit never changes: the row is the index's)."""
        txn.delete(index, db=self._idx)
        if (fitting := _fit_row(job, index)) is not None:
            txn.delete(fitting, db=self._fit)

    def _stored_state(self, txn: lmdb.Transaction, job_id: bytes) -> str | None:
        """The state a job is stored (and indexed) in; None for a job not stored yet."""
        return next((s for s in STATES if txn.get(queue_state_row(s, job_id), db=self._states) is not None), None)

    def _expired_leases(self, txn: lmdb.Transaction, now: float) -> dict[str, dict[str, Any]]:
        """Jobs stored as leased whose lease has expired, as callers see them (pending or dead), by id: a range scan."""
        out: dict[str, dict[str, Any]] = {}
        cursor = txn.cursor(db=self._idx)
        if cursor.set_range(b"L"):
            for idx_key in cursor.iternext(values=False):
                if not idx_key.startswith(b"L") or _U64.unpack(idx_key[1:9])[0] > now * 1000:
                    break
                job = self._get(txn, idx_key[9:].decode())
                if job is not None and (view := self._view(job, now, summary=True))["state"] != LEASED:
                    out[job["key"]] = view
        return out

    def _set_state(self, txn: lmdb.Transaction, job: dict[str, Any], state: str, **changes: Any) -> None:
        old = self._index_key(job)
        job.update(state=state, **changes)
        if state != LEASED:
            job.update(lease_id="", lease_owner="", lease_holder="", lease_expires=0.0)
        self._save(txn, job, old)

    def _leased_job(self, txn: lmdb.Transaction, key: str, lease_id: str, holder: str | None) -> dict[str, Any]:
        """The job under a lease its caller still holds: same lease id, same holder, not expired."""
        job = self._get(txn, key)
        if job is None:  # taken out (an admin forgot its requester, or its history was trimmed): nobody holds it
            raise LeaseLost(f"lease {lease_id[:8]}… on {key[:12]}…: the job is gone (an admin took it out); drop this work")
        held = (
            job["state"] == LEASED and secrets.compare_digest(job["lease_id"].encode(), lease_id.encode())
            and (holder is None or secrets.compare_digest(job.get("lease_holder", "").encode(), holder.encode()))
            and job["lease_expires"] >= time.time()
        )  # fmt: skip
        if not held:
            raise LeaseLost(f"lease {lease_id[:8]}… on {key[:12]}… is not held by this caller (expired, re-leased or someone else's); drop this work")
        return job

    def _view(self, job: dict[str, Any], now: float, summary: bool = False) -> dict[str, Any]:
        """A job as callers see it: no lease id, and an expired lease shown as given back."""
        out = {k: v for k, v in job.items() if k not in _PRIVATE and not (summary and k in _SUMMARY_DROP)}
        out.setdefault("task", TUNE)
        if out["task"] == TUNE:
            out["callers"] = callers(job)
        if job["state"] == LEASED and job["lease_expires"] < now:
            out["state"] = DEAD if job["attempts"] >= self.max_attempts else PENDING
            out["last_error"] = f"lease held by {job['lease_owner']!r} expired (attempt {job['attempts']})"
        return out

    # -- operations ------------------------------------------------------------------------

    def report(self, identity: Identity, count: int = 1, *, by: str = "", limit: int | None = None,
               txn: lmdb.Transaction | None = None) -> dict[str, Any]:  # fmt: skip
        """Record demand for a workload; the first report creates its job, ``by`` its requester, who may have at most
        ``limit`` (None: any number of) tune jobs pending or leased: past it :class:`TooManyRequests`, nothing changed."""
        now = time.time()
        with self.store.write(txn) as t:
            has_records = t.get(identity.key.encode(), db=self.store.dbs["records"]) is not None
            job = self._get(t, identity.key)
            if job is None:
                if limit is not None and not has_records and (waiting := self.awaiting(by, TUNE, t)) >= limit:
                    raise TooManyRequests(f"{by!r} has {waiting} reported misses awaiting tuning, the most this registry queues for one "
                                          "caller; nothing of this report was queued: report them again once workers have tuned some")
                job = {
                    **identity.to_dict(), "task": TUNE, "kind": target_kind(identity.target), "demand": 0, "requester": by, "asked_by": [],
                    "state": DONE if has_records else PENDING, "attempts": 0, "first_seen": now,
                    "seq": self.store.next_seq(t, b"queue_seq"), "last_error": "",
                    "lease_id": "", "lease_owner": "", "lease_holder": "", "lease_expires": 0.0, "stage": "",
                }  # fmt: skip
                old, joinable = None, False
            else:
                old = self._index_key(job)
                joinable = job["state"] in AWAITING  # in the rotation already: a new caller spends a turn on it
                if job["state"] == DONE and not has_records:  # its records were quarantined
                    job.update(state=PENDING, attempts=0, stage="")
            job["demand"] += max(1, count)
            job["last_seen"] = now
            asked_by = job.setdefault("asked_by", [requester(job)])
            if by not in asked_by and len(asked_by) < MAX_CALLERS and job["state"] in AWAITING:  # an ended job is history, its size counted
                asked_by.append(by)
                if joinable:  # it comes up at the first turn spent on it
                    job["turn"] = min(job.get("turn", MAX_TURN), self._next_turn(t, by))
            self._save(t, job, old)
            return {"key": job["key"], "state": job["state"], "demand": job["demand"], "callers": callers(job)}

    def awaiting(self, who: str, task: str = VERIFY, txn: lmdb.Transaction | None = None) -> int:
        """How many jobs of ``task`` that ``who`` queued (their requester) are pending or leased."""
        if txn is not None:
            return read_count(txn, self.store.dbs["meta"], awaiting_row(task, who))
        with self.store.read() as t:
            return read_count(t, self.store.dbs["meta"], awaiting_row(task, who))

    def enqueue_verify(self, record: Record, pushed_by: str, reason: str, *, by: str | None = None, limit: int | None = None,
                       txn: lmdb.Transaction | None = None) -> dict[str, Any]:  # fmt: skip
        """Queue the verification of one stored record (a new claim, or a complaint about it). ``pushed_by``:
        the record's pusher (named if it is refused); ``by``: who asks (default the pusher; a complaint's caller),
        who may have at most ``limit`` (None: any number of) verifications pending or leased: past it
        :class:`TooManyRequests`, nothing queued."""
        now = time.time()
        by = pushed_by if by is None else by
        job_id = verify_job_id(record.key, record.trace_id)
        with self.store.write(txn) as t:
            job = self._get(t, job_id)
            if job is not None and job["state"] in (PENDING, LEASED):
                old = self._index_key(job)
                job["demand"] += 1
                job["last_seen"] = now
                self._save(t, job, old)
                return {"key": job_id, "state": job["state"], "demand": job["demand"]}
            if limit is not None and self.awaiting(by, VERIFY, t) >= limit:
                raise TooManyRequests(f"this request would give {by!r} more than {limit} records awaiting verification (claims it pushed, "
                                      "records it complained about), the most this registry queues for one caller; nothing of it was "
                                      "stored: send it again once workers have verified some")
            old = self._index_key(job) if job is not None else None
            ident = record.identity
            job = {
                "key": job_id, "task": VERIFY, "record_key": record.key, "trace_id": record.trace_id, "trace": record.trace,
                "claimed_secs": record.mean_secs, "pusher": pushed_by, "reason": reason[:1000], "requester": by, "ordinal": self.awaiting(by, VERIFY, t),
                "identity": ident.to_dict(), "op": ident.op, "fingerprint": ident.fingerprint, "target": ident.target,
                "kind": target_kind(ident.target), "demand": 1, "state": PENDING, "attempts": 0, "first_seen": now,
                "last_seen": now, "seq": self.store.next_seq(t, b"queue_seq"), "last_error": "",
                "lease_id": "", "lease_owner": "", "lease_holder": "", "lease_expires": 0.0,
            }  # fmt: skip
            self._save(t, job, old)
            return {"key": job_id, "state": PENDING, "demand": 1}

    def lease(
        self, worker: str, max_jobs: int = 1, lease_secs: float = 300.0, *, fingerprint: str | None = None,
        kind: str | None = None, device: str | None = None, tasks: tuple[str, ...] = (TUNE,), holder: str | None = None,
        txn: lmdb.Transaction | None = None,
    ) -> list[Lease]:
        """Hand out up to ``max_jobs`` pending jobs (verifications first, by ordinal, then tune jobs awaiting their
        first pass, then refine jobs; tune jobs by turn, callers and demand), reclaiming expired leases first. After
        :data:`VERIFY_STREAK` verification leases in a row the tune jobs go first, once.

        ``fingerprint``, ``kind`` and ``device`` restrict the jobs to those a worker can do: its
        compiler (a schedule found by another compiler lands under a key nobody asks for), its target
        kind and its device model (:func:`target_device`: a kernel built for another CPU may not run
        here, and timings taken on another model would be published for this one). A job for a
        generic target of the kind (no model named) suits every device.
        ``holder`` names the token that takes the lease; only it can renew, ack, fail or release it.
        """
        now = time.time()
        lease_secs = min(lease_secs, MAX_LEASE_SECS)
        with self.store.write(txn) as t:
            self._reclaim_expired(t, now)
            meta = self.store.dbs["meta"]
            streak = before = read_count(t, meta, _STREAK_ROW)
            lanes = _LANES
            if streak >= VERIFY_STREAK:  # tuning's turn: verifications go after a suitable tune job, if one is pending
                lanes = (*lanes[1:], lanes[0])
            taken: list[dict[str, Any]] = []
            for prefix, task in lanes:
                if task not in tasks:
                    continue
                for job_id in self._pending(t, prefix, fingerprint, kind, device):
                    if len(taken) >= max_jobs:
                        break
                    job = self._get(t, job_id)
                    if _suits(job, fingerprint, kind, device):
                        taken.append(job)
            for job in taken:
                streak = streak + 1 if job.get("task") == VERIFY else 0
            add_count(t, meta, _STREAK_ROW, streak - before)
            if (turn := max((job.get("turn", 0) for job in taken if job.get("task", TUNE) == TUNE), default=0)) > read_count(t, meta, _CLOCK_ROW):
                t.put(_CLOCK_ROW, COUNT.pack(turn), db=meta)  # the clock: a requester queueing from now on starts here
            leases = []
            for job in taken:
                lease_id = secrets.token_hex(16)
                self._set_state(t, job, LEASED, attempts=job["attempts"] + 1, lease_id=lease_id, lease_owner=worker,
                                lease_holder=holder or "", lease_expires=now + lease_secs)  # fmt: skip
                leases.append(Lease(job["key"], lease_id, job["lease_expires"], self._view(job, now)))
            return leases

    def _pending(self, txn: lmdb.Transaction, lane: bytes, fingerprint: str | None, kind: str | None, device: str | None) -> Iterator[str]:
        """Ids of a lane's pending jobs in lease order: for a worker that names its compiler, kind and device, only
        those of its fit and of its kind's generic target (``queue_fit``, two range scans merged); else every one."""
        if fingerprint is None or kind is None or device is None:
            db, prefixes = self._idx, [lane]
        else:
            db, prefixes = self._fit, list(dict.fromkeys(lane + fit(fingerprint, kind, d) for d in (device, "")))

        def rows(prefix: bytes) -> Iterator[bytes]:
            cursor = txn.cursor(db=db)
            if cursor.set_range(prefix):
                for row in cursor.iternext(values=False):
                    if not row.startswith(prefix):
                        return
                    yield row[len(prefix) :]  # rank, seq, id: the order of queue_idx in both

        for row in heapq.merge(*map(rows, prefixes)):
            yield row[2 * _U64.size :].decode()

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

    def renew(self, key: str, lease_id: str, lease_secs: float = 300.0, *, holder: str | None = None, txn: lmdb.Transaction | None = None) -> float:
        """Extend a held lease (a worker's heartbeat, capped like a lease); LeaseLost once it expired or was reclaimed."""
        with self.store.write(txn) as t:
            job = self._leased_job(t, key, lease_id, holder)
            self._set_state(t, job, LEASED, lease_expires=time.time() + min(lease_secs, MAX_LEASE_SECS))
            return job["lease_expires"]

    def ack(self, key: str, lease_id: str, verdict: dict[str, Any] | None = None, *, refine: bool = False, holder: str | None = None,
            txn: lmdb.Transaction | None = None) -> str:  # fmt: skip
        """Close a held job. A verification job needs its ``verdict`` ({"run_secs": [...] | None,
        "reason": str}, and "flushed_secs" where the verifier timed it on flushed caches too), which is applied to
        the record; returns the outcome ('done', or the verdict's).
        ``refine``: a tune job's first pass is pushed; it goes back to pending as a refine job (outcome
        'refine'), fresh attempts. A refine job acked with ``refine`` is done: one full search is enough."""
        with self.store.write(txn) as t:
            job = self._leased_job(t, key, lease_id, holder)
            if refine and job.get("task", TUNE) == VERIFY:
                raise InvalidRecord("'refine' acks a tune job's first pass; a verification job is acked with its verdict")
            if refine and job.get("stage") != REFINE:
                self._set_state(t, job, PENDING, attempts=0, last_error="", stage=REFINE, outcome=REFINE)
                return REFINE
            outcome = DONE
            if job.get("task") == VERIFY:
                if not isinstance(verdict, dict):
                    raise InvalidRecord("acking a verification job needs a 'verdict': {'run_secs': [...] or null, 'reason': '...'}")
                outcome = self.store.verdict(job["record_key"], job["trace_id"], job.get("lease_owner", ""), verdict.get("run_secs"),
                                             str(verdict.get("reason", "")), self.tolerance, flushed_secs=verdict.get("flushed_secs"), txn=t)  # fmt: skip
            searched = {"searches": int(job.get("searches", 0)) + 1} if job.get("task", TUNE) == TUNE else {}  # a search ended (not a first pass)
            self._set_state(t, job, DONE, last_error="", outcome=outcome, **searched)
            return outcome

    def fail(self, key: str, lease_id: str, error: str, *, holder: str | None = None, txn: lmdb.Transaction | None = None) -> str:
        """Give a job back after an error; dead once it used its attempts. Returns the new state."""
        with self.store.write(txn) as t:
            job = self._leased_job(t, key, lease_id, holder)
            state = DEAD if job["attempts"] >= self.max_attempts else PENDING
            self._set_state(t, job, state, last_error=error[:4000])
            return state

    def release(self, key: str, lease_id: str, reason: str, *, holder: str | None = None, txn: lmdb.Transaction | None = None) -> None:
        """Give a job back unfinished (a worker shutting down): pending again, the attempt not counted."""
        with self.store.write(txn) as t:
            job = self._leased_job(t, key, lease_id, holder)
            self._set_state(t, job, PENDING, attempts=max(0, job["attempts"] - 1), last_error=f"released: {reason}"[:4000])

    def requeue(self, key: str, *, txn: lmdb.Transaction | None = None) -> None:
        """Put a dead or done job back to pending with fresh attempts (an operator's action)."""
        with self.store.write(txn) as t:
            job = self._get(t, key)
            if job is None:
                raise NotFound(f"no queue job for key {key}: never queued, or an ended job its requester's history no longer keeps "
                               "(the next miss report of it queues it again)")
            self._set_state(t, job, PENDING, attempts=0, stage="")

    def hand_over(self, key: str, of: str, *, txn: lmdb.Transaction | None = None) -> str:
        """Take caller ``of`` (being forgotten) out of a job: a tune job awaiting work that others asked for too passes to the
        next of them, its turn kept ('handed over'); any other job of its requester's is dropped ('dropped'); one awaiting
        work that it only asked for counts it no more ('left'); '' where ``of`` had no part in it."""
        with self.store.write(txn) as t:
            job = self._get(t, key)
            if job is None:
                return ""
            others = [name for name in job.get("asked_by", ()) if name != of]
            if requester(job) != of:
                if len(others) == len(job.get("asked_by", ())) or job["state"] not in AWAITING:  # an ended job is its requester's history
                    return ""
                old = self._index_key(job)
                job["asked_by"] = others
                self._save(t, job, old)
                return "left"
            if job.get("task", TUNE) != TUNE or job["state"] not in AWAITING or not others:
                return "dropped" if self.drop(key, of=of, txn=t) else ""
            old = self._index_key(job)
            meta = self.store.dbs["meta"]
            add_count(t, meta, awaiting_row(TUNE, of), -1)
            add_count(t, meta, awaiting_row(TUNE, others[0]), +1)
            job.update(requester=others[0], asked_by=others)
            self._save(t, job, old)
            return "handed over"

    def drop(self, key: str, *, of: str | None = None, txn: lmdb.Transaction | None = None) -> bool:
        """Delete a job whatever its state, if it is requester ``of``'s when named (an admin forgetting its requester;
        a worker holding its lease is told it is lost); whether it was there."""
        with self.store.write(txn) as t:
            job = self._get(t, key)
            if job is None or (of is not None and of != requester(job)):
                return False
            if (index := self._index_key(job)) is not None:
                self._unindex(t, job, index)
            if job["state"] in AWAITING:
                add_count(t, self.store.dbs["meta"], awaiting_row(job.get("task", TUNE), requester(job)), -1)
            self.store.unkeep(t, job)
            self.store.drop_queue_job(t, key.encode())
            return True

    def peek(self, key: str, *, txn: lmdb.Transaction | None = None) -> dict[str, Any] | None:
        """The key's tune job as stored, or None (no raise: a network's kernels may have no job)."""
        if txn is not None:
            return self._get(txn, key)
        with self.store.read() as t:
            return self._get(t, key)

    def refine_again(self, identity: Identity, *, by: str, txn: lmdb.Transaction | None = None) -> bool:
        """One more search of a kernel that has records (a network's bottleneck, ``_networks``): its ended job pending again
        in the refine stage, at ``by``'s next turn (one is made for a kernel tuned outside the queue). Returns whether it was
        requeued: not while it awaits work already, nor when it died."""
        with self.store.write(txn) as t:
            job = self._get(t, identity.key)
            if job is None:  # tuned outside the queue (schedhub tune, a push): that was one search
                self.report(identity, by=by, txn=t)
                job = self._get(t, identity.key)
                if job is not None:
                    job.setdefault("searches", 1)
            if job is None or job["state"] != DONE or job.get("task", TUNE) != TUNE:
                return False
            self._set_state(t, job, PENDING, attempts=0, last_error="", stage=REFINE, turn=self._next_turn(t, requester(job)))
            return True

    def satisfy(self, key: str, *, txn: lmdb.Transaction | None = None) -> None:
        """A record arrived for the key: a pending job for it has nothing left to do (unless it
        is a refine job: a first pass pushed records and asked for the search still)."""
        with self.store.write(txn) as t:
            job = self._get(t, key)
            if job is not None and job["state"] == PENDING and job.get("stage") != REFINE:
                self._set_state(t, job, DONE)

    def get(self, key: str) -> dict[str, Any]:
        """One job, whole (workload included), as callers see it."""
        with self.store.read() as t:
            job = self._get(t, key)
        if job is None:
            raise NotFound(f"no queue job for key {key}")
        return self._view(job, time.time())

    def jobs(self, state: str | None = None, limit: int = 1000, after: str = "") -> list[dict[str, Any]]:
        """Job summaries (no workload, trace or lease id) in id order after ``after``: one page.

        A state's page reads that state's index (and the expired leases, shown as given back), not the
        whole queue: a page of the few dead jobs among a million pending ones costs the page.
        """
        now = time.time()
        with self.store.read() as t:
            if state is None or not self.store.indexed(t, QUEUE_STATES):
                return self._scan(t, state, limit, after, now)
            expired = self._expired_leases(t, now)
            given_back = sorted(k for k, view in expired.items() if view["state"] == state and k > after)
            prefix = state.encode() + b"\0"
            cursor = t.cursor(db=self._states)
            found = cursor.set_range(prefix + (after.encode() + b"\0" if after else b""))

            def indexed() -> Iterator[str]:
                for row in cursor.iternext(values=False) if found else ():
                    if not row.startswith(prefix):
                        return
                    yield row[len(prefix) :].decode()

            out: list[dict[str, Any]] = []
            for job_id in heapq.merge(indexed(), given_back):
                view = expired.get(job_id) or self._view(self._get(t, job_id), now, summary=True)
                if view["state"] == state:
                    out.append(view)
                    if len(out) >= limit:
                        break
            return out

    def _scan(self, t: lmdb.Transaction, state: str | None, limit: int, after: str, now: float) -> list[dict[str, Any]]:
        """A page of jobs read in id order (every job, or a read-only store from before the state index)."""
        out: list[dict[str, Any]] = []
        cursor = t.cursor(db=self._jobs)
        if not cursor.set_range(after.encode() + b"\0" if after else b""):
            return out
        for _, raw in cursor:
            job = self._view(unpackb(raw), now, summary=True)
            if state is None or job["state"] == state:
                out.append(job)
                if len(out) >= limit:
                    break
        return out

    def most_wanted(self, limit: int = 10) -> list[dict[str, Any]]:
        """The first ``limit`` pending jobs in lease order (:meth:`in_lease_order`)."""
        return self.in_lease_order(limit)[0]

    def in_lease_order(self, limit: int, after: bytes = b"") -> tuple[list[dict[str, Any]], bytes | None]:
        """Pending jobs in the order the queue hands them out (verifications, first passes, refinements; each in its rank),
        after the one whose index row is ``after``: at most ``limit``, and the row to go on after (None at the end). A
        worker's own order leaves out what it cannot take and lets a tune job go first after a run of verifications."""
        out: list[dict[str, Any]] = []
        last: bytes | None = None
        with self.store.read() as t:
            cursor = t.cursor(db=self._idx)
            for lane in _LANE_PREFIXES[_LANE_PREFIXES.index(after[:1]) if after else 0 :]:
                found = cursor.set_range(after + b"\0" if after[:1] == lane else lane)
                while found and cursor.key().startswith(lane):
                    if len(out) == limit:
                        return out, last
                    last = bytes(cursor.key())
                    if (job := self._get(t, last[1 + 2 * _U64.size :].decode())) is not None:
                        out.append(self._view(job, time.time(), summary=True))
                    found = cursor.next()
        return out, None

    def counts(self) -> dict[str, int]:
        """Jobs per state as callers see them: the stored counts, expired leases moved to what they became."""
        now = time.time()
        with self.store.read() as t:
            if not self.store.indexed(t, QUEUE_STATES):
                counts = dict.fromkeys(STATES, 0)
                for _, raw in t.cursor(db=self._jobs):
                    counts[self._view(unpackb(raw), now, summary=True)["state"]] += 1
                return counts
            counts = {s: self.store.queue_count(t, s) for s in STATES}
            for view in self._expired_leases(t, now).values():
                counts[LEASED] -= 1
                counts[view["state"]] += 1
            return counts


def lease_order_cursor(text: str) -> bytes:
    """A cursor of :meth:`MissQueue.in_lease_order` from its text (the hex of a pending job's index row); raises
    InvalidRecord for anything else."""
    try:
        row = bytes.fromhex(text)
    except ValueError:
        row = b""
    if len(row) != 1 + 2 * _U64.size + 64 or row[:1] not in _LANE_PREFIXES or not all(c in b"0123456789abcdef" for c in row[-64:]):
        raise InvalidRecord("'after' must be the 'next' of an earlier page in lease order")
    return row


def task_label(job: dict[str, Any]) -> str:
    """A job's task as listings show it: ``tune (refine)`` once its first pass is pushed and its search is left."""
    return job.get("task", TUNE) + (f" ({REFINE})" if job.get("stage") == REFINE else "")


def fit(fingerprint: str, kind: str, device: str) -> bytes:
    """Which workers can take a job, as 8 bytes: a digest of its compiler fingerprint, target kind and device model."""
    return hashlib.sha256(f"{fingerprint}\0{kind}\0{device}".encode()).digest()[:8]


def _fit_row(job: dict[str, Any], index: bytes | None) -> bytes | None:
    """A job's ``queue_fit`` row for its ``queue_idx`` row ``index`` (pending jobs only; None for any other)."""
    if index is None or index[:1] == b"L":
        return None
    return index[:1] + fit(job["fingerprint"], job["kind"], target_device(job["target"])) + index[1:]


def _rank(job: dict[str, Any]) -> int:
    """Where a pending job sorts in its lane (smaller first): a tune job by its turn, then its callers and its demand, most
    first; a verification by its ordinal (its requester's jobs awaiting before it), then its demand."""
    if job.get("task") == VERIFY:
        return (min(int(job.get("ordinal", 0)), 0xFFFF) << 16) | (0xFFFF - min(job["demand"], 0xFFFF))
    return (min(int(job.get("turn", 0)), MAX_TURN) << 20) | ((0xFF - min(callers(job), 0xFF)) << 12) | (0xFFF - min(job["demand"], 0xFFF))


def _pending_prefix(job: dict[str, Any]) -> bytes:
    """Where a pending job sorts: verifications, then tune jobs awaiting a first pass, then refinements."""
    if job.get("task") == VERIFY:
        return b"V"
    return b"R" if job.get("stage") == REFINE else b"P"


def _suits(job: dict[str, Any], fingerprint: str | None, kind: str | None, device: str | None) -> bool:
    """Whether a worker of this compiler, target kind and device model can do ``job``."""
    return ((fingerprint is None or job["fingerprint"] == fingerprint) and (kind is None or job["kind"] == kind)
            and (device is None or target_device(job["target"]) in ("", device)))  # fmt: skip
