"""What the registry keeps of each caller's ended work: within a budget of bytes per caller, oldest out first.

A queue job that ended (done, or dead after its attempts) and a record taken out of service (quarantined or
refused) are kept so people can see who asked, what happened and why. Each is kept under its *owner* (a job's
requester, a record's pusher) in ``kept``: ``owner | NUL | seq | kind | id`` → its size in bytes, oldest first,
and the owner's bytes are counted in ``meta``. When an owner's kept bytes pass its budget, its oldest items go.
So a caller whose work ends at the workers' pace (a reader's misses that die, a pusher's claims that fail)
cannot fill the store, and nobody else's history is touched.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import lmdb

from ._counts import add_count, drop_counts, read_count

ENDED = ("done", "dead")  # the queue's states of a job that ended
JOB, OUT_OF_SERVICE = b"J", b"Q"  # a queue job (id: the job id); a record out of service (id: its quarantine row)
DEFAULT_KEPT_BYTES = 64 << 20
KEPT_INDEX = b"index:kept"  # meta flag: every ended job and record out of service is in ``kept`` and counted
_KEPT_BYTES = b"kept_bytes:"  # the prefix of each owner's count of bytes kept, in ``meta``
_SEQ = struct.Struct(">Q")

#: Removes one kept item (its kind, its id) from the store; the ``kept`` row is removed by the caller.
Dropper = Callable[[lmdb.Transaction, bytes, bytes], None]


def requester(job: dict[str, Any]) -> str:
    """Whose a job is: who queued it (a verification queued before requesters were kept: its record's pusher)."""
    return str(job.get("requester", job.get("pusher", "")))


def kept_bytes_row(owner: str) -> bytes:
    """The ``meta`` row counting the bytes kept of ``owner``'s ended work."""
    return _KEPT_BYTES + owner.encode()


def kept_bytes(txn: lmdb.Transaction, dbs: dict[str, Any], owner: str) -> int:
    return read_count(txn, dbs["meta"], kept_bytes_row(owner))


def kept_row(owner: str, seq: int, kind: bytes, item_id: bytes) -> bytes:
    """An item's row in ``kept`` (``seq``: a store-wide counter, so later items sort later); the item holds it, for :func:`unkeep`."""
    return owner.encode() + b"\0" + _SEQ.pack(seq) + kind + item_id


def owner_of(row: bytes) -> str:
    return row.split(b"\0", 1)[0].decode()


def keep(txn: lmdb.Transaction, dbs: dict[str, Any], row: bytes, size: int, budget: int, drop: Dropper) -> None:
    """Note the item at ``row`` as kept, ``size`` bytes, then drop its owner's oldest items (this one too, if it alone
    is past the budget) while the owner's bytes pass ``budget``."""
    txn.put(row, _SEQ.pack(size), db=dbs["kept"])
    add_count(txn, dbs["meta"], kept_bytes_row(owner_of(row)), size)
    trim(txn, dbs, owner_of(row), budget, drop)


def unkeep(txn: lmdb.Transaction, dbs: dict[str, Any], row: bytes) -> None:
    """The item at ``row`` is back at work (a job requeued) or gone otherwise: no longer kept or counted."""
    raw = txn.get(row, db=dbs["kept"])
    if raw is not None:
        txn.delete(row, db=dbs["kept"])
        add_count(txn, dbs["meta"], kept_bytes_row(owner_of(row)), -_SEQ.unpack(raw)[0])


def trim(txn: lmdb.Transaction, dbs: dict[str, Any], owner: str, budget: int, drop: Dropper) -> int:
    """Drop ``owner``'s oldest kept items until its bytes are within ``budget``; how many went."""
    prefix, dropped = owner.encode() + b"\0", 0
    rows = txn.cursor(db=dbs["kept"])
    while kept_bytes(txn, dbs, owner) > budget and rows.set_range(prefix) and rows.key().startswith(prefix):
        row = rows.key()
        kind, item_id = row[len(prefix) + _SEQ.size : len(prefix) + _SEQ.size + 1], row[len(prefix) + _SEQ.size + 1 :]
        unkeep(txn, dbs, row)
        drop(txn, kind, item_id)
        dropped += 1
    return dropped


def forget_all(txn: lmdb.Transaction, dbs: dict[str, Any]) -> None:
    """Empty ``kept`` and every owner's count (before indexing a store from before them)."""
    txn.drop(dbs["kept"], delete=False)
    drop_counts(txn, dbs["meta"], _KEPT_BYTES)
