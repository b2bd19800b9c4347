"""LocalRegistry: the registry's operations over one LMDB root, in this process.

It is both the embedded default (the hook and the worker use a local directory directly) and
the engine behind the HTTP server. :class:`schedhub.registry.RegistryClient` offers the same
method names over HTTP, so callers take either.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import lmdb

from ._errors import REFUSED_ON_READ, TooManyRequests
from ._forget import Step, forget, forget_steps
from ._history import DEFAULT_KEPT_BYTES
from ._queue import DEFAULT_MAX_ATTEMPTS, DEFAULT_TOLERANCE, TUNE, Lease, MissQueue, lease_order_cursor
from ._models import CostModelEntry, CostModelStore
from ._networks import NetworkBook, parse_goal, parse_kernels, parse_name
from ._neighbours import Candidate, Probe, served_candidates
from ._records import Identity, Record, RefusedRecord, served_records
from ._listing import KeyPage, KeySummary
from ._store import PutResult, Store
from ._trials import TrialLog, TrialStore, iter_pages
from ._trust import Accepts, Trust, trust_filter, trusted
from ._usage import largest, usage_page


class LocalRegistry:
    """Records, miss queue and statistics of one store root."""

    def __init__(self, root: str | os.PathLike[str], *, readonly: bool = False, sync: bool = True, top_k: int | None = None,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, tolerance: float = DEFAULT_TOLERANCE, map_size: int | None = None,
                 kept_bytes: int = DEFAULT_KEPT_BYTES) -> None:  # fmt: skip
        """``kept_bytes``: how much of each caller's ended work (jobs, records taken out of service) is kept; past it, its oldest go."""
        kwargs: dict[str, Any] = {"readonly": readonly, "sync": sync, "kept_bytes": kept_bytes}
        if top_k is not None:
            kwargs["top_k"] = top_k
        if map_size is not None:  # default: SCHEDHUB_MAP_SIZE, else 64 GiB (the first handle on a path in a process sets it)
            kwargs["map_size"] = map_size
        self.store = Store(root, **kwargs)
        self.queue = MissQueue(self.store, max_attempts, tolerance)
        self.trial_store = TrialStore(self.store)
        self.model_store = CostModelStore(self.store)
        self.networks = NetworkBook(self.store, self.queue)

    @property
    def location(self) -> str:
        return str(self.store.root)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> LocalRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- records ---------------------------------------------------------------------------

    def get_raw(self, key: str) -> list[bytes]:
        return self.store.get(key)

    def get(self, key: str, refused: list[RefusedRecord] | None = None) -> list[Record]:
        return self.lookup([key], refused=refused).get(key, [])

    def lookup_entries(self, keys: list[str], top: int | None = None) -> dict[str, list[tuple[bytes, dict[str, Any]]]]:
        """(canonical bytes, status) of the best ``top`` records of every key that has some."""
        return self.store.entries_many(keys, top)

    def lookup_entries_within(self, keys: list[str], top: int | None, max_bytes: int) -> dict[str, list[tuple[bytes, dict[str, Any]]]] | None:
        """:meth:`lookup_entries`, or None where the keys' stored values hold more than ``max_bytes``."""
        return self.store.entries_within(keys, top, max_bytes)

    def lookup_raw(self, keys: list[str]) -> dict[str, list[bytes]]:
        return self.store.get_many(keys)

    def lookup(self, keys: list[str], top: int | None = None, refused: list[RefusedRecord] | None = None, weighing: Collection[str] = ()) -> dict[str, list[Record]]:
        """Records of many keys, best first, each with its ``served`` status (owner, verifier); a stored record
        this version refuses is left out and appended to ``refused`` (a key with none left is a miss). ``weighing``:
        what a served registry counts apart (a local store counts no lookups)."""
        found = ((k, served_records(v, refused)) for k, v in self.store.entries_many(keys, top).items())
        return {k: records for k, records in found if records}

    def neighbours(self, probes: list[Probe], per_key: int = 4, accepts: Accepts | None = None) -> dict[str, list[tuple[bytes, dict[str, Any], str, float]]]:
        """(record bytes, status, relation, distance) of each probe's nearest neighbours that ``accepts``, nearest first."""
        return self.store.neighbours(probes, per_key, accepts)

    def lookup_with_candidates(self, identities: list[Identity], top: int | None = None, per_key: int = 4,
                               refused: list[RefusedRecord] | None = None, trust: Trust = "any",
                               exact_only: Sequence[Identity] = ()) -> tuple[dict[str, list[Record]], dict[str, list[Candidate]]]:  # fmt: skip
        """Records of every key that has some and, for each key that has none ``trust`` accepts, candidates to
        transfer that it accepts (a stored record this version refuses is left out and appended to ``refused``);
        ``exact_only``: keys whose records are asked in the same request, without candidates."""
        found = self.lookup(list(dict.fromkeys([i.key for i in identities] + [i.key for i in exact_only])), top, refused)
        accepts = trusted(trust)
        served = trust_filter(trust)
        probes = [Probe.of(i) for i in identities if not any(served(r) for r in found.get(i.key, []))]
        near = self.neighbours(probes, per_key, accepts) if probes and per_key > 0 else {}
        return found, served_candidates(near, refused)

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def put_many(self, records: Iterable[Record], pushed_by: str = "", *, verified: bool = True, claim_limit: int | None = None,
                 bytes_limit: int | None = None, txn: lmdb.Transaction | None = None) -> list[PutResult]:  # fmt: skip
        """Store records in one transaction; a pending miss for their key is done.

        ``verified``: the pusher vouches for the measurements (a local store's owner, a trusted
        worker). Otherwise each new record is a claim, and its verification is queued.
        ``claim_limit``: the most verifications the pusher may have awaiting (its claims, its complaints); a push
        that would queue more stores nothing and raises :class:`TooManyRequests` (a server's bound, not a local store's).
        ``bytes_limit``: the most bytes of records in service the pusher may own; a push that would grow them past it
        stores nothing and raises :class:`TooManyRequests` too.
        """
        return self._put_each(((r, pushed_by, verified, None) for r in records), txn, claim_limit, bytes_limit)

    def mirror(self, records: Iterable[Record], *, txn: lmdb.Transaction | None = None) -> list[PutResult]:
        """Store records fetched from another registry (with their ``served`` status) as that registry
        holds them: a verified record stays verified, by its verifier at its verified time; a claim stays
        its pusher's claim (its verification queued here). A record without a status is a claim."""

        def vouched(record: Record) -> tuple[Record, str, bool, tuple[str, float, float] | None]:
            s = record.served
            if s is None:
                return record, "", False, None
            ok = s.verified and math.isfinite(s.verified_secs) and s.verified_secs > 0
            return record, s.pushed_by, ok, (s.verified_by, s.verified_secs, s.verified_flushed_secs) if ok else None

        return self._put_each(map(vouched, records), txn)

    def _put_each(self, items: Iterable[tuple[Record, str, bool, tuple[str, float, float] | None]], txn: lmdb.Transaction | None,
                  claim_limit: int | None = None, bytes_limit: int | None = None) -> list[PutResult]:  # fmt: skip
        """(record, pusher, verified, verifier) into the store in one transaction; claims queue their
        verification, and a pending miss of a key that got a record is done."""
        with self.store.write(txn) as t:
            results = []
            for record, pushed_by, verified, verifier in items:
                owned = self.store.owned_bytes(t, pushed_by) if bytes_limit is not None else 0
                result = self.store.put(record, pushed_by, verified=verified, verifier=verifier, txn=t)
                if bytes_limit is not None and (now := self.store.owned_bytes(t, pushed_by)) > max(owned, bytes_limit):
                    raise TooManyRequests(f"this push would give {pushed_by!r} {now:,} bytes of records in service, over the {bytes_limit:,} "
                                          "this registry keeps for one pusher; nothing of it was stored (an admin may raise the bound "
                                          "or take records out)")
                if result.needs_verification:
                    self.queue.enqueue_verify(record, pushed_by, "new claim", limit=claim_limit, txn=t)
                results.append(result)
            for key in {r.key for r in results}:
                self.queue.satisfy(key, txn=t)
            return results

    def put(self, record: Record, pushed_by: str = "", *, verified: bool = True) -> PutResult:
        return self.put_many([record], pushed_by, verified=verified)[0]

    def complain(self, key: str, trace_id: str, reason: str, who: str = "local", *, limit: int | None = None,
                 txn: lmdb.Transaction | None = None) -> dict[str, Any] | None:  # fmt: skip
        """A client saw a record fail (replay, build, bounds): noted, and its verification queued.

        The record stays in service until the verification confirms the failure (or an admin
        quarantines it); returns its status, None when the registry has no such record. A stored record
        that this registry's own checks refuse (stored before a check existed) needs no verification:
        it is quarantined at once, on the registry's judgement, not the complainer's. ``limit``: the most
        verifications the complainer may have awaiting (a server's bound; past it nothing is noted or queued).
        """
        with self.store.write(txn) as t:
            status = self.store.complain(key, trace_id, who, txn=t)
            found = self.store.entry(key, trace_id, txn=t)
            if status is None or found is None:
                return None
            try:
                record = Record.from_bytes(found[0])
            except REFUSED_ON_READ as exc:
                self.store.quarantine(key, trace_id, f"fails the registry's checks: {str(exc)[:300]}", txn=t)
                return {**status, "quarantined": True}
            job = self.queue.enqueue_verify(record, status["by"], f"complaint by {who}: {reason}", by=who, limit=limit, txn=t)
            return {**status, "verify_job": job["key"]}

    def quarantine(self, key: str, trace_id: str, reason: str, *, txn: lmdb.Transaction | None = None) -> bool:
        """Take a record out of service (an admin's decision; the next miss report re-queues its key)."""
        return self.store.quarantine(key, trace_id, reason, txn=txn)

    def forget(self, name: str, *, verified: bool = False) -> dict[str, int]:
        """Take out what caller ``name`` left behind (an admin's step after revoking its token): its claims (with
        ``verified``, its verified records too), the queue jobs it asked for, its measurement log and its ended work,
        a short write transaction at a time. How many of each went."""
        return forget(self.store, self.queue, self.trial_store, name, verified=verified)

    def forget_steps(self, name: str, *, verified: bool = False) -> Iterator[Step]:
        """:meth:`forget`'s write transactions, for a server to commit one at a time between other writes."""
        return forget_steps(self.store, self.queue, self.trial_store, name, verified=verified)

    def backup(self, folder: str | os.PathLike[str]) -> int:
        """A compacted, consistent copy of the whole store in ``folder`` (new or empty), taken while writers go on; its bytes."""
        return self.store.backup(folder)

    def callers(self, after: str = "", limit: int = 100) -> tuple[list[dict[str, Any]], bool]:
        """Callers after ``after`` (by name) that hold anything here, with what they hold (:data:`USAGE`); and whether more follow."""
        with self.store.read() as txn:
            return usage_page(txn, self.store.dbs["meta"], after, limit)

    def quarantined(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.store.quarantined(limit)

    def summaries(self, op: str | None = None, target: str | None = None, since: int = 0, limit: int | None = None,
                  *, newest: bool = False, prefix: str = "") -> list[KeySummary]:
        return self.store.summaries(op, target, since, limit, newest=newest, prefix=prefix)

    def page(self, op: str | None = None, target: str | None = None, since: int = 0, limit: int | None = None,
             *, newest: bool = False, prefix: str = "", scan: int | None = None) -> KeyPage:
        return self.store.page(op, target, since, limit, newest=newest, prefix=prefix, scan=scan)

    def iter_served(self, op: str | None = None, target: str | None = None, since: int = 0, page: int = 256,
                    refused: list[RefusedRecord] | None = None) -> Iterator[tuple[KeySummary, list[Record]]]:  # fmt: skip
        """Every matching key with its records, best first, each with its ``served`` status; paged through the
        change feed (a stored record this version refuses is left out and appended to ``refused``)."""
        while True:
            batch = self.summaries(op, target, since, page)
            if not batch:
                return
            found = self.lookup([s.key for s in batch], refused=refused)
            for s in batch:
                if s.key in found:
                    yield s, found[s.key]
            since = batch[-1].seq

    # -- measurement log -------------------------------------------------------------------

    def push_trials(self, log: TrialLog, pushed_by: str = "", *, verified: bool = True, claimed_bytes: int | None = None,
                    txn: lmdb.Transaction | None = None) -> dict[str, Any]:  # fmt: skip
        """Merge a tuner's measured trials into the log (``verified`` as for :meth:`put_many`; ``claimed_bytes``: the most
        bytes of unverified entries the pusher may have stored, a server's bound)."""
        return self.trial_store.put(log, pushed_by, verified=verified, claimed_bytes=claimed_bytes, txn=txn)

    def trial_logs(self, after: str = "", limit: int = 100, *, verified_only: bool = False, target: str = "",
                   structure: str = "") -> tuple[list[TrialLog], str, bool]:  # fmt: skip
        """One page of the log (``target``: a canonical target's entries only; ``structure``, with ``target``: one
        structure id's): (entries, cursor of the next page, whether there is more)."""
        return self.trial_store.page(after, limit, verified_only=verified_only, target=target, structure=structure)

    def iter_trial_logs(self, *, verified_only: bool = False, page: int = 100, target: str = "", structure: str = "") -> Iterator[TrialLog]:
        """Every entry of the log (of canonical ``target`` only, and its ``structure`` id only, when given), page by page."""
        yield from iter_pages(self.trial_logs, verified_only=verified_only, page=page, target=target, structure=structure)

    # -- served cost models ----------------------------------------------------------------

    def push_cost_model(self, entry: CostModelEntry, pushed_by: str = "", *, verified: bool = True, txn: lmdb.Transaction | None = None) -> dict[str, Any]:
        """Serve ``entry`` as its target's model for its compiler and feature set (``verified`` as for :meth:`put_many`)."""
        return self.model_store.put(entry, pushed_by, verified=verified, txn=txn)

    def cost_model(self, target: str, compiler: str, features: str) -> CostModelEntry | None:
        """The model served for canonical ``target``, ``compiler`` and ``features`` (None: none)."""
        return self.model_store.get(target, compiler, features)

    # -- queue -----------------------------------------------------------------------------

    def report_misses(self, misses: Iterable[Identity], *, by: str = "", limit: int | None = None,
                      txn: lmdb.Transaction | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """Queue (or add demand to) a tune job per missed workload, in one transaction. ``by``: who reports; ``limit``: the
        most tune jobs they may have queued and not yet tuned (a server's bound): past it nothing is queued."""
        with self.store.write(txn) as t:
            return [self.queue.report(m, by=by, limit=limit, txn=t) for m in misses]

    def report_network(self, kernels: list[tuple[str, int]], *, by: str = "", txn: lmdb.Transaction | None = None, name: str | None = None,
                       goal: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Keep the network one compile built: its kernels' keys and calls per forward pass, and optionally its name and
        the latency it aims at ({"label", "secs"}) (``_networks``)."""
        return self.networks.report(parse_kernels([{"key": k, "calls": c} for k, c in kernels]), by, txn, name=parse_name(name), goal=parse_goal(goal))

    def recent_networks(self) -> list[dict[str, Any]]:
        """The networks reported last and where each stands (``_networks.NetworkBook.recent``)."""
        return [n.to_dict() for n in self.networks.recent()]

    def refine_bottleneck(self, fingerprint: str, kind: str, device: str = "", *, by: str = "", txn: lmdb.Transaction | None = None) -> dict[str, Any] | None:
        """Requeue for one more search the kernel (of those a worker of ``fingerprint``, ``kind`` and ``device`` tunes) whose
        search is expected to lower a reported network's time most; what was requeued, or None when nothing is worth it."""
        pick = self.networks.bottleneck(fingerprint, kind, device, by, txn)
        return pick.to_dict() if pick is not None else None

    def lease(
        self, worker: str, max_jobs: int = 1, lease_secs: float = 300.0, *, fingerprint: str | None = None,
        kind: str | None = None, device: str | None = None, tasks: tuple[str, ...] = (TUNE,), holder: str | None = None,
        txn: lmdb.Transaction | None = None,
    ) -> list[Lease]:
        return self.queue.lease(worker, max_jobs, lease_secs, fingerprint=fingerprint, kind=kind, device=device, tasks=tasks, holder=holder, txn=txn)

    def renew(self, key: str, lease_id: str, lease_secs: float = 300.0, *, holder: str | None = None, txn: lmdb.Transaction | None = None) -> float:
        return self.queue.renew(key, lease_id, lease_secs, holder=holder, txn=txn)

    def ack(self, key: str, lease_id: str, verdict: dict[str, Any] | None = None, *, refine: bool = False, holder: str | None = None,
            txn: lmdb.Transaction | None = None) -> str:  # fmt: skip
        return self.queue.ack(key, lease_id, verdict, refine=refine, holder=holder, txn=txn)

    def fail(self, key: str, lease_id: str, error: str, *, holder: str | None = None, txn: lmdb.Transaction | None = None) -> str:
        return self.queue.fail(key, lease_id, error, holder=holder, txn=txn)

    def release(self, key: str, lease_id: str, reason: str, *, holder: str | None = None, txn: lmdb.Transaction | None = None) -> None:
        self.queue.release(key, lease_id, reason, holder=holder, txn=txn)

    def requeue(self, key: str, *, txn: lmdb.Transaction | None = None) -> None:
        self.queue.requeue(key, txn=txn)

    def job(self, key: str) -> dict[str, Any]:
        return self.queue.get(key)

    def jobs(self, state: str | None = None, limit: int = 1000, after: str = "") -> list[dict[str, Any]]:
        return self.queue.jobs(state, limit, after)

    def lease_order_page(self, limit: int = 100, after: str = "") -> tuple[list[dict[str, Any]], str | None]:
        """Pending jobs in the order the queue hands them out, after cursor ``after``: a page, and the cursor to go on from."""
        jobs, last = self.queue.in_lease_order(limit, lease_order_cursor(after) if after else b"")
        return jobs, last.hex() if last is not None else None

    def jobs_in_lease_order(self, limit: int = 1000) -> list[dict[str, Any]]:
        """The first ``limit`` pending jobs in the order the queue hands them out."""
        return self.lease_order_page(limit)[0]

    def stats(self) -> dict[str, Any]:
        return {**self.store.stats(), "queue": self.queue.counts(), "networks": self.networks.count()}

    def dashboard_data(self, recent: int = 20, top: int | None = None) -> dict[str, Any]:
        """What the dashboard shows beside the stats: aggregates (each dimension's ``top``), the newest log entries, the most wanted jobs, quarantine,
        the callers holding the most bytes, the networks reported last."""
        with self.store.read() as txn:
            callers, more = largest(txn, self.store.dbs["meta"], top or recent)
        served, read = self.store.served_speedups()
        return {"aggregates": self.store.aggregates(top), "recent": self.store.recent_log(recent), "wanted": self.queue.most_wanted(recent),
                "quarantined": self.store.quarantined(recent), "callers": callers, "more_callers": more, "served": served, "served_read": read,
                "networks": self.recent_networks()}  # fmt: skip

