"""Synthesis: schedules for a missed kernel drawn from its own design space, ranked by a cost model.

A transfer can only be as good as a schedule tuned for another kernel replayed on this one; where the
shapes differ, its tile sizes are re-derived and much of its speed goes. Synthesis samples the kernel's
own MetaSchedule design space (the same rules the tuner searches, random decisions, postprocessors
applied) and scores every sample with an xgboost model trained on the registry's measurement log
(:mod:`.costmodel`: every trial its tuners measured, slow ones included). The model's best few are
timed on this machine beside the transfer candidates and served only if one agrees with the default
schedule's output and is the fastest (:mod:`.measure`); an unmeasured sample is never served.

What it costs, once a machine: the model is trained on the log once per log content (each trial's
features are cached, so a log that grew costs only its new trials, ~25 ms each), and a kernel's
sampled schedules are kept in the kernel cache, so a later compile replays them from there.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tvm_ffi
import tvm
from tvm.s_tir import meta_schedule as ms

from schedhub.registry import CostModelEntry, Identity, Registry, RegistryError, Trial, TrialLog, target_kind, trace_id

from ..kernels.cache import KernelCache
from ..kernels.errors import TVM_ERRORS
from .costmodel import FEATURES, WIDTH, CostModel, Kernels, features, flops, log2_gflops
from ..kernels.identity import compiler_fingerprint
from ..kernels.intrinsics import load_tensor_intrinsics
from ..kernels.measure import Budget
from .msdb import trace_text

log = logging.getLogger("schedhub")

TIMED = 8  # the model's best samples timed per kernel (its first choices are often wrong: on ResNet-18 at 96 px the best
#           timed of its top 8 summed 15% less than of its top 3; drawing 256 samples instead of 64 did not help)
MAX_SAMPLES = 1024  # design-space samples a kernel may ask for
MAX_LOG_TRIALS = 4096  # trials of the log a model trains on
MIN_TRAINING = 32  # fewer usable trials: no model
MAX_SIBLINGS = 2  # other targets tried for a log that tops up a target's own
SERVED_ALONE = 512  # logged trials a served model learned from for it to serve synthesis where a sibling's log could top up a
#                     small own log (a model of 79 own trials synthesized 1.26x slower schedules than one topped up: bench.studies.sibling)


def check_sample_count(samples: object) -> int:
    """``samples`` if it is a design-space sample count a caller may ask for (a whole number from 0 to
    :data:`MAX_SAMPLES`); raises ValueError otherwise."""
    if type(samples) is not int or not 0 <= samples <= MAX_SAMPLES:
        raise ValueError(f"synthesize must be a whole number of samples from 0 to {MAX_SAMPLES}, got {samples!r}")
    return samples


def design_space_samples(normalized: tvm.IRModule, target: tvm.target.Target, count: int) -> list[tvm.s_tir.Schedule]:
    """Up to ``count`` distinct schedules (distinct scheduled kernels) of ``normalized`` (MetaSchedule's normalized kernel): its design spaces
    with random decisions (seeded: the same kernel draws the same samples), postprocessors applied."""
    load_tensor_intrinsics()
    context = ms.TuneContext(mod=normalized, target=target, space_generator="post-order-apply", search_strategy="evolutionary", num_threads=1)
    spaces = context.generate_design_space()
    postprocs = context.space_generator.postprocs
    found: dict[int, tvm.s_tir.Schedule] = {}  # by the scheduled kernel's structural hash (a trace's JSON text costs 3 ms to write)
    for i in range(count if spaces else 0):
        sch = tvm.s_tir.Schedule(normalized, seed=i + 1)
        try:
            spaces[i % len(spaces)].trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=lambda _inst, _inputs, _attrs, _decision: None)
            sch.enter_postproc()
            if all(p.apply(sch) for p in postprocs):
                found.setdefault(tvm_ffi.structural_hash(sch.mod), sch)
        except TVM_ERRORS:  # a draw the rules cannot complete: drawn again with the next seed
            continue
    return list(found.values())


def synthesize(normalized: tvm.IRModule, target: tvm.target.Target, model: CostModel, count: int, keep: int = TIMED) -> list[tuple[str, float]]:
    """The model's ``keep`` fastest of ``count`` design-space samples of the kernel: (trace JSON text,
    predicted seconds per call), fastest first."""
    samples = design_space_samples(normalized, target, count)
    if not samples:
        return []
    work = flops(normalized)
    predicted = model.predict([features(s.mod, target, work) for s in samples])
    best = np.argsort(predicted)[::-1][:keep]
    return [(trace_text(samples[i].trace), work / (2.0 ** predicted[i]) / 1e9) for i in best]


class LogModel:
    """Cost models trained on the registry's measurement log, one per target, for one session.

    ``accepts`` says which log entries it may learn from (the session's trust; ``verified_only``: it
    accepts only verified ones, so only those are fetched). A trained model is
    kept in the kernel cache by the content of the log it learned from and this compiler; each
    trial's features by its workload, trace and this compiler. Training stops when ``budget`` runs
    out: a model of what was featurized by then serves this session (and is not kept), the rest is
    featurized by a later one.

    A target whose own log is short of :data:`MAX_LOG_TRIALS` (a CPU model new to the registry, or one
    its tuners have only begun with) is topped up with the log of a sibling: another target of the same
    kind, named by the caller (the targets of the kernel's neighbours, nearest first), its own trials
    first. The model only chooses which samples are timed here, and a sibling's log ranks schedules
    about as well as an own one of its size, so more of it helps: with a 79-trial own log of a
    transformer's matmuls, ResNet-18's synthesized schedules ran 1.26x slower than with the sibling's
    683 trials alone, and 0.77x the small log's time topped up (``python -m bench.studies.sibling --small-own``).
    ``top_up=False`` keeps a target that has a model of its own to it (borrowing only where its log
    trains none): what the bench compares against.

    A model the registry serves for the target under this compiler (:meth:`served`: trained by a worker
    on the target's own log, :mod:`schedhub.tuner.workloads.publish`) comes first when ``use_served`` and the session
    trusts its pusher: it costs one download instead of the training. Where siblings could top the log up, it
    comes first only once it learned from :data:`SERVED_ALONE` trials. A worker that trains the models it
    publishes sets ``use_served`` False.
    """

    def __init__(self, registry: Registry, cache: KernelCache, accepts: Callable[[TrialLog | CostModelEntry], bool], verified_only: bool,
                 use_served: bool = True) -> None:  # fmt: skip
        self.registry = registry
        self.use_served = use_served
        self._served: dict[str, tuple[CostModel, CostModelEntry] | None] = {}  # by target: the registry's model, fetched once a session
        self.cache = cache
        self.accepts = accepts
        self.verified_only = verified_only
        self._models: dict[tuple[str, str], CostModel | None] = {}  # by target and the sibling that topped up its log ("": none)
        self._logs: dict[str, list[tuple[Identity, Trial]]] = {}  # by target: its log as read this session
        self.trained_on: dict[str, int] = {}  # by target: trials the model learned from
        self.partial: set[str] = set()  # targets whose training the budget cut short (a later LogModel goes on from the cache)
        self.borrowed: dict[str, str] = {}  # by target: the sibling target whose log topped up its own
        self.top_up = True

    def get(self, target: str, budget: Budget, siblings: Sequence[str] = ()) -> CostModel | None:
        """The model for kernels of canonical ``target``: trained on its own log topped up with the log of
        the first of up to :data:`MAX_SIBLINGS` of ``siblings`` (canonical targets of the same kind) that
        lends it trials, or on its own log alone; None when no log trains one, or no time is left. A
        sibling, once lent, serves the target's later kernels too, those without neighbours included."""
        served = self.served(target)
        if served is not None and (not siblings or served[1].trials >= SERVED_ALONE):
            self.trained_on[target] = served[1].trials
            return served[0]
        if target in self.borrowed:
            return self._trained(target, self.borrowed[target], budget)
        own = None if self.top_up else self._trained(target, "", budget)
        if own is not None:
            return own
        kind = target_kind(target)
        for sibling in [s for s in dict.fromkeys(siblings) if s != target and kind and target_kind(s) == kind][:MAX_SIBLINGS]:
            model = self._trained(target, sibling, budget) if self._lent(target, sibling) else None
            if model is not None:
                log.info("schedhub: synthesizing for %s with a model that learned from the measurement log of %s too", target, sibling)
                self.borrowed[target] = sibling
                return model
        return self._trained(target, "", budget)

    def served(self, target: str) -> tuple[CostModel, CostModelEntry] | None:
        """The model the registry serves for canonical ``target`` under this compiler and :data:`.costmodel.FEATURES`,
        with its entry (who pushed it, how many trials it learned from), when the session trusts its pusher
        (None: none, not trusted, unreadable, or ``use_served`` is off). Fetched once a session."""
        if not self.use_served:
            return None
        if target not in self._served:
            self._served[target] = self._fetch(target)
        return self._served[target]

    def _fetch(self, target: str) -> tuple[CostModel, CostModelEntry] | None:
        try:
            entry = self.registry.cost_model(target, compiler_fingerprint(), FEATURES)
        except RegistryError as exc:  # an unreadable or malformed model is only a model less: training remains
            log.warning("schedhub: could not read the registry's cost model for %s (%s)", target, str(exc)[:300])
            return None
        if entry is None or not self.accepts(entry):
            return None
        if entry.trees.width != WIDTH:
            log.warning("schedhub: the registry's cost model for %s reads %d features, not %d: not used", target, entry.trees.width, WIDTH)
            return None
        return CostModel(entry.trees), entry

    def _trained(self, target: str, sibling: str, budget: Budget) -> CostModel | None:
        """The model trained on ``target``'s log and ``sibling``'s ("": none), trained once a session."""
        if (target, sibling) not in self._models:
            own = self._log(target) if self.top_up or not sibling else []
            self._models[target, sibling] = self._model(target, own + self._lent(target, sibling), budget)  # its own first: featurized first
        return self._models[target, sibling]

    def _lent(self, target: str, sibling: str) -> list[tuple[Identity, Trial]]:
        """The trials of ``sibling``'s log ("": none) that a model of ``target`` learns from beside its own."""
        room = MAX_LOG_TRIALS - (len(self._log(target)) if self.top_up else 0)
        return self._log(sibling)[:room] if sibling and room > 0 else []

    def _model(self, target: str, trials: list[tuple[Identity, Trial]], budget: Budget) -> CostModel | None:
        compiler = compiler_fingerprint()
        content = hashlib.sha256(compiler.encode())
        for identity, trial in sorted(trials, key=lambda t: (t[0].key, t[1].secs, t[1].trace)):
            content.update(f"\0{identity.key}\0{trace_id(trial.trace)}\0{trial.secs!r}".encode())
        digest = content.hexdigest()
        cached = self.cache.get("costmodel", digest)
        if cached is not None and type(cached.get("trials")) is int:
            try:
                model = CostModel.from_obj(cached.get("trees"))
                self.trained_on[target] = cached["trials"]
                return model
            except Exception:  # unreadable: train again
                pass
        rows, labels, complete = [], [], True
        kernels = Kernels()
        for identity, trial in trials:
            if not budget.left():
                complete = False
                break
            found = self._features(kernels, identity, trial.trace, compiler)
            if found is not None:
                rows.append(found[0])
                labels.append(log2_gflops(found[1], trial.secs))
        if not complete:
            self.partial.add(target)
        if len(rows) < MIN_TRAINING:
            log.info("schedhub: %d usable trials in the registry's log for %s: no cost model to synthesize schedules with", len(rows), target)
            return None
        model = CostModel.fit(rows, labels)
        self.trained_on[target] = len(rows)
        if complete:
            self.cache.put("costmodel", (digest,), {"trees": model.to_dict(), "trials": len(rows)})
        return model

    def log_trials(self, target: str) -> list[str]:
        """The trials of ``target``'s log this model learns from (at most :data:`MAX_LOG_TRIALS`), each named by its
        workload key and trace id (a trace two workers timed is there twice)."""
        return sorted(f"{identity.key}:{trace_id(trial.trace)}" for identity, trial in self._log(target))

    def _log(self, target: str) -> list[tuple[Identity, Trial]]:
        """Up to :data:`MAX_LOG_TRIALS` trials of ``target``'s log the session accepts, every workload's first
        trials first (read once a session)."""
        if target not in self._logs:
            try:
                self._logs[target] = list(_interleaved(self._entries(target)))
            except RegistryError as exc:
                log.warning("schedhub: could not read the registry's measurement log of %s (%s): no schedules synthesized from it", target, exc)
                self._logs[target] = []
        return self._logs[target]

    def _entries(self, target: str) -> list[TrialLog]:
        """The log entries of ``target`` the session accepts, until they hold :data:`MAX_LOG_TRIALS` trials."""
        entries, held = [], 0
        for entry in self.registry.iter_trial_logs(verified_only=self.verified_only, target=target):
            if self.accepts(entry):  # of ``target`` only: the store filters, a client refuses a page of another
                entries.append(entry)
                held += len(entry.trials)
                if held >= MAX_LOG_TRIALS:
                    break
        return entries

    def _features(self, kernels: Kernels, identity: Identity, trace: str, compiler: str) -> tuple[np.ndarray, float] | None:
        """A trial's features and its workload's FLOPs, from the cache or computed (None: it does not replay here)."""
        parts = (identity.key, trace_id(trace), compiler)
        entry = self.cache.get("features", *parts)
        if entry is not None:
            row, work = entry.get("row"), entry.get("work")
            if entry.get("error") is True:
                return None
            if isinstance(row, list) and len(row) == WIDTH and isinstance(work, (int, float)) and math.isfinite(work) and work > 0:
                return np.asarray(row, dtype=np.float32), float(work)
        found = kernels.features(identity, trace)
        self.cache.put("features", parts, {"error": True} if found is None else {"row": [float(x) for x in found[0]], "work": found[1]})
        return found


def _interleaved(entries: list[TrialLog]) -> Iterator[tuple[Identity, Trial]]:
    """Every entry's trials, the first of each entry, then the second…: a budget that runs out leaves every
    workload some trials; at most :data:`MAX_LOG_TRIALS`."""
    taken = 0
    for depth in range(max((len(e.trials) for e in entries), default=0)):
        for entry in entries:
            if depth < len(entry.trials):
                if taken >= MAX_LOG_TRIALS:
                    return
                taken += 1
                yield entry.identity, entry.trials[depth]
