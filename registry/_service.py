"""LocalRegistry: the registry's operations over one LMDB root, in this process.

It is both the embedded default (the hook and the worker use a local directory directly) and
the engine behind the HTTP server. :class:`schedhub.registry.RegistryClient` offers the same
method names over HTTP, so callers take either.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import lmdb

from ._queue import Lease, MissQueue
from ._records import Identity, Record
from ._store import KeySummary, PutResult, Store


class LocalRegistry:
    """Records, miss queue and statistics of one store root."""

    def __init__(self, root: str | os.PathLike[str], *, readonly: bool = False, sync: bool = True,
                 top_k: int | None = None, max_attempts: int | None = None) -> None:  # fmt: skip
        kwargs: dict[str, Any] = {"readonly": readonly, "sync": sync}
        if top_k is not None:
            kwargs["top_k"] = top_k
        self.store = Store(root, **kwargs)
        self.queue = MissQueue(self.store) if max_attempts is None else MissQueue(self.store, max_attempts)

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

    def get(self, key: str) -> list[Record]:
        return [Record.from_bytes(b) for b in self.store.get(key)]

    def lookup_raw(self, keys: list[str]) -> dict[str, list[bytes]]:
        return self.store.get_many(keys)

    def lookup(self, keys: list[str]) -> dict[str, list[Record]]:
        return {k: [Record.from_bytes(b) for b in v] for k, v in self.store.get_many(keys).items()}

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def put_many(self, records: Iterable[Record], pushed_by: str = "", *, txn: lmdb.Transaction | None = None) -> list[PutResult]:
        """Store records in one transaction; a pending miss for their key is done."""
        with self.store.write(txn) as t:
            results = [self.store.put(r, pushed_by, txn=t) for r in records]
            for key in {r.key for r in results}:
                self.queue.satisfy(key, txn=t)
            return results

    def put(self, record: Record, pushed_by: str = "") -> PutResult:
        return self.put_many([record], pushed_by)[0]

    def quarantine(self, key: str, trace_id: str, reason: str, *, txn: lmdb.Transaction | None = None) -> bool:
        """Take a record that failed to replay out of service (the next miss report re-queues its key)."""
        return self.store.quarantine(key, trace_id, reason, txn=txn)

    def summaries(self, op: str | None = None, target: str | None = None, since: int = 0, limit: int | None = None) -> list[KeySummary]:
        return self.store.summaries(op, target, since, limit)

    def iter_raw(self, op: str | None = None, target: str | None = None, since: int = 0, page: int = 256) -> Iterator[tuple[KeySummary, list[bytes]]]:
        """Every matching key with its records' bytes, paged through the change feed."""
        while True:
            batch = self.summaries(op, target, since, page)
            if not batch:
                return
            found = self.store.get_many([s.key for s in batch])
            for s in batch:
                if s.key in found:
                    yield s, found[s.key]
            since = batch[-1].seq
            if op:  # the op index is read whole in one call
                return

    # -- queue -----------------------------------------------------------------------------

    def report_misses(self, misses: Iterable[Identity], *, txn: lmdb.Transaction | None = None) -> list[dict[str, Any]]:
        with self.store.write(txn) as t:
            return [self.queue.report(m, txn=t) for m in misses]

    def lease(
        self, worker: str, max_jobs: int = 1, lease_secs: float = 300.0, *, fingerprint: str | None = None,
        kind: str | None = None, txn: lmdb.Transaction | None = None,
    ) -> list[Lease]:
        return self.queue.lease(worker, max_jobs, lease_secs, fingerprint=fingerprint, kind=kind, txn=txn)

    def renew(self, key: str, lease_id: str, lease_secs: float = 300.0, *, txn: lmdb.Transaction | None = None) -> float:
        return self.queue.renew(key, lease_id, lease_secs, txn=txn)

    def ack(self, key: str, lease_id: str, *, txn: lmdb.Transaction | None = None) -> None:
        self.queue.ack(key, lease_id, txn=txn)

    def fail(self, key: str, lease_id: str, error: str, *, txn: lmdb.Transaction | None = None) -> str:
        return self.queue.fail(key, lease_id, error, txn=txn)

    def requeue(self, key: str, *, txn: lmdb.Transaction | None = None) -> None:
        self.queue.requeue(key, txn=txn)

    def jobs(self, state: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        return self.queue.jobs(state, limit)

    def stats(self) -> dict[str, Any]:
        return {**self.store.stats(), "queue": self.queue.counts()}
