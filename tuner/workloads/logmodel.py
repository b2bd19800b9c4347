"""A search's cost model started from the registry's measurement log, where a search otherwise starts cold.

MetaSchedule's XGBoost model ranks the candidates of a search's first rounds at random until it has measured enough
of its own. The registry's verified log already holds what earlier searches measured: for workloads of the same
structure (the same skeleton at other shapes, or this very workload) each logged trial is a schedule of its own
workload and its time. :func:`model_log` gathers them (in the driver, which reads the registry); :func:`pretrained`
(in the tuning task) trains a fresh ``XGBModel`` on them, each workload's trials as one group, as its own searches
would have (the model learns which schedules of a workload are fast relative to the others, which carries across
shapes), and the search starts with it. TenSet and TLP report several times shorter searches from such a model.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from typing import Any

from schedhub.registry import Identity, Registry, RegistryError, TrialLog

log = logging.getLogger("schedhub.tuner")

MAX_GROUPS = 32  # workloads (each an entry's trials) a model starts from
MAX_ENTRIES_READ = 4 * MAX_GROUPS  # entries of the structure read looking for groups (claims and short ones are skipped)
MIN_GROUP = 4  # trials a workload needs to teach a ranking
#: Samples after which the model's predictions are used (MetaSchedule's XGBModel scores at random below its
#: num_warmup_samples, 100 by default: a model started from fewer logged trials would be started for nothing)
WARMUP_SAMPLES = 16


def model_log(registry: Registry, identity: Identity) -> list[list[Any]]:
    """[workload text, [[trace, secs], …]] of the verified log's entries of ``identity``'s structure on its target
    (this workload's first), each with at least :data:`MIN_GROUP` trials; at most :data:`MAX_GROUPS` of them, from the
    first :data:`MAX_ENTRIES_READ` entries of the structure (the registry's index of the log by structure: nothing of
    the target's other structures is read). [] when the registry cannot say."""
    groups: list[list[Any]] = []
    page = MAX_GROUPS + 1  # one page when the log holds no more than a model takes
    try:
        found = registry.iter_trial_logs(verified_only=True, target=identity.target, structure=identity.structure, page=page)
        for n, entry in enumerate(found):
            if n >= MAX_ENTRIES_READ or len(groups) >= MAX_GROUPS:
                break
            if len(entry.trials) < MIN_GROUP:  # of the structure: the store filters, a client refuses a page of another
                continue
            group = logged(entry)
            groups.insert(0, group) if entry.identity.key == identity.key else groups.append(group)
    except RegistryError as exc:
        log.warning("schedhub: the measurement log could not be read for %s's cost model: %s", identity.op, exc)
        return []
    return groups


def logged(entry: TrialLog) -> list[Any]:
    """A log entry as one group of :func:`model_log`: [workload text, [[trace, secs], …]]."""
    return [entry.identity.workload, [[t.trace, t.secs] for t in entry.trials]]


def replayed(mod: Any, trials: list[list[Any]]) -> tuple[list[Any], list[float]]:
    """``trials`` ([[trace, secs], …]) replayed on ``mod`` as MetaSchedule's measure candidates, with their times; a
    trace that does not replay is left out."""
    kept = [(candidate, float(secs)) for candidate, (_, secs) in zip(replayed_each(mod, trials), trials, strict=True) if candidate is not None]
    return [c for c, _ in kept], [secs for _, secs in kept]


def replayed_each(mod: Any, trials: list[list[Any]]) -> list[Any]:
    """Each of ``trials``' traces replayed on ``mod`` as a measure candidate, or None where it does not replay."""
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.metaschedule.msdb import replay_schedule

    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    out = []
    for trace, _ in trials:
        try:
            out.append(ms.MeasureCandidate(replay_schedule(mod, json.loads(trace)), args_info))
        except Exception:  # noqa: BLE001 (TVM's errors: a trace of another workload after all)
            out.append(None)
    return out


def pretrained(groups: list[list[Any]], target: Any, cache: Any = None) -> Any:
    """A fresh ``XGBModel`` trained on ``groups`` (:func:`model_log`): each workload's logged schedules replayed on
    it and featurized as the search featurizes its own candidates (:func:`replayed`). None where nothing could be
    used. ``cache`` (a ``KernelCache``): where each logged schedule's features are kept, so a search whose log an
    earlier one featurized on this machine neither replays nor featurizes it again (:func:`LoggedFeatures`)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.kernels.identity import workload_module

    extractor = LoggedFeatures(cache)
    model = ms.cost_model.XGBModel(extractor=extractor, num_warmup_samples=WARMUP_SAMPLES, adaptive_training=True)
    usable = []
    for workload, trials in groups:
        try:
            mod = workload_module(workload)
        except Exception:  # noqa: BLE001 (someone else's workload text: refused as the hook refuses it)
            continue
        context = ms.TuneContext(mod=mod, target=target)
        features, times = extractor.of_log(context, workload, trials)
        if len(features) >= MIN_GROUP:
            usable.append((context, features, times))
    for i, (context, features, times) in enumerate(usable):
        # Each update trains a new booster on all the data so far: only the last one's is kept, so only it trains
        # (an update trains where its data grew by a fifth since ``last_train_size``: never, until the last).
        model.last_train_size = 0 if i == len(usable) - 1 else math.inf
        results = [ms.runner.RunnerResult(run_secs=[secs], error_msg=None) for secs in times]
        placeholder = ms.MeasureCandidate(tvm.s_tir.Schedule(context.mod), ms.arg_info.ArgInfo.from_prim_func(context.mod["main"]))
        extractor.given = features  # what the model's update extracts for these placeholders
        model.update(context, [placeholder] * len(features), results)
    used = sum(len(features) for _, features, _ in usable)
    log.info("schedhub: the search's cost model starts trained on %d logged trials", used)
    if cache is not None and cache.writes and cache.root is not None:  # the cache grew: kept within its bound
        from schedhub.hooks.kernels.cache import max_bytes, prune

        prune(cache.root, max_bytes())
    # XGBModel retrains only once its data has grown by a fifth since the last training: started on hundreds of
    # logged trials, it would rank a whole search by the log alone and never learn from the workload's own timings
    model.adaptive_training = False
    return model if used else None


@functools.lru_cache(maxsize=1)
def _logged_features_class() -> type:
    """:func:`LoggedFeatures`' class, made on first use: MetaSchedule is imported only where a search runs."""
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.ir.utils import derived_object

    from schedhub.hooks.kernels.identity import compiler_fingerprint

    @derived_object
    class _LoggedFeatures(ms.feature_extractor.PyFeatureExtractor):
        def __init__(self, cache: Any) -> None:
            super().__init__()
            self.cache = cache
            self.inner = ms.feature_extractor.PerStoreFeature()  # XGBModel's own default
            self.given: list[Any] | None = None

        def extract_from(self, context: Any, candidates: list[Any]) -> list[Any]:
            if self.given is not None:
                given, self.given = self.given, None
                return given
            return list(self.inner.extract_from(context, candidates))

        def of_log(self, context: Any, workload: str, trials: list[list[Any]]) -> tuple[list[Any], list[float]]:
            """The features of each logged ``[trace, secs]`` that replays on ``context``'s workload, and its time, in
            the log's order: from the cache where an earlier search left them, else replayed and extracted (and kept)."""
            parts = (compiler_fingerprint(), str(context.target), workload)
            rows = [_rows(self.cache.get(FEATURES, *parts, trace)) if self.cache is not None else None for trace, _ in trials]
            todo = [i for i, r in enumerate(rows) if r is None]
            candidates = replayed_each(context.mod, [trials[i] for i in todo])
            replayable = [c for c in candidates if c is not None]
            fresh = iter(self.inner.extract_from(context, replayable) if replayable else [])
            for i, candidate in zip(todo, candidates, strict=True):
                rows[i] = next(fresh).numpy().astype(np.float32) if candidate is not None else np.zeros((0, 0), np.float32)
                if self.cache is not None:
                    self.cache.put(FEATURES, (*parts, trials[i][0]), {"shape": list(rows[i].shape), "values": rows[i].ravel().tolist()})
            kept = [(r, float(secs)) for r, (_, secs) in zip(rows, trials, strict=True) if r.size]
            return [tvm.runtime.tensor(r) for r, _ in kept], [secs for _, secs in kept]

    return _LoggedFeatures


#: The kernel cache's kind for a logged schedule's features (by compiler, target, workload and trace).
FEATURES = "logfeatures"


def _rows(entry: dict[str, Any] | None) -> Any:
    """A cached entry's feature rows as a float32 array (empty: the trace did not replay), or None where it is not one."""
    import numpy as np

    if entry is None:
        return None
    shape, values = entry.get("shape"), entry.get("values")
    if not (isinstance(shape, list) and len(shape) == 2 and all(type(n) is int and n >= 0 for n in shape) and isinstance(values, list)
            and len(values) == shape[0] * shape[1] and all(type(v) in (int, float) for v in values)):  # fmt: skip
        return None
    return np.asarray(values, dtype=np.float32).reshape(shape)


def LoggedFeatures(cache: Any = None) -> Any:  # noqa: N802 (a class, made on first use)
    """MetaSchedule's per-store feature extractor, which also featurizes a group of logged schedules (``of_log``)
    through ``cache`` (a ``KernelCache``; None keeps nothing) and hands the model's next ``update`` the features it
    is ``given`` in place of extracting them from that update's placeholders."""
    return _logged_features_class()(cache)
