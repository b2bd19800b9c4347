"""The store's aggregates, kept on every write: keys per op, canonical target and compiler fingerprint, pushes per
pusher, verified speedups per op (the dashboard's and ``/v1/stats``' figures), each dimension ranked by weight so a
reader takes its heaviest rows without reading them all. A part of :class:`._store.Store`: it writes in the store's
transactions and reads its databases."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import lmdb

from ._counts import COUNT as _COUNT, SEQ as _SEQ, SEQ_MAX as _SEQ_MAX, add_count
from ._errors import REFUSED_ON_READ
from ._records import Identity, Record, packb, unpackb

AGG_RANK = b"index:agg_rank"  # meta flag: every aggregate row is ranked in agg_rank and each dimension's names are counted
KEY_DIMENSIONS = ("op", "target", "fingerprint")
AGG_DIMENSIONS = (*KEY_DIMENSIONS, "pusher", "speedup")  # each ranked in agg_rank: by count, or a speedup's pushes (n)
MAX_AGG_NAME = 300  # bytes of a name in an aggregate row's LMDB key (agg_name)


def stored_record(data: bytes) -> Record | None:
    """A stored record as this version reads it; None when its checks refuse it (stored before a check existed):
    rebuilding an index on open must not fail on a record that every read already leaves out."""
    try:
        return Record.from_bytes(data)
    except REFUSED_ON_READ:
        return None


def stored_identity(data: bytes) -> Identity | None:
    """A stored record's identity (its trace not read), or None as for :func:`stored_record`."""
    try:
        return Identity.from_obj(unpackb(data))
    except REFUSED_ON_READ:
        return None


class Aggregates:
    """:class:`._store.Store`'s aggregates (see the module's docstring)."""

    dbs: dict[str, Any]

    def _aggregate_all(self, txn: lmdb.Transaction) -> None:
        """Build the aggregates from every key and log entry (once, on open, for a store from before them); their ranking is
        built again after them."""
        txn.drop(self.dbs["agg"], delete=False)
        txn.delete(AGG_RANK, db=self.dbs["meta"])
        for raw_key, raw in txn.cursor(db=self.dbs["records"]):
            value = unpackb(raw)
            if not value["entries"]:
                continue
            if "fp" not in value:
                identity = stored_identity(value["entries"][0]["rec"])
                value["fp"] = identity.fingerprint if identity else ""
                txn.put(raw_key, packb(value), db=self.dbs["records"])
            self._count_key(txn, value, +1)
            for entry in value["entries"]:
                record = stored_record(entry["rec"]) if entry.get("vby") else None
                if record is not None:
                    self._add_speedup(txn, value["op"], record)
        for _, raw in txn.cursor(db=self.dbs["log"]):
            event = unpackb(raw)
            if "event" not in event:  # a push (verdicts carry an event)
                self._count(txn, "pusher", event.get("by") or "local", +1)

    def _rank_all(self, txn: lmdb.Transaction) -> None:
        """Rank every aggregate row and count each dimension's names (once, on open, for a store from before the ranking)."""
        txn.drop(self.dbs["agg_rank"], delete=False)
        for dimension in AGG_DIMENSIONS:
            txn.delete(distinct_row(dimension), db=self.dbs["meta"])
        for row, raw in txn.cursor(db=self.dbs["agg"]):
            dimension, _, name = row.decode().partition("\0")
            if dimension in AGG_DIMENSIONS:
                self._rerank(txn, dimension, name, 0, _weight(dimension, raw))

    def _rerank(self, txn: lmdb.Transaction, dimension: str, name: str, old: int, new: int) -> None:
        """Move ``name``'s row in ``agg_rank`` from weight ``old`` to ``new`` (0: absent) and keep its dimension's count of names."""
        if old == new:
            return
        if old > 0:
            txn.delete(_rank_row(dimension, old, name), db=self.dbs["agg_rank"])
        if new > 0:
            txn.put(_rank_row(dimension, new, name), b"", db=self.dbs["agg_rank"])
        if (old > 0) != (new > 0):
            add_count(txn, self.dbs["meta"], distinct_row(dimension), 1 if new > 0 else -1)

    def _count(self, txn: lmdb.Transaction, dimension: str, name: str, delta: int) -> None:
        name = agg_name(name)
        self._rerank(txn, dimension, name, *add_count(txn, self.dbs["agg"], f"{dimension}\0{name}".encode(), delta))

    def _count_key(self, txn: lmdb.Transaction, value: dict[str, Any], delta: int) -> None:
        for dimension, name in zip(KEY_DIMENSIONS, (value["op"], value["target"], value.get("fp", ""))):
            self._count(txn, dimension, name, delta)

    def _add_speedup(self, txn: lmdb.Transaction, op: str, record: Record) -> None:
        """Count a pushed record's speedup over TVM's default schedule (the tuner's side-by-side re-timing)."""
        untuned = record.provenance.get("untuned_secs")
        if not isinstance(untuned, (int, float)) or not math.isfinite(untuned) or untuned <= 0:
            return
        speedup = untuned / record.mean_secs
        row = f"speedup\0{op}".encode()
        raw = txn.get(row, db=self.dbs["agg"])
        agg = unpackb(raw) if raw else {"n": 0, "log2_sum": 0.0, "best": 0.0}
        agg.update(n=agg["n"] + 1, log2_sum=agg["log2_sum"] + math.log2(speedup), best=max(agg["best"], speedup))
        txn.put(row, packb(agg), db=self.dbs["agg"])
        self._rerank(txn, "speedup", op, agg["n"] - 1, agg["n"])

    def aggregates(self, top: int | None = None) -> dict[str, Any]:
        """Keys per op, target and fingerprint, pushes per pusher, speedups per op (kept on every write):
        every name, or each dimension's ``top`` heaviest (most keys or pushes; speedups: most pushes) from the ranking."""
        out: dict[str, Any] = {d: {} for d in AGG_DIMENSIONS}
        if self.dbs.get("agg") is None:  # an old store opened read-only
            return out
        with self.read() as txn:
            if top is not None and self.indexed(txn, AGG_RANK):
                ranked = (f"{d}\0{name}".encode() for d in AGG_DIMENSIONS for name in self._ranked(txn, d, top))
                rows = ((row, txn.get(row, db=self.dbs["agg"])) for row in ranked)
            else:
                rows = iter(txn.cursor(db=self.dbs["agg"]))
            for row, raw in rows:
                dimension, _, name = row.decode().partition("\0")
                if raw is None or dimension not in out:
                    continue
                if dimension == "speedup":
                    agg = unpackb(raw)
                    out["speedup"][name] = {"n": agg["n"], "geomean": 2 ** (agg["log2_sum"] / agg["n"]), "best": agg["best"]}
                else:
                    out[dimension][name] = _COUNT.unpack(raw)[0]
        return out

    def _ranked(self, txn: lmdb.Transaction, dimension: str, top: int) -> list[str]:
        """The ``top`` heaviest names of ``dimension`` (ties by name)."""
        head = dimension.encode() + b"\0"
        cursor, names = txn.cursor(db=self.dbs["agg_rank"]), []
        if cursor.set_range(head):
            for row in cursor.iternext(values=False):
                if not row.startswith(head) or len(names) >= top:
                    break
                names.append(row[len(head) + _SEQ.size :].decode())
        return names


def agg_name(name: str) -> str:
    """``name`` as the aggregates hold it: as it is, or, past :data:`MAX_AGG_NAME` bytes (a canonical target
    may be 4096 characters; an LMDB key at most 511 bytes), its start and a digest of the whole, still one name each."""
    if len(name.encode()) <= MAX_AGG_NAME:
        return name
    return name.encode()[: MAX_AGG_NAME - 40].decode(errors="ignore") + "…" + hashlib.sha256(name.encode()).hexdigest()[:32]


def _rank_row(dimension: str, weight: int, name: str) -> bytes:
    """A name's row in ``agg_rank``: its dimension, NUL, its weight inverted (heaviest first), its name."""
    return dimension.encode() + b"\0" + _SEQ.pack(_SEQ_MAX - weight) + name.encode()


def _weight(dimension: str, raw: bytes) -> int:
    """What ranks an aggregate row: its count, or a speedup's number of pushes."""
    return int(unpackb(raw)["n"]) if dimension == "speedup" else _COUNT.unpack(raw)[0]


def distinct_row(dimension: str) -> bytes:
    """The ``meta`` row counting the names ``dimension`` has (ops with keys, pushers who pushed, ...)."""
    return b"agg_distinct:" + dimension.encode()
