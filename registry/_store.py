"""LMDB store: top-k records per key, an op/target index, a change feed, a measurement log.

One environment per registry root, opened per process (never carried across fork). Every write
method takes an optional open write transaction, so a server can group many writes into one
durable commit; without one it opens and commits its own.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from ._errors import NotFound, RegistryError
from ._keys import SCHEMA_VERSION, target_kind
from ._records import Record, packb, unpackb

DEFAULT_MAP_SIZE = int(os.environ.get("SCHEDHUB_MAP_SIZE", 64 << 30))
DEFAULT_TOP_K = 8
STORE_FORMAT = b"1"
_SEQ = struct.Struct(">Q")
_DB_NAMES = ("records", "by_op", "changes", "log", "meta", "quarantine", "queue", "queue_idx")


class StoreFormatError(RegistryError):
    """The directory holds an LMDB store of another format version."""


@dataclass(frozen=True)
class PutResult:
    key: str
    trace_id: str
    kept: bool  # the record is among the top-k of its key now
    rank: int  # its 0-based rank when kept, else -1
    best_secs: float


@dataclass(frozen=True)
class KeySummary:
    key: str
    seq: int
    op: str
    kind: str
    target: str
    count: int
    best_secs: float

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


class Store:
    """Records keyed by content address, kept best-first, at most ``top_k`` per key."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        readonly: bool = False,
        top_k: int = DEFAULT_TOP_K,
        sync: bool = True,
    ) -> None:
        self.root = Path(root)
        self.top_k = top_k
        self.readonly = readonly
        if not readonly:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not (self.root / "data.mdb").exists():
            raise NotFound(f"no schedhub store at {self.root} (data.mdb missing)")
        self.env = lmdb.open(
            str(self.root), map_size=map_size, max_dbs=len(_DB_NAMES), readonly=readonly,
            sync=sync, metasync=sync, lock=True, max_readers=512,
        )  # fmt: skip
        self.dbs = {name: self.env.open_db(name.encode(), create=not readonly) for name in _DB_NAMES}
        if not readonly:
            self._check_format()

    def _check_format(self) -> None:
        with self.env.begin(write=True) as txn:
            found = txn.get(b"format", db=self.dbs["meta"])
            if found is None:
                txn.put(b"format", STORE_FORMAT, db=self.dbs["meta"])
                txn.put(b"schema", SCHEMA_VERSION.encode(), db=self.dbs["meta"])
            elif found != STORE_FORMAT:
                raise StoreFormatError(f"{self.root} holds store format {found!r}; this schedhub reads {STORE_FORMAT!r}")

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------------

    @contextmanager
    def write(self, txn: lmdb.Transaction | None = None) -> Iterator[lmdb.Transaction]:
        """Use ``txn`` when given, else a new write transaction committed on success."""
        if txn is not None:
            yield txn
            return
        with self.env.begin(write=True) as own:
            yield own

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

    def _load(self, txn: lmdb.Transaction, key: str) -> dict[str, Any] | None:
        raw = txn.get(key.encode(), db=self.dbs["records"])
        return unpackb(raw) if raw is not None else None

    def get(self, key: str) -> list[bytes]:
        """The canonical bytes of the key's records, best first; [] when none."""
        with self.read() as txn:
            value = self._load(txn, key)
        return [e["rec"] for e in value["entries"]] if value else []

    def get_many(self, keys: list[str]) -> dict[str, list[bytes]]:
        """Records of every key that has some, in one read transaction."""
        found: dict[str, list[bytes]] = {}
        with self.read() as txn:
            for key in keys:
                value = self._load(txn, key)
                if value:
                    found[key] = [e["rec"] for e in value["entries"]]
        return found

    def exists(self, key: str) -> bool:
        with self.read() as txn:
            return txn.get(key.encode(), db=self.dbs["records"]) is not None

    def put(self, record: Record, pushed_by: str = "", *, txn: lmdb.Transaction | None = None) -> PutResult:
        """Insert a record into its key's top-k (idempotent: one trace is one entry, best time kept)."""
        now = time.time()
        data = record.to_bytes()
        with self.write(txn) as t:
            key = record.key
            value = self._load(t, key) or {
                "op": record.identity.op, "target": record.identity.target,
                "kind": target_kind(record.identity.target), "seq": 0, "entries": [],
            }  # fmt: skip
            entries = [e for e in value["entries"] if e["tid"] != record.trace_id]
            previous = next((e for e in value["entries"] if e["tid"] == record.trace_id), None)
            mine = {"rec": data, "mean": record.mean_secs, "tid": record.trace_id, "at": now, "by": pushed_by}
            if previous is not None and previous["mean"] <= record.mean_secs:
                mine = previous
            entries.append(mine)
            entries.sort(key=lambda e: (e["mean"], e["tid"]))
            value["entries"] = entries[: self.top_k]
            rank = next((i for i, e in enumerate(value["entries"]) if e is mine), -1)
            if rank >= 0 and mine is not previous:  # the key's top-k changed
                self._touch(t, key, value)
                t.put(key.encode(), packb(value), db=self.dbs["records"])
            self._log(t, record, pushed_by, now)
            return PutResult(key, record.trace_id, rank >= 0, rank, value["entries"][0]["mean"])

    def _touch(self, txn: lmdb.Transaction, key: str, value: dict[str, Any]) -> None:
        """Move the key to the head of the change feed and keep the op index."""
        if value["seq"]:
            txn.delete(_SEQ.pack(value["seq"]), db=self.dbs["changes"])
        value["seq"] = self.next_seq(txn, b"seq")
        txn.put(_SEQ.pack(value["seq"]), key.encode(), db=self.dbs["changes"])
        txn.put(_op_index(value["op"], value["kind"], key), b"", db=self.dbs["by_op"])

    def _log(self, txn: lmdb.Transaction, record: Record, pushed_by: str, now: float) -> None:
        entry = {
            "key": record.key, "tid": record.trace_id, "op": record.identity.op,
            "run_secs": record.run_secs, "at": now, "by": pushed_by,
            "host_cpu": record.provenance.get("host_cpu", ""),
        }  # fmt: skip
        txn.put(_SEQ.pack(self.next_seq(txn, b"log_seq")), packb(entry), db=self.dbs["log"])

    def quarantine(self, key: str, trace_id: str, reason: str, *, txn: lmdb.Transaction | None = None) -> bool:
        """Move one record out of service (its trace failed to replay); False if it was not there."""
        with self.write(txn) as t:
            value = self._load(t, key)
            hit = next((e for e in value["entries"] if e["tid"] == trace_id), None) if value else None
            if value is None or hit is None:
                return False
            value["entries"] = [e for e in value["entries"] if e is not hit]
            t.put(f"{key}:{trace_id}".encode(), packb({"rec": hit["rec"], "reason": reason, "at": time.time()}), db=self.dbs["quarantine"])
            if value["entries"]:
                self._touch(t, key, value)
                t.put(key.encode(), packb(value), db=self.dbs["records"])
            else:
                t.delete(_SEQ.pack(value["seq"]), db=self.dbs["changes"])
                t.delete(_op_index(value["op"], value["kind"], key), db=self.dbs["by_op"])
                t.delete(key.encode(), db=self.dbs["records"])
            return True

    # -- listing ---------------------------------------------------------------------------

    def summaries(self, op: str | None = None, target: str | None = None, since: int = 0, limit: int | None = None) -> list[KeySummary]:
        """Keys changed after ``since`` (a change-feed cursor), oldest change first, filtered.

        ``target`` is a kind (``llvm``) or a canonical target text. One short read transaction;
        page through a large store with ``since`` = the last summary's ``seq``.
        """
        out: list[KeySummary] = []
        with self.read() as txn:
            for key in self._candidate_keys(txn, op, since):
                value = self._load(txn, key)
                if value is None or value["seq"] <= since or (target and target not in (value["kind"], value["target"])):
                    continue
                out.append(KeySummary(key, value["seq"], value["op"], value["kind"], value["target"],
                                      len(value["entries"]), value["entries"][0]["mean"]))  # fmt: skip
                if limit is not None and not op and len(out) >= limit:
                    break
        out.sort(key=lambda s: s.seq)
        return out[:limit] if limit is not None else out

    def _candidate_keys(self, txn: lmdb.Transaction, op: str | None, since: int) -> Iterator[str]:
        """Keys from the op index when an op is named, else from the change feed in seq order."""
        if op:
            prefix = f"{op}\0".encode()
            cursor = txn.cursor(db=self.dbs["by_op"])
            if cursor.set_range(prefix):
                for k in cursor.iternext(values=False):
                    if not k.startswith(prefix):
                        break
                    yield k.rsplit(b"\0", 1)[1].decode()
            return
        cursor = txn.cursor(db=self.dbs["changes"])
        if cursor.set_range(_SEQ.pack(since + 1)):
            for _, key in cursor:
                yield key.decode()

    def measurements(self, since: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
        """The append-only measurement log after sequence number ``since``."""
        with self.read() as txn:
            cursor = txn.cursor(db=self.dbs["log"])
            if cursor.set_range(_SEQ.pack(since + 1)):
                for raw_seq, raw in cursor:
                    yield _SEQ.unpack(raw_seq)[0], unpackb(raw)

    def stats(self) -> dict[str, Any]:
        with self.read() as txn:
            counts = {name: txn.stat(self.dbs[name])["entries"] for name in ("records", "log", "quarantine")}
            raw_seq = txn.get(b"seq", db=self.dbs["meta"])
        info = self.env.info()
        return {
            "keys": counts["records"],
            "measurements": counts["log"],
            "quarantined": counts["quarantine"],
            "cursor": _SEQ.unpack(raw_seq)[0] if raw_seq else 0,
            "map_size": info["map_size"],
            "bytes_used": (info["last_pgno"] + 1) * self.env.stat()["psize"],
            "root": str(self.root),
        }

    def records_count(self) -> int:
        """Records (not keys) held: walks every key once."""
        with self.read() as txn:
            return sum(len(unpackb(v)["entries"]) for _, v in txn.cursor(db=self.dbs["records"]))


def _op_index(op: str, kind: str, key: str) -> bytes:
    return f"{op}\0{kind}\0{key}".encode()
