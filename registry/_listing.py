"""The store's listings: a page of keys changed after a cursor (the change feed), filtered by op, target or key
prefix, each filter read from its own feed so a page costs its rows, not the store's. A part of :class:`._store.Store`:
it reads the store's databases."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
import math
from typing import Any
import lmdb
from ._aggregates import stored_record
from ._counts import SEQ as _SEQ, SEQ_MAX as _SEQ_MAX
from ._keys import target_digest
from ._records import keeps_default_schedule


OP_FEED = b"index:op_feed"  # meta flag: every key is in op_feed (stores from before it get it on open)
TARGET_FEED = b"index:target_feed"  # meta flag: every key is in target_feed, under its kind and its target
OP_TARGET_FEED = b"index:op_target_feed"  # meta flag: every key is in target_feed under its op with its kind and with its target too


def ranked(entries: list[dict[str, Any]]) -> None:
    """Sort a key's entries into serving order: verified entries first, then claims; within each, by flushed time
    (timed with every argument but the input out of cache, as a network's kernel meets its weights) when every
    entry of the group has one, else by warm time. Two measures are never compared with each other: a flushed
    2.45 ms and a warm 1.41 ms say nothing about which runs faster in a network."""
    verified = [e for e in entries if e.get("vby")]
    by_flushed = (all(e.get("vfmean") for e in verified), all(e.get("fmean") for e in entries if not e.get("vby")))

    def order(entry: dict[str, Any]) -> tuple[int, float, str]:
        if entry.get("vby"):
            return (0, entry["vfmean"] if by_flushed[0] else entry["vmean"], entry["tid"])
        return (1, entry["fmean"] if by_flushed[1] else entry["mean"], entry["tid"])

    entries.sort(key=order)


def warm_secs(entry: dict[str, Any]) -> float:
    """An entry's warm mean time: its verified one, else its claimed one."""
    return entry["vmean"] if entry.get("vby") else entry["mean"]


@dataclass(frozen=True)
class KeySummary:
    key: str
    seq: int
    op: str
    kind: str
    target: str
    count: int
    best_secs: float
    verified: int = 0  # entries verified by a trusted worker

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass(frozen=True)
class KeyPage:
    """A page of the change feed: its keys, the cursor to go on from, and whether more may follow."""

    items: list[KeySummary]
    next: int
    more: bool


def _op_feed_row(op: str, seq: int) -> bytes:
    """A key's row in ``op_feed``: its op, NUL, its change-feed position (each op's keys in seq order)."""
    return op.encode() + b"\0" + _SEQ.pack(seq)


def target_feed_head(target: str, op: str = "") -> bytes:
    """Where a target filter's keys are in ``target_feed``: a canonical target (JSON) by its digest, a kind by
    name; with ``op``, that op's keys of the target or kind (capital tags, the op after)."""
    tag, name = (b"t", target_digest(target)) if target.startswith("{") else (b"k", target.encode() + b"\0")
    return (tag.upper() + name + op.encode() + b"\0") if op else tag + name


def _target_feed_rows(value: dict[str, Any]) -> list[bytes]:
    """A key's rows in ``target_feed``, each its filter's head then its change-feed position: under its kind and
    its target, and under its op with each (so a filter by both reads only the keys that match)."""
    heads = [target_feed_head(t) for t in (value["kind"], value["target"])]
    heads += [target_feed_head(t, value["op"]) for t in (value["kind"], value["target"])]
    return [head + _SEQ.pack(value["seq"]) for head in heads]


class Listings:
    """:class:`._store.Store`'s listings (see the module's docstring)."""

    def served_speedups(self, limit: int = 200) -> tuple[list[dict[str, Any]], int]:
        """For each of the ``limit`` keys changed last whose served record (the first in serving order) is verified and
        was timed beside the default schedule: its op, argument shapes and that record's speedup over the default
        (the tuner's untimed figure over the verified time); and how many keys were read. What a compile of that
        kernel is served, where an op's aggregate mixes every push, runners-up included, under a per-model name."""
        page = self.page(limit=limit, newest=True)
        out = []
        with self.read() as txn:
            for summary in page.items:
                value = self._load(txn, summary.key)
                entries = (value or {}).get("entries") or []
                served = entries[0] if entries else None
                if served is None or not served.get("vby") or not served.get("vmean"):
                    continue
                record = stored_record(served["rec"])
                untuned = record.provenance.get("untuned_secs") if record is not None else None
                if isinstance(untuned, (int, float)) and math.isfinite(untuned) and untuned > 0:
                    first = record.identity.args_info[0] if record.identity.args_info else []
                    shape = "x".join(map(str, first[2])) if len(first) > 2 and isinstance(first[2], list) else ""
                    out.append({"key": summary.key, "op": value["op"], "shape": shape, "speedup": untuned / served["vmean"],
                                "keeps_default": keeps_default_schedule(record.trace)})  # fmt: skip
        return out, len(page.items)

    dbs: dict[str, Any]

    def summaries(self, op: str | None = None, target: str | None = None, since: int = 0, limit: int | None = None,
                  *, newest: bool = False, prefix: str = "") -> list[KeySummary]:
        """Keys changed after ``since`` (a change-feed cursor), oldest change first, filtered: :meth:`page`'s items."""
        return self.page(op, target, since, limit, newest=newest, prefix=prefix).items

    def page(self, op: str | None = None, target: str | None = None, since: int = 0, limit: int | None = None,
             *, newest: bool = False, prefix: str = "", scan: int | None = None) -> KeyPage:
        """One page of keys changed after ``since``, oldest change first, filtered; one short read transaction.

        ``target`` is a kind (``llvm``) or a canonical target text; ``prefix`` (8 hex characters or
        more, so its matches are few) keeps keys that start with it; ``newest`` answers the last
        ``limit`` matching changes instead of the first (still oldest first). ``scan`` bounds the feed
        rows read, as a server must (a filter may match nothing in a million keys): a page cut short
        says ``more`` and its ``next`` is past every row it read. Page on with ``since`` = ``next``.
        """
        out: list[KeySummary] = []
        position, more, read = since, False, 0
        with self.read() as txn:
            feed = self._feed_for(txn, op, target, prefix)
            in_order = feed is not None
            for seq, key in self._candidates(txn, feed, op, since, newest, prefix):
                read += 1
                value = self._load(txn, key)
                if value is not None and value["seq"] > since and not (op and value["op"] != op) and not (target and target not in (value["kind"], value["target"])):
                    out.append(KeySummary(key, value["seq"], value["op"], value["kind"], value["target"],
                                          len(value["entries"]), warm_secs(value["entries"][0]),
                                          sum(bool(e.get("vby")) for e in value["entries"])))  # fmt: skip
                if not in_order:
                    continue
                position = seq if not newest else max(position, seq)
                if (limit is not None and len(out) >= limit) or (scan is not None and read >= scan):
                    more = not newest  # the newest changes are the feed's end
                    break
        if in_order:
            return KeyPage(out[::-1] if newest else out, position, more)
        out.sort(key=lambda s: s.seq, reverse=newest)
        more = limit is not None and len(out) > limit
        out = out[:limit] if limit is not None else out
        out = out[::-1] if newest else out
        return KeyPage(out, max((s.seq for s in out), default=since), more)

    def _feed_for(self, txn: lmdb.Transaction, op: str | None, target: str | None, prefix: str) -> tuple[str, bytes] | None:
        """The feed (database, row head) whose rows are the filter's keys in change order, the narrowest first:
        an op's with a target or kind, a canonical target's, an op's, a kind's, every key's. None: no such feed
        (``prefix``, or an op in a read-only store from before the op feed), the candidates come unordered."""
        if prefix:
            return None
        if op and target and self.indexed(txn, OP_TARGET_FEED):
            return "target_feed", target_feed_head(target, op)
        by_target = bool(target) and self.indexed(txn, TARGET_FEED)
        if target and by_target and target.startswith("{"):
            return "target_feed", target_feed_head(target)
        if op:
            return ("op_feed", f"{op}\0".encode()) if self.indexed(txn, OP_FEED) else None
        return ("target_feed", target_feed_head(target)) if target and by_target else ("changes", b"")

    def _candidates(self, txn: lmdb.Transaction, feed: tuple[str, bytes] | None, op: str | None, since: int, newest: bool,
                    prefix: str) -> Iterator[tuple[int, str]]:  # fmt: skip
        """(seq, key) from ``feed`` in seq order (newest first when ``newest``); without a feed, keys
        starting with ``prefix``, or a read-only old store's keys of ``op``, unordered (seq 0)."""
        if feed is None:
            start, db = (prefix.encode(), "records") if prefix else (f"{op}\0".encode(), "by_op")
            cursor = txn.cursor(db=self.dbs[db])
            if cursor.set_range(start):
                for k in cursor.iternext(values=False):
                    if not k.startswith(start):
                        return
                    yield 0, k.decode() if prefix else k.rsplit(b"\0", 1)[1].decode()
            return
        db, head = feed
        cursor = txn.cursor(db=self.dbs[db])
        if newest:  # the feed's last row: just before the first row past it, else the last of all
            positioned = (cursor.set_range(head + _SEQ.pack(_SEQ_MAX)) and cursor.prev()) or cursor.last()
            rows = cursor.iterprev() if positioned else iter(())
        else:
            rows = cursor.iternext() if cursor.set_range(head + _SEQ.pack(since + 1)) else iter(())
        for row, key in rows:
            if not row.startswith(head):
                return
            seq = _SEQ.unpack(row[len(head) :])[0]
            if newest and seq <= since:
                return
            yield seq, key.decode()
