"""LMDB store: top-k records per key, an op/target index, a change feed, a measurement log.

One environment per registry root, opened per process (never carried across fork). Every write
method takes an optional open write transaction, so a server can group many writes into one
durable commit; without one it opens and commits its own.
"""

from __future__ import annotations

import contextlib

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from ._errors import NotFound, RegistryError, StoreFull
from ._aggregates import AGG_RANK, KEY_DIMENSIONS, Aggregates, distinct_row, stored_identity
from ._decoded import DecodedValues
from ._listing import OP_FEED, OP_TARGET_FEED, TARGET_FEED, Listings, _op_feed_row, _target_feed_rows, ranked, warm_secs
from ._counts import COUNT as _COUNT, SEQ as _SEQ, add_count, drop_counts, read_count
from ._history import DEFAULT_KEPT_BYTES, ENDED, JOB, KEPT_INDEX, OUT_OF_SERVICE, forget_all, keep, kept_row, requester, unkeep
from ._keys import SCHEMA_VERSION, target_kind
from ._neighbours import Probe, dims_of
from ._trust import Accepts, accepts_entry
from ._records import Identity, Record, keeps_default_schedule, packb, unpackb
from ._trials import TRIALS_BY_STRUCTURE, TRIALS_BY_TARGET, TRIALS_CLAIMED, count_claimed_bytes, index_trial_structures, index_trial_targets

DEFAULT_MAP_SIZE = int(os.environ.get("SCHEDHUB_MAP_SIZE", 64 << 30))
DEFAULT_TOP_K = 8
MAX_COMPLAINANTS = 32
STORE_FORMAT = b"8"  # 2: op_feed and queue_state; 3: target_feed, trials_by_target, agg_rank; 4: target_feed by op too; 5: verifications
#                      queued by requester (queue_idx ranks them by ordinal), queue_fit, what callers have waiting and each pusher's
#                      bytes of unverified log counted; 6: each caller's ended work kept within a budget (``kept``) and each
#                      pusher's bytes of records in service counted; 7: queue_idx ranks tune jobs by the callers' turns,
#                      then their distinct callers, then their demand (8-byte ranks); 8: trials_by_structure. Older formats
#                      are brought to 8 when opened writable
_DB_NAMES = ("records", "by_op", "by_struct", "changes", "log", "meta", "quarantine", "queue", "queue_idx", "agg", "trials", "queue_state", "op_feed", "target_feed",
             "trials_by_target", "agg_rank", "models", "queue_fit", "kept", "networks", "trials_by_structure")
STRUCTURE_INDEX = b"index:by_struct"  # meta flag: every key is in by_struct (stores from before it get it on open)
AGGREGATES = b"index:agg"  # meta flag: the aggregates cover every key and log entry (stores from before them get them on open)
QUEUE_STATES = b"index:queue_state"  # meta flag: every job is in queue_state and counted (stores from before it get it on open)
RECORDS_OWNED = b"index:records_owned"  # meta flag: each pusher's bytes of records in service are counted (owned_row)
QUEUE_ORDER = b"index:queue_order"  # meta flag: queue_idx ranks verifications by ordinal and tune jobs by turn and callers,
#                                     requesters' jobs are counted and every pending job is in queue_fit (the queue rebuilds them)
INDEXES = {OP_FEED: "op_feed", QUEUE_STATES: "queue_state", TARGET_FEED: "target_feed", OP_TARGET_FEED: "target_feed",
           TRIALS_BY_TARGET: "trials_by_target", TRIALS_BY_STRUCTURE: "trials_by_structure", AGG_RANK: "agg_rank"}  # fmt: skip
#: What an upgrade rebuilds: the indexes a writer of that format did not keep (format 1 was written before by_struct and agg too).
_REBUILT_ON_UPGRADE = {b"1": (STRUCTURE_INDEX, AGGREGATES, *INDEXES, QUEUE_ORDER, TRIALS_CLAIMED, KEPT_INDEX, RECORDS_OWNED),
                       b"2": (TARGET_FEED, OP_TARGET_FEED, TRIALS_BY_TARGET, AGG_RANK, QUEUE_ORDER, TRIALS_CLAIMED, KEPT_INDEX, RECORDS_OWNED, TRIALS_BY_STRUCTURE),
                       b"3": (OP_TARGET_FEED, QUEUE_ORDER, TRIALS_CLAIMED, KEPT_INDEX, RECORDS_OWNED, TRIALS_BY_STRUCTURE),
                       b"4": (QUEUE_ORDER, TRIALS_CLAIMED, KEPT_INDEX, RECORDS_OWNED, TRIALS_BY_STRUCTURE),
                       b"5": (QUEUE_ORDER, KEPT_INDEX, RECORDS_OWNED, TRIALS_BY_STRUCTURE), b"6": (QUEUE_ORDER, TRIALS_BY_STRUCTURE),
                       b"7": (TRIALS_BY_STRUCTURE,)}  # fmt: skip
#: Aggregate dimensions: keys per op / canonical target / compiler fingerprint, pushes per pusher,
#: tuned-vs-default speedup per op of verified pushes (``speedup`` rows hold msgpack {n, log2_sum, best}).
MAX_NEIGHBOUR_SCAN = 4096  # index rows read for one probe
MAX_REQUEST_SCAN = 65536  # index rows read for one neighbours call
NEIGHBOUR_LOADS_PER_PICK = 4  # keys loaded per candidate wanted: default-schedule keys are skipped, but not without end


class StoreFormatError(RegistryError):
    """The directory holds an LMDB store of another format version."""


@dataclass(frozen=True)
class PutResult:
    key: str
    trace_id: str
    kept: bool  # the record is among the top-k of its key now
    rank: int  # its 0-based rank when kept, else -1
    best_secs: float
    verified: bool = False  # the entry is verified (now or before)
    needs_verification: bool = False  # a new claim: a verification job was (or should be) queued


def served_entries(value: bytes) -> list[tuple[bytes, dict[str, Any]]]:
    """A key's stored value as (canonical bytes, status) of its entries, best first."""
    decoded = unpackb(value)
    return [(e["rec"], entry_status(e)) for e in decoded["entries"]] if decoded else []


def entry_status(entry: dict[str, Any]) -> dict[str, Any]:
    """The public part of an entry's bookkeeping (who pushed it, who verified it)."""
    status = {"tid": entry["tid"], "by": entry.get("by", ""), "vby": entry.get("vby", ""),
              "vmean": entry.get("vmean", 0.0), "complaints": len(entry.get("complaints", []))}  # fmt: skip
    if entry.get("vfmean"):  # only where timed so: every lookup answers this map
        status["vfmean"] = entry["vfmean"]
    return status


class _SharedEnv:
    """One LMDB environment per store path per process, shared by every Store on that path.

    LMDB allows one open environment per file per process; a second ``lmdb.open`` raises. The
    process id is part of the key: an environment inherited across fork is never reused.
    """

    _open: dict[tuple[int, str], _SharedEnv] = {}
    _lock = threading.Lock()

    def __init__(self, path: str, env: lmdb.Environment, readonly: bool) -> None:
        self.path, self.env, self.readonly, self.refs = path, env, readonly, 0
        self.dbs = {name: _open_db(env, name, readonly) for name in _DB_NAMES}

    @classmethod
    def acquire(cls, root: Path, *, map_size: int, readonly: bool, sync: bool) -> _SharedEnv:
        path = os.path.realpath(root)
        with cls._lock:
            shared = cls._open.get((os.getpid(), path))
            if shared is None:
                shared = cls._open[(os.getpid(), path)] = cls._opened(path, map_size=map_size, readonly=readonly, sync=sync)
            elif shared.readonly and not readonly:
                raise RegistryError(f"the store at {path} is already open read-only in this process; close it before opening it writable")
            shared.refs += 1
            return shared

    @classmethod
    def _opened(cls, path: str, *, map_size: int, readonly: bool, sync: bool) -> _SharedEnv:
        """The environment at ``path`` opened; a file LMDB refuses (another kind of file, a damaged one, one it may not
        read) raises :class:`StoreFormatError` saying so, and nothing of it stays open."""
        try:
            env = lmdb.open(path, map_size=map_size, max_dbs=len(_DB_NAMES), readonly=readonly,
                            sync=sync, metasync=sync, lock=True, max_readers=512)  # fmt: skip
        except lmdb.Error as exc:
            raise StoreFormatError(f"{path} could not be opened as a schedhub store: {type(exc).__name__}: {exc}") from None
        foreign = _foreign_key(env)
        if foreign is not None:  # another program's LMDB: opened writable, its main database would gain ours
            env.close()
            raise StoreFormatError(f"{path} holds an LMDB database that is not a schedhub store (its main database holds {foreign!r}): nothing was written")
        try:
            return cls(path, env, readonly)
        except lmdb.Error as exc:
            env.close()
            raise StoreFormatError(f"{path} holds an LMDB file that is not a schedhub store: {type(exc).__name__}: {exc}") from None

    def release(self) -> None:
        with self._lock:
            self.refs -= 1
            if self.refs == 0:
                self._open.pop((os.getpid(), self.path), None)
                self.env.close()


class Store(Aggregates, Listings):
    """Records keyed by content address, kept best-first, at most ``top_k`` per key."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        readonly: bool = False,
        top_k: int = DEFAULT_TOP_K,
        per_pusher: int | None = None,
        sync: bool = True,
        kept_bytes: int = DEFAULT_KEPT_BYTES,
    ) -> None:
        self.root = Path(root)
        self.top_k = top_k
        self.kept_bytes = kept_bytes  # of each caller's ended work (jobs, records out of service): see _history
        self.per_pusher = per_pusher if per_pusher is not None else max(1, top_k // 4)
        self.readonly = readonly
        if not readonly:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not (self.root / "data.mdb").exists():
            raise NotFound(f"no schedhub store at {self.root} (data.mdb missing)")
        self._shared = _SharedEnv.acquire(self.root, map_size=map_size, readonly=readonly, sync=sync)
        self.env, self.dbs = self._shared.env, self._shared.dbs
        self._decoded: DecodedValues[list[tuple[bytes, dict[str, Any]]]] = DecodedValues(served_entries)  # reads skip decoding what they decoded before
        if not readonly:
            self._check_format()

    def _check_format(self) -> None:
        with self.env.begin(write=True) as txn:
            found = txn.get(b"format", db=self.dbs["meta"])
            if found is None:
                txn.put(b"format", STORE_FORMAT, db=self.dbs["meta"])
                txn.put(b"schema", SCHEMA_VERSION.encode(), db=self.dbs["meta"])
            elif found in _REBUILT_ON_UPGRADE:  # indexes an older writer may have left stale are rebuilt; it cannot write here again
                for flag in _REBUILT_ON_UPGRADE[found]:
                    txn.delete(flag, db=self.dbs["meta"])
                txn.put(b"format", STORE_FORMAT, db=self.dbs["meta"])
            elif found != STORE_FORMAT:
                raise StoreFormatError(f"{self.root} holds store format {found!r}; this schedhub reads {STORE_FORMAT!r} and upgrades {tuple(_REBUILT_ON_UPGRADE)!r}")
            rebuilds: tuple[tuple[tuple[bytes, ...], Callable[[lmdb.Transaction], None]], ...] = (  # in this order: each may read the ones before
                ((STRUCTURE_INDEX,), self._index_structures),
                ((AGGREGATES,), self._aggregate_all),
                ((AGG_RANK,), self._rank_all),
                ((OP_FEED, TARGET_FEED, OP_TARGET_FEED), self._index_feeds),
                ((TRIALS_BY_TARGET,), lambda t: index_trial_targets(t, self.dbs["trials"], self.dbs["trials_by_target"])),
                ((TRIALS_BY_STRUCTURE,), lambda t: index_trial_structures(t, self.dbs["trials"], self.dbs["trials_by_structure"])),
                ((TRIALS_CLAIMED,), lambda t: count_claimed_bytes(t, self.dbs["trials"], self.dbs["meta"])),
                ((QUEUE_STATES,), self._index_queue_states),
                ((KEPT_INDEX,), self._index_kept),
                ((RECORDS_OWNED,), self._count_owned),
            )
            for flags, rebuild in rebuilds:
                if any(txn.get(flag, db=self.dbs["meta"]) is None for flag in flags):
                    rebuild(txn)
                    for flag in flags:
                        txn.put(flag, b"1", db=self.dbs["meta"])

    def _index_structures(self, txn: lmdb.Transaction) -> None:
        """Put every key in the structure index (once, on open, for a store from before it or upgraded from format 1)."""
        txn.drop(self.dbs["by_struct"], delete=False)
        for raw_key, raw in txn.cursor(db=self.dbs["records"]):
            value = unpackb(raw)
            if value["entries"] and "st" not in value:
                identity = stored_identity(value["entries"][0]["rec"])
                if identity is None:  # refused on every read: a neighbour to nobody
                    continue
                _describe(value, identity)
                txn.put(raw_key, packb(value), db=self.dbs["records"])
            if value["entries"]:
                _put_structure(txn, self.dbs["by_struct"], raw_key.decode(), value)

    def _index_feeds(self, txn: lmdb.Transaction) -> None:
        """Put every key in its op's, kind's, target's, op and kind's, and op and target's feeds (once, on open, for a store from before them)."""
        for name in ("op_feed", "target_feed"):
            txn.drop(self.dbs[name], delete=False)
        for raw_key, raw in txn.cursor(db=self.dbs["records"]):
            self._feed(txn, unpackb(raw), raw_key)

    def _feed(self, txn: lmdb.Transaction, value: dict[str, Any], raw_key: bytes | None) -> None:
        """Put a key's rows in the op and target feeds at its change-feed position (``raw_key`` None: delete them)."""
        for db, row in (("op_feed", _op_feed_row(value["op"], value["seq"])), *(("target_feed", r) for r in _target_feed_rows(value))):
            if raw_key is None:
                txn.delete(row, db=self.dbs[db])
            else:
                txn.put(row, raw_key, db=self.dbs[db])

    def _index_queue_states(self, txn: lmdb.Transaction) -> None:
        """Index and count every queue job by its stored state (once, on open, for a store from before it)."""
        txn.drop(self.dbs["queue_state"], delete=False)
        drop_counts(txn, self.dbs["meta"], queue_count_row(""))
        counts: dict[str, int] = {}
        for raw_key, raw in txn.cursor(db=self.dbs["queue"]):
            state = unpackb(raw)["state"]
            txn.put(queue_state_row(state, raw_key), b"", db=self.dbs["queue_state"])
            counts[state] = counts.get(state, 0) + 1
        for state, count in counts.items():
            txn.put(queue_count_row(state), _COUNT.pack(count), db=self.dbs["meta"])

    def move_queue_job(self, txn: lmdb.Transaction, job_id: bytes, old: str | None, new: str) -> None:
        """Keep the ``queue_state`` index and counts in step with a job stored in state ``new`` (``old``: before; None when new)."""
        if old == new:
            return
        for state, delta in ((old, -1), (new, +1)):
            if state is not None:
                add_count(txn, self.dbs["meta"], queue_count_row(state), delta)
        if old is not None:
            txn.delete(queue_state_row(old, job_id), db=self.dbs["queue_state"])
        txn.put(queue_state_row(new, job_id), b"", db=self.dbs["queue_state"])

    def _index_kept(self, txn: lmdb.Transaction) -> None:
        """Keep every ended job and record out of service under its owner, oldest first, within the budget (once, on open,
        for a store from before ``kept``): a job's age is when it was last reported or queued, a record's when it went out."""
        forget_all(txn, self.dbs)
        ended: list[tuple[float, str, bytes, bytes, dict[str, Any]]] = []
        for job_id, raw in txn.cursor(db=self.dbs["queue"]):
            job = unpackb(raw)
            if job["state"] in ENDED:
                ended.append((job.get("ended_at", job.get("last_seen", job.get("first_seen", 0.0))), requester(job), JOB, job_id, job))
        for row, raw in txn.cursor(db=self.dbs["quarantine"]):
            item = unpackb(raw)
            ended.append((item["at"], item.get("by", ""), OUT_OF_SERVICE, row, item))
        for _, owner, kind, item_id, value in sorted(ended, key=lambda e: e[0]):
            self.keep(txn, owner, kind, item_id, value)

    def keep(self, txn: lmdb.Transaction, owner: str, kind: bytes, item_id: bytes, value: dict[str, Any]) -> None:
        """Store ``value`` (an ended job, a record out of service) as ``owner``'s, kept within the owner's budget
        (:attr:`kept_bytes`; its oldest kept items go, this one too if it alone is past it)."""
        value["kept"] = kept_row(owner, self.next_seq(txn, b"kept_seq"), kind, item_id)
        packed = packb(value)
        txn.put(item_id, packed, db=self.dbs["queue" if kind == JOB else "quarantine"])
        keep(txn, self.dbs, value["kept"], len(packed), self.kept_bytes, self.drop_kept)

    def unkeep(self, txn: lmdb.Transaction, value: dict[str, Any]) -> None:
        """``value`` (a job requeued, a record quarantined again) is no longer kept as ended work."""
        if (row := value.pop("kept", None)) is not None:
            unkeep(txn, self.dbs, row)

    def drop_kept(self, txn: lmdb.Transaction, kind: bytes, item_id: bytes) -> None:
        """Delete a kept item (its ``kept`` row is the caller's business)."""
        if kind == OUT_OF_SERVICE:
            txn.delete(item_id, db=self.dbs["quarantine"])
        else:
            self.drop_queue_job(txn, item_id)

    def drop_queue_job(self, txn: lmdb.Transaction, job_id: bytes) -> None:
        """Delete a queue job and its ``queue_state`` row and count (its lease and requester indexes are the queue's business)."""
        raw = txn.get(job_id, db=self.dbs["queue"])
        if raw is not None:
            state = unpackb(raw)["state"]
            add_count(txn, self.dbs["meta"], queue_count_row(state), -1)
            txn.delete(queue_state_row(state, job_id), db=self.dbs["queue_state"])
            txn.delete(job_id, db=self.dbs["queue"])

    def queue_count(self, txn: lmdb.Transaction, state: str) -> int:
        return read_count(txn, self.dbs["meta"], queue_count_row(state))

    def indexed(self, txn: lmdb.Transaction, flag: bytes) -> bool:
        """Whether the index ``flag`` names (:data:`INDEXES`) is complete here (a read-only store from before it lacks it)."""
        return self.dbs[INDEXES[flag]] is not None and txn.get(flag, db=self.dbs["meta"]) is not None

    def recent_log(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest entries of the measurement log, newest first."""
        out: list[dict[str, Any]] = []
        with self.read() as txn:
            cursor = txn.cursor(db=self.dbs["log"])
            if cursor.last():
                for _, raw in cursor.iterprev():
                    out.append(unpackb(raw))
                    if len(out) >= limit:
                        break
        return out

    def close(self) -> None:
        if self._shared is not None:
            self._shared.release()
            self._shared = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------------

    @contextmanager
    def write(self, txn: lmdb.Transaction | None = None) -> Iterator[lmdb.Transaction]:
        """Use ``txn`` when given, else a new write transaction committed on success. Either way the store's format is
        read again inside it: a process that opened the store before a newer schedhub upgraded it must not write in its
        old format (its writes would miss the indexes the new one keeps, whose flags say they are whole)."""
        if self.readonly:
            raise RegistryError(f"the store at {self.root} is open read-only")
        try:
            if txn is not None:
                self._refuse_other_format(txn)
                yield txn
                return
            with self.env.begin(write=True) as own:
                self._refuse_other_format(own)
                yield own
        except lmdb.MapFullError:  # every write fails until the operator acts: say what to do, not LMDB's advice to a programmer
            raise StoreFull(f"the registry's store is full (its LMDB map holds {self.env.info()['map_size']:,} bytes): nothing was "
                            "written; its operator must give it room (SCHEDHUB_MAP_SIZE, in bytes, read when a process opens it, and "
                            "the disk space behind it)") from None

    def _refuse_other_format(self, txn: lmdb.Transaction) -> None:
        found = txn.get(b"format", db=self.dbs["meta"])
        if found is not None and bytes(found) != STORE_FORMAT:
            raise StoreFormatError(f"{self.root} was upgraded to store format {bytes(found)!r} while this process had it open in format "
                                   f"{STORE_FORMAT!r}: nothing was written; restart it with the schedhub that upgraded the store")  # fmt: skip

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        with self.env.begin(buffers=False) as txn:
            yield txn

    def next_seq(self, txn: lmdb.Transaction, counter: bytes) -> int:
        raw = txn.get(counter, db=self.dbs["meta"])
        seq = (_SEQ.unpack(raw)[0] if raw else 0) + 1
        txn.put(counter, _SEQ.pack(seq), db=self.dbs["meta"])
        return seq

    # -- records ---------------------------------------------------------------------------
    #
    # A key's value holds its entries, best first. An entry is one trace: its owner ("by", the
    # first pusher), the claimed mean time of the owner's push ("mean"), and, once a trusted
    # worker replayed, checked and re-measured it, the verifier ("vby") and its mean ("vmean").
    # Where timed on flushed caches too, "fmean" is the claimed and "vfmean" the verified mean so.
    # Verified entries rank before claims (:func:`._listing.ranked`); each pusher holds at most
    # ``per_pusher`` unverified claims on a key, so no one pusher can crowd the others out of the top-k.

    def _load(self, txn: lmdb.Transaction, key: str) -> dict[str, Any] | None:
        raw = txn.get(key.encode(), db=self.dbs["records"])
        return unpackb(raw) if raw is not None else None

    def get(self, key: str) -> list[bytes]:
        """The canonical bytes of the key's records, best first; [] when none."""
        return [rec for rec, _ in self.entries_many([key]).get(key, [])]

    def get_many(self, keys: list[str]) -> dict[str, list[bytes]]:
        """Records of every key that has some, in one read transaction."""
        return {k: [rec for rec, _ in v] for k, v in self.entries_many(keys).items()}

    def entries_many(self, keys: list[str], top: int | None = None) -> dict[str, list[tuple[bytes, dict[str, Any]]]]:
        """For every key that has records: (canonical bytes, status) of its best ``top``, best first."""
        found = self.entries_within(keys, top, None)
        assert found is not None
        return found

    def entries_within(self, keys: list[str], top: int | None, max_bytes: int | None) -> dict[str, list[tuple[bytes, dict[str, Any]]]] | None:
        """:meth:`entries_many`, or None without decoding anything where the keys' stored values hold more than
        ``max_bytes`` in all: a server answers small reads where they are cheapest and takes large ones where they
        stall no one. The sizes are read in the same read transaction (a value is copied out before its size is known:
        a memcpy, up to a few ms for the largest a key holds)."""
        with self.read() as txn:
            stored: list[tuple[str, Any]] = []
            size = 0
            for key in keys:
                raw = txn.get(key.encode(), db=self.dbs["records"])
                if raw is None:
                    continue
                size += len(raw)
                if max_bytes is not None and size > max_bytes:
                    return None
                stored.append((key, raw))
            found: dict[str, list[tuple[bytes, dict[str, Any]]]] = {}
            for key, raw in stored:
                entries = self._decoded.get(key, raw)
                if entries:
                    found[key] = entries[:top]
        return found

    def filled(self) -> float:
        """How much of its LMDB map the store's file has grown to (0..1): pages freed inside it are reused, but the
        file never shrinks, so this is the high-water mark."""
        info = self.env.info()
        return (info["last_pgno"] + 1) * self.env.stat()["psize"] / info["map_size"]

    def held(self, txn: lmdb.Transaction | None = None) -> float:
        """How much of its LMDB map the store's data holds (0..1): the pages of every database's tree, as ``txn`` (a write
        transaction's own writes included) or a fresh read sees them. Deleting data lowers it, where :meth:`filled`
        never falls: LMDB reuses freed pages."""
        with contextlib.ExitStack() as stack:
            t = txn if txn is not None else stack.enter_context(self.read())
            pages = _META_PAGES + sum(_tree_pages(t.stat(db)) for db in self.dbs.values()) + _tree_pages(self.env.stat())
            return pages * self.env.stat()["psize"] / self.env.info()["map_size"]

    def exists(self, key: str) -> bool:
        with self.read() as txn:
            return txn.get(key.encode(), db=self.dbs["records"]) is not None

    def put(self, record: Record, pushed_by: str = "", *, verified: bool = False, verifier: tuple[str, float, float] | None = None,
            txn: lmdb.Transaction | None = None) -> PutResult:  # fmt: skip
        """Add a record to its key's entries (idempotent: one trace is one entry, owned by its first pusher).

        ``verified``: the pusher is trusted to have replayed, checked and measured it (a worker,
        an admin, a local store's owner); otherwise the record is a claim awaiting verification.
        ``verifier``: who verified it, its measured mean and its mean on flushed caches (0.0: not timed so), when that
        was not the pusher (a record copied from another registry keeps its verification); default the pusher, at the
        record's times. A trace someone else owns is not overwritten: a trusted re-push verifies it, or gives it the
        flushed time it lacked; any other re-push is only logged.
        """
        now = time.time()
        data = record.to_bytes()
        with self.write(txn) as t:
            key = record.key
            value = self._load(t, key) or {
                "op": record.identity.op, "target": record.identity.target,
                "kind": target_kind(record.identity.target), "seq": 0, "entries": [],
            }  # fmt: skip
            if "st" not in value:  # new, or stored before the structure index
                _describe(value, record.identity)
            entries: list[dict[str, Any]] = value["entries"]
            owned = _owned(entries)
            mine = next((e for e in entries if e["tid"] == record.trace_id), None)
            changed, new_claim = False, False
            if mine is None:
                mine = {"rec": data, "mean": record.mean_secs, "tid": record.trace_id, "at": now, "by": pushed_by, "vby": "", "vmean": 0.0, "complaints": [],
                        **_flushed("fmean", record.flushed_secs)}  # fmt: skip
                entries.append(mine)
                if verified:  # a claim's speedup is not counted: only what a trusted tuner or worker measured
                    self._add_speedup(t, value["op"], record)
                changed, new_claim = True, not verified
                claims = [e for e in entries if e.get("by") == pushed_by and not e.get("vby")]
                ranked(claims)
                for extra in claims[self.per_pusher :]:  # the pusher's worst claims beyond its share
                    entries.remove(extra)
            elif mine.get("by") == pushed_by and record.mean_secs < mine["mean"]:
                mine.update(rec=data, mean=record.mean_secs, at=now)
                mine.pop("fmean", None)
                mine.update(_flushed("fmean", record.flushed_secs))
                changed = True
            if verified:
                name, secs, flushed = verifier or (pushed_by or "local", record.mean_secs, record.flushed_secs or 0.0)
                if not mine.get("vby"):
                    mine.update(vby=name, vmean=secs, **_flushed("vfmean", flushed))
                    changed = True
                elif flushed and not mine.get("vfmean"):  # verified before flushed times were taken: now it has one
                    mine.update(vfmean=flushed)
                    changed = True
            ranked(entries)
            del entries[self.top_k :]
            kept = any(e is mine for e in entries)
            if changed:
                self._own(t, owned, _owned(entries))
                self._save(t, key, value)
            self._log(t, record, pushed_by, now, verified=verified)
            best = entries[0] if entries else mine
            return PutResult(key, record.trace_id, kept, entries.index(mine) if kept else -1, warm_secs(best),
                             verified=bool(mine.get("vby")), needs_verification=kept and new_claim)  # fmt: skip

    def _save(self, txn: lmdb.Transaction, key: str, value: dict[str, Any]) -> None:
        """Write a key's entries (its change-feed position moves to the head), or drop an empty key."""
        if value["entries"]:
            if not value["seq"]:
                self._count_key(txn, value, +1)
            self._touch(txn, key, value)
            txn.put(key.encode(), packb(value), db=self.dbs["records"])
        elif value["seq"]:
            self._count_key(txn, value, -1)
            txn.delete(_SEQ.pack(value["seq"]), db=self.dbs["changes"])
            self._feed(txn, value, None)
            txn.delete(_op_index(value["op"], value["kind"], key), db=self.dbs["by_op"])
            if "st" in value:
                txn.delete(_structure_index(value["st"], key), db=self.dbs["by_struct"])
            txn.delete(key.encode(), db=self.dbs["records"])

    def _own(self, txn: lmdb.Transaction, before: Counter[str], after: Counter[str]) -> None:
        """Keep each pusher's count of the bytes of its records in service (``owned_bytes``) in step with a key's change."""
        for owner in before.keys() | after.keys():
            if after[owner] != before[owner]:
                add_count(txn, self.dbs["meta"], owned_row(owner), after[owner] - before[owner])

    def owned_bytes(self, txn: lmdb.Transaction, owner: str) -> int:
        """The bytes of ``owner``'s records in service (claims and verified records it pushed first)."""
        return read_count(txn, self.dbs["meta"], owned_row(owner))

    def _count_owned(self, txn: lmdb.Transaction) -> None:
        """Count every pusher's bytes of records in service (once, on open, for a store from before the counts)."""
        drop_counts(txn, self.dbs["meta"], owned_row(""))
        for _, raw in txn.cursor(db=self.dbs["records"]):
            self._own(txn, Counter(), _owned(unpackb(raw)["entries"]))

    def _touch(self, txn: lmdb.Transaction, key: str, value: dict[str, Any]) -> None:
        """Move the key to the head of the change feed and keep the op index."""
        if value["seq"]:
            txn.delete(_SEQ.pack(value["seq"]), db=self.dbs["changes"])
            self._feed(txn, value, None)
        value["seq"] = self.next_seq(txn, b"seq")
        txn.put(_SEQ.pack(value["seq"]), key.encode(), db=self.dbs["changes"])
        self._feed(txn, value, key.encode())
        txn.put(_op_index(value["op"], value["kind"], key), b"", db=self.dbs["by_op"])
        if "st" in value:
            _put_structure(txn, self.dbs["by_struct"], key, value)

    def _log(self, txn: lmdb.Transaction, record: Record, pushed_by: str, now: float, *, verified: bool) -> None:
        entry = {
            "key": record.key, "tid": record.trace_id, "op": record.identity.op,
            "run_secs": record.run_secs, "at": now, "by": pushed_by, "verified": verified,
            "host_cpu": record.provenance.get("host_cpu", ""),
        }  # fmt: skip
        self.log_event(txn, entry)
        self._count(txn, "pusher", pushed_by or "local", +1)

    def log_event(self, txn: lmdb.Transaction, entry: dict[str, Any]) -> None:
        """Append to the measurement log (pushes, verifications, refusals, complaints)."""
        txn.put(_SEQ.pack(self.next_seq(txn, b"log_seq")), packb(entry), db=self.dbs["log"])

    def entry(self, key: str, trace_id: str, *, txn: lmdb.Transaction | None = None) -> tuple[bytes, dict[str, Any]] | None:
        """One entry's record bytes and status, or None."""
        if txn is not None:
            _, hit = self._find(txn, key, trace_id)
        else:
            with self.read() as own:
                _, hit = self._find(own, key, trace_id)
        return (hit["rec"], entry_status(hit)) if hit else None

    def _find(self, txn: lmdb.Transaction, key: str, trace_id: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """A key's value and its entry for ``trace_id`` (None where absent)."""
        value = self._load(txn, key)
        hit = next((e for e in value["entries"] if e["tid"] == trace_id), None) if value else None
        return value, hit

    def complain(self, key: str, trace_id: str, who: str, *, txn: lmdb.Transaction | None = None) -> dict[str, Any] | None:
        """Note that ``who`` saw the entry fail (once per complainant); its status, or None if absent."""
        with self.write(txn) as t:
            value, hit = self._find(t, key, trace_id)
            if value is None or hit is None:
                return None
            complaints = hit.setdefault("complaints", [])  # entries stored before complaints existed lack it
            if who not in complaints and len(complaints) < MAX_COMPLAINANTS:
                complaints.append(who)
                t.put(key.encode(), packb(value), db=self.dbs["records"])
            return entry_status(hit)

    def verdict(self, key: str, trace_id: str, verifier: str, run_secs: list[float] | None, reason: str,
                tolerance: float, *, flushed_secs: list[float] | None = None, txn: lmdb.Transaction | None = None) -> str:  # fmt: skip
        """Apply a verification: 'verified', 'refused' (re-measured far slower than claimed, warm or on flushed caches),
        'quarantined' (did not replay, build or match the reference) or 'gone' (no such entry). ``flushed_secs``: the
        verifier's times on flushed caches, where it took them."""
        now = time.time()
        with self.write(txn) as t:
            value, hit = self._find(t, key, trace_id)
            if value is None or hit is None:
                return "gone"
            measured = sum(run_secs) / len(run_secs) if run_secs else None
            flushed = sum(flushed_secs) / len(flushed_secs) if run_secs and flushed_secs else 0.0
            over = _over_claim(hit, measured, flushed, tolerance)
            if measured is not None and over is None:
                hit.pop("vfmean", None)  # a time of an earlier verification is not this one's
                hit.update(vby=verifier, vmean=measured, **_flushed("vfmean", flushed))
                ranked(value["entries"])
                outcome = "verified"
            else:
                outcome = "quarantined" if measured is None else "refused"
                if over is not None:
                    reason = f"{over} by {verifier} (over {tolerance:g}× the claim)"
                self._remove(t, key, value, hit, f"{outcome} by {verifier}: {reason}"[:4000])
            self.log_event(t, {"key": key, "tid": trace_id, "op": value["op"], "event": outcome, "by": hit.get("by", ""), "verifier": verifier,
                               "run_secs": run_secs or [], "claimed_secs": hit["mean"], "reason": reason[:1000], "at": now})  # fmt: skip
            if outcome == "verified":
                self._save(t, key, value)
            return outcome

    def _remove(self, txn: lmdb.Transaction, key: str, value: dict[str, Any], hit: dict[str, Any], reason: str) -> None:
        self._own(txn, _owned([hit]), Counter())
        value["entries"] = [e for e in value["entries"] if e is not hit]
        row = f"{key}:{hit['tid']}".encode()
        if (before := txn.get(row, db=self.dbs["quarantine"])) is not None:  # out of service once before: kept once, as of now
            self.unkeep(txn, unpackb(before))
        self.keep(txn, hit.get("by", ""), OUT_OF_SERVICE, row, {"rec": hit["rec"], "reason": reason, "by": hit.get("by", ""), "at": time.time()})
        self._save(txn, key, value)

    def withdraw(self, txn: lmdb.Transaction, key: str, which: Callable[[dict[str, Any]], bool], complainant: str = "") -> tuple[int, int]:
        """Delete a key's entries that ``which`` picks, and ``complainant``'s complaints about the others (an admin
        forgetting a caller; nothing is quarantined); how many entries and complaints went."""
        value = self._load(txn, key)
        if value is None:
            return 0, 0
        kept = [e for e in value["entries"] if not which(e)]
        gone, owned, value["entries"] = len(value["entries"]) - len(kept), _owned(value["entries"]), kept
        unsaid = 0
        for entry in kept:
            if complainant and complainant in entry.get("complaints", []):
                entry["complaints"].remove(complainant)
                unsaid += 1
        if gone:
            self._own(txn, owned, _owned(kept))
            self._save(txn, key, value)
        elif unsaid:  # the feed does not move: what is served did not change
            txn.put(key.encode(), packb(value), db=self.dbs["records"])
        return gone, unsaid

    def quarantine(self, key: str, trace_id: str, reason: str, *, txn: lmdb.Transaction | None = None) -> bool:
        """Move one record out of service (an admin's decision); False if it was not there."""
        with self.write(txn) as t:
            value, hit = self._find(t, key, trace_id)
            if value is None or hit is None:
                return False
            self._remove(t, key, value, hit, reason)
            return True

    def quarantined(self, limit: int = 100) -> list[dict[str, Any]]:
        """Records out of service, with why and whose (the record bytes left out)."""
        out = []
        with self.read() as txn:
            for k, raw in txn.cursor(db=self.dbs["quarantine"]):
                item = unpackb(raw)
                key, _, tid = k.decode().partition(":")
                out.append({"key": key, "trace_id": tid, "reason": item["reason"], "by": item.get("by", ""), "at": item["at"]})
                if len(out) >= limit:
                    break
        return out

    # -- neighbours ------------------------------------------------------------------------

    def neighbours(self, probes: list[Probe], per_key: int = 4, accepts: Accepts | None = None) -> dict[str, list[tuple[bytes, dict[str, Any], str, float]]]:
        """For each probe, the best entry that ``accepts`` (the caller's trust: verified, pushed by; default every
        entry) of up to ``per_key`` keys of its structure, nearest first: a claim the caller would not serve never
        takes a candidate's place.

        Each item is (record bytes, status, relation, distance); see :mod:`._neighbours` for the
        order. At most MAX_NEIGHBOUR_SCAN index rows are read per probe and MAX_REQUEST_SCAN per
        call, so a request stays bounded whatever the store holds; later probes then get nothing.
        """
        found: dict[str, list[tuple[bytes, dict[str, Any], str, float]]] = {}
        db = self.dbs["by_struct"]
        if db is None:
            return found
        budget = MAX_REQUEST_SCAN
        with self.read() as txn:
            cursor = txn.cursor(db=db)
            for probe in probes:
                if budget <= 0:
                    break
                ranked = []
                prefix = bytes.fromhex(probe.structure)
                if cursor.set_range(prefix):
                    for raw_key, raw in cursor:
                        if not raw_key.startswith(prefix) or budget <= 0 or len(ranked) >= MAX_NEIGHBOUR_SCAN:
                            break
                        budget -= 1
                        key = raw_key[len(prefix) :].hex()
                        if key != probe.key:
                            meta = unpackb(raw)
                            ranked.append((probe.rank(meta["t"], meta["w"], meta["d"]), key))
                ranked.sort(key=lambda item: (item[0][0], item[0][1], item[1]))
                picked = []
                for (_, distance, relation), key in ranked[: per_key * NEIGHBOUR_LOADS_PER_PICK]:
                    value = self._load(txn, key)
                    best = next((e for e in (value or {}).get("entries", []) if (accepts is None or accepts_entry(accepts, e))
                                 and not keeps_default_schedule(unpackb(e["rec"])["trace"])), None)  # fmt: skip
                    if best is not None:  # a key whose records all keep the default schedule has nothing to transfer
                        picked.append((best["rec"], entry_status(best), relation, distance))
                    if len(picked) >= per_key:
                        break
                if picked:
                    found[probe.key] = picked
        return found

    def measurements(self, since: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
        """The append-only measurement log after sequence number ``since``."""
        with self.read() as txn:
            cursor = txn.cursor(db=self.dbs["log"])
            if cursor.set_range(_SEQ.pack(since + 1)):
                for raw_seq, raw in cursor:
                    yield _SEQ.unpack(raw_seq)[0], unpackb(raw)

    def backup(self, folder: str | os.PathLike[str]) -> int:
        """Copy the whole store (records, queue, logs, models, counts) into ``folder`` (new or empty), compacted (free
        pages left out): a consistent snapshot taken in one read transaction, so writers go on meanwhile. The copy's
        size in bytes; open it as a store root to restore."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        if (out / "data.mdb").exists():
            raise RegistryError(f"{out} already holds a store: back up into a new or empty folder (nothing was written)")
        self.env.copy(str(out), compact=True)
        return (out / "data.mdb").stat().st_size

    def stats(self) -> dict[str, Any]:
        with self.read() as txn:
            counts = {name: txn.stat(self.dbs[name])["entries"] for name in ("records", "log", "quarantine")}
            for name in ("trials", "models"):  # None: a read-only store from before them
                counts[name] = txn.stat(self.dbs[name])["entries"] if self.dbs[name] is not None else 0
            raw_seq = txn.get(b"seq", db=self.dbs["meta"])
        info = self.env.info()
        return {
            "keys": counts["records"],
            "measurements": counts["log"],
            "quarantined": counts["quarantine"],
            "trial_logs": counts["trials"],
            "cost_models": counts["models"],
            "coverage": self._coverage(),
            "cursor": _SEQ.unpack(raw_seq)[0] if raw_seq else 0,
            "map_size": info["map_size"],
            "bytes_used": (info["last_pgno"] + 1) * self.env.stat()["psize"],
            "root": str(self.root),
        }

    def _coverage(self) -> dict[str, int]:
        """Distinct ops, targets and compiler fingerprints among the keys in service (kept counts; an old read-only store counts them)."""
        with self.read() as txn:
            if self.indexed(txn, AGG_RANK):
                return {f"{d}s": read_count(txn, self.dbs["meta"], distinct_row(d)) for d in KEY_DIMENSIONS}
        counted = self.aggregates()
        return {f"{d}s": len(counted[d]) for d in KEY_DIMENSIONS}

    def records_count(self) -> int:
        """Records (not keys) held: walks every key once."""
        with self.read() as txn:
            return sum(len(unpackb(v)["entries"]) for _, v in txn.cursor(db=self.dbs["records"]))


def _flushed(name: str, secs: float | None) -> dict[str, float]:
    """An entry's flushed-time field where there is a time (an entry without one stores nothing for it)."""
    return {name: secs} if secs else {}


def _over_claim(entry: dict[str, Any], measured: float | None, flushed: float, tolerance: float) -> str | None:
    """How a verifier's means (``flushed``: 0.0 when not timed so) exceed an entry's claims past ``tolerance``, in words;
    None when they do not (or nothing was measured)."""
    if measured is not None and measured > entry["mean"] * tolerance:
        return f"claimed {entry['mean'] * 1e6:.3g} µs, re-measured {measured * 1e6:.3g} µs"
    if measured is not None and flushed and entry.get("fmean") and flushed > entry["fmean"] * tolerance:
        return f"claimed {entry['fmean'] * 1e6:.3g} µs on flushed caches, re-measured {flushed * 1e6:.3g} µs"
    return None


def _op_index(op: str, kind: str, key: str) -> bytes:
    return f"{op}\0{kind}\0{key}".encode()


def _structure_index(structure: str, key: str) -> bytes:
    return bytes.fromhex(structure) + bytes.fromhex(key)


def _describe(value: dict[str, Any], identity: Identity) -> None:
    """Keep on a key's value what ranking its neighbours needs: structure, workload id, shapes."""
    value.update(st=identity.structure, wid=identity.workload_id, dims=dims_of(identity), fp=identity.fingerprint)


def _put_structure(txn: lmdb.Transaction, db: Any, key: str, value: dict[str, Any]) -> None:
    meta = {"t": value["target"], "w": value["wid"], "d": value["dims"]}
    txn.put(_structure_index(value["st"], key), packb(meta), db=db)


def owned_row(owner: str) -> bytes:
    """The ``meta`` row counting the bytes of a pusher's records in service."""
    return b"records_owned:" + owner.encode()


def _owned(entries: list[dict[str, Any]]) -> Counter[str]:
    """The bytes of a key's entries by owner."""
    owned: Counter[str] = Counter()
    for entry in entries:
        owned[entry.get("by", "")] += len(entry["rec"])
    return owned


def queue_state_row(state: str, job_id: bytes) -> bytes:
    """A job's row in the ``queue_state`` index: its stored state, NUL, its id (id order within a state)."""
    return state.encode() + b"\0" + job_id


def queue_count_row(state: str) -> bytes:
    """The ``meta`` row counting the jobs stored in ``state``."""
    return b"queue_count:" + state.encode()


def _foreign_key(env: lmdb.Environment) -> bytes | None:
    """A key of ``env``'s main database that is not one of a store's named databases (the main database of a store
    holds nothing else), or None."""
    ours = {name.encode() for name in _DB_NAMES}
    with env.begin() as txn:
        return next((key for key in txn.cursor().iternext(values=False) if key not in ours), None)


_META_PAGES = 2  # LMDB's two meta pages


def _tree_pages(stat: dict[str, int]) -> int:
    """The pages of one LMDB database's tree, from its ``stat``."""
    return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]


def _open_db(env: lmdb.Environment, name: str, readonly: bool) -> Any:
    """A named database; None for one a read-only store of an older layout lacks."""
    try:
        return env.open_db(name.encode(), create=not readonly)
    except lmdb.NotFoundError:
        if readonly:
            return None
        raise
