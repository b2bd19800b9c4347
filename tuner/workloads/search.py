"""Tune one workload: warm start, MetaSchedule search on Ray, then verify and re-measure.

1. Warm start: traces the registry already holds (the same key, and the same fused op at other
   shapes, where replay re-derives tile sizes) are replayed on this workload, measured, and seeded
   into the search's database, so evolutionary search starts from them.
2. Search: ``ms.tune_tir`` with the xgboost cost model; builds and measurements are Ray tasks
   (:mod:`.backends`). A *first pass* (:meth:`TuneOptions.first_pass`: no trials) skips it and
   publishes the best of what step 1 measured.
3. Publish: the best distinct schedules are rebuilt, their outputs checked against the
   unscheduled kernel built for this CPU on the same random inputs, and timed again with longer
   repeated timing side by side with the target's default schedule (the unscheduled kernel on a
   CPU, DLight's on a GPU); the re-measured figures are what the records carry. Only schedules
   faster than the default are published; when none is, the default itself is (an empty trace),
   so the kernel is not queued again.
"""

from __future__ import annotations

import json
import logging
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from schedhub.registry import FLUSHED_SECS, MAX_TRIALS_PER_ENTRY, Identity, Record, Trial, TrialLog, trace_id

from ..execution import cluster, tvm_env
from ..execution.backends import BuiltKernels, RayBuilder, RayRunner, Timeline
from ..execution.kernels import FINAL_TIMING, TUNING_TIMING

log = logging.getLogger("schedhub.tuner")
TUNER_NAME = "schedhub.tuner/0.1"
_FAILED_SECS = 1e9  # MetaSchedule records a failed measurement as 1e10
SEEDS = 3  # synthesized schedules a job measures before its search (dispatch.Seeder draws them)
#: MetaSchedule's XGBoost model scores candidates with ``np.random.uniform`` until it has measured this many of its
#: own (its ``num_warmup_samples``): a cold search of up to 100 trials draws its candidates from the evolutionary
#: search at random.
COLD_WARMUP = 100


class ToolchainMismatch(RuntimeError):
    """The workload was keyed under another compiler: its schedules would land under a key no one asks for."""


@dataclass(frozen=True)
class TuneOptions:
    """The budget and knobs of one tuning job (all plain values: they travel as msgpack)."""

    trials: int = 64  # 0: a first pass (the warm start measured and the best published, no search)
    trials_per_iter: int = 16
    seed: int = 0
    publish: int = 3  # best distinct schedules verified, re-measured and pushed
    warm_start: int = 8  # registry traces replayed before the search
    repostprocess: bool = True  # on a CPU or CUDA GPU, each registry trace's sketch also measured postprocessed again at this shape
    synthesize: int = 64  # design-space samples ranked by the registry's log model; its best ``seeds`` are seeded too (0: none)
    seeds: int = SEEDS  # synthesized schedules measured before the search
    rules: bool = True  # on a CPU, the schedule the hook's rules give a miss (hooks.metaschedule.rules) measured too: a record is never slower than it
    search_threads: int = 0  # MetaSchedule's own threads; 0: physical cores. With 1, a seed gives the same first batch every time
    warm_model: bool = True  # start the search's cost model trained on the registry's verified log of this structure (logmodel.py)
    model_warmup: int = COLD_WARMUP  # candidates a cold cost model measures before it ranks any (below: at random)
    population: int = 512  # evolutionary search population (MetaSchedule's default); smaller is cheaper per trial
    genetic_iters: int = 4  # evolution rounds per batch of candidates (MetaSchedule's default)
    #: share of each batch's population drawn from the fastest measured so far (MetaSchedule's default). Their order
    #: is the timings', so later batches vary with the machine's noise; at 0, a seeded one-thread search whose model
    #: still ranks at random measures the same candidates in every batch
    measured_share: float = 0.2
    timing: dict[str, Any] = field(default_factory=lambda: dict(TUNING_TIMING))
    final_timing: dict[str, Any] = field(default_factory=lambda: dict(FINAL_TIMING))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TuneOptions:
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown tuning options: {sorted(unknown)}")
        return cls(**values)

    def first_pass(self) -> TuneOptions:
        """These options for a first pass: the registry's traces and as many synthesized seeds as a compile
        times (``hooks.metaschedule.synthesis.TIMED``) measured, the best published, no search (a worker queues the search
        after every miss had one)."""
        from schedhub.hooks.metaschedule.synthesis import TIMED

        return replace(self, trials=0, seeds=max(self.seeds, TIMED))

    @property
    def starts_model(self) -> bool:
        """Whether a job with these options starts its search's cost model from the registry's log: asked for, and a search to start."""
        return self.warm_model and self.trials > 0

    def warm_measurements(self) -> int:
        """The most candidates a job measures before its search: the registry's traces (each with its twin
        postprocessed here, with ``repostprocess``), the synthesized seeds and the rules' schedule."""
        return self.warm_start * (2 if self.repostprocess else 1) + (self.seeds if self.synthesize else 0) + int(self.rules)


@dataclass
class TuneResult:
    """What a tuning job produced; ``records`` are verified and re-measured, best first."""

    identity: Identity
    records: list[Record]
    untuned_secs: float  # the target's default schedule, timed beside the records
    trials: int
    warm_started: int
    search_secs: float
    curve: list[tuple[int, float]]  # (measured candidates so far, best mean seconds so far)
    events: list[dict[str, Any]]
    rejected: list[str]
    measured: list[tuple[str, float]] = field(default_factory=list)  # the search's trials for the measurement log: (trace text, mean secs)
    skipped: list[str] = field(default_factory=list)  # warm-start traces not replayed: "trace id: why"
    phases: dict[str, float] = field(default_factory=dict)  # the search's wall seconds by phase (:func:`tuning_phases`)
    untuned_flushed_secs: float = 0.0  # the default schedule on flushed caches, where it was timed so
    retimed: list[Record] = field(default_factory=list)  # the key's older records timed again with their flushed times (.retime), to push too

    @property
    def best_secs(self) -> float | None:
        return self.records[0].mean_secs if self.records else None

    def ranked_times(self) -> tuple[float | None, float]:
        """(best, default) in the measure the registry ranks the key's records by once these are pushed (the job's own
        and the older ones it re-timed): on flushed caches where the default and every record were timed so, else warm."""
        pushed = self.records + self.retimed
        flushed = [r.flushed_secs for r in pushed]
        if self.untuned_flushed_secs and flushed and all(flushed):
            return min(flushed), self.untuned_flushed_secs  # type: ignore[type-var]  # all set
        return min((r.mean_secs for r in pushed), default=None), self.untuned_secs

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["identity"] = self.identity.to_dict()
        out["records"] = [r.to_dict() for r in self.records]
        out["retimed"] = [r.to_dict() for r in self.retimed]
        out["curve"] = [list(p) for p in self.curve]
        out["measured"] = [list(m) for m in self.measured]
        return out

    def trial_log(self) -> TrialLog | None:
        """What the search measured, as the registry's measurement log takes it (None when nothing was)."""
        return TrialLog(self.identity, [Trial(t, secs) for t, secs in self.measured]) if self.measured else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TuneResult:
        return cls(
            identity=Identity(**d["identity"]), records=[Record.from_obj(r) for r in d["records"]],
            untuned_secs=d["untuned_secs"], trials=d["trials"], warm_started=d["warm_started"],
            search_secs=d["search_secs"], curve=[(int(a), float(b)) for a, b in d["curve"]],
            events=d["events"], rejected=d["rejected"], measured=[(str(t), float(secs)) for t, secs in d.get("measured", [])],
            skipped=[str(s) for s in d.get("skipped", [])], phases={p: float(d["phases"][p]) for p in PHASE_NAMES if p in d.get("phases", {})},
            untuned_flushed_secs=float(d.get("untuned_flushed_secs", 0.0)), retimed=[Record.from_obj(r) for r in d.get("retimed", [])],
        )  # fmt: skip


def tune_job(identity: dict[str, Any], warm_traces: list[str], options: dict[str, Any], label: str, seeds: list[str] | None = None,
             model_log: list[Any] | None = None, retime_traces: list[str] | None = None, settled_traces: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """:func:`tune_workload` with plain values in and out: the body of a Ray tuning task."""
    return tune_workload(Identity(**identity), warm_traces, TuneOptions.from_dict(options), label, seeds, model_log, retime_traces, settled_traces).to_dict()


def tune_workload(identity: Identity, warm_traces: list[str], options: TuneOptions, label: str = "", seeds: list[str] | None = None,
                  model_log: list[Any] | None = None, retime_traces: list[str] | None = None, settled_traces: list[str] | None = None) -> TuneResult:  # fmt: skip
    """Search schedules for one workload on the Ray cluster this process is connected to, measuring first
    ``warm_traces`` (the registry's, at most ``options.warm_start``), ``seeds`` (synthesized, at most ``options.seeds``) and,
    with ``options.rules``, the schedule the hook's CPU rules give the kernel as a miss (the search starts from it too);
    with no trials, only those (a first pass). ``model_log`` (:func:`.logmodel.model_log`), with ``options.warm_model``:
    what the search's cost model is trained on before its first round. ``retime_traces``: the key's verified records
    without a flushed time (:func:`.retime.lacking_flushed`), timed again (:func:`time_traces`) after publishing where
    the final timing takes flushed times, so the key ranks by them once pushed (``TuneResult.retimed``).
    ``settled_traces``: the key's records a re-push leaves as they are (:func:`.retime.settled`); publishing times
    again at most one of them (:func:`to_publish`)."""
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.kernels.cache import KernelCache, default_dir
    from schedhub.hooks.kernels.identity import compiler_fingerprint, target_from_text, workload_module
    from schedhub.hooks.metaschedule.msdb import normalize_mod, trace_text, tuning_target
    from schedhub.hooks.metaschedule.rules import ruled_trace

    from .logmodel import pretrained

    tvm_env.prepare()
    if identity.fingerprint != compiler_fingerprint():
        raise ToolchainMismatch(f"workload {identity.key[:12]} was keyed under {identity.fingerprint!r}; this tuner runs {compiler_fingerprint()!r}")
    cluster.check_feasible(identity.target)
    mod = workload_module(identity.workload)
    target = tuning_target(target_from_text(identity.target))
    timeline = Timeline(label or identity.key[:12])
    with tempfile.TemporaryDirectory(prefix="schedhub-tune-") as work_dir:
        builder, runner = RayBuilder(work_dir, timeline), RayRunner(timeline, identity.target, options.timing)
        database = ms.database.MemoryDatabase()
        synthesized = (seeds or [])[: options.seeds if options.synthesize else 0]
        timeline.stage = "warm start"
        registry_traces = list(dict.fromkeys(warm_traces[: options.warm_start]))
        ruled = [t for t in [ruled_trace(normalize_mod(mod), target)] if t] if options.rules else []  # what a miss runs (hooks.metaschedule.rules)
        traces = registry_traces + [t for t in dict.fromkeys(synthesized + ruled) if t not in registry_traces]
        twinned = len(registry_traces) if options.repostprocess else 0
        warm, skipped = _seed_database(database, mod, target, traces, builder, runner, twinned)
        started, phases = time.time(), {}
        timeline.stage = "search"
        if options.trials > 0:
            cost_model = pretrained(model_log, target, KernelCache(default_dir())) if options.starts_model and model_log else None
            _, phases = profiled_tune_tir(mod, target, work_dir=work_dir, builder=builder, runner=runner, database=database,
                                          **search_settings(options, cost_model))  # fmt: skip
        search_secs = time.time() - started
        measured = [tr for tr in database.get_all_tuning_records() if mean_secs(tr) < _FAILED_SECS]
        curve = best_so_far([mean_secs(tr) for tr in measured])
        timeline.stage = "publish"
        records, default, rejected = _publish(identity, mod, measured, options, timeline, builder.kept, frozenset(settled_traces or ()))
        untuned = default.mean_secs
        logged = [(trace_text(tr.trace), mean_secs(tr)) for tr in log_sample(measured)]
    strategy = "evolutionary+xgb" if options.trials > 0 else "first pass: warm start measured, no search"
    prov = {"tuner": TUNER_NAME, "strategy": strategy, "trials": options.trials, "seed": options.seed, "warm_started": warm, "synthesized_seeds": len(synthesized),
            "search_secs": round(search_secs, 3), "untuned_secs": untuned, "host": socket.gethostname(), "job": timeline.job,
            "host_cpu": tvm_env.host_target()["mcpu"], "search_threads": options.search_threads or "physical",
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "curve": json.dumps(_thin(curve, 64)),
            **({"cache_flushed": True} if options.final_timing.get("flush_cache") else {})}  # fmt: skip
    records = [Record(r.identity, r.trace, r.run_secs, {**prov, **r.provenance, "rank": i}) for i, r in enumerate(records)]
    retimed = time_traces(identity, retime_traces, options.final_timing)[0] if retime_traces and options.final_timing.get("flushed_too") else []
    return TuneResult(identity, records, untuned, options.trials, warm, search_secs, curve, timeline.events, rejected, logged, skipped, phases,
                      default.flushed_secs or 0.0, retimed)  # fmt: skip


#: Where a search's time goes, by MetaSchedule's profiler scopes (flat, never nested in one another).
PHASES = {"search": ("EvoSearch/",), "build": ("SendToBuilder",), "measure": ("SendToRunner", "JoinRunnerFutures"), "cost model": ("MeasureCallback/UpdateCostModel",)}
PHASE_NAMES = (*PHASES, "rest")


def profiled_tune_tir(*args: Any, **kwargs: Any) -> tuple[Any, dict[str, float]]:
    """``ms.tune_tir(*args, **kwargs)``'s database and its wall seconds by phase (:func:`tuning_phases`)."""
    from tvm.s_tir import meta_schedule as ms

    with ms.Profiler() as profiler:
        database = ms.tune_tir(*args, **kwargs)
    return database, tuning_phases(profiler.get())


def tuning_phases(profile: dict[str, Any]) -> dict[str, float]:
    """Wall seconds of a ``ms.tune_tir`` run by phase, from its ``ms.Profiler`` (``profile``: scope → seconds):
    ``search`` (the evolutionary search: sampling, mutation, the cost model's predictions), ``build``
    (handing a round's candidates to the builder until every one is built), ``measure`` (to the runner,
    then waiting for the timings), ``cost model`` (training it on a round's timings) and ``rest`` (the
    total less those: the task scheduler and everything between scopes)."""
    secs = {name: float(value) for name, value in profile.items()}
    phases = {phase: sum(v for name, v in secs.items() if any(name == p or (p.endswith("/") and name.startswith(p)) for p in prefixes))
              for phase, prefixes in PHASES.items()}  # fmt: skip
    phases["rest"] = max(0.0, secs.get("Total", 0.0) - sum(phases.values()))
    return phases


def default_schedule(mod: Any, target: Any) -> Any:
    """:func:`schedhub.hooks.kernels.defaults.default_schedule`, the schedule every record must beat, under the target
    MetaSchedule searches (:func:`schedhub.hooks.metaschedule.msdb.tuning_target`: a CUDA target with the per-block limits its GPU rules read)."""
    from schedhub.hooks.kernels.defaults import default_schedule as target_default
    from schedhub.hooks.metaschedule.msdb import tuning_target

    return target_default(mod, tuning_target(target))


def default_label(target_text: str) -> str:
    """:func:`default_schedule` as a column label: ``"untuned"`` on a CPU, ``"DLight"`` on a GPU."""
    from schedhub.registry import target_kind

    return "untuned" if target_kind(target_text) == "llvm" else "DLight"


def default_name(target_text: str) -> str:
    """:func:`default_schedule` in words, for verdicts and rejections."""
    return "the unscheduled kernel" if default_label(target_text) == "untuned" else "DLight's schedule"


def search_settings(options: TuneOptions, cost_model: Any = None) -> dict[str, Any]:
    """``ms.tune_tir`` keyword arguments for the search ``options`` ask for: budget, seed, threads, strategy.

    Seeds numpy's global generator too: until it has enough samples, MetaSchedule's XGBoost cost
    model scores candidates with ``np.random.uniform``, so the seed alone did not fix the candidates.
    (With more than one search thread the candidates still vary: threads take work dynamically,
    each with its own generator.)
    """
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    np.random.seed(options.seed)
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=options.population, init_min_unmeasured=min(50, max(1, options.population // 2)), genetic_num_iters=options.genetic_iters,
        init_measured_ratio=options.measured_share,
    )  # fmt: skip
    if cost_model is None and options.model_warmup != COLD_WARMUP:
        cost_model = ms.cost_model.XGBModel(num_warmup_samples=options.model_warmup, tree_method="auto")
    return {"max_trials_global": options.trials, "num_trials_per_iter": options.trials_per_iter, "cost_model": cost_model or "xgb", "seed": options.seed,
            "num_tuning_cores": options.search_threads or "physical", "strategy": strategy}  # fmt: skip


def mean_secs(tr: Any) -> float:
    """A TuningRecord's mean run time (inf when it was never measured)."""
    secs = [float(s) for s in (tr.run_secs or [])]
    return sum(secs) / len(secs) if secs else float("inf")


def log_sample(measured: list[Any], size: int = MAX_TRIALS_PER_ENTRY, fastest: int = 16) -> list[Any]:
    """The trials worth logging when there are more than ``size``: the ``fastest`` few and an even spread of the
    rest in measurement order (a cost model learns as much from the slow schedules as from the fast), slowest first
    so the registry, which keeps an entry's newest, drops the fast ones last."""
    if len(measured) > size:
        ranked = sorted(range(len(measured)), key=lambda i: mean_secs(measured[i]))
        top, rest = ranked[:fastest], sorted(ranked[fastest:])
        step = len(rest) / (size - fastest)
        measured = [measured[rest[int(j * step)]] for j in range(size - fastest)] + [measured[i] for i in top]
    return sorted(measured, key=mean_secs, reverse=True)


def best_so_far(means: list[float]) -> list[tuple[int, float]]:
    """The tuning curve: (candidates measured, best mean so far) after each measurement."""
    curve, best = [], float("inf")
    for i, m in enumerate(means, 1):
        best = min(best, m)
        curve.append((i, best))
    return curve


def _thin(curve: list[tuple[int, float]], points: int) -> list[tuple[int, float]]:
    if len(curve) <= points:
        return curve
    step = len(curve) / points
    return [curve[int(i * step)] for i in range(points - 1)] + [curve[-1]]


def replay(mod: Any, text: str) -> Any:
    """A record's trace text replayed on ``mod`` as the hook replays it: the re-derived Trace.

    Raises TVM's error when the trace does not fit the workload's structure.
    """
    from schedhub.hooks.metaschedule.msdb import replay_schedule

    return replay_schedule(mod, json.loads(text)).trace


def _seed_database(database: Any, mod: Any, target: Any, traces: list[str], builder: RayBuilder, runner: RayRunner,
                   twinned: int = 0) -> tuple[int, list[str]]:  # fmt: skip
    """Replay registry traces on ``mod``, measure them and commit them to ``database``; returns how many were
    committed (their builds are in ``builder.kept``, so publishing does not build them again), and why each skipped
    trace was skipped. A trace is someone else's data (a claim of any pusher): one past the
    hook's cost bounds is skipped, not built (it would hold a build slot until the builder's timeout). Each of the
    first ``twinned`` traces that replays brings its twin postprocessed here where that differs
    (``hooks.metaschedule.msdb.postprocessed_here``: its postprocessing was decided for the record's own loop extents), measured beside it.
    Of traces that schedule the kernel alike (``hooks.kernels.measure.first_equal``), the first is measured."""
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.metaschedule.guard import ScheduleLimits
    from schedhub.hooks.kernels.measure import first_equal
    from schedhub.hooks.metaschedule.msdb import first_line, postprocessed_here, replay_launchable

    workload = database.commit_workload(mod)
    limits = ScheduleLimits()
    replayed, skipped = [], []
    for i, text in enumerate(traces):
        try:
            sch = replay_launchable(mod, text, target, limits)  # a GPU launch made consistent where the recorded one is not
            replayed.append((sch.trace, sch.mod))
        except Exception as exc:  # a trace of another structure, or one that would cost the build too much: skip it, say so
            why = f"{type(exc).__name__}: {first_line(exc)}"
            skipped.append(f"{trace_id(text)}: {why}")
            log.info("warm start: a registry trace is skipped (%s)", why)
            continue
        if i >= twinned:
            continue
        try:
            twin = postprocessed_here(mod, text, target, limits, sch.mod)
        except Exception as exc:  # someone else's trace: no twin, the trace itself is still measured
            log.info("warm start: no twin postprocessed here for %s (%s: %s)", trace_id(text), type(exc).__name__, first_line(exc))
            continue
        if twin is not None:
            replayed.append((twin.trace, twin.mod))
    firsts = first_equal([m["main"] for _, m in replayed])  # traces that schedule the kernel alike: one is built and measured
    replayed = [pair for i, pair in enumerate(replayed) if firsts[i] == i]
    if not replayed:
        return 0, skipped
    args_info = [ms.arg_info.ArgInfo.from_entry_func(m, remove_preproc=True) for _, m in replayed]  # as built: weights prepacked where it rewrites them
    built = builder.build([ms.builder.BuilderInput(m, target) for _, m in replayed])
    device = "cpu" if target.kind.name == "llvm" else target.kind.name
    inputs = [ms.runner.RunnerInput(b.artifact_path, device, args) for b, args in zip(built, args_info) if b.artifact_path]
    futures = iter(runner.run(inputs))
    committed = 0
    for (trace, _), b, args in zip(replayed, built, args_info):
        if b.artifact_path is None:
            continue
        res = next(futures).result()
        if res.run_secs:
            database.commit_tuning_record(ms.database.TuningRecord(trace, workload, res.run_secs, target, args))
            committed += 1
    return committed, skipped


#: Where the reference output is computed for kernels of other devices: this CPU, unscheduled.
HOST_REFERENCE = '{"kind":"llvm"}'
#: :func:`side_by_side` times the default briefly where each candidate's checking call was this many times faster than
#: its own: a verdict it cannot change, and a precision no one reads (each record's own time is timed in full)
BRIEF_DEFAULT_PAST = 10.0


def reference_build(mod: Any, target_text: str) -> tuple[Any, str] | None:
    """What the outputs of ``mod``'s schedules for ``target_text`` are checked against, as (module, target)
    to build: the unscheduled kernel on this CPU (:data:`HOST_REFERENCE`) for another device; None on a
    CPU target, where the default schedule's own build is the reference."""
    from schedhub.registry import target_kind

    return None if target_kind(target_text) == "llvm" else (mod, HOST_REFERENCE)


def side_by_side(identity: Identity, mod: Any, candidates: list[Any], timing: dict[str, Any], timeline: Timeline,
                 prebuilt: list[bytes | None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Build the target's :func:`default_schedule` of ``mod`` and each scheduled candidate (CPU tasks; a
    candidate whose ``prebuilt`` artifact is given is not built again, but for its whole build where its schedule
    prepacks weights: :func:`.kernels.build`'s ``whole_only``), then time them in one measurement
    task that holds the device, checking every output against the unscheduled kernel's on a CPU (on a CPU
    target, the default's own build). The caller has checked that the cluster can build and time them
    (:func:`cluster.check_feasible`).

    A build still running :data:`cluster.BUILD_TIMEOUT_SECS` after the wait for it began is cancelled and fails.
    Returns one ``{"run_secs", "error", "build_secs"}`` per module (``build_secs``: None where it was prebuilt and not
    built whole again, or did not come back), the default first (it must run). The default is timed briefly where every candidate's checking call
    was :data:`BRIEF_DEFAULT_PAST` times faster than its own (:data:`.kernels.BRIEF_CALLS`; its result says ``"brief"``),
    unless ``timing`` says otherwise (``"brief_first_past"``: None never). On a CPU the default's first call is the
    reference's (``kernels.measure``'s ``first_is_reference``).
    """
    import tvm

    from schedhub.hooks.kernels.identity import target_from_text

    timing = {"brief_first_past": BRIEF_DEFAULT_PAST, **timing}
    host = reference_build(mod, identity.target)
    given = [None, *(prebuilt or [None] * len(candidates))]
    packs = [False, *(tvm_env.packed_args_info(c) is not None for c in candidates)]  # given built, still built whole to be checked
    builds = [(default_schedule(mod, target_from_text(identity.target)), identity.target), *((c, identity.target) for c in candidates)]
    if host:
        builds.append(host)
        given.append(None)
        packs.append(False)
    refs = [None if artifact is not None and not whole else cluster.submit("build", placed=cluster.placement("build", t), mod_json=tvm.ir.save_json(m),
                                                                           target_text=t, checkable=True, whole_only=artifact is not None)
            for (m, t), artifact, whole in zip(builds, given, packs)]  # fmt: skip
    built = [_built(ref, artifact) for ref, artifact in zip(refs, given)]
    for b in built:
        if "start" in b:  # built now (not given, timed out nor lost)
            timeline.add("build", b)
    reference = built.pop() if host else built[0]
    if reference["artifact"] is None:
        raise RuntimeError(f"the unscheduled workload does not build: {reference['error']}")
    if built[0]["artifact"] is None:
        raise RuntimeError(f"{default_name(identity.target)} does not build: {built[0]['error']}")
    answer = cluster.result(cluster.submit(
        "measure", placed=cluster.placement("measure", identity.target), artifacts=[b["artifact"] for b in built], args_info=identity.args_info,
        timing=timing, target_text=identity.target, **({"reference": reference["artifact"]} if host else {"first_is_reference": True}),
        **({"own_args": [b.get("args_info") for b in built], "checks": [b.get("check_artifact") for b in built]} if any("check_artifact" in b for b in built) else {}),
    ))  # fmt: skip
    timeline.add("measure", answer, len(built))
    results = [{**(r if b["artifact"] is not None else {**r, "error": b["error"]}), "build_secs": b["end"] - b["start"] if "start" in b else None}
               for r, b in zip(answer["results"], built)]  # fmt: skip
    if not results[0]["run_secs"]:
        raise RuntimeError(f"{default_name(identity.target)} does not run: {results[0]['error']}")
    return results


def _built(ref: Any, given: bytes | None) -> dict[str, Any]:
    """One module of :func:`side_by_side` as built: its ``given`` artifact, with the answer of its build task (``ref``,
    None: none was needed) where one was made: all of it, or its whole build for checking where the artifact is given."""
    if ref is None:
        return {"artifact": given, "error": None}
    answer = cluster.build_result(ref)
    return answer if given is None or answer["error"] else {**answer, "artifact": given}


def to_publish(measured: list[Any], count: int, settled: frozenset[str]) -> dict[str, Any]:
    """The ``count`` fastest distinct schedules the job measured (TuningRecords by trace text, fastest first), less
    every ``settled`` one after the fastest of them: the registry keeps a verified record's time as first verified, so
    timing it again is worth nothing; the fastest stays, so that a round's best is timed beside what it has to beat."""
    from schedhub.hooks.metaschedule.msdb import trace_text

    best: dict[str, Any] = {}
    for tr in sorted(measured, key=mean_secs):
        text = trace_text(tr.trace)
        best.setdefault(text, tr)
        if len(best) >= count:
            break
    first_settled = next((text for text in best if text in settled), None)
    return {text: tr for text, tr in best.items() if text not in settled or text == first_settled}


def _publish(identity: Identity, mod: Any, measured: list[Any], options: TuneOptions, timeline: Timeline,
             kept: BuiltKernels | None = None, settled: frozenset[str] = frozenset()) -> tuple[list[Record], Record, list[str]]:  # fmt: skip
    """Verify and re-measure the best distinct schedules (:func:`to_publish`; ``kept``: the builds the job's warm start
    and search made, timed again as they are); returns (records best first, the default schedule as a record, timed beside
    them, rejections: ``"<trace id>: <why>"`` for each schedule the search measured that is not published)."""
    from schedhub.hooks.metaschedule.msdb import scheduled

    best = to_publish(measured, options.publish, settled)
    candidates = [scheduled(mod, tr.trace) for tr in best.values()]
    prebuilt = [kept.get(c) if kept is not None else None for c in candidates]
    timed = side_by_side(identity, mod, candidates, options.final_timing, timeline, prebuilt)
    records, default, rejected = _against_default(identity, mod, list(best), timed)
    if not records and any(r["run_secs"] for r in timed[1:]):
        # "Nothing beats the default" pins a kernel: the hook serves it as a hit and never reports it again. One
        # timing taken while the machine was busy (a 7.2 ms default against 16.4 ms for a schedule that ran 0.41 ms
        # elsewhere) must not decide that, so the verdict stands only if a second side-by-side timing agrees.
        records, default, rejected = _against_default(identity, mod, list(best), side_by_side(identity, mod, candidates, options.final_timing, timeline, prebuilt))
        default = Record(identity, default.trace, default.run_secs, {**default.provenance, "timed_twice": True})
    # When nothing beat the target's default, that *is* the best known schedule: publish it (an
    # empty trace: the hook leaves the kernel to the default) so the hook stops reporting the
    # kernel as a miss and nobody tunes it again blindly.
    records = sorted(records, key=lambda r: r.mean_secs) or [default]
    return records, default, rejected


def flushed_claim(result: dict[str, Any]) -> dict[str, float]:
    """A timed kernel's mean on flushed caches as a record's provenance claims it (``{}`` where it was not timed so)."""
    secs = result.get("flushed_secs")
    return {FLUSHED_SECS: sum(secs) / len(secs)} if secs else {}


def _against_default(identity: Identity, mod: Any, traces: list[str], results: list[dict[str, Any]]) -> tuple[list[Record], Record, list[str]]:
    """The candidates (``traces``) that beat the default in one :func:`side_by_side` timing (``results``: the default's
    first), the default as a record, and why each other was rejected."""
    import tvm

    from schedhub.hooks.metaschedule.msdb import trace_text

    default = Record(identity, trace_text(tvm.s_tir.Schedule(mod).trace), results[0]["run_secs"],
                     {"default_schedule": True, "default": default_name(identity.target), **flushed_claim(results[0]),
                      **({"timed_briefly": True} if results[0].get("brief") else {})})  # fmt: skip
    records, rejected = [], []
    for text, result in zip(traces, results[1:]):
        if not result["run_secs"]:
            rejected.append(f"{trace_id(text)}: {result['error']}")
        elif (record := Record(identity, text, result["run_secs"], flushed_claim(result))).mean_secs < default.mean_secs:
            records.append(record)
        else:
            rejected.append(f"{trace_id(text)}: slower than {default_name(identity.target)} when timed side by side")
    return records, default, rejected


@dataclass
class Retimed:
    """One key re-timed: each record's (warm, flushed) mean seconds by trace id, and why any record was not timed."""

    key: str
    op: str
    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def time_traces(identity: Identity, traces: list[str], timing: dict[str, Any] | None = None) -> tuple[list[Record], Retimed]:
    """Records of ``identity`` (``traces``, a registry's) timed side by side with the default schedule as ``timing`` says
    (default :data:`.kernels.FINAL_TIMING`: warm and flushed), outputs checked: records to push again with their flushed
    means, and what was timed. A trace that does not replay within the hook's bounds is left out, and why said."""
    from schedhub.hooks.metaschedule.guard import ScheduleLimits
    from schedhub.hooks.kernels.identity import workload_module
    from schedhub.hooks.metaschedule.msdb import replay_within

    tvm_env.prepare()
    done = Retimed(identity.key, identity.op)
    mod = workload_module(identity.workload)
    replayed: list[tuple[str, object]] = []
    for trace in dict.fromkeys(traces):
        try:
            replayed.append((trace, replay_within(mod, trace, ScheduleLimits()).mod))
        except Exception as exc:  # verified once, someone's data all the same: left as it is, said why
            done.errors.append(f"{trace_id(trace)}: does not replay: {type(exc).__name__}: {str(exc).strip()[:200]}")
    if not replayed:
        return [], done
    cluster.check_feasible(identity.target)
    timed = side_by_side(identity, mod, [m for _, m in replayed], timing or FINAL_TIMING, Timeline(f"retime:{identity.key[:8]}"))
    again = []
    for (trace, _), result in zip(replayed, timed[1:]):
        claim = flushed_claim(result)
        if not result["run_secs"] or not claim:
            done.errors.append(f"{trace_id(trace)}: {result.get('error') or 'not timed on flushed caches'}")
            continue
        again.append(record := Record(identity, trace, result["run_secs"], {"retimed": True, **claim}))
        done.times[record.trace_id] = (record.mean_secs, claim[FLUSHED_SECS])
    return again, done
