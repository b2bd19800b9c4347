"""Re-time a registry's verified records on flushed caches, so each key ranks by what a network sees.

A key ranks its verified records by their flushed times only when every one of them has one (the registry never
compares a flushed time with a warm one). Records verified before flushed times were taken have none, so their keys
rank by warm time, which served ResNet-18 a stage-4 convolution that read its weights in an order the network pays
for. For each key with two verified records or more, some without a flushed time, :func:`retime` times them all side
by side with the default schedule, warm and flushed, each output checked as a verification checks it, and pushes each
again with its flushed time: a trusted re-push (a worker's or an admin's token, or a local store) gives an entry the
flushed time it lacked. Its owner, its bytes and its verified warm time stay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from schedhub.registry import FLUSHED_SECS, Record, Registry, target_kind

from . import cluster, tvm_env
from .backends import Timeline
from .kernels import FINAL_TIMING

log = logging.getLogger("schedhub.tuner")


@dataclass
class Retimed:
    """One key re-timed: each record's (warm, flushed) mean seconds by trace id, and why any record was not timed."""

    key: str
    op: str
    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def needs_retime(records: list[Record]) -> bool:
    """Whether a key's records (as served, best first) would rank by flushed time once re-timed: two verified
    records or more on a CPU, some of them without a verified flushed time."""
    verified = [r for r in records if r.served is not None and r.served.verified]
    return len(verified) >= 2 and target_kind(verified[0].identity.target) == "llvm" and any(not r.served.verified_flushed_secs for r in verified)


def retime_records(records: list[Record]) -> tuple[list[Record], Retimed]:
    """The verified ``records`` of one key timed side by side (warm and flushed, outputs checked), as records to push
    again (each its own trace, the new warm times and its flushed mean in provenance), and what was timed."""
    from schedhub.hooks.guard import ScheduleLimits
    from schedhub.hooks.identity import workload_module
    from schedhub.hooks.msdb import replay_within

    from .search import flushed_claim, side_by_side

    tvm_env.prepare()
    identity = records[0].identity
    done = Retimed(identity.key, identity.op)
    mod = workload_module(identity.workload)
    replayed: list[tuple[Record, object]] = []
    for record in records:
        if record.served is None or not record.served.verified:
            continue
        try:
            replayed.append((record, replay_within(mod, record.trace, ScheduleLimits()).mod))
        except Exception as exc:  # verified once, someone's data all the same: left as it is, said why
            done.errors.append(f"{record.trace_id}: does not replay: {type(exc).__name__}: {str(exc).strip()[:200]}")
    if not replayed:
        return [], done
    cluster.check_feasible(identity.target)
    timed = side_by_side(identity, mod, [m for _, m in replayed], FINAL_TIMING, Timeline(f"retime:{identity.key[:8]}"))
    again = []
    for (record, _), result in zip(replayed, timed[1:]):
        claim = flushed_claim(result)
        if not result["run_secs"] or not claim:
            done.errors.append(f"{record.trace_id}: {result.get('error') or 'not timed on flushed caches'}")
            continue
        again.append(Record(identity, record.trace, result["run_secs"], {"retimed": True, **claim}))
        done.times[record.trace_id] = (sum(result["run_secs"]) / len(result["run_secs"]), claim[FLUSHED_SECS])
    return again, done


def keys_to_retime(registry: Registry, op: str | None = None, target: str | None = None) -> list[str]:
    """The keys of ``registry`` (filtered by ``op`` and ``target``) that :func:`needs_retime`, listed before any is
    pushed again (a push moves its key to the change feed's head)."""
    return [summary.key for summary, records in registry.iter_served(op, target) if summary.verified >= 2 and needs_retime(records)]


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
