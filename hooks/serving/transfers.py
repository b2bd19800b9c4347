"""How a :class:`.session.HookSession` serves a missed kernel a transfer: the registry's candidates of the same
structure (and, opted in, schedules synthesized from the kernel's own design space and twins postprocessed here) applied
on the kernel, ranked by fit or by a served cost model, timed against each other and the default where the compile
measures, the fastest that agrees served. A part of the session: it reads and keeps the session's state."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from schedhub.registry import (
    COMPILER,
    TARGET,
    Candidate,
    Identity,
    Record,
    keeps_default_schedule,
)

from ..metaschedule.costmodel import WIDTH, CostModel, features, flops
from ..kernels.defaults import default_contends, default_schedule
from ..kernels.identity import compiler_fingerprint
from ..kernels.measure import TIMING, KernelBench, Timing, build_all, first_equal, machine
from .misses import transferred_secs
from ..metaschedule.msdb import postprocessed_here, repostprocesses, trace_text
from ..build.objects import OBJECT_ID
from ..metaschedule.ranking import (
    MEASURED_ONLY,
    REPOSTPROCESSED,
    SYNTHESIZED,
    Retiling,
    model_decides,
    model_rank_key,
    rank_key,
    speed,
    work,
)
from .report import RULED, TRANSFER, KeptDefault, RuledFaster
from ..metaschedule.synthesis import TIMED, synthesize

log = logging.getLogger("schedhub")


class TransferServing:
    """:class:`.session.HookSession`'s transfers (see the module's docstring)."""

    def _transfer(self, identity: Identity, apply: Callable[[Record, list[Any] | None], Any], bench: tuple[tvm.IRModule, Any] | None = None,
                  kernel: tuple[tvm.IRModule, Any] | None = None, ruled: tuple[Record, Any] | None = None) -> Any:  # fmt: skip
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

        ``ruled``: the CPU rules' record of the kernel and the kernel it schedules (:meth:`_ruled`). Untimed, it is
        served ahead of every candidate but the very workload's under another compiler build (relation ``compiler``):
        a schedule tuned at another shape or on another CPU ran slower than the rules' on every network measured
        (ResNet-18@160 from records tuned 40 minutes at 224: 35.8 ms against the rules' 26.1, where at 224 the records
        ran as fast as the rules, 44.4 ms against 44.5; znver3), so only those are offered. With ``bench`` it is timed
        beside the candidates, and where it runs fastest the verdict (:class:`.report.RuledFaster`) is returned.
        """
        applied: list[tuple[Candidate, Any]] = []
        offered = [c for c in self._candidates.get(identity.key, []) if self.trusts(c.record) and not keeps_default_schedule(c.record.trace)]
        if ruled is not None and bench is None:
            offered = [c for c in offered if c.relation == COMPILER]
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
        rival = Candidate(ruled[0], RULED, 0.0) if ruled is not None and bench is not None else None
        if rival is not None and ruled is not None:  # timed beside them; untimed, first but for the very workload's
            applied.insert(int(applied[0][0].relation == COMPILER), (rival, ruled[1]))
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
        if candidate is rival:
            return RuledFaster(measured)
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
