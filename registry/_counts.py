"""Counters kept in LMDB rows (8-byte signed big-endian): per-state queue counts, aggregates, what a caller has waiting."""

from __future__ import annotations

import struct
from typing import Any

import lmdb

COUNT = struct.Struct(">q")
SEQ = struct.Struct(">Q")  # sequence numbers and inverted weights in index rows (big-endian: they sort as numbers)
SEQ_MAX = 2**64 - 1


def read_count(txn: lmdb.Transaction, db: Any, row: bytes) -> int:
    """The counter at ``row`` (0 where absent)."""
    raw = txn.get(row, db=db)
    return COUNT.unpack(raw)[0] if raw else 0


def add_count(txn: lmdb.Transaction, db: Any, row: bytes, delta: int) -> tuple[int, int]:
    """Add ``delta`` to the counter at ``row``; a counter that reaches zero is removed (absent reads as 0). Returns (before, after)."""
    raw = txn.get(row, db=db)
    before = COUNT.unpack(raw)[0] if raw else 0
    count = before + delta
    if count > 0:
        txn.put(row, COUNT.pack(count), db=db)
    elif raw is not None:
        txn.delete(row, db=db)
    return before, max(count, 0)


def drop_counts(txn: lmdb.Transaction, db: Any, prefix: bytes) -> None:
    """Remove every counter whose row starts with ``prefix`` (before counting them all again)."""
    rows = txn.cursor(db=db)
    while rows.set_range(prefix) and rows.key().startswith(prefix):
        rows.delete()
