"""The measurement log: every schedule a tuner measured for a key, not only the few it published.

A cost model that must tell a fast schedule from a slow one learns from both; the records are
only the winners. A tuner pushes its search's measured trials (trace and mean seconds) beside its
records; whoever trains a model reads them back page by page.

Bounded on every axis: per key, one entry per pusher (at most :data:`MAX_PUSHERS_PER_KEY`; a
trusted worker's push evicts the oldest claim when the key is full, a claim is refused), and an
entry keeps the newest :data:`MAX_TRIALS_PER_ENTRY` distinct traces within
:data:`MAX_ENTRY_BYTES`. Like records, a log pushed by a worker is *verified* (its pusher measured
side by side); anyone else's is a claim, and readers choose which they train on.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from ._counts import add_count, drop_counts
from ._errors import REFUSED_ON_READ, Forbidden, InvalidRecord, PayloadTooLarge, TooManyRequests
from ._keys import is_key, structure_key, target_digest
from ._limits import parse_each
from ._records import Identity, measured_secs, packb, trace_field, unpackb

MAX_TRIALS_PER_PUSH = 512
MAX_TRIALS_PER_ENTRY = 64
MAX_ENTRY_BYTES = 2 << 20
MAX_PUSHERS_PER_KEY = 8
MAX_CURSOR_CHARS = 1024  # hex of a log's database key (key, NUL, pusher name)
MAX_PAGE_BYTES = 8 << 20  # a page stops early past this many bytes of entries
TRIALS_BY_TARGET = b"index:trials_by_target"  # the store's meta flag: every trial log is in trials_by_target
TRIALS_BY_STRUCTURE = b"index:trials_by_structure"  # the store's meta flag: every trial log is in trials_by_structure
TRIALS_CLAIMED = b"index:trials_claimed"  # the store's meta flag: every pusher's bytes of unverified entries are counted
MAX_PAGE_SCAN = 10_000  # entries a page reads, kept or not: a filter may match nothing in a large log


@dataclass(frozen=True)
class Trial:
    """One measured schedule: MetaSchedule's trace JSON and its mean seconds per run."""

    trace: str
    secs: float

    @classmethod
    def from_obj(cls, obj: Any) -> Trial:
        if not isinstance(obj, dict) or set(obj) != {"trace", "secs"}:
            raise InvalidRecord("a trial must be a map with exactly 'trace' and 'secs'")
        return cls(trace_field(obj), measured_secs(obj["secs"], "secs"))

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "secs": self.secs}


@dataclass(frozen=True)
class TrialLog:
    """One pusher's measured trials of one workload (``pushed_by``/``verified``/``at``: as stored)."""

    identity: Identity
    trials: list[Trial]
    pushed_by: str = ""
    verified: bool = False
    at: float = 0.0

    @property
    def key(self) -> str:
        return self.identity.key

    @classmethod
    def from_obj(cls, obj: Any) -> TrialLog:
        """A push as it comes over the wire: ``{"identity": {…}, "trials": [{"trace", "secs"}, …]}``."""
        if not isinstance(obj, dict) or set(obj) - {"identity", "trials"}:
            raise InvalidRecord("a trial log must be a map of 'identity' and 'trials'")
        items = obj.get("trials")
        if not isinstance(items, list) or not items:
            raise InvalidRecord("field 'trials' must be a non-empty list")
        if len(items) > MAX_TRIALS_PER_PUSH:
            raise PayloadTooLarge(f"{len(items)} trials in one push; the limit is {MAX_TRIALS_PER_PUSH}")
        return cls(Identity.from_obj(obj.get("identity")), parse_each(items, Trial.from_obj, "trials"))

    def to_dict(self) -> dict[str, Any]:
        return {"identity": self.identity.to_dict(), "trials": [t.to_dict() for t in self.trials],
                "by": self.pushed_by, "verified": self.verified, "at": self.at}  # fmt: skip

    @classmethod
    def from_stored(cls, obj: Any, own_store: bool = False) -> TrialLog:
        """A stored or served entry (the form :meth:`to_dict` writes), validated again: readers trust no record.
        A trial this version's checks refuse (stored before a check existed) is left out; an entry left with none
        is refused. ``own_store``: the entry was read from this process's own store, where one written after these
        very checks passed on it (stamped :data:`CHECKED_BY`) has its traces read as they are. Never for a served
        entry: a server can stamp anything."""
        if not isinstance(obj, dict):
            raise InvalidRecord("a stored trial log must be a map")
        items = obj.get("trials")
        if not isinstance(items, list) or not 0 < len(items) <= MAX_TRIALS_PER_PUSH:
            raise InvalidRecord(f"a stored trial log's 'trials' must be a list of 1..{MAX_TRIALS_PER_PUSH}")
        read = _checked_trial if own_store and obj.get("checked") == CHECKED_BY else _readable_trial
        trials = [trial for trial in map(read, items) if trial is not None]
        if not trials:
            raise InvalidRecord("a stored trial log holds no trial this version reads")
        by, verified, at = obj.get("by", ""), obj.get("verified", False), obj.get("at", 0.0)
        if not isinstance(by, str) or not isinstance(verified, bool) or isinstance(at, bool) or not isinstance(at, (int, float)):
            raise InvalidRecord("a stored trial log's 'by', 'verified' and 'at' must be a string, a boolean and a number")
        return cls(Identity.from_obj(obj.get("identity")), trials, by[:256], verified, float(at))


def _checks_digest() -> str:
    """What this version's checks of a trial log are: the source of the modules that make them."""
    digest = hashlib.sha256()
    for name in ("_limits.py", "_records.py", "_trials.py", "_keys.py"):
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:32]


#: Stamped on each entry this store writes, whose trials passed this version's checks on their way in (:meth:`TrialStore.put`).
CHECKED_BY = _checks_digest()


def _checked_trial(item: Any) -> Trial | None:
    """A trial of an entry stored after this version's checks: its trace not parsed again."""
    if isinstance(item, dict) and isinstance(item.get("trace"), str) and isinstance(secs := item.get("secs"), float):
        return Trial(item["trace"], secs)
    return _readable_trial(item)


def _readable_trial(item: Any) -> Trial | None:
    try:
        return Trial.from_obj(item)
    except REFUSED_ON_READ:
        return None


def stored_logs(entries: Iterable[Any], own_store: bool = False) -> list[TrialLog]:
    """The entries of a page that this version reads (:meth:`TrialLog.from_stored`, ``own_store`` as there); one it
    refuses is left out, so one entry stored before a check existed does not cost every reader of the log its page."""
    logs = []
    for entry in entries:
        try:
            logs.append(TrialLog.from_stored(entry, own_store))
        except REFUSED_ON_READ:
            continue
    return logs


def merged(old: list[Trial], new: list[Trial]) -> list[Trial]:
    """``old`` then ``new`` (a trace pushed again takes its newer time and place), the newest
    :data:`MAX_TRIALS_PER_ENTRY` kept, then the oldest dropped until the entry fits :data:`MAX_ENTRY_BYTES`."""
    by_trace = {t.trace: t for t in old}
    for t in new:
        by_trace.pop(t.trace, None)
        by_trace[t.trace] = t
    kept = list(by_trace.values())[-MAX_TRIALS_PER_ENTRY:]
    size = sum(len(t.trace) + 16 for t in kept)
    while kept and size > MAX_ENTRY_BYTES:
        size -= len(kept.pop(0).trace) + 16
    return kept


class TrialStore:
    """The ``trials`` database of a :class:`~schedhub.registry.Store`: db key = record key, NUL, pusher name;
    ``trials_by_target`` holds each entry's db key under its target's digest (one target's entries, in db key order),
    ``trials_by_structure`` under its target's digest and its structure id (one structure's entries on a target: what
    a search's cost model starts from, without reading the rest of the target's log)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    @property
    def _db(self) -> Any:
        return self.store.dbs["trials"]

    @property
    def _index(self) -> Any:
        return self.store.dbs["trials_by_target"]

    @property
    def _structures(self) -> Any:
        return self.store.dbs["trials_by_structure"]

    def put(self, log: TrialLog, pushed_by: str, *, verified: bool, claimed_bytes: int | None = None,
            txn: lmdb.Transaction | None = None) -> dict[str, Any]:  # fmt: skip
        """Merge ``log`` into the pusher's entry for its key; returns ``{"key", "trials"}`` (the entry's count now).
        ``claimed_bytes``: the most bytes of unverified entries the pusher may have stored in all keys (a server's
        bound; None: any): past it :class:`TooManyRequests`, nothing changed."""
        name = pushed_by or "local"
        prefix = log.key.encode() + b"\0"
        by_target, by_structure = target_digest(log.identity.target), structure_row(log.identity)  # a key has one of each
        with self.store.write(txn) as t:
            raw_entries = dict(_prefixed(t, self._db, prefix))
            entries = {k: unpackb(v) for k, v in raw_entries.items()}
            mine = prefix + name.encode()
            old = TrialLog.from_stored(entries[mine], own_store=True) if mine in entries else None
            if old is None and len(entries) >= MAX_PUSHERS_PER_KEY:
                claims = sorted((v.get("at", 0.0), k) for k, v in entries.items() if not v.get("verified"))
                if not verified or not claims:
                    raise Forbidden(f"key {log.key} already holds the trial logs of {MAX_PUSHERS_PER_KEY} pushers")
                evicted = claims[0][1]
                self._count_claimed(t, evicted[len(prefix) :], -len(raw_entries[evicted]))
                t.delete(evicted, db=self._db)
                t.delete(by_target + evicted, db=self._index)
                t.delete(by_structure + evicted, db=self._structures)
            kept = old.trials if old is not None and old.verified == verified else []  # a change of trust starts the entry again
            trials = merged(kept, log.trials)
            stored = TrialLog(log.identity, trials, name, verified, time.time())
            value = packb({**stored.to_dict(), "checked": CHECKED_BY})  # its trials passed these checks: read without them
            if mine in raw_entries and not entries[mine].get("verified"):
                self._count_claimed(t, name.encode(), -len(raw_entries[mine]))
            if not verified:
                now = self._count_claimed(t, name.encode(), len(value))
                if claimed_bytes is not None and now > claimed_bytes:
                    raise TooManyRequests(f"this push would give {name!r} {now:,} bytes of unverified measurement log, over the "
                                          f"{claimed_bytes:,} this registry keeps for one pusher; nothing of it was stored")
            t.put(mine, value, db=self._db)
            t.put(by_target + mine, b"", db=self._index)
            t.put(by_structure + mine, b"", db=self._structures)
        return {"key": log.key, "trials": len(trials)}

    def drop(self, db_key: bytes, *, txn: lmdb.Transaction | None = None) -> bool:
        """Delete one pusher's entry of one key (``db_key``: key, NUL, pusher name) and its index row and count."""
        with self.store.write(txn) as t:
            raw = t.get(db_key, db=self._db)
            if raw is None:
                return False
            entry = unpackb(raw)
            if not entry.get("verified"):
                self._count_claimed(t, db_key[db_key.index(b"\0") + 1 :], -len(raw))
            identity = entry.get("identity")
            if isinstance(identity, dict) and isinstance(identity.get("target"), str):
                t.delete(target_digest(identity["target"]) + db_key, db=self._index)
            row = stored_structure_row(entry)
            if row is not None:
                t.delete(row + db_key, db=self._structures)
            t.delete(db_key, db=self._db)
            return True

    def _count_claimed(self, txn: lmdb.Transaction, pusher: bytes, delta: int) -> int:
        """Add ``delta`` to a pusher's bytes of unverified entries; returns the count now."""
        return add_count(txn, self.store.dbs["meta"], claimed_row(pusher), delta)[1]

    def page(self, after: str = "", limit: int = 100, *, verified_only: bool = False, target: str = "",
             structure: str = "") -> tuple[list[TrialLog], str, bool]:  # fmt: skip
        """Entries after the cursor ``after`` (hex, '' for the start), of canonical ``target`` only when
        given, and of its ``structure`` id only when given too: (logs, next cursor, more). A page reads at most
        :data:`MAX_PAGE_SCAN` entries, so one whose filters matched few says ``more`` with a cursor past every
        entry it read."""
        check_structure_filter(target, structure)
        if len(after) > MAX_CURSOR_CHARS:
            raise InvalidRecord(f"cursor 'after' is over {MAX_CURSOR_CHARS} characters")
        try:
            start = bytes.fromhex(after)
        except ValueError:
            raise InvalidRecord("cursor 'after' must be the hex 'next' of a previous page") from None
        if self._db is None:  # a read-only store from before the log
            return [], after, False
        logs: list[TrialLog] = []
        cursor_at, size, read, more = after, 0, 0, False
        with self.store.read() as txn:
            for db_key, raw in self._entries_after(txn, start, target, structure):
                if len(logs) >= limit or size > MAX_PAGE_BYTES or read >= MAX_PAGE_SCAN:
                    more = True
                    break
                cursor_at, read = db_key.hex(), read + 1
                entry = unpackb(raw)
                if verified_only and entry.get("verified") is not True:
                    continue
                if target and not (isinstance(entry.get("identity"), dict) and entry["identity"].get("target") == target):
                    continue
                found = stored_logs([entry], own_store=True)
                logs += [log for log in found if log.identity.structure == structure] if structure else found
                size += len(raw)
        return logs, cursor_at, more

    def _entries_after(self, txn: lmdb.Transaction, start: bytes, target: str, structure: str) -> Iterator[tuple[bytes, bytes]]:
        """(db key, entry) after ``start`` in db key order: ``target``'s (and ``structure``'s) from the narrowest
        index there is, else every entry."""
        index, head = self._db, b""
        if structure and self.store.indexed(txn, TRIALS_BY_STRUCTURE):
            index, head = self._structures, target_digest(target) + bytes.fromhex(structure)
        elif target and self.store.indexed(txn, TRIALS_BY_TARGET):
            index, head = self._index, target_digest(target)
        indexed = index is not self._db
        cursor = txn.cursor(db=index)
        found = cursor.set_range(head + start)
        if found and start and cursor.key() == head + start:
            found = cursor.next()
        while found and cursor.key().startswith(head):
            db_key = cursor.key()[len(head) :]
            raw = txn.get(db_key, db=self._db) if indexed else cursor.value()
            if raw is not None:
                yield bytes(db_key), bytes(raw)
            found = cursor.next()


def claimed_row(pusher: bytes) -> bytes:
    """The ``meta`` row counting a pusher's bytes of unverified log entries."""
    return b"trials_claimed:" + pusher


def count_claimed_bytes(txn: lmdb.Transaction, trials_db: Any, meta_db: Any) -> None:
    """Count every pusher's bytes of unverified log entries (once, on open, for a store from before the counts)."""
    drop_counts(txn, meta_db, claimed_row(b""))
    for db_key, raw in txn.cursor(db=trials_db):
        if not unpackb(raw).get("verified"):
            add_count(txn, meta_db, claimed_row(db_key[db_key.index(b"\0") + 1 :]), len(raw))


def structure_row(identity: Identity) -> bytes:
    """The head of an entry's ``trials_by_structure`` row: its target's digest, then its structure id (32 bytes)."""
    return _structure_head(identity.target, identity.workload, identity.schema)


def _structure_head(target: str, workload: str, schema: str) -> bytes:
    return target_digest(target) + bytes.fromhex(structure_key(target, workload, schema))


def stored_structure_row(entry: Any) -> bytes | None:
    """:func:`structure_row` of a stored entry, from the fields it was put under (as ``trials_by_target``'s row is), so
    that a drop finds the row whatever a later version's checks say of the entry (None: not an entry's identity)."""
    identity = entry.get("identity") if isinstance(entry, dict) else None
    if not isinstance(identity, dict) or not all(isinstance(identity.get(f), str) for f in ("target", "workload", "schema")):
        return None
    return _structure_head(identity["target"], identity["workload"], identity["schema"])


def check_structure_filter(target: str, structure: str) -> None:
    """A ``structure`` filter is a structure id (64 hex) and comes with its canonical ``target``."""
    if structure and not is_key(structure):
        raise InvalidRecord("filter 'structure' must be a structure id (64 lowercase hex)")
    if structure and not target.startswith("{"):
        raise InvalidRecord("filter 'structure' needs 'target', the canonical target it was tuned for (a structure id names an op on a target kind)")


def index_trial_structures(txn: lmdb.Transaction, trials_db: Any, index_db: Any) -> None:
    """Put every trial log in ``trials_by_structure`` (once, on open, for a store from before the index)."""
    txn.drop(index_db, delete=False)
    for db_key, raw in txn.cursor(db=trials_db):
        row = stored_structure_row(unpackb(raw))
        if row is not None:
            txn.put(row + db_key, b"", db=index_db)


def index_trial_targets(txn: lmdb.Transaction, trials_db: Any, index_db: Any) -> None:
    """Put every trial log in ``trials_by_target`` (once, on open, for a store from before the index)."""
    txn.drop(index_db, delete=False)
    for db_key, raw in txn.cursor(db=trials_db):
        identity = unpackb(raw).get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("target"), str):
            txn.put(target_digest(identity["target"]) + db_key, b"", db=index_db)


def iter_pages(fetch: Callable[..., tuple[list[TrialLog], str, bool]], *, verified_only: bool, page: int, target: str = "",
               structure: str = "") -> Iterator[TrialLog]:  # fmt: skip
    """Every entry, following ``fetch(after, limit, verified_only=…, target=…, structure=…)``'s cursors (a local
    store's or a client's)."""
    after = ""
    while True:
        logs, cursor, more = fetch(after, page, verified_only=verified_only, target=target, structure=structure)
        yield from logs
        if not more or cursor <= after:  # a cursor that does not advance would page forever
            return
        after = cursor


def _prefixed(txn: lmdb.Transaction, db: Any, prefix: bytes) -> list[tuple[bytes, bytes]]:
    cursor = txn.cursor(db=db)
    out = []
    if cursor.set_range(prefix):
        for k, v in cursor:
            if not k.startswith(prefix):
                break
            out.append((bytes(k), bytes(v)))
    return out
