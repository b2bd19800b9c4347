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

The session is split along its seams: this module looks kernels up and serves what the registry holds (hits, the
replay and its cache, refusals and complaints); :mod:`.transfers` serves a miss a transfer (candidates, ranking,
synthesis, measurement); :mod:`.misses` orders and reports the misses; :mod:`.report` is what a compile reports.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import tvm
import tvm_ffi
from schedhub.registry import (
    Candidate,
    Identity,
    Record,
    RefusedRecord,
    Registry,
    RegistryError,
    Trust,
    keeps_default_schedule,
    trust_filter,
    trusted,
)
from tvm import tirx
from tvm_ffi.serialization import from_json_graph_str, to_json_graph_str

from ..kernels.cache import KernelCache, default_dir
from .choice import RewriteOptions
from ..kernels.defaults import default_contends
from ..metaschedule.guard import ScheduleLimits, check_scheduled
from ..rewrites import NO_REWRITES, Rewrites
from ..kernels.identity import as_module, plain_json, workload_identity
from ..build.lowering import Lowerings
from ..kernels.measure import Budget, runs_here
from .misses import MissReporter, transferred_secs, untuned_secs
from ..metaschedule.msdb import normalize_mod, replay_launchable
from ..build.objects import OBJECT_ID, ObjectCache, object_id_of
from ..metaschedule.padding import PADDED, padded_dispatch
from ..metaschedule.ranking import Retiling, retiled
from ..metaschedule.recompute import RELOCATED, relocated
from ..metaschedule.rules import RULES, ruled_trace
from .report import (
    FALLBACK,
    HIT,
    MISS,
    OFFLINE,
    RULED,
    CompileReport,
    KeptDefault,
    KernelOutcome,
    RegistryFallbackWarning,
    RuledFaster,
)
from ..metaschedule.synthesis import LogModel, check_sample_count
from ..kernels.threads import usable_cpus, warn_idle_cores
from .transfers import TransferServing

log = logging.getLogger("schedhub")

MAX_REFUSED_NAMED = 8  # records left out at lookups that a session names and complains about; the rest are counted
DEFAULT_CANDIDATES = 4  # neighbours asked for per missed key
OWN_COMMITS_KEPT = 8  # a process's own commits read back per key: its best, as the registry keeps a key's best 8
LAUNCHES_CHECKED = "GPU launches checked: threads bound consistently, within the block's limits"  # in the kernel cache's key of
#   every schedule: schedules cached before the checks (:func:`.msdb.replay_launchable`) are worked out again


class ReplayFailed(RuntimeError):
    """A trace that failed to replay on this kernel before (the per-machine cache remembers)."""


class HookSession(TransferServing):
    def __init__(self, registry: Registry, *, report_misses: bool = True, trust: Trust = "verified",
                 limits: ScheduleLimits | None = None, transfer: bool = True, cache: KernelCache | None = None,
                 measure: float = 0.0, objects: ObjectCache | None = None, synthesize: int = 0, rank_by_model: bool | None = None, pad: bool = True,
                 relocate: bool = True, repostprocess: bool = True, rewrites: Rewrites | RewriteOptions = NO_REWRITES, rules: bool = True,
                 network_name: str | None = None) -> None:  # fmt: skip
        check_sample_count(synthesize)
        self.rewrite_options = rewrites if isinstance(rewrites, RewriteOptions) else RewriteOptions((rewrites,))  # what a compile may rewrite (:mod:`.choice`)
        self.rewrites = self.rewrite_options.first  # what the compile rewrites before its kernels are looked up (:mod:`.rewrites`)
        self.registry = registry
        self.objects = objects  # where scheduled kernels' machine code is kept and linked from (None: compiled in each build)
        self.measure = measure
        self.synthesize = synthesize  # design-space samples scored per missed kernel (0: none; needs ``measure``)
        self.rank_by_model = rank_by_model  # transfers ranked with the registry's served cost model: always, never, None: where it decides
        self.pad = pad  # loops whose recorded tiles TVM would re-derive padded to them (:mod:`.padding`)
        self.relocate = relocate  # a transfer's compute locations that recompute a reduction moved out (:mod:`.recompute`)
        self.rules = rules  # a CPU kernel the registry cannot serve gets a rule-decided schedule, not the unscheduled default (:mod:`.rules`)
        self.repostprocess = repostprocess  # a measured compile also times each transfer's sketch postprocessed here (:meth:`_repostprocessed`)
        self._budget = Budget(measure)
        self.build_workers = usable_cpus()  # candidates compiled at once
        self.cache = cache if cache is not None else KernelCache(default_dir())
        self.lowerings = Lowerings(self.cache)  # scheduled kernels not built alone, lowered alone before the model's build
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
        self.reporting = MissReporter(registry, self.cache, enabled=report_misses, name=network_name)  # misses and networks told: :mod:`.misses`
        self._calls: dict[str, int] = {}  # kernel key: call sites in the module being compiled
        self._served_secs: dict[str, float] = {}  # kernel key: seconds per call of the transfer it served (measured or estimated)
        self._refused_keys: set[str] = set()
        self._refused_named = 0  # records left out at a lookup that this session named and complained about
        self._told_refused: set[RefusedRecord] = set()  # what :meth:`_left_out` was told (a key asked again answers them again)
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
        self.reporting.flush(self.report, self.offline, self.miss_cost, self.say)
        self.reporting.report_network(self._calls, self.offline)
        if (why := self.cache.unwritable.tell()) is not None:
            self.say(f"the kernel cache in {self.cache.root} cannot be written ({why}): later compiles redo this one's work")
        if self.objects is not None and (why := self.objects.failed.tell()) is not None:
            self.say(f"kernel objects not cached in {self.objects.root} ({why}): those kernels are built in the model's module")
        log.info(self.report.summary())

    def measure_priority(self, identity: Identity) -> float:
        """How much measuring a kernel's candidates may matter, before it is served: nothing for a hit, else the
        seconds it is expected to cost one run of the module, its call sites times its work at the home speed
        (:func:`.ranking.speed`) of its nearest trusted candidate, or, with none, at :data:`.misses.UNTUNED_SPEED` (a
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
        TVM's default schedule, its work, data movement included (:func:`.ranking.effort`), at :data:`.misses.UNTUNED_SPEED`."""
        secs = self._served_secs.get(identity.key)
        return self._calls.get(identity.key, 1) * (untuned_secs(identity) if secs is None else secs)

    def say(self, problem: str) -> None:
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

    def prefetch(self, identities: list[Identity], candidates: bool = True, exact_only: Sequence[Identity] = ()) -> None:
        """Fetch every key not yet cached in one batch request. ``candidates=False`` (weighing rewrites the compile may
        not take, :mod:`.choice`): exact records only, and a key without one it would serve is not cached, so that a
        later prefetch asks for it again with the candidates to transfer where the compile takes it. ``exact_only``:
        more keys asked so in the same request (the options a compile weighs beside the one it most likely takes)."""
        wanted = list({i.key: i for i in identities if i.key not in self._records}.values())
        asked = {i.key for i in wanted}
        exact = list({i.key: i for i in exact_only if i.key not in self._records and i.key not in asked}.values())
        if not (wanted or exact) or self.offline:
            return
        near_too = self.transfer and candidates
        start = time.perf_counter()
        refused: list[RefusedRecord] = []
        try:
            if near_too:
                found, near = self.registry.lookup_with_candidates(wanted, per_key=DEFAULT_CANDIDATES, refused=refused, trust=self.trust, exact_only=exact)
            else:
                weighing = [i.key for i in [*wanted, *exact]] if not candidates else [i.key for i in exact]
                found, near = self.registry.lookup([i.key for i in [*wanted, *exact]], refused=refused, weighing=weighing), {}
        except RegistryError as exc:
            self._go_offline(exc)
            return
        finally:
            self.report.lookups += 1
            self.report.lookup_secs += time.perf_counter() - start
        for identity in [*wanted, *exact]:
            records = found.get(identity.key, [])
            if self.transfer and not (near_too and identity.key in asked) and not any(self.trusts(r) for r in records):
                continue  # asked again, with candidates, where the compile takes this key
            self._records[identity.key] = records
            self._candidates[identity.key] = [c for c in near.get(identity.key, []) if c.record.identity.structure == identity.structure]
        self._left_out(refused)

    def _left_out(self, refused: list[RefusedRecord]) -> None:
        """Say which records the registry answered that this version's checks refuse, and complain about them (the
        registry checks each and takes it out of service): the first :data:`MAX_REFUSED_NAMED` a session meets, so
        a registry full of them costs a compile a bounded number of requests; the rest are counted. Each is told once,
        though a key asked again (:meth:`prefetch`'s ``candidates``) answers it again."""
        refused = [item for item in dict.fromkeys(refused) if item not in self._told_refused]
        self._told_refused.update(refused)
        for n, item in enumerate(refused):
            if self._refused_named >= MAX_REFUSED_NAMED:
                self.say(f"{len(refused) - n} more records left out, not named; the last: {refused[-1].reason[:200]}")
                return
            self._refused_named += 1
            self.say(f"record {item.trace_id or '(unnamed)'} of key {item.key[:16] or '(unnamed)'} left out: {item.reason}")
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
        return self.fetched_records(identity)

    def fetched_records(self, identity: Identity) -> list[Record]:
        """:meth:`records` as fetched so far: a key not prefetched has none, and no request is made."""
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
            ruled, record = self._ruled(identity, apply, kernel)
            self._note(identity, OFFLINE, _ruled_detail(record))
            return ruled
        for record in self.records(identity):
            try:
                out = apply(record, None)
            except Exception as exc:  # TVM raises ScheduleError, InternalError, ValueError… on a bad trace
                self._refuse(record, exc)
                continue
            self._note(identity, HIT, f"default:{record.trace_id}" if keeps_default_schedule(record.trace) else record.trace_id)
            return out
        self.reporting.add(identity)
        ruled, record = self._ruled(identity, apply, kernel)
        transferred = self._transfer(identity, apply, bench, kernel, (record, ruled) if record is not None else None) if transfers else None
        if transferred is not None and not isinstance(transferred, (KeptDefault, RuledFaster)):
            return transferred
        measured = transferred.measured if transferred is not None else {}
        outcome = FALLBACK if identity.key in self._refused_keys else MISS
        if isinstance(transferred, KeptDefault) and transferred.detail:  # a GPU's default timed faster than every candidate
            self._note(identity, outcome, transferred.detail, measured)
            return None
        self._note(identity, outcome, _ruled_detail(record), measured)
        return ruled

    def _ruled(self, identity: Identity, apply: Callable[[Record, list[Any] | None], Any],
               kernel: tuple[tvm.IRModule, Any] | None) -> tuple[Any, Record | None]:  # fmt: skip
        """A kernel nothing in the registry serves, scheduled by the CPU rules (:mod:`.rules`; the trace is worked out
        once a machine and kept in the kernel cache), and the rules' record of it; (None, None) where the session
        does not rule (off, not a CPU, a symbolic size) or the rules give nothing that replays within the bounds."""
        if not self.rules or kernel is None or identity.symbolic or kernel[1].kind.name != "llvm":  # no cache entry for a GPU's
            return None, None
        normalized, target = kernel
        entry = self.cache.get(RULED, identity.key, RULES)
        trace = entry.get("trace") if entry is not None else None
        if not isinstance(trace, str):
            trace = ruled_trace(normalized, target) or ""
            self.cache.put(RULED, (identity.key, RULES), {"trace": trace})
        if not trace:
            return None, None
        record = Record(identity, trace, [], {"source": RULES})
        try:
            return apply(record, None), record
        except Exception as exc:  # past the bounds, or TVM's errors: the default schedule (the cache remembers)
            log.debug("schedhub: the ruled schedule of %s is not served: %s", identity.op, str(exc)[:200])
            return None, None

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
            if record.provenance.get("source") == RULES:  # not the registry's: nothing to complain about
                self.report.problems.append(f"the ruled schedule of {record.identity.op} does not build here; it keeps the default")
            else:
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


def _ruled_detail(record: Record | None) -> str:
    """What a miss that got the CPU rules' schedule reports: ``ruled:`` and the trace's id; "" for TVM's default."""
    return f"{RULED}:{record.trace_id}" if record is not None else ""


def best_first(records: list[Record]) -> list[Record]:
    """``records`` fastest first by mean time, each trace once, at its best time."""
    best: dict[str, Record] = {}
    for record in records:
        if record.trace_id not in best or record.mean_secs < best[record.trace_id].mean_secs:
            best[record.trace_id] = record
    return sorted(best.values(), key=lambda r: r.mean_secs)
