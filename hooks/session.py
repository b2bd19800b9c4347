"""HookSession: what the compile hook knows during one ``use(...)`` block, in plain Python.

It turns kernels into registry identities (cached by structural hash), looks them up in batches
with a read-through cache, buffers misses for one batched report, quarantines records whose trace
does not replay, and goes offline (one warning) when the registry fails, so the compile falls
back to TVM's default schedules instead of failing.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm_ffi

from schedhub.registry import Identity, Record, Registry, RegistryError

from .identity import as_module, workload_identity
from .msdb import tuning_record

log = logging.getLogger("schedhub")

HIT, MISS, FALLBACK, OFFLINE = "hit", "miss", "fallback", "offline"


class RegistryFallbackWarning(UserWarning):
    """The registry could not be used; kernels keep TVM's default schedules."""


@dataclass
class KernelOutcome:
    op: str
    key: str
    outcome: str  # hit | miss | fallback (a record failed to replay) | offline
    detail: str = ""


@dataclass
class CompileReport:
    kernels: list[KernelOutcome] = field(default_factory=list)
    lookups: int = 0  # registry round trips
    lookup_secs: float = 0.0
    misses_reported: int = 0
    problems: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(k.outcome == outcome for k in self.kernels)

    @property
    def hits(self) -> int:
        return self.count(HIT)

    @property
    def misses(self) -> int:
        return self.count(MISS) + self.count(OFFLINE)

    @property
    def fallbacks(self) -> int:
        return self.count(FALLBACK)

    def summary(self) -> str:
        return (f"schedhub: {len(self.kernels)} kernels: {self.hits} hits, {self.misses} misses, {self.fallbacks} fallbacks "
                f"({self.lookups} lookups in {self.lookup_secs * 1e3:.1f} ms, {self.misses_reported} misses reported)")  # fmt: skip


class HookSession:
    def __init__(self, registry: Registry, *, report_misses: bool = True) -> None:
        self.registry = registry
        self.report_misses = report_misses
        self.reports: list[CompileReport] = [CompileReport()]
        self.offline = False
        self._identities: dict[tuple[int, str], Identity] = {}
        self._records: dict[str, list[Record]] = {}
        self._pending_misses: dict[str, Identity] = {}
        self._quarantined_keys: set[str] = set()

    @property
    def report(self) -> CompileReport:
        """The report of the latest compile in this block."""
        return self.reports[-1]

    def begin_compile(self) -> None:
        if self.report.kernels or self.report.lookups:
            self.reports.append(CompileReport())

    def end_compile(self) -> None:
        self.flush_misses()
        log.info(self.report.summary())

    # -- identity and lookup -----------------------------------------------------------------

    def identity(self, func: tvm.IRModule | Any, target: tvm.target.Target, op: str | None = None) -> Identity:
        mod = as_module(func)
        cache_key = (tvm_ffi.structural_hash(mod), str(target))
        if cache_key not in self._identities:
            self._identities[cache_key] = workload_identity(mod, target, op)
        return self._identities[cache_key]

    def prefetch(self, identities: list[Identity]) -> None:
        """Fetch every key not yet cached in one batch request."""
        wanted = [i.key for i in identities if i.key not in self._records]
        if not wanted or self.offline:
            return
        start = time.perf_counter()
        try:
            found = self.registry.lookup(wanted)
        except RegistryError as exc:
            self._go_offline(exc)
            return
        finally:
            self.report.lookups += 1
            self.report.lookup_secs += time.perf_counter() - start
        for key in wanted:
            self._records[key] = found.get(key, [])

    def cached(self) -> dict[str, list[Record]]:
        """Every key this session has looked up, with the records it found ([] for a miss)."""
        return dict(self._records)

    def records(self, identity: Identity) -> list[Record]:
        self.prefetch([identity])
        return self._records.get(identity.key, [])

    # -- the query TVM makes -----------------------------------------------------------------

    def best_tuning_record(self, mod: tvm.IRModule, target: tvm.target.Target, op: str | None) -> Any:
        """The best record that replays on ``mod``, or None (a miss, reported later)."""
        identity = self.identity(mod, target, op)
        if self.offline:
            self._note(identity, OFFLINE)
            return None
        for record in self.records(identity):
            try:
                tr = tuning_record(record, mod)
            except Exception as exc:  # TVM raises ScheduleError, TVMError, ValueError… on a bad trace
                self._quarantine(record, exc)
                continue
            self._note(identity, HIT, record.trace_id)
            return tr
        self._note(identity, FALLBACK if identity.key in self._quarantined_keys else MISS)
        self._pending_misses[identity.key] = identity
        return None

    def _quarantine(self, record: Record, exc: Exception) -> None:
        reason = f"{exc.__class__.__name__}: {str(exc)[:1000]}"
        self.report.problems.append(f"record {record.trace_id} of {record.identity.op} failed to replay ({reason}); quarantined")
        log.warning("schedhub: a record for %s failed to replay and was quarantined: %s", record.identity.op, reason[:200])
        self._quarantined_keys.add(record.key)
        self._records[record.key] = [r for r in self._records.get(record.key, []) if r.trace_id != record.trace_id]
        try:
            self.registry.quarantine(record.key, record.trace_id, reason)
        except RegistryError as exc2:
            self.report.problems.append(f"could not quarantine {record.trace_id}: {exc2}")

    def _note(self, identity: Identity, outcome: str, detail: str = "") -> None:
        self.report.kernels.append(KernelOutcome(identity.op, identity.key, outcome, detail))

    def _go_offline(self, exc: Exception) -> None:
        self.offline = True
        message = f"schedhub registry {getattr(self.registry, 'location', '')} unavailable ({exc}); compiling with TVM's default schedules"
        self.report.problems.append(message)
        warnings.warn(message, RegistryFallbackWarning, stacklevel=2)

    # -- end of the block --------------------------------------------------------------------

    def flush_misses(self) -> None:
        """Report buffered misses in one request (skipped when offline or disabled)."""
        if not self._pending_misses or not self.report_misses or self.offline:
            return
        misses = list(self._pending_misses.values())
        self._pending_misses.clear()
        try:
            self.registry.report_misses(misses)
            self.report.misses_reported += len(misses)
        except RegistryError as exc:
            self.report.problems.append(f"misses not reported: {exc}")
            warnings.warn(f"schedhub could not report {len(misses)} misses: {exc}", RegistryFallbackWarning, stacklevel=2)
