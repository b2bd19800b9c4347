"""The miss-queue worker: lease jobs, tune them on Ray, push the results, ack.

Nothing lives only in the worker. A job is leased for ``lease_secs`` and renewed every third of
that while its task runs; a worker killed at any moment stops renewing, the lease expires and the
registry hands the job to the next worker. A worker asked to stop (SIGTERM, SIGINT) gives its
leases back at once instead. Pushes are idempotent (a trace is one entry per key) and the ack
comes after the push, so a job is done exactly when its records are stored.

Two tasks: ``tune`` (search a missed workload, push the results) and ``verify`` (replay, check and
re-measure someone's pushed claim; the verdict travels with the ack). Verifications come first.

A tune job the registry can warm-start (transfers from neighbours, or synthesized seeds once the
measurement log teaches a model) first gets a *first pass*: those candidates measured side by side,
the best pushed within seconds, the job acked with ``refine`` so the queue hands out every other
miss's first pass before this one's full search. A compile that missed a whole model so gets
measured schedules for all its kernels long before the searches end.

A registry that is away (restarting, redeployed, unreachable) stops nothing: the worker stops
leasing and says so once, its running tasks go on, and results it could not deliver are kept and
pushed when the registry answers again (their leases are renewed meanwhile; one that expired is
pushed all the same, and the next holder finds the records). Only a stop request ends a worker
that still holds undelivered results.

A worker leases only jobs its cluster can time (:func:`cluster.measurable`): CPU jobs for the CPU
model it runs on, CUDA jobs for the architecture of the cluster's GPUs; the rest stay queued for
a worker that can.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schedhub.registry import (
    PENDING,
    REFINE,
    TUNE,
    VERIFY,
    Forbidden,
    Identity,
    InvalidRecord,
    Lease,
    LeaseLost,
    MalformedAnswer,
    NotFound,
    PayloadTooLarge,
    Registry,
    RegistryError,
    RegistryUnavailable,
    target_device,
)

from .execution import cluster
from .workloads.dispatch import KeyRecords, Seeder, key_records, publish_each, push_result, submit_tuning, warm_start
from .workloads.logmodel import model_log
from .workloads.search import TuneOptions, TuneResult

log = logging.getLogger("schedhub.tuner.worker")
AWAY = (RegistryUnavailable, MalformedAnswer)  # down, restarting, or a proxy's page in its place: try again later
MAX_JOB_SECS = 4 * 3600.0  # a job's task running longer is stopped: at the real budget (64 trials) a kernel took minutes


@dataclass
class WorkerStats:
    done: int = 0
    first_passes: int = 0
    verified: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    results: list[TuneResult] = field(default_factory=list)


@dataclass
class _Running:
    lease: Lease
    identity: Identity
    ref: Any
    renewed: float
    first_pass: bool = False
    started: float = field(default_factory=time.time)
    answer: Any = None  # the task's result, once it ended and could not be delivered yet


class Worker:
    """Drains the registry's miss queue onto the Ray cluster this process is connected to."""

    def __init__(
        self, registry: Registry, options: TuneOptions, *, name: str | None = None, concurrency: int = 1,
        lease_secs: float = 120.0, poll_secs: float = 2.0, on_event: Callable[[str, dict[str, Any]], None] | None = None,
        tasks: tuple[str, ...] = (VERIFY, TUNE), device: str | None = None, devices: list[tuple[str, str]] | None = None,
        first_pass: bool = True, max_job_secs: float = MAX_JOB_SECS, refine: bool = True,
    ) -> None:  # fmt: skip
        """``device``: the CPU model CPU jobs must be for (default: this machine's). ``devices``: every
        (target kind, device model) to lease for (default: what the cluster can time, asked of it).
        ``first_pass``: give tune jobs with something to warm-start from a first pass before their search, when
        the search measures more than a first pass would (at 8 trials the two took as long: bench/RESULTS.md).
        ``max_job_secs``: a job's task still running that long after it started is cancelled and the job failed with
        why (a hostile or mistaken miss of a kernel too large to time would otherwise hold the worker for good).
        ``refine``: when the queue has nothing for this worker, have the registry requeue the kernel whose search is expected
        to lower a reported network's time most (``registry._networks``), and tune that."""
        from schedhub.hooks.kernels.identity import compiler_fingerprint
        from schedhub.hooks.kernels.measure import host_cpu

        self.registry = registry
        self.options = options
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.concurrency = max(1, concurrency)
        self.lease_secs = lease_secs
        self.poll_secs = poll_secs
        self.max_job_secs = max_job_secs
        self.fingerprint = compiler_fingerprint()
        self.tasks = tasks
        self.first_pass = first_pass and options.trials > options.first_pass().warm_measurements()
        self.device = device or host_cpu()  # jobs for another CPU model are left to a worker on one
        self.devices = devices if devices is not None else cluster.measurable(self.device)
        self.on_event = on_event or (lambda kind, info: log.info("%s %s", kind, info))
        self.running: dict[str, _Running] = {}  # tasks on Ray, and ended ones whose results wait for the registry (``answer``)
        self.away_since: float | None = None  # when the registry stopped answering
        # jobs are seeded one after another between lease renewals: training takes a quarter of a lease at most per batch
        self.seeder = Seeder(registry, options.synthesize, train_secs=lease_secs / 4 / self.concurrency) if options.synthesize else None
        self.publish_models = True  # train and serve the cost model of each target whose log this worker grew, once the queue is dry
        self.refine = refine  # with nothing queued for it, search again the bottleneck of the networks compiles reported
        self._logged_targets: set[str] = set()  # targets whose measurement log this worker pushed to since it last published

    def run(self, *, max_jobs: int | None = None, until_idle: bool = False, should_stop: Callable[[], bool] = lambda: False,
            away_limit: float | None = None) -> WorkerStats:  # fmt: skip
        """Work until ``max_jobs`` jobs ended, the queue is empty (``until_idle``), or ``should_stop()``.

        ``away_limit``: seconds the registry may stay away while this worker holds nothing before
        RegistryUnavailable is raised (None: wait for it forever, as a service should)."""
        import ray

        stats = WorkerStats()
        started = 0
        while not should_stop():
            if max_jobs is None or started < max_jobs:
                started += self._lease_more(None if max_jobs is None else max_jobs - started, stats)
            for held in [r for r in self.running.values() if r.answer is not None]:
                self._deliver(held, stats)  # results that ended while the registry was away
            if not self.running:
                self._publish_models()
                if (until_idle and self.away_since is None) or (max_jobs is not None and started >= max_jobs):
                    break  # idle: the registry answered that nothing is queued
                if self.away_since is not None and away_limit is not None and time.time() - self.away_since > away_limit:
                    raise RegistryUnavailable(f"the registry has not answered for {away_limit:g} s (and this worker holds no work)")
                time.sleep(self.poll_secs)
                continue
            refs = [r.ref for r in self.running.values() if r.answer is None]
            if refs:
                ready, _ = ray.wait(refs, num_returns=1, timeout=min(self.poll_secs, self.lease_secs / 3))
                for held in [r for r in self.running.values() if r.ref in ready]:
                    self._finish(held, stats)
            else:
                time.sleep(self.poll_secs)
            self._stop_overdue(stats)
            self._renew_due()
        self.release_all("worker stopped", stats)
        return stats

    def left_behind(self, limit: int = 1000) -> list[str]:
        """Why the pending jobs this worker cannot take stay pending: one line per (why, target), with how many (of the
        first ``limit`` pending). A compile for another CPU model queues jobs only a worker on that model can time."""
        try:
            pending = self.registry.jobs(PENDING, limit)
        except RegistryError:
            return []
        reasons: dict[str, int] = {}
        timed = {kind: device for kind, device in self.devices}
        for job in pending:
            kind, device = str(job.get("kind", "")), target_device(str(job.get("target", "")))
            if job.get("fingerprint") != self.fingerprint:
                why = f"tuned under another compiler ({str(job.get('fingerprint'))[:60]}); this worker runs {self.fingerprint[:60]}"
            elif kind not in timed:
                why = f"for {kind}, which this worker's cluster cannot time"
            elif device not in ("", timed[kind]):
                why = f"for {kind} {device}; this worker times {timed[kind]}: run a worker on such a machine, or compile for this one's CPU"
            else:
                continue
            reasons[why] = reasons.get(why, 0) + 1
        return [f"{count} pending jobs {why}" for why, count in reasons.items()]

    def release_all(self, reason: str, stats: WorkerStats | None = None) -> None:
        """Give every held lease back now (pending again, the attempt not counted) and cancel its task."""
        import ray

        for key, run in list(self.running.items()):
            if run.answer is not None:  # a result the registry could not take before: one more try, else it is lost
                self._deliver(run, stats or WorkerStats())
                if key not in self.running:
                    continue
            ray.cancel(run.ref, force=True)
            try:
                self.registry.release(key, run.lease.lease_id, reason)
                if stats is not None:
                    stats.released += 1
                self.on_event("released", {"key": key, "reason": reason})
            except RegistryError as exc:  # lost already, or the registry is away: the lease expires on its own
                self.on_event("release-failed", {"key": key, "error": str(exc)})
            del self.running[key]

    def _lease_more(self, allowed: int | None, stats: WorkerStats) -> int:
        room = self.concurrency - len(self.running)
        if allowed is not None:
            room = min(room, allowed)
        if room <= 0:
            return 0
        leases: list[Lease] = []
        leased_at = time.time()  # a lease runs from here, not from when its warm start is done
        try:
            for refining in (False, True):  # with nothing queued for it, one more search of a reported network's bottleneck
                if refining and (leases or self.running or not self.refine or TUNE not in self.tasks or not self._requeue_bottleneck()):
                    break
                for kind, device in self.devices:
                    if len(leases) < room:
                        leases += self.registry.lease(self.name, room - len(leases), self.lease_secs, fingerprint=self.fingerprint, kind=kind, device=device, tasks=self.tasks)
        except AWAY as exc:
            self._away(exc)
        else:
            self._back()
        started = 0
        for lease in leases:
            try:
                first = False
                if lease.job.get("task") == VERIFY:
                    identity = Identity.from_obj(lease.job.get("identity"))
                    ref = cluster.submit("verify", job=lease.job, timing=self.options.final_timing)
                else:
                    identity = Identity.from_obj(lease.job)
                    first, ref = self._start_tuning(lease, identity)
            except InvalidRecord as exc:  # a job no worker can run: failed with the reason, not retried forever
                self._fail(lease.key, lease.lease_id, f"malformed job: {exc}", stats)
                continue
            except AWAY as exc:  # away between the lease and the warm start: the lease expires, the job comes back
                self._away(exc)
                continue
            self.running[lease.key] = _Running(lease, identity, ref, leased_at, first)
            started += 1
            task = "first-pass" if first else lease.job.get("task", TUNE)
            self.on_event("leased", {"key": lease.key, "task": task, "op": identity.op, "attempt": lease.job.get("attempts")})
            self._renew_due()  # a warm start (lookups, seeding) may take a third of a lease or more: this one's included
        return started

    def _requeue_bottleneck(self) -> bool:
        """Ask the registry to requeue the bottleneck kernel of the networks compiles reported that this worker can tune
        (``registry._networks``); whether it did. A registry that refuses (no worker role) is told once and not asked again."""
        for kind, device in self.devices:
            try:
                pick = self.registry.refine_bottleneck(self.fingerprint, kind, device)
            except (Forbidden, NotFound) as exc:
                self.refine = False
                self.on_event("refine-off", {"error": str(exc)[:300]})
                return False
            if pick is not None:
                self.on_event("refine", {"key": pick["key"], "op": pick["op"], "share": round(pick["share"], 3), "searches": pick["searches"]})
                return True
        return False

    def _away(self, exc: RegistryError) -> None:
        if self.away_since is None:
            self.away_since = time.time()
            self.on_event("registry-away", {"error": str(exc)[:300], "running": len(self.running)})

    def _back(self) -> None:
        if self.away_since is not None:
            self.on_event("registry-back", {"after_secs": time.time() - self.away_since})
            self.away_since = None

    def _start_tuning(self, lease: Lease, identity: Identity) -> tuple[bool, Any]:
        """Submit a tune job: its first pass when it has not had one and there is something to measure, else its search."""
        may_first = self.first_pass and lease.job.get("stage", "") != REFINE
        warm, seeds = warm_start(self.registry, identity, self.options.first_pass() if may_first else self.options, self.seeder)
        first = may_first and bool(warm or seeds)
        options = self.options.first_pass() if first else self.options
        model = model_log(self.registry, identity) if options.starts_model else None
        known = key_records(self.registry, identity)
        if first:  # a first pass is for seconds: its search re-times
            known = KeyRecords(settled=known.settled)
        return first, submit_tuning(identity, options, warm, seeds, f"{identity.op}:{lease.key[:8]}", model, jobs=self.concurrency, known=known)

    def _stop_overdue(self, stats: WorkerStats) -> None:
        """Cancel every task running past ``max_job_secs`` and fail its job with why (it is retried up to the queue's attempts)."""
        import ray

        now = time.time()
        for key, run in list(self.running.items()):
            if run.answer is None and now - run.started > self.max_job_secs:
                ray.cancel(run.ref, force=True)
                del self.running[key]
                task = "first pass" if run.first_pass else run.lease.job.get("task", TUNE)
                self._fail(key, run.lease.lease_id, f"{task} ran past this worker's {self.max_job_secs:g} s a job and was stopped", stats)

    def _renew_due(self) -> None:
        import ray

        now = time.time()
        for key, run in list(self.running.items()):
            if now - run.renewed < self.lease_secs / 3:
                continue
            try:
                self.registry.renew(key, run.lease.lease_id, self.lease_secs)
                run.renewed = now
            except LeaseLost:  # the registry gave the job to someone else: stop spending on it
                if run.answer is not None:
                    continue  # ended already: its records are still pushed (the ack will say lost)
                ray.cancel(run.ref, force=True)
                del self.running[key]
                self.on_event("lost", {"key": key})
            except RegistryError as exc:  # the registry is briefly away: keep tuning, retry next round
                self.on_event("renew-failed", {"key": key, "error": str(exc)[:300]})

    def _finish(self, run: _Running, stats: WorkerStats) -> None:
        """A task ended: deliver its result (or its failure)."""
        task = run.lease.job.get("task", TUNE)
        try:
            run.answer = cluster.result(run.ref)
            if task == TUNE:
                TuneResult.from_dict(run.answer)
        except Exception as exc:  # the task raised or died: the job goes back with the error
            del self.running[run.lease.key]
            self._fail(run.lease.key, run.lease.lease_id, f"{task} failed: {str(exc).strip()[-2000:]}", stats)
            return
        if not self._deliver(run, stats):
            self.on_event("result-kept", {"key": run.lease.key, "op": run.identity.op, "until": "the registry answers"})

    def _deliver(self, run: _Running, stats: WorkerStats) -> bool:
        """Push a result and ack its job; a registry that is away keeps it in ``running`` for the next round."""
        try:
            self._push_and_ack(run, stats)
        except AWAY as exc:
            self._away(exc)
            return False
        except (InvalidRecord, PayloadTooLarge) as exc:  # refused, and would be every time: the job goes back with why
            del self.running[run.lease.key]
            self._fail(run.lease.key, run.lease.lease_id, f"the registry refused the result: {exc}", stats)
            return True
        self._back()
        del self.running[run.lease.key]
        return True

    def _push_and_ack(self, run: _Running, stats: WorkerStats) -> None:
        key, lease_id, answer = run.lease.key, run.lease.lease_id, run.answer
        result = TuneResult.from_dict(answer) if run.lease.job.get("task", TUNE) == TUNE else None
        try:
            if result is None:
                outcome = self.registry.ack(key, lease_id, answer)
                stats.verified += 1
                self.on_event("verified", {"key": run.identity.key, "trace_id": run.lease.job["trace_id"], "outcome": outcome, "reason": answer["reason"]})
                return
            if result.warm_started or not run.first_pass:  # a first pass that measured nothing has nothing to say
                push_result(self.registry, result, self.name)
                if result.trial_log() is not None:
                    self._logged_targets.add(result.identity.target)
            outcome = self.registry.ack(key, lease_id, refine=run.first_pass)
            if run.first_pass and outcome != REFINE:  # a registry older than refine jobs closed it: search at once from now on
                self.first_pass = False
                self.on_event("first-pass-off", {"key": key, "reason": "the registry closed a first pass's job instead of requeueing it for its search"})
        except LeaseLost:  # expired while we pushed: the records are stored, the next holder will find them
            stats.lost += 1
            self.on_event("lost", {"key": key})
            return
        if run.first_pass:
            stats.first_passes += 1
        else:
            stats.done += 1
        stats.results.append(result)
        spent = {"tuning_s": result.search_secs, **{f"{phase.replace(' ', '_')}_s": secs for phase, secs in result.phases.items()}} if result.phases else {}
        self.on_event("first-pass" if run.first_pass else "done", {"key": key, "op": run.identity.op, "untuned_ms": result.untuned_secs * 1e3,
                                                                   "best_ms": (result.best_secs or 0) * 1e3, **spent})  # fmt: skip

    def _publish_models(self) -> None:
        """Train and serve the cost model of every target whose log this worker grew (:mod:`.publish`), holding a
        CPU of this node so no kernel is timed meanwhile; a registry that refuses (a token without the worker role)
        or is away is told once and the worker goes on."""
        if not self.publish_models or not self._logged_targets or self.away_since is not None:
            return
        targets, self._logged_targets = sorted(self._logged_targets), set()
        for target, outcome in publish_each(self.registry, targets, self.seeder.cache if self.seeder else None, self.name):
            if isinstance(outcome, RegistryError):
                self.on_event("model-not-published", {"target": target, "error": str(outcome)[:300]})
                if isinstance(outcome, Forbidden):
                    self.publish_models = False  # this token may not serve models: do not train them again
                    return
                continue
            self.on_event("model" if outcome.stored else "model-kept", {"target": target, "trials": outcome.trials, "served_before": outcome.served_before,
                                                                      "reason": outcome.reason})  # fmt: skip

    def _fail(self, key: str, lease_id: str, error: str, stats: WorkerStats) -> None:
        stats.failed += 1
        try:
            state = self.registry.fail(key, lease_id, error)
        except LeaseLost:
            state = "lost"
        except AWAY:  # the lease expires and the job comes back, its attempt counted
            state = "unreported"
        self.on_event("failed", {"key": key, "state": state, "error": error})
