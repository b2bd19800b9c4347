"""What each caller holds in a registry: the counts its bounds are checked against, a page of callers at a time.

Each count is a row in ``meta`` under a prefix and the caller's name, so a page merges one range scan per
prefix from the cursor on and reads each listed caller's counts: it costs its page, not the registry.
The names of the counts are the names of the server's bounds (``CallerBounds``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lmdb

from ._counts import read_count
from ._history import kept_bytes_row
from ._queue import TUNE, VERIFY, awaiting_row
from ._store import owned_row
from ._trials import claimed_row

#: A count's name → the ``meta`` row of a caller's count (from its name, as bytes).
USAGE: dict[str, Callable[[bytes], bytes]] = {
    "records_bytes": lambda name: owned_row(name.decode()),
    "claims_awaiting": lambda name: awaiting_row(VERIFY, name.decode()),
    "misses_awaiting": lambda name: awaiting_row(TUNE, name.decode()),
    "claimed_log_bytes": claimed_row,
    "kept_bytes": lambda name: kept_bytes_row(name.decode()),
}


def usage_page(txn: lmdb.Transaction, meta: Any, after: str = "", limit: int = 100) -> tuple[list[dict[str, Any]], bool]:
    """Callers after ``after`` (by name) that hold anything, at most ``limit``, each with every count; and whether more follow."""
    names: set[bytes] = set()
    more = False
    start = after.encode()
    for row_of in USAGE.values():
        prefix = row_of(b"")
        rows = txn.cursor(db=meta)
        found = rows.set_range(prefix + start)
        taken = 0
        while found and rows.key().startswith(prefix):
            name = bytes(rows.key()[len(prefix) :])
            if name != start or not after:
                if taken == limit:
                    more = True
                    break
                names.add(name)
                taken += 1
            found = rows.next()
    listed = sorted(names)
    more = more or len(listed) > limit
    return [{"name": name.decode(), **{count: read_count(txn, meta, row_of(name)) for count, row_of in USAGE.items()}}
            for name in listed[:limit]], more  # fmt: skip


HELD_BYTES = ("records_bytes", "claimed_log_bytes", "kept_bytes")  # the counts that are bytes of the store


def size_text(count: int) -> str:
    """Bytes as listings show them: in the largest unit of which there is at least one."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:,.2f} {unit}"
    return f"{count:,} B"


def by_bytes_held(item: dict[str, Any]) -> tuple[int, str]:
    """The order of callers by what they hold, most bytes of the store first (then by name)."""
    return -sum(item[count] for count in HELD_BYTES), item["name"]


def every_caller(page: Callable[[str, int], tuple[list[dict[str, Any]], bool]], most: int | None = None) -> tuple[list[dict[str, Any]], bool]:
    """Callers read a page at a time through ``page(after, limit)`` (:func:`usage_page`, a client's ``callers``), at most
    ``most`` (None: every one); and whether callers were left unread."""
    held: list[dict[str, Any]] = []
    after, more = "", True
    while more and (most is None or len(held) < most):
        listed, more = page(after, 500 if most is None else min(500, most - len(held)))
        held += listed
        after = listed[-1]["name"] if listed else after
        more = more and bool(listed)
    return held, more


SCANNED_CALLERS = 1000  # callers the dashboard reads (a registry's callers are its tokens' names: few)


def largest(txn: lmdb.Transaction, meta: Any, top: int) -> tuple[list[dict[str, Any]], bool]:
    """The ``top`` callers holding the most bytes among the first :data:`SCANNED_CALLERS` by name; and whether there were more."""
    held, more = every_caller(lambda after, limit: usage_page(txn, meta, after, limit), SCANNED_CALLERS)
    return sorted(held, key=by_bytes_held)[:top], more
