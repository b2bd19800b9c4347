"""Re-time a registry's verified records on flushed caches, so each key ranks by what a network sees.

A key ranks its verified records by their flushed times only when every one of them has one (the registry never
compares a flushed time with a warm one). Records verified before flushed times were taken have none, so their keys
rank by warm time, which served ResNet-18 a stage-4 convolution that read its weights in an order the network pays
for. For each key with two verified records or more, some without a flushed time, :func:`retime` times them all side
by side with the default schedule, warm and flushed, each output checked as a verification checks it, and pushes each
again with its flushed time: a trusted re-push (a worker's or an admin's token, or a local store) gives an entry the
flushed time it lacked. Its owner, its bytes and its verified warm time stay. A tuning job does the same for its own
key (:func:`lacking_flushed`, timed after its publishing), so a served registry's keys get theirs as workers tune them.
"""

from __future__ import annotations

from collections.abc import Callable

from schedhub.registry import Record, Registry, target_kind

from .search import Retimed, time_traces


def _verified(records: list[Record]) -> list[Record]:
    return [r for r in records if r.served is not None and r.served.verified]


def needs_retime(records: list[Record]) -> bool:
    """Whether a key's records (as served, best first) would rank by flushed time once re-timed: two verified
    records or more on a CPU, some of them without a verified flushed time."""
    verified = _verified(records)
    return len(verified) >= 2 and target_kind(verified[0].identity.target) == "llvm" and any(not r.served.verified_flushed_secs for r in verified)


def lacking_flushed(records: list[Record]) -> list[str]:
    """The traces of a key's verified records (as served) that keep it ranked by warm time: none where it does not
    :func:`needs_retime`."""
    return [r.trace for r in _verified(records) if not r.served.verified_flushed_secs] if needs_retime(records) else []  # type: ignore[union-attr]


def settled(records: list[Record]) -> list[str]:
    """The traces of a key's records (as served) that a trusted re-push leaves as they are: verified, and with a verified
    flushed time where the target's records are timed so (a CPU's). Timing one again is worth nothing to the registry."""
    cpu = bool(records) and target_kind(records[0].identity.target) == "llvm"
    return [r.trace for r in _verified(records) if r.served.verified_flushed_secs or not cpu]  # type: ignore[union-attr]


def retime_records(records: list[Record]) -> tuple[list[Record], Retimed]:
    """The verified ``records`` of one key timed side by side (warm and flushed, outputs checked), as records to push
    again (each its own trace, the new warm times and its flushed mean in provenance), and what was timed."""
    verified = [r.trace for r in _verified(records)]
    return time_traces(records[0].identity, verified) if verified else ([], Retimed(records[0].identity.key, records[0].identity.op))


def keys_to_retime(registry: Registry, op: str | None = None, target: str | None = None) -> list[str]:
    """The keys of ``registry`` (filtered by ``op`` and ``target``) that :func:`needs_retime`, listed before any is
    pushed again (a push moves its key to the change feed's head)."""
    return [summary.key for summary, records in registry.iter_served(op, target) if needs_retime(records)]


def retime(registry: Registry, op: str | None = None, target: str | None = None, on_key: Callable[[Retimed], None] | None = None) -> list[Retimed]:
    """Re-time every key of ``registry`` that :func:`needs_retime` (on the Ray cluster this process is connected to)
    and push its records again; returns what each key's records timed."""
    out = []
    for key in keys_to_retime(registry, op, target):
        again, done = retime_records(registry.get(key))
        if again:
            registry.put_many(again)
        out.append(done)
        if on_key is not None:
            on_key(done)
    return out
