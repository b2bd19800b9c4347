"""Starting tuning jobs on Ray, and tuning a list of workloads (``schedhub tune``).

Resume state lives in the registry, not in the driver: a workload whose key already has records
is skipped (unless ``retune``), so a run that was killed and started again does only what is left.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from schedhub.registry import TARGET, Candidate, Identity, Record, RefusedRecord, Registry, RegistryError

from ..execution import cluster
from .logmodel import model_log
from .retime import lacking_flushed, settled
from .publish import Published, publish_cost_model
from .search import SEEDS, TuneOptions, TuneResult

log = logging.getLogger("schedhub.tuner")


def warm_start_traces(registry: Registry, identity: Identity, limit: int) -> list[str]:
    """Traces worth replaying first: this key's records, then its neighbours' (same structure, nearest first)."""
    if limit <= 0:
        return []
    own, near = _known(registry, identity, min(limit, 8))
    return _traces(own, near, limit)


def _known(registry: Registry, identity: Identity, per_key: int) -> tuple[list[Record], list[Candidate]]:
    """The key's records and up to ``per_key`` of its neighbours', in one lookup (those this version's checks refuse
    left out, and logged)."""
    refused: list[RefusedRecord] = []
    found, near = registry.lookup_with_candidates([identity], per_key=per_key, refused=refused)
    for item in refused:
        log.warning("schedhub: record %s of key %s left out of %s's warm start: %s", item.trace_id, item.key[:16], identity.op, item.reason)
    return found.get(identity.key, []), near.get(identity.key, [])


def _traces(own: list[Record], near: list[Candidate], limit: int) -> list[str]:
    return list(dict.fromkeys([r.trace for r in own] + [c.record.trace for c in near]))[:limit]


class Seeder:
    """Warm-start seeds no one tuned: the best of a workload's own design-space samples (``samples`` drawn) as
    ranked by a cost model trained on the registry's verified measurement log (:mod:`schedhub.hooks.metaschedule.synthesis`,
    what a compile with ``synthesize=`` serves once timed). A transfer seed is a schedule tuned for another
    shape; these are drawn for this one. The model is kept in ``cache`` (this machine's kernel cache) by the
    log's content and read again from the log every ``refresh_secs``, so a long-running worker learns from what
    it pushed. Nothing is seeded without a model (too few logged trials) or for another compiler's workload.

    ``train_secs`` bounds the training one call may do: a worker seeds while it holds leases, and a fresh
    machine featurizes a large log for minutes. A model trained on part of the log in that time serves (none
    does below the minimum of trials), what was featurized stays in the cache, and the next call trains
    again from there, until the model has the whole log.
    """

    def __init__(self, registry: Registry, samples: int, refresh_secs: float = 600.0, train_secs: float = math.inf, cache: Any = None) -> None:
        from schedhub.hooks.metaschedule.synthesis import check_sample_count

        self.registry = registry
        self.samples = check_sample_count(samples)
        self.refresh_secs = refresh_secs
        self.train_secs = train_secs
        self.cache = cache  # a KernelCache (None: the machine's default folder, opened on first use)
        self._model: Any = None
        self._since = -math.inf
        self._siblings: dict[str, dict[str, None]] = {}  # by target: every sibling a job has named, first named first

    def traces(self, identity: Identity, keep: int = SEEDS, siblings: Sequence[str] = ()) -> list[str]:
        """The model's best ``keep`` samples of ``identity``'s workload as trace texts, best first ([]: none).
        ``siblings``: targets whose logs may top up the workload's own target's
        (:meth:`~schedhub.hooks.metaschedule.synthesis.LogModel.get`), then those earlier jobs of the same target named, so a
        job without such a neighbour borrows too. Drawn holding a CPU of this node
        (:func:`cluster.holding_driver_cpu`), so no kernel is timed meanwhile."""
        from schedhub.hooks.kernels.identity import compiler_fingerprint

        if not self.samples or identity.fingerprint != compiler_fingerprint():
            return []
        known = self._siblings.setdefault(identity.target, {})
        known.update(dict.fromkeys(siblings))
        with cluster.holding_driver_cpu():  # training and sampling run here, in the driver: never beside a measurement
            return self._draw(identity, keep, list(dict.fromkeys([*siblings, *known])))

    def _draw(self, identity: Identity, keep: int, siblings: Sequence[str]) -> list[str]:
        from schedhub.hooks.kernels.cache import KernelCache, default_dir
        from schedhub.hooks.kernels.errors import TVM_ERRORS
        from schedhub.hooks.kernels.identity import target_from_text, workload_module
        from schedhub.hooks.kernels.measure import Budget
        from schedhub.hooks.metaschedule.msdb import normalize_mod
        from schedhub.hooks.metaschedule.synthesis import LogModel, synthesize

        if self._model is None or time.monotonic() - self._since > self.refresh_secs or self._model.partial & {identity.target, *siblings}:
            self.cache = self.cache or KernelCache(default_dir())
            self._model = LogModel(self.registry, self.cache, lambda entry: entry.verified, verified_only=True)
            self._since = time.monotonic()
        model = self._model.get(identity.target, Budget(self.train_secs), siblings)
        if model is None:
            return []
        try:
            kernel = normalize_mod(workload_module(identity.workload)["main"])
            return [trace for trace, _ in synthesize(kernel, target_from_text(identity.target), model, self.samples, keep=keep)]
        except TVM_ERRORS as exc:  # a workload MetaSchedule cannot sample: seeded from the registry only
            log.info("schedhub: no synthesized seeds for %s: %s", identity.op, str(exc)[:200])
            return []


def warm_start(registry: Registry, identity: Identity, options: TuneOptions, seeder: Seeder | None = None) -> tuple[list[str], list[str]]:
    """What a job measures before its search: the registry's traces and ``seeder``'s best ``options.seeds``
    (its model borrowed from the log of a neighbour's target where the job's own target has too little)."""
    if seeder is None:
        return warm_start_traces(registry, identity, options.warm_start), []
    own, near = _known(registry, identity, min(max(options.warm_start, 1), 8))
    siblings = [c.record.identity.target for c in near if c.relation == TARGET]
    return _traces(own, near, options.warm_start), seeder.traces(identity, options.seeds, siblings)


def submit_tuning(identity: Identity, options: TuneOptions, warm: list[str], seeds: list[str], label: str, model: list[Any] | None = None,
                  jobs: int = 1, known: KeyRecords | None = None) -> Any:  # fmt: skip
    """Submit one tuning job as a Ray task (``model``: :func:`.logmodel.model_log`, its cost model's start) among ``jobs``
    running at once: unless ``options`` name their search threads, the jobs split a node's (:func:`.cluster.search_threads`).
    ``known``: what the job is told of its key's records (:func:`key_records`). Returns its ObjectRef."""
    if options.search_threads == 0 and jobs > 1:
        options = replace(options, search_threads=cluster.search_threads(identity.target, jobs))
    known = known or KeyRecords()
    return cluster.submit("tune", identity=identity.to_dict(), warm_traces=warm, seeds=seeds, options=asdict(options), label=label, model_log=model or [],
                          retime_traces=known.retime, settled_traces=known.settled)  # fmt: skip


def start_tuning(registry: Registry, identity: Identity, options: TuneOptions, label: str, seeder: Seeder | None = None, jobs: int = 1) -> Any:
    """Submit one tuning job as a Ray task (among ``jobs`` at once: :func:`submit_tuning`), warm-started from the registry's
    traces and ``seeder``'s, and with ``options.warm_model`` its cost model from the registry's log; returns its ObjectRef."""
    model = model_log(registry, identity) if options.starts_model else None
    return submit_tuning(identity, options, *warm_start(registry, identity, options, seeder), label, model, jobs, key_records(registry, identity))


@dataclass(frozen=True)
class KeyRecords:
    """What a tuning job is told of its key's records as served: the traces to time again for their flushed times
    (:func:`.retime.lacking_flushed`), and those its publishing need not time again (:func:`.retime.settled`)."""

    retime: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)


def key_records(registry: Registry, identity: Identity) -> KeyRecords:
    """:class:`KeyRecords` of ``identity``'s key; none where the registry cannot say (the job then times them as before)."""
    try:
        served = registry.get(identity.key)
    except RegistryError as exc:  # the job tunes all the same; the key keeps its warm ranking a while longer
        log.warning("schedhub: %s's records not read for re-timing: %s", identity.op, exc)
        return KeyRecords()
    return KeyRecords(lacking_flushed(served), settled(served))


def push_result(registry: Registry, result: TuneResult, pushed_by: str = "") -> None:
    """A tuning job's records (and the key's older ones it timed again), then its measured trials into the measurement
    log (what a cost model learns from)."""
    registry.put_many([*result.records, *result.retimed], pushed_by)  # never empty: at worst TVM's default schedule
    log_entry = result.trial_log()
    if log_entry is None:
        return
    try:
        registry.push_trials(log_entry, pushed_by)
    except RegistryError as exc:  # the log only teaches cost models: the records are what the job owed
        log.warning("schedhub: %d trials of %s not logged: %s", len(log_entry.trials), result.identity.op, exc)


@dataclass
class BulkSummary:
    tuned: list[TuneResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # keys that already had records
    failed: dict[str, str] = field(default_factory=dict)
    models: list[Published] = field(default_factory=list)  # cost models trained on the grown logs and pushed (or kept)


def publish_each(registry: Registry, targets: Sequence[str], cache: Any = None, pushed_by: str = "") -> Iterator[tuple[str, Published | RegistryError]]:
    """:func:`.publish.publish_cost_model` of each target in turn, holding a CPU of this node so no kernel is
    timed meanwhile: ``(target, what was published)``, or ``(target, the error)`` of a registry that refused
    (a token without the worker role) or could not take it. The caller may stop early (a refusal is final)."""
    for target in dict.fromkeys(targets):
        outcome: Published | RegistryError
        try:
            with cluster.holding_driver_cpu():
                outcome = publish_cost_model(registry, target, cache, pushed_by)
        except RegistryError as exc:
            outcome = exc
        yield target, outcome


def publish_models(registry: Registry, targets: Sequence[str], pushed_by: str = "") -> list[Published]:
    """:func:`publish_each`, what the registry refused logged and the rest returned."""
    done = []
    for target, outcome in publish_each(registry, targets, pushed_by=pushed_by):
        if isinstance(outcome, RegistryError):
            log.warning("schedhub: the cost model of %s was not published: %s", target, str(outcome)[:300])
        else:
            done.append(outcome)
    return done


def tune_many(
    registry: Registry, identities: list[Identity], options: TuneOptions, *, concurrency: int = 2, retune: bool = False,
    pushed_by: str = "", on_done: Callable[[Identity, TuneResult | None, str | None], None] | None = None, publish: bool = True,
) -> BulkSummary:  # fmt: skip
    """Tune each workload (``concurrency`` jobs at once share the cluster), pushing results as they come; then
    (``publish``) serve the cost model of each target whose measurement log grew (:mod:`.publish`)."""
    import ray

    summary = BulkSummary()
    have = registry.lookup([i.key for i in identities]) if not retune and identities else {}
    todo = [i for i in identities if not have.get(i.key)]
    summary.skipped = [i.key for i in identities if have.get(i.key)]
    seeder = Seeder(registry, options.synthesize) if options.synthesize and todo else None
    pending = list(reversed(todo))
    running: dict[Any, Identity] = {}
    while pending or running:
        while pending and len(running) < max(1, concurrency):
            ident = pending.pop()
            running[start_tuning(registry, ident, options, f"{ident.op}:{ident.key[:8]}", seeder, jobs=max(1, concurrency))] = ident
        ready, _ = ray.wait(list(running), num_returns=1)
        ident = running.pop(ready[0])
        try:
            result = TuneResult.from_dict(cluster.result(ready[0]))
        except Exception as exc:  # one workload failing does not stop the others
            summary.failed[ident.key] = str(exc).strip()[-2000:]
            _notify(on_done, ident, None, summary.failed[ident.key])
            continue
        push_result(registry, result, pushed_by)
        summary.tuned.append(result)
        _notify(on_done, ident, result, None)
    if publish:
        summary.models = publish_models(registry, [r.identity.target for r in summary.tuned if r.trial_log() is not None], pushed_by)
    return summary


def _notify(on_done: Callable[[Identity, TuneResult | None, str | None], None] | None, ident: Identity, result: TuneResult | None, error: str | None) -> None:
    if error:
        log.warning("tuning %s (%s) failed: %s", ident.op, ident.key[:12], error)
    if on_done is not None:
        on_done(ident, result, error)
