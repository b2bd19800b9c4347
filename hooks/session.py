"""HookSession: what the compile hook knows during one ``use(...)`` block, in plain Python.

It turns kernels into registry identities (cached by structural hash), looks them up in batches
with a read-through cache, serves only records its ``trust`` accepts, refuses records that fail to
replay or would cost the compile too much (:mod:`.guard`) and complains about them to the registry,
serves a *transfer* on a miss (a record of the same structure from another shape, compiler build or
target that replays on the kernel within the bounds; the miss is still reported, so the exact
schedule gets tuned) or, opted in with a measurement budget, a schedule *synthesized* from the
kernel's own design space (:mod:`.synthesis`) that ran fastest here, buffers misses for one batched report, and goes offline (one warning) when the registry fails, so
the compile falls back to TVM's default schedules instead of failing.

``trust``: ``"verified"`` (the default) serves records a trusted worker replayed, checked and
re-measured; ``"any"`` also serves unverified claims (verified first); a collection of pusher
names serves verified records and those names' claims.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm_ffi.serialization import from_json_graph_str, to_json_graph_str

from schedhub.registry import TARGET, Candidate, Identity, Record, RefusedRecord, Registry, RegistryError, Trust, keeps_default_schedule, signature_args_info, trust_filter, trusted

from .cache import KernelCache, default_dir
from .guard import ScheduleLimits, check_scheduled
from .identity import as_module, compiler_fingerprint, plain_json, workload_identity
from .defaults import default_contends, default_schedule
from .measure import TIMING, Budget, KernelBench, Timing, build_all, first_equal, machine, runs_here
from .msdb import normalize_mod, postprocessed_here, replay_launchable, repostprocesses, trace_text
from .lowering import Lowerings
from .objects import OBJECT_ID, ObjectCache, object_id_of
from .padding import PADDED, padded_dispatch
from .recompute import RELOCATED, relocated
from .costmodel import WIDTH, CostModel, features, flops
from .ranking import MEASURED_ONLY, REPOSTPROCESSED, SYNTHESIZED, Retiling, effort, model_decides, model_rank_key, rank_key, retiled, speed, work
from .synthesis import TIMED, LogModel, check_sample_count, synthesize
from .threads import usable_cpus, warn_idle_cores


log = logging.getLogger("schedhub")

MAX_REFUSED_NAMED = 8  # records left out at lookups that a session names and complains about; the rest are counted
HIT, TRANSFER, MISS, FALLBACK, OFFLINE = "hit", "transfer", "miss", "fallback", "offline"  # and SYNTHESIZED
DEFAULT_CANDIDATES = 4  # neighbours asked for per missed key
OWN_COMMITS_KEPT = 8  # a process's own commits read back per key: its best, as the registry keeps a key's best 8
LAUNCHES_CHECKED = "GPU launches checked: threads bound consistently, within the block's limits"  # in the kernel cache's key of
#   every schedule: schedules cached before the checks (:func:`.msdb.replay_launchable`) are worked out again


@dataclass(frozen=True)
class KeptDefault:
    """A measured compile's verdict on a missed kernel: the target's default schedule (DLight's on a GPU) ran faster
    than every candidate timed, so the kernel keeps it (``detail`` says by how much; ``measured``: the candidates' seconds)."""

    detail: str
    measured: dict[str, float | None]


class ReplayFailed(RuntimeError):
    """A trace that failed to replay on this kernel before (the per-machine cache remembers)."""


class RegistryFallbackWarning(UserWarning):
    """The registry could not be used; kernels keep TVM's default schedules."""


@dataclass
class KernelOutcome:
    op: str
    key: str
    outcome: str  # hit | transfer | synthesized | miss | fallback (a record failed to replay) | offline
    detail: str = ""  # hit: the trace id ("default:" before it where the record says nothing beat the default schedule); transfer, synthesized: "relation:trace id:source op"; miss: "default:…" where the default beat every candidate timed
    measured: dict[str, float | None] = field(default_factory=dict)  # candidates timed here: trace id → seconds (None: refused)


@dataclass
class CompileReport:
    kernels: list[KernelOutcome] = field(default_factory=list)
    lookups: int = 0  # registry round trips
    lookup_secs: float = 0.0
    misses_reported: int = 0
    problems: list[str] = field(default_factory=list)
    linked: int = 0  # scheduled kernels whose machine code came from this machine's object cache
    objects_compiled: int = 0  # of those, compiled in this build (the rest were cached)
    ranked_by: str = ""  # the cost model that ranked this compile's transfers ('': the fit ranking, hooks.ranking.rank_key)
    model_ranked: int = 0  # kernels whose candidates it ranked (the rest: the fit ranking)

    def count(self, outcome: str) -> int:
        return sum(k.outcome == outcome for k in self.kernels)

    @property
    def hits(self) -> int:
        return self.count(HIT)

    @property
    def default_hits(self) -> int:
        """Hits whose record says nothing beat the target's default schedule: the kernel keeps it (a result, not a speedup)."""
        return sum(k.outcome == HIT and k.detail.startswith("default:") for k in self.kernels)

    @property
    def transfers(self) -> int:
        return self.count(TRANSFER)

    @property
    def synthesized(self) -> int:
        return self.count(SYNTHESIZED)

    @property
    def misses(self) -> int:
        return self.count(MISS) + self.count(OFFLINE)

    @property
    def fallbacks(self) -> int:
        return self.count(FALLBACK)

    def summary(self) -> str:
        linked = f"; {self.linked} kernel objects linked ({self.objects_compiled} compiled now)" if self.linked else ""
        linked += f"; {self.model_ranked} kernels' transfers ranked by {self.ranked_by}" if self.ranked_by else ""
        synthesized = f", {self.synthesized} synthesized" if self.synthesized else ""
        kept = sum(k.outcome == MISS and k.detail.startswith("default:") for k in self.kernels)
        if offline := self.count(OFFLINE):  # not "misses" as if the registry had answered: it did not
            linked = f"; the registry could not be reached: {offline} kernels kept TVM's default schedules, unreported" + linked
        linked += f"; {kept} misses kept the default schedule, faster than every candidate timed" if kept else ""
        hits = f"{self.hits} hits ({self.default_hits} of them keep the default schedule: nothing beat it)" if self.default_hits else f"{self.hits} hits"
        return (f"schedhub: {len(self.kernels)} kernels: {hits}, {self.transfers} transfers{synthesized}, {self.count(MISS)} misses, {self.fallbacks} fallbacks "
                f"({self.lookups} lookups in {self.lookup_secs * 1e3:.1f} ms, {self.misses_reported} misses reported){linked}")  # fmt: skip


class HookSession:
    def __init__(self, registry: Registry, *, report_misses: bool = True, trust: Trust = "verified",
                 limits: ScheduleLimits | None = None, transfer: bool = True, cache: KernelCache | None = None,
                 measure: float = 0.0, objects: ObjectCache | None = None, synthesize: int = 0, rank_by_model: bool | None = None, pad: bool = True,
                 relocate: bool = True, repostprocess: bool = True) -> None:  # fmt: skip
        check_sample_count(synthesize)
        self.registry = registry
        self.objects = objects  # where scheduled kernels' machine code is kept and linked from (None: compiled in each build)
        self.measure = measure
        self.synthesize = synthesize  # design-space samples scored per missed kernel (0: none; needs ``measure``)
        self.rank_by_model = rank_by_model  # transfers ranked with the registry's served cost model: always, never, None: where it decides
        self.pad = pad  # loops whose recorded tiles TVM would re-derive padded to them (:mod:`.padding`)
        self.relocate = relocate  # a transfer's compute locations that recompute a reduction moved out (:mod:`.recompute`)
        self.repostprocess = repostprocess  # a measured compile also times each transfer's sketch postprocessed here (:meth:`_repostprocessed`)
        self._budget = Budget(measure)
        self.build_workers = usable_cpus()  # candidates compiled at once
        self.cache = cache if cache is not None else KernelCache(default_dir())
        self.lowerings = Lowerings(self.cache)  # scheduled kernels not built alone, lowered alone before the model's build
        self.report_misses = report_misses
        self.transfer = transfer
        self.trust = trust
        self.trusts = trust_filter(trust)
        accepts = trusted(trust)
        self.log_model = LogModel(registry, self.cache, lambda entry: accepts(entry.verified, entry.pushed_by), verified_only=trust == "verified")
        self.limits = limits or ScheduleLimits()
        self.reports: list[CompileReport] = [CompileReport()]
        self.offline = False
        self._identities: dict[tuple[int, str], Identity] = {}
        self._records: dict[str, list[Record]] = {}
        self._candidates: dict[str, list[Candidate]] = {}  # neighbours of missed keys, nearest first
        self._flops: dict[str, float] = {}  # kernel key: TVM's FLOP estimate (a cost model's feature)
        self._retiled: dict[tuple[str, str], Retiling] = {}  # (kernel key, trace id): tile sizes re-derived on replay
        self._committed: dict[str, dict[str, Record]] = {}  # key: trace id: this process's best commit of it, read back at once
        self._pending_misses: dict[str, Identity] = {}
        self._calls: dict[str, int] = {}  # kernel key: call sites in the module being compiled
        self._served_secs: dict[str, float] = {}  # kernel key: seconds per call of the transfer it served (measured or estimated)
        self._refused_keys: set[str] = set()
        self._refused_named = 0  # records left out at a lookup that this session named and complained about
        self._served_objects: dict[str, tuple[Record, tuple[str, ...]]] = {}  # this compile's scheduled kernels by OBJECT_ID: record, cache parts
        self.originals: dict[str, tirx.PrimFunc] = {}  # this compile's kernels the apply pass scheduled, as they were, by name
        self._targets_checked: set[str] = set()

    @property
    def report(self) -> CompileReport:
        """The report of the latest compile in this block."""
        return self.reports[-1]

    def begin_compile(self) -> None:
        if self.report.kernels or self.report.lookups:
            self.reports.append(CompileReport())
        self._budget = Budget(self.measure)
        self._calls.clear()  # what orders this compile's misses: this compile's module and what it serves
        self._served_secs.clear()
        self.originals.clear()
        self._served_objects.clear()

    def end_compile(self) -> None:
        self.flush_misses()
        if (why := self.cache.unwritable.tell()) is not None:
            self._say(f"the kernel cache in {self.cache.root} cannot be written ({why}): later compiles redo this one's work")
        if self.objects is not None and (why := self.objects.failed.tell()) is not None:
            self._say(f"kernel objects not cached in {self.objects.root} ({why}): those kernels are built in the model's module")
        log.info(self.report.summary())

    def _say(self, problem: str) -> None:
        """A problem the compile survived, in the report and the log, once a session."""
        self.report.problems.append(problem)
        log.warning("schedhub: %s", problem)

    def check_threads(self, target: tvm.target.Target) -> None:
        """Say once a block per target when TVM will run its kernels here on fewer threads than its num-cores."""
        if str(target) in self._targets_checked:
            return
        self._targets_checked.add(str(target))
        message = warn_idle_cores(target)
        if message is not None:
            self.report.problems.append(message)

    # -- identity and lookup -----------------------------------------------------------------

    def identity(self, func: tvm.IRModule | Any, target: tvm.target.Target, op: str | None = None) -> Identity:
        mod = as_module(func)
        cache_key = (tvm_ffi.structural_hash(mod), str(target))
        if cache_key not in self._identities:
            self._identities[cache_key] = workload_identity(mod, target, op, self.cache)
        return self._identities[cache_key]

    def prefetch(self, identities: list[Identity]) -> None:
        """Fetch every key not yet cached in one batch request."""
        wanted = list({i.key: i for i in identities if i.key not in self._records}.values())
        if not wanted or self.offline:
            return
        start = time.perf_counter()
        refused: list[RefusedRecord] = []
        try:
            if self.transfer:
                found, near = self.registry.lookup_with_candidates(wanted, per_key=DEFAULT_CANDIDATES, refused=refused, trust=self.trust)
            else:
                found, near = self.registry.lookup([i.key for i in wanted], refused=refused), {}
        except RegistryError as exc:
            self._go_offline(exc)
            return
        finally:
            self.report.lookups += 1
            self.report.lookup_secs += time.perf_counter() - start
        for identity in wanted:
            self._records[identity.key] = found.get(identity.key, [])
            self._candidates[identity.key] = [c for c in near.get(identity.key, []) if c.record.identity.structure == identity.structure]
        self._left_out(list(dict.fromkeys(refused)))

    def _left_out(self, refused: list[RefusedRecord]) -> None:
        """Say which records the registry answered that this version's checks refuse, and complain about them (the
        registry checks each and takes it out of service): the first :data:`MAX_REFUSED_NAMED` a session meets, so
        a registry full of them costs a compile a bounded number of requests; the rest are counted."""
        for n, item in enumerate(refused):
            if self._refused_named >= MAX_REFUSED_NAMED:
                self._say(f"{len(refused) - n} more records left out, not named; the last: {refused[-1].reason[:200]}")
                return
            self._refused_named += 1
            self._say(f"record {item.trace_id or '(unnamed)'} of key {item.key[:16] or '(unnamed)'} left out: {item.reason}")
            if item.key and item.trace_id:
                self._complain(item.key, item.trace_id, item.reason)

    def count_calls(self, kernels: list[tuple[Identity, int]]) -> None:
        """How often the module being compiled calls each kernel (identity, call sites; a kernel under two
        names counts both): what orders the misses this compile reports."""
        calls: dict[str, int] = {}
        for identity, count in kernels:
            calls[identity.key] = calls.get(identity.key, 0) + max(1, count)
        self._calls.update(calls)

    def cached(self) -> dict[str, list[Record]]:
        """Every key this session has looked up, with the records it found ([] for a miss)."""
        return dict(self._records)

    def records(self, identity: Identity) -> list[Record]:
        """The records this session would serve for ``identity``: the registry's in its order; with this process's own
        commits of the key, all of them best first by mean time, a trace once at its best."""
        self.prefetch([identity])
        served = [r for r in self._records.get(identity.key, []) if self.trusts(r)]
        own = self._committed.get(identity.key)
        return best_first([*own.values(), *served]) if own else served

    def committed(self, record: Record) -> None:
        """A record this process stored: served from now on, whatever the registry's cache said; a trace committed
        again keeps its best time, and a key keeps its :data:`OWN_COMMITS_KEPT` best traces."""
        own = self._committed.setdefault(record.key, {})
        kept = own.get(record.trace_id)
        if kept is not None and kept.mean_secs <= record.mean_secs:
            return
        own[record.trace_id] = record
        if len(own) > OWN_COMMITS_KEPT:
            del own[max(own.values(), key=lambda r: r.mean_secs).trace_id]

    def own_commits(self) -> list[Record]:
        """What this process committed and keeps (:meth:`committed`), every key's best first."""
        return [r for own in self._committed.values() for r in best_first(list(own.values()))]

    # -- what the compile's apply pass asks -----------------------------------------------------

    def scheduled(self, func: tirx.PrimFunc, target: tvm.target.Target, op: str | None) -> tvm.IRModule | None:
        """The kernel in MetaSchedule's normalized module scheduled by the best record that applies (a hit), else by a
        transfer, with the trace replayed (from the per-machine cache when it was replayed before); None for a miss."""
        identity = self.identity(func, target, op)
        normalized = normalize_mod(func)
        static = not identity.symbolic  # a symbolic size (a dynamic batch) cannot be measured: its transfers are ranked only,
        transfers = static or not default_contends(target)  # and on a GPU, where they could not be timed against DLight, not served
        bench = (normalized, target) if self.measure > 0 and runs_here(target) and static else None

        def apply(record: Record, _args_info: list[Any] | None) -> tvm.IRModule | None:
            if keeps_default_schedule(record.trace):  # nothing beat the target's default: leave the kernel to it (DLight's on a GPU)
                return None
            return self._schedule(record, normalized, identity, target)

        return self._serve(identity, apply, bench, (normalized, target), transfers)

    def _serve(self, identity: Identity, apply: Callable[[Record, list[Any] | None], Any], bench: tuple[tvm.IRModule, Any] | None = None,
               kernel: tuple[tvm.IRModule, Any] | None = None, transfers: bool = True) -> Any:  # fmt: skip
        """The first record (best first) that ``apply`` accepts; else (with ``transfers``) the first candidate that does (a transfer); else None."""
        if self.offline and not self._committed.get(identity.key):
            self._note(identity, OFFLINE)
            return None
        for record in self.records(identity):
            try:
                out = apply(record, None)
            except Exception as exc:  # TVM raises ScheduleError, InternalError, ValueError… on a bad trace
                self._refuse(record, exc)
                continue
            self._note(identity, HIT, f"default:{record.trace_id}" if keeps_default_schedule(record.trace) else record.trace_id)
            return out
        self._pending_misses[identity.key] = identity  # a transfer too: the exact schedule is still to tune
        transferred = self._transfer(identity, apply, bench, kernel) if transfers else None
        if transferred is not None and not isinstance(transferred, KeptDefault):
            return transferred
        kept = transferred or KeptDefault("", {})
        self._note(identity, FALLBACK if identity.key in self._refused_keys else MISS, kept.detail, kept.measured)
        return None

    def _schedule(self, record: Record, normalized: tvm.IRModule, identity: Identity, target: tvm.target.Target) -> tvm.IRModule:
        """``normalized`` with ``record``'s trace replayed once and checked against the bounds, or
        from the cache (keyed by the kernel's key, the trace, the bounds and the repairs: the same canonical
        workload up to parameter names); raises if it does not apply, also when it did not before.
        A transfer on a CPU target is repaired where the session allows: compute locations that recompute a reduction
        moved out (``relocate``, :mod:`.recompute`), then loops whose recorded tiling TVM re-derived (a symbolic size, or
        tiles that no longer divide) padded to the recorded tiles (``pad``, :mod:`.padding`), each where it replays
        within the bounds (a record of this very workload, from another compiler build or CPU, is not relocated). The
        padding copies are CPU loops, and nothing repaired was timed on a GPU. On a GPU, a transfer whose recorded
        postprocessing binds one launch's threads to loops of different extents is postprocessed again here, and a
        schedule past the block's limits is refused (:func:`.msdb.replay_launchable`)."""
        key, cpu = identity.key, target.kind.name == "llvm"
        pad = self.pad and cpu
        relocate = self.relocate and cpu and record.identity.workload != identity.workload  # one tuned for this workload was measured on it
        parts = (key, record.trace, repr(self.limits), f"{PADDED}: {pad}", f"{RELOCATED}: {relocate}", LAUNCHES_CHECKED)
        entry = self.cache.get("scheduled", *parts)
        if entry is not None and isinstance(entry.get("error"), str):
            raise ReplayFailed(entry["error"])
        mod = None
        if entry is not None and isinstance(entry.get("module"), str) and type(entry.get("retiled")) is int and type(entry.get("blind")) is int:
            with contextlib.suppress(Exception):  # unreadable: replay again
                mod = from_json_graph_str(entry["module"])  # written by this compiler: no schema upgrade (tvm.ir.load_json's costs a replay)
                self._retiled[(key, record.trace_id)] = Retiling(entry["retiled"], entry["blind"])
        if mod is None:
            try:
                sch = replay_launchable(normalized, record.trace, target, self.limits)
                recorded = json.loads(record.trace)
                tiles = retiled(recorded, sch.trace)
                moved = relocated(normalized, recorded, sch, target, self.limits) if relocate else None
                if moved is not None:
                    sch, recorded = moved, plain_json(moved.trace.as_json())
                mod = (self._padded(normalized, record, recorded, sch) if pad else None) or sch.mod
            except Exception as exc:
                self.cache.put("scheduled", parts, {"error": f"{exc.__class__.__name__}: {str(exc)[:2000]}"})
                raise
            self._retiled[(key, record.trace_id)] = tiles
            self.cache.put("scheduled", parts, {"module": to_json_graph_str(mod), "retiled": tiles.rederived, "blind": tiles.blind})
        # The same name identifies the kernel's machine code (.objects): one per kernel, trace and bounds.
        out = mod.clone()
        object_id = KernelCache.name("object", *parts)
        out.update_func(out.get_global_var("main"), mod["main"].with_attr(OBJECT_ID, object_id))
        self._served_objects[object_id] = (record, parts)
        return out

    def unbuildable(self, mod: tvm.IRModule, failures: tuple[tuple[tvm.ir.GlobalVar, Exception], ...]) -> tvm.IRModule:
        """``mod`` with each scheduled kernel that TVM could not build (``failures``: its GlobalVar and TVM's error) as
        it was before the apply pass, so the model's build does not fail on it: its record is refused, complained
        about and remembered (the kernel cache keeps the error), and the kernel reported as a fallback."""
        out = mod.clone()
        for gv, exc in failures:
            original, served = self.originals.get(gv.name_hint), self._served_objects.get(object_id_of(mod[gv]) or "")
            if original is None or served is None:
                continue  # not scheduled by this session: the build fails as it would without schedhub
            record, parts = served
            out.update_func(gv, original)
            reason = f"the scheduled kernel does not build: {exc.__class__.__name__}: {str(exc)[:1000]}"
            self.cache.put("scheduled", parts, {"error": reason})
            self._refuse(record, ReplayFailed(reason))
            for kernel in self.report.kernels:
                if kernel.key == parts[0] and kernel.outcome != FALLBACK:
                    kernel.outcome, kernel.detail, kernel.measured = FALLBACK, record.trace_id, {}
        return out

    def _padded(self, normalized: tvm.IRModule, record: Record, recorded: list[Any], replayed: tvm.s_tir.Schedule) -> tvm.IRModule | None:
        """:func:`.padding.padded_dispatch` of ``record`` (its trace as JSON: ``recorded``) within the bounds, or None
        (nothing to pad, or the padded replay failed or is too costly)."""
        try:
            out = padded_dispatch(normalized, recorded, replayed)
            if out is not None:
                check_scheduled(out, self.limits, normalized)
            return out
        except Exception as exc:  # TVM's errors, a trace that lists other blocks, ScheduleTooCostly, JSON the plain replay let pass
            log.debug("schedhub: %s not padded on %s: %s", record.trace_id, record.identity.op, str(exc)[:200])
            return None

    def _transfer(self, identity: Identity, apply: Callable[[Record, list[Any] | None], Any], bench: tuple[tvm.IRModule, Any] | None = None,
                  kernel: tuple[tvm.IRModule, Any] | None = None) -> Any:  # fmt: skip
        """A candidate that ``apply`` accepts on the kernel: the first by :func:`.ranking.rank_key` (its tiling fits
        the kernel as tuned, then its speed on its own workload) or, with ``rank_by_model`` where the registry
        serves a cost model the session trusts and ``kernel`` (the normalized kernel and its target) lets features be computed, by
        :func:`.ranking.model_rank_key` (the model's predicted speed on this kernel in place of the speed at home:
        :meth:`_predicted`); or with ``bench``
        (the kernel's normalized module and target: opt-in measurement) the fastest that agrees with
        the default schedule's output, while the compile's measurement budget lasts; else None. On a GPU
        the default (DLight's schedule) is timed beside them, and where every candidate timed is slower
        none is served: the kernel keeps the default (:class:`KeptDefault`, the verdict, is returned).

        A candidate that does not apply is dropped for this session without a complaint: it was
        tuned for another kernel, and failing on this one says nothing against it.
        """
        applied: list[tuple[Candidate, Any]] = []
        offered = [c for c in self._candidates.get(identity.key, []) if self.trusts(c.record) and not keeps_default_schedule(c.record.trace)]
        if bench is not None and self.synthesize:
            offered += self._synthesized(identity, bench)
        for candidate in offered:
            try:
                applied.append((candidate, apply(candidate.record, identity.args_info)))
            except Exception as exc:  # another structure after all, or over the bounds here
                log.debug("schedhub: candidate %s does not transfer to %s: %s", candidate.record.trace_id, identity.op, str(exc)[:200])
                if candidate.relation != SYNTHESIZED:  # a synthesized one is not in the list
                    self._candidates[identity.key].remove(candidate)
                continue
        if not applied:
            return None
        if bench is not None and self.repostprocess:
            applied += self._repostprocessed(identity, applied, bench, apply)
        group = {id(c): model_rank_key(c.relation, self._retiling(identity.key, c), 0.0, 0)[:3] for c, _ in applied}
        first = min(group.values())  # only these compete on a prediction: the others rank after them whatever it is
        model = self._ranking_model(identity, [c.record.identity.args_info for c, _ in applied if group[id(c)] == first]) if kernel is not None else None
        if model is not None and kernel is not None:
            ranked = {id(c): model_rank_key(c.relation, self._retiling(identity.key, c), self._predicted(identity, c.record, out, kernel, model) if group[id(c)] == first else -math.inf, i)
                      for i, (c, out) in enumerate(applied)}  # fmt: skip
        else:
            ranked = {id(c): self._rank(identity.key, c, i) for i, (c, _) in enumerate(applied)}
        applied.sort(key=lambda pair: ranked[id(pair[0])])
        derived = any(c.relation in MEASURED_ONLY for c, _ in applied)
        contends = bench is not None and default_contends(bench[1])  # a GPU's default (DLight) is a schedule a candidate must beat
        measured, default_secs = self._measure(identity, applied, bench) if bench is not None and (len(applied) > 1 or derived or contends) else ({}, None)
        # refused by measurement: never served; synthesized or postprocessed here: served only once measured here
        served = [(c, out) for c, out in applied if measured.get(c.record.trace_id, 0.0 if c.relation not in MEASURED_ONLY else None) is not None]
        if measured:
            served.sort(key=lambda pair: measured.get(pair[0].record.trace_id) or float("inf"))  # fastest measured first
        fastest = measured.get(served[0][0].record.trace_id) if served else None
        if default_secs is not None and fastest is not None and default_secs <= fastest:  # every candidate timed lost to it
            timed = sum(secs is not None for secs in measured.values())
            self._served_secs[identity.key] = default_secs
            return KeptDefault(f"default:{default_secs * 1e6:.1f} us, faster than the {timed} candidates timed", measured)
        if not served:
            return None
        candidate, out = served[0]
        self._candidates[identity.key] = [candidate, *(c for c in self._candidates.get(identity.key, []) if c is not candidate)]
        record = candidate.record
        self._served_secs[identity.key] = measured.get(record.trace_id) or transferred_secs(identity, record)
        outcome = SYNTHESIZED if candidate.relation == SYNTHESIZED else TRANSFER
        self._note(identity, outcome, f"{candidate.relation}:{candidate.record.trace_id}:{candidate.record.identity.op}", measured)
        return out

    def _repostprocessed(self, identity: Identity, applied: list[tuple[Candidate, Any]], bench: tuple[tvm.IRModule, Any],
                         apply: Callable[[Record, list[Any] | None], Any]) -> list[tuple[Candidate, Any]]:  # fmt: skip
        """For each transfer in ``applied`` on a CPU or CUDA GPU (:func:`.msdb.repostprocesses`), its sketch with the
        target's postprocessors applied again at this kernel (:func:`.msdb.repostprocessed`) as one more candidate, where
        that schedules the kernel otherwise than the record's own postprocessing (decided for the record's loop extents: which loops are fused into the parallel one, which
        vectorized, how far unrolled), ``apply``-ed; served only once measured (:func:`.msdb.postprocessed_here`). Kept in
        this machine's cache."""
        normalized, target = bench
        if not repostprocesses(target):
            return []
        out = []
        for candidate, _ in applied:
            source = candidate.record
            trace = self._postprocessed_trace(identity, source, normalized, target) if candidate.relation not in MEASURED_ONLY else None
            if trace is None:
                continue
            variant = Record(source.identity, trace, source.run_secs, {**source.provenance, "postprocessed_here_from": source.trace_id})
            try:
                out.append((Candidate(variant, REPOSTPROCESSED, candidate.distance), apply(variant, identity.args_info)))
            except Exception as exc:  # over the bounds once repaired, say
                log.debug("schedhub: %s postprocessed here does not apply to %s: %s", source.trace_id, identity.op, str(exc)[:200])
        return out

    def _postprocessed_trace(self, identity: Identity, record: Record, normalized: tvm.IRModule, target: tvm.target.Target) -> str | None:
        """The trace (JSON text) of ``record``'s sketch postprocessed again on the kernel, or None where that replays as the
        record's own postprocessing does (or fails): from this machine's cache, or worked out (one replay of each)."""
        parts = (identity.key, record.trace, repr(self.limits))
        entry = self.cache.get("repostprocessed", *parts)
        if isinstance(entry, dict) and "trace" in entry and (entry["trace"] is None or isinstance(entry["trace"], str)):
            return entry["trace"]
        trace = None
        with contextlib.suppress(Exception):  # a trace that does not replay as recorded: no variant
            sch = postprocessed_here(normalized, record.trace, target, self.limits)
            trace = None if sch is None else trace_text(sch.trace)
        self.cache.put("repostprocessed", parts, {"trace": trace})
        return trace

    def _synthesized(self, identity: Identity, bench: tuple[tvm.IRModule, Any]) -> list[Candidate]:
        """The cost model's best schedules of the kernel's own design space (:mod:`.synthesis`) as candidates:
        from this machine's cache, or drawn and scored while the compile's measurement budget lasts."""
        normalized, target = bench
        parts = (identity.key, str(self.synthesize), str(TIMED))  # the key names the compiler
        entry = self.cache.get("synthesized", *parts) or {}
        drawn = entry.get("schedules")
        if not (isinstance(drawn, list) and all(isinstance(d, list) and len(d) == 2 and isinstance(d[0], str) and isinstance(d[1], (int, float)) for d in drawn)):
            model = self.log_model.get(identity.target, self._budget, self._siblings(identity)) if self._budget.left() else None
            if model is None:
                return []
            try:
                drawn = [list(d) for d in synthesize(normalized, target, model, self.synthesize)]
            except Exception as exc:  # a kernel MetaSchedule cannot sample
                log.debug("schedhub: no schedules synthesized for %s: %s", identity.op, str(exc)[:200])
                drawn = []
            self.cache.put("synthesized", parts, {"schedules": drawn})
        provenance = {"synthesized": f"{self.synthesize} design-space samples ranked by a cost model", "predicted": True}
        return [Candidate(Record(identity, trace, [float(secs)], provenance), SYNTHESIZED, 0.0) for trace, secs in drawn if math.isfinite(secs) and secs > 0]

    def _siblings(self, identity: Identity) -> list[str]:
        """Other targets whose logs may lend ``identity``'s target a cost model: those of the kernel's own
        trusted ``target``-relation candidates, nearest first, then those of every other kernel this session
        looked up, so a kernel without such a neighbour, compiled before any kernel that has one, borrows too."""
        near = [*self._candidates.get(identity.key, []), *(c for found in self._candidates.values() for c in found)]
        return list(dict.fromkeys(c.record.identity.target for c in near if c.relation == TARGET and self.trusts(c.record)))

    def _ranking_model(self, identity: Identity, contenders: list[list[Any]]) -> CostModel | None:
        """The registry's cost model for the kernel's target, when it serves one the session trusts (fetched once a
        session; never trained here: training costs a compile 14-29 s, :class:`.synthesis.LogModel`) and it is to
        rank these ``contenders`` (the argument lists of the candidates that compete on a prediction): always with
        ``rank_by_model=True``, where :func:`.ranking.model_decides` with None, never with False."""
        if self.offline or self.rank_by_model is False or len(contenders) < 2:
            return None
        if self.rank_by_model is None and not model_decides(identity.args_info, contenders):
            return None
        served = self.log_model.served(identity.target)
        if served is None:
            return None
        model, entry = served
        if not self.report.ranked_by:
            self.report.ranked_by = f"the registry's cost model ({entry.trials} logged trials, pushed by {entry.pushed_by})"
        self.report.model_ranked += 1
        return model

    def _predicted(self, identity: Identity, record: Record, scheduled_mod: Any, kernel: tuple[tvm.IRModule, Any], model: CostModel) -> float:
        """The log₂ GFLOPS ``model`` predicts for ``record``'s schedule on this kernel (its features from this machine's
        cache, or computed from ``scheduled_mod``); -inf where they cannot be computed (ranked last)."""
        normalized, target = kernel
        parts = (identity.key, record.trace_id, compiler_fingerprint())  # as :class:`.synthesis.LogModel` keys a trial's features
        entry = self.cache.get("features", *parts) or {}
        row = entry.get("row")
        if not (isinstance(row, list) and len(row) == WIDTH):
            try:
                if identity.key not in self._flops:
                    self._flops[identity.key] = flops(normalized)
                work = self._flops[identity.key]
                row = [float(x) for x in features(scheduled_mod, target, work)]
            except Exception as exc:  # a schedule MetaSchedule cannot featurize: ranked last
                log.debug("schedhub: no features of %s on %s: %s", record.trace_id, identity.op, str(exc)[:200])
                return -math.inf
            self.cache.put("features", parts, {"row": row, "work": work})
        try:
            return model.predict([np.asarray(row, dtype=np.float32)])[0]
        except ValueError:
            return -math.inf

    def _retiling(self, key: str, candidate: Candidate) -> Retiling:
        """How ``candidate``'s tilings fit kernel ``key``, as its replay found (none re-derived: not replayed here)."""
        return self._retiled.get((key, candidate.record.trace_id), Retiling(0, 0))

    def _rank(self, key: str, candidate: Candidate, order: int) -> tuple[int, int, int, float, int]:
        """:func:`.ranking.rank_key` of a candidate replayed (already) on kernel ``key``."""
        record = candidate.record
        return rank_key(candidate.relation, self._retiling(key, candidate), speed(work(record.identity.workload), record.mean_secs), order)

    def _measure(self, identity: Identity, applied: list[tuple[Candidate, Any]], bench: tuple[tvm.IRModule, Any]) -> tuple[dict[str, float | None], float | None]:
        """Seconds per call of each applied candidate on this machine (None: wrong output or failed), from the
        cache or measured while the budget lasts; candidates left unmeasured are absent. The ones to measure
        are compiled side by side (with the target's default schedule), then checked and timed one at a time; those that
        schedule the kernel alike (:func:`.measure.first_equal`) once, their timing shared.
        Also the default schedule's seconds per call where it contends (:func:`.defaults.default_contends`; None elsewhere or untimed)."""
        kernel, target = bench
        here = machine(target)
        found: dict[str, float | None] = {}
        todo = []
        for candidate, scheduled_mod in applied:
            parts = (identity.key, candidate.record.trace, here, repr(TIMING))
            timing = Timing.from_dict(self.cache.get("measured", *parts) or {})
            if timing is None:
                todo.append((candidate, scheduled_mod, parts))
            else:
                found[candidate.record.trace_id] = timing.secs
        contends = default_contends(target)
        default_parts = (identity.key, "default", here, repr(TIMING))
        default_timing = Timing.from_dict(self.cache.get("measured", *default_parts) or {}) if contends else None
        default_untimed = contends and default_timing is None
        if not (todo or default_untimed) or not self._budget.left():
            return found, default_timing.secs if default_timing else None
        firsts = first_equal([m["main"].without_attr(OBJECT_ID) for _, m, _ in todo])  # a kernel scheduled alike is built and timed once
        unique = [i for i, first in enumerate(firsts) if first == i]
        try:
            built = build_all([default_schedule(kernel, target), *(todo[i][1] for i in unique)], target, self.build_workers)
            kernel_bench = KernelBench(built[0], identity.args_info, target)
            if self.objects is not None:
                self.objects.settle()  # no kernel object compiling beside the timing
            self.lowerings.settle()  # nor lowering
            if default_untimed:
                default_timing = Timing(kernel_bench.time_default())
                self.cache.put("measured", default_parts, default_timing.to_dict())
        except Exception as exc:  # arguments it cannot make, a default that cannot be scheduled (DLight), built or run
            log.debug("schedhub: cannot measure %s: %s", identity.op, exc)
            return found, None  # what was timed here before still holds
        libs, timed = dict(zip(unique, built[1:])), {}
        for (candidate, _, parts), first in zip(todo, firsts):
            if first not in timed:
                if not self._budget.left():
                    break
                timed[first] = kernel_bench.time(libs[first])
            self.cache.put("measured", parts, timed[first].to_dict())
            found[candidate.record.trace_id] = timed[first].secs
        return found, default_timing.secs if default_timing else None

    def _refuse(self, record: Record, exc: Exception) -> None:
        """Stop serving a record here and complain to the registry, which queues its verification."""
        reason = f"{exc.__class__.__name__}: {str(exc)[:1000]}"
        self.report.problems.append(f"record {record.trace_id} of {record.identity.op} refused ({reason}); complaint sent")
        log.warning("schedhub: a record for %s was refused and reported: %s", record.identity.op, reason[:200])
        self._refused_keys.add(record.key)
        self._records[record.key] = [r for r in self._records.get(record.key, []) if r.trace_id != record.trace_id]
        self._committed.get(record.key, {}).pop(record.trace_id, None)
        self._complain(record.key, record.trace_id, reason)

    def _complain(self, key: str, trace_id: str, reason: str) -> None:
        """Tell the registry a record failed here (unless offline): it verifies the record, or quarantines one that
        fails its own checks."""
        if self.offline:
            return
        try:
            self.registry.complain(key, trace_id, reason)
        except RegistryError as exc:
            self.report.problems.append(f"could not report {trace_id}: {exc}")

    def _note(self, identity: Identity, outcome: str, detail: str = "", measured: dict[str, float | None] | None = None) -> None:
        self.report.kernels.append(KernelOutcome(identity.op, identity.key, outcome, detail, dict(measured or {})))

    def _go_offline(self, exc: Exception) -> None:
        self.offline = True
        message = f"schedhub registry {getattr(self.registry, 'location', '')} unavailable ({exc}); compiling with TVM's default schedules"
        self.report.problems.append(message)
        warnings.warn(message, RegistryFallbackWarning, stacklevel=2)

    # -- end of the block --------------------------------------------------------------------

    def flush_misses(self) -> None:
        """Report buffered misses in one request (skipped when offline or disabled), the kernel that costs the
        compiled module the most time first (:meth:`miss_cost`): the registry's queue hands out one caller's jobs
        in the order they were first reported, so a worker's first passes speed the module up soonest."""
        if not self._pending_misses or not self.report_misses or self.offline:
            return
        misses = sorted((m for m in self._pending_misses.values() if tunable(m)), key=self.miss_cost, reverse=True)
        skipped = len(self._pending_misses) - len(misses)
        if skipped:  # dynamic shapes: nothing MetaSchedule could tune, and the registry refuses them
            self.report.problems.append(f"{skipped} kernels with non-static arguments not reported")
        self._pending_misses.clear()
        if not misses:
            return
        try:
            self.registry.report_misses(misses)
            self.report.misses_reported += len(misses)
        except RegistryError as exc:
            self.report.problems.append(f"misses not reported: {exc}")
            warnings.warn(f"schedhub could not report {len(misses)} misses: {exc}", RegistryFallbackWarning, stacklevel=2)

    def measure_priority(self, identity: Identity) -> float:
        """How much measuring a kernel's candidates may matter, before it is served: nothing for a hit, else the
        seconds it is expected to cost one run of the module, its call sites times its work at the home speed
        (:func:`.ranking.speed`) of its nearest trusted candidate, or, with none, at :data:`UNTUNED_SPEED` (a
        kernel only synthesis can serve). A compile that measures serves its misses in this order, so a budget
        that runs out has been spent where the module spends its time."""
        if self.records(identity):
            return 0.0
        near = next((c.record for c in self._candidates.get(identity.key, []) if self.trusts(c.record) and not keeps_default_schedule(c.record.trace)), None)
        return self._calls.get(identity.key, 1) * (transferred_secs(identity, near) if near else untuned_secs(identity))

    def miss_cost(self, identity: Identity) -> float:
        """Estimated seconds a missed kernel costs one run of the module compiled: its call sites times the
        seconds per call of what it was served (the transfer's time measured here, or its record's speed on
        its own workload applied to this kernel's work: :func:`.ranking.work`), or, for a kernel left to
        TVM's default schedule, its work, data movement included (:func:`.ranking.effort`), at :data:`UNTUNED_SPEED`."""
        secs = self._served_secs.get(identity.key)
        return self._calls.get(identity.key, 1) * (untuned_secs(identity) if secs is None else secs)


#: Work per second (:func:`.ranking.effort` units: about FLOP/s, or elements written per second) assumed of a
#: kernel left to TVM's default schedule: unscheduled CPU convolutions ran at 1–2 GFLOPS (``schedhub profile``),
#: MobileNet-V2's classifier-weight transpose (1.3M elements) in 1.2 ms; it only orders misses.
UNTUNED_SPEED = 1e9


def best_first(records: list[Record]) -> list[Record]:
    """``records`` fastest first by mean time, each trace once, at its best time."""
    best: dict[str, Record] = {}
    for record in records:
        if record.trace_id not in best or record.mean_secs < best[record.trace_id].mean_secs:
            best[record.trace_id] = record
    return sorted(best.values(), key=lambda r: r.mean_secs)


def transferred_secs(identity: Identity, record: Record) -> float:
    """Seconds per call ``record``'s schedule is expected to take on ``identity``'s kernel: the record's speed
    on its own workload (:func:`.ranking.speed`) applied to this kernel's work."""
    return work(identity.workload) / max(speed(work(record.identity.workload), record.mean_secs), 1.0)


def untuned_secs(identity: Identity) -> float:
    """Seconds per call assumed of ``identity``'s kernel on TVM's default schedule: its :func:`.ranking.effort` at :data:`UNTUNED_SPEED`."""
    return effort(identity.workload) / UNTUNED_SPEED


def tunable(identity: Identity) -> bool:
    """Whether the registry can derive the kernel's arguments from its workload (static tensors)."""
    try:
        return signature_args_info(identity.workload) == identity.args_info
    except RegistryError:
        return False
