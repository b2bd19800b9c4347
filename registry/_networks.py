"""Networks that compiles reported: which kernels one compile holds and how often it calls each, so that the queue can
refine a network's bottleneck, not each kernel in isolation.

A compile inside ``hooks.use(...)`` reports its module's kernels (keys and calls per forward pass), once a session.
A network is stored under a digest of its sorted (key, calls) list: the same network reported again counts one more
report, not one more row. A caller keeps at most :data:`MAX_PER_CALLER` networks and the registry :data:`MAX_NETWORKS`;
past either, a new network is refused (429) and nothing is lost. A report may name its network and the latency it
aims at (an engine's, say); its first reporter's name and goal stay. The registry's page shows the
:data:`RECENT` networks reported last (:meth:`NetworkBook.recent`): kernels, how many hold a verified record, and
the estimate those give against the goal.

:meth:`NetworkBook.bottleneck` is what a worker asks for when the queue has nothing for it. It reads, for a few
networks at a time in rotation (:data:`SCAN`: the work of one call is bounded, and every network's turn comes), each
kernel's best verified time and how many searches its queue job has had, and names the kernel whose next search is
expected to lower its network's time most: calls × best time / (searches + 1), the forward estimate of
``tuner.networks.allocation``'s gradient policy. A kernel is refined only while that is at least :data:`MIN_SHARE` of its
network's time and it has had fewer than :data:`MAX_SEARCHES`: refinement ends. The pick goes back to the queue as a
refine job (leased after every first pass), asked for by the network's first reporter.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any

import lmdb

from ._errors import InvalidRecord, TooManyRequests
from ._keys import target_device, target_kind
from ._aggregates import stored_record
from ._counts import add_count, read_count
from ._queue import DONE
from ._records import Identity, Record, packb, unpackb

MAX_KERNELS = 512  # kernels one network report may name (a ResNet-50 compiles to about 50)
MAX_CALLS = 1 << 20  # calls of one kernel in one forward pass
MAX_PER_CALLER = 64  # networks one caller keeps
MAX_NETWORKS = 8192  # networks the registry keeps
SCAN = 16  # networks one bottleneck search reads
MIN_SHARE = 0.02  # a kernel's expected gain, as a share of its network's time, worth a search
MAX_SEARCHES = 4  # searches a kernel gets for its networks' sake
_COUNT = b"networks"  # meta row: networks kept
_CURSOR = b"networks:cursor"  # meta row: the last network a bottleneck search read
_OF = b"networks_of:"  # meta rows: networks each caller keeps
_RECENT = b"networks:recent"  # meta row: the ids of the networks reported last, newest first
RECENT = 12  # networks the page shows
MAX_NAME = 80  # characters of a network's name
MAX_GOAL_SECS = 3600.0  # a goal's latency


def network_id(kernels: list[tuple[str, int]]) -> str:
    """The digest a network is stored under: of its (key, calls) pairs, sorted."""
    return hashlib.sha256(packb(sorted([list(k) for k in kernels]))).hexdigest()


def parse_kernels(value: Any) -> list[tuple[str, int]]:
    """A network report's ``kernels`` ([{"key": 64 hex, "calls": n}, ...]) checked; InvalidRecord says what is wrong."""
    if not isinstance(value, list) or not value:
        raise InvalidRecord("'kernels' must be a non-empty list of {key, calls}")
    if len(value) > MAX_KERNELS:
        raise InvalidRecord(f"a network may name at most {MAX_KERNELS} kernels, this one names {len(value)}")
    out: dict[str, int] = {}
    for item in value:
        if not isinstance(item, dict) or set(item) != {"key", "calls"}:
            raise InvalidRecord("each kernel is {\"key\": <64 hex characters>, \"calls\": <calls per forward pass>}")
        key, calls = item["key"], item["calls"]
        if not isinstance(key, str) or len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise InvalidRecord("a kernel's 'key' is 64 lowercase hex characters")
        if isinstance(calls, bool) or not isinstance(calls, int) or not 1 <= calls <= MAX_CALLS:
            raise InvalidRecord(f"a kernel's 'calls' is an integer from 1 to {MAX_CALLS}")
        out[key] = out.get(key, 0) + calls
    return sorted((k, min(c, MAX_CALLS)) for k, c in out.items())


def parse_name(value: Any) -> str | None:
    """A network report's optional ``name``: printable text of 1 to :data:`MAX_NAME` characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME or not value.isprintable() or value != value.strip():
        raise InvalidRecord(f"a network's 'name' is 1 to {MAX_NAME} printable characters, without spaces at its ends")
    return value


def parse_goal(value: Any) -> dict[str, Any] | None:
    """A network report's optional ``goal``: {"label": what it is (an engine's name), "secs": its latency}."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"label", "secs"}:
        raise InvalidRecord('a network\'s \'goal\' is {"label": <text>, "secs": <seconds>}')
    label, secs = value["label"], value["secs"]
    if not isinstance(label, str) or not 1 <= len(label) <= 40 or not label.isprintable():
        raise InvalidRecord("a goal's 'label' is 1 to 40 printable characters")
    if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not math.isfinite(secs) or not 0 < secs <= MAX_GOAL_SECS:
        raise InvalidRecord(f"a goal's 'secs' is a latency above 0 and at most {MAX_GOAL_SECS:g} seconds")
    return {"label": label, "secs": float(secs)}


@dataclass(frozen=True)
class NetworkStanding:
    """Where one reported network stands: its kernels, how many hold a verified record, and what those give."""

    network: str
    name: str | None
    by: str
    reports: int
    last_seen: float
    kernels: int
    held: int
    estimate_secs: float  # Σ calls × best verified time, over the kernels held (all of them when held == kernels)
    goal: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {"network": self.network, "name": self.name, "by": self.by, "reports": self.reports, "last_seen": self.last_seen,
                "kernels": self.kernels, "held": self.held, "estimate_secs": self.estimate_secs, "complete": self.held == self.kernels,
                "goal": self.goal}  # fmt: skip


@dataclass(frozen=True)
class Bottleneck:
    """The kernel a network's time is expected to fall most by searching again, and why."""

    identity: Identity
    network: str
    calls: int
    best_secs: float
    searches: int
    share: float  # its expected gain over its network's estimated time
    requester: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.identity.key, "op": self.identity.op, "network": self.network, "calls": self.calls, "best_secs": self.best_secs,
                "searches": self.searches, "share": self.share}  # fmt: skip


class NetworkBook:
    """The networks compiles reported, in the store's ``networks`` database (see the module's docstring)."""

    def __init__(self, store: Any, queue: Any) -> None:
        self.store, self.queue = store, queue
        self._db, self._meta = store.dbs["networks"], store.dbs["meta"]

    def report(self, kernels: list[tuple[str, int]], by: str, txn: lmdb.Transaction | None = None, *, name: str | None = None,
               goal: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Keep a network (or count one more report of it); returns its id and how often it was reported. ``name`` and
        ``goal`` (:func:`parse_name`, :func:`parse_goal`) are kept where the network has none yet, or its first
        reporter sends them."""
        ident = network_id(kernels)
        now = time.time()
        with self.store.write(txn) as t:
            raw = t.get(ident.encode(), db=self._db)
            if raw is None:
                mine = read_count(t, self._meta, _OF + by.encode())
                if mine >= MAX_PER_CALLER:
                    raise TooManyRequests(f"{by!r} keeps {mine} networks, the most a caller may; nothing was kept")
                if read_count(t, self._meta, _COUNT) >= MAX_NETWORKS:
                    raise TooManyRequests(f"this registry keeps {MAX_NETWORKS} networks, the most it may; nothing was kept")
                network = {"kernels": [list(k) for k in kernels], "by": by, "reports": 0, "first_seen": now}
                add_count(t, self._meta, _OF + by.encode(), 1)
                add_count(t, self._meta, _COUNT, 1)
            else:
                network = unpackb(raw)
            network["reports"] += 1
            network["last_seen"] = now
            first = network.get("by") == by
            for field, value in (("name", name), ("goal", goal)):
                if value is not None and (first or not network.get(field)):
                    network[field] = value
            t.put(ident.encode(), packb(network), db=self._db)
            recent = [n for n in unpackb(t.get(_RECENT, db=self._meta) or packb([])) if n != ident]
            t.put(_RECENT, packb([ident, *recent][:RECENT]), db=self._meta)
            return {"network": ident, "kernels": len(kernels), "reports": network["reports"]}

    def count(self) -> int:
        with self.store.read() as t:
            return read_count(t, self._meta, _COUNT)

    def recent(self) -> list[NetworkStanding]:
        """The :data:`RECENT` networks reported last, newest first, each with where it stands (bounded: their kernels'
        best records only)."""
        out: list[NetworkStanding] = []
        with self.store.read() as t:
            for ident in unpackb(t.get(_RECENT, db=self._meta) or packb([])):
                raw = t.get(ident.encode(), db=self._db)
                if raw is None:
                    continue
                network = unpackb(raw)
                held = [(best[0], int(calls)) for key, calls in network["kernels"] if (best := self._best_verified(t, key)) is not None]
                out.append(NetworkStanding(ident, network.get("name"), str(network.get("by", "")), int(network.get("reports", 0)),
                                           float(network.get("last_seen", 0.0)), len(network["kernels"]), len(held),
                                           sum(secs * calls for secs, calls in held), network.get("goal")))  # fmt: skip
        return out

    def bottleneck(self, fingerprint: str, kind: str, device: str, by: str = "", txn: lmdb.Transaction | None = None) -> Bottleneck | None:
        """Requeue for refinement the kernel (of those a worker of ``fingerprint``, ``kind`` and ``device`` can tune) whose
        next search is expected to lower its network's time most, from the next :data:`SCAN` networks; None when none
        is worth it."""
        with self.store.write(txn) as t:
            cursor = t.get(_CURSOR, db=self._meta) or b""
            scanned, last = self._next_networks(t, cursor)
            if last is not None:
                t.put(_CURSOR, last, db=self._meta)
            picks = [p for ident, network in scanned if (p := self._worth_refining(t, ident, network, fingerprint, kind, device)) is not None]
            if not picks:
                return None
            best = max(picks, key=lambda p: p.share)
            self.queue.refine_again(best.identity, by=best.requester or by, txn=t)
            return best

    def _next_networks(self, t: lmdb.Transaction, cursor: bytes) -> tuple[list[tuple[str, dict[str, Any]]], bytes | None]:
        """Up to :data:`SCAN` networks after ``cursor``, going round to the first after the last."""
        out: list[tuple[str, dict[str, Any]]] = []
        cur = t.cursor(db=self._db)
        for wrapped in (False, True):
            found = cur.set_range(cursor) if not wrapped else cur.first()
            while found and len(out) < SCAN:
                key, raw = cur.item()
                if wrapped and cursor and key > cursor:  # round again, up to and with the one read last
                    break
                if wrapped or key > cursor:
                    out.append((key.decode(), unpackb(raw)))
                found = cur.next()
            if len(out) >= SCAN or not cursor:
                break
        return out, out[-1][0].encode() if out else None

    def _worth_refining(self, t: lmdb.Transaction, ident: str, network: dict[str, Any], fingerprint: str, kind: str, device: str) -> Bottleneck | None:
        """The network's kernel with the largest expected gain among those this worker can tune, if it is worth a search."""
        timed: list[tuple[float, int, Record, int]] = []  # (best secs, calls, its record, searches) of every kernel timed and verified
        for key, calls in network["kernels"]:
            best = self._best_verified(t, key)
            if best is None:
                continue
            job = self.queue.peek(key, txn=t)
            searches = int(job.get("searches", 1)) if job is not None else 1  # tuned outside the queue (schedhub tune): one search
            if job is not None and job.get("state") not in (None, DONE):
                searches = MAX_SEARCHES  # already on its way: nothing to add
            timed.append((best[0], int(calls), best[1], searches))
        total = sum(secs * calls for secs, calls, _, _ in timed)
        if total <= 0:
            return None
        mine = [(secs * calls / (searches + 1), secs, calls, record, searches) for secs, calls, record, searches in timed
                if searches < MAX_SEARCHES and record.identity.fingerprint == fingerprint and target_kind(record.identity.target) == kind
                and target_device(record.identity.target) in ("", device)]  # fmt: skip
        if not mine:
            return None
        gain, secs, calls, record, searches = max(mine, key=lambda m: m[0])
        if gain / total < MIN_SHARE:
            return None
        return Bottleneck(record.identity, ident, calls, secs, searches, gain / total, str(network.get("by", "")))

    def _best_verified(self, t: lmdb.Transaction, key: str) -> tuple[float, Record] | None:
        """The key's fastest verified record and its verified mean seconds (None: no verified record)."""
        value = self.store._load(t, key)
        for entry in (value or {}).get("entries") or []:
            if entry.get("vby") and entry.get("vmean"):
                record = stored_record(entry["rec"])
                if record is not None:
                    return float(entry["vmean"]), record
        return None

