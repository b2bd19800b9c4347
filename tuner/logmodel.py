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

import json
import logging
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
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.msdb import replay_schedule

    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    candidates, times = [], []
    for trace, secs in trials:
        try:
            sch = replay_schedule(mod, json.loads(trace))
        except Exception:  # noqa: BLE001 (TVM's errors: a trace of another workload after all)
            continue
        candidates.append(ms.MeasureCandidate(sch, args_info))
        times.append(float(secs))
    return candidates, times


def pretrained(groups: list[list[Any]], target: Any) -> Any:
    """A fresh ``XGBModel`` trained on ``groups`` (:func:`model_log`): each workload's logged schedules replayed on
    it and featurized as the search featurizes its own candidates (:func:`replayed`). None where nothing could be
    used."""
    from tvm.s_tir import meta_schedule as ms

    from schedhub.hooks.identity import workload_module

    model = ms.cost_model.XGBModel(num_warmup_samples=WARMUP_SAMPLES)
    used = 0
    for workload, trials in groups:
        try:
            mod = workload_module(workload)
        except Exception:  # noqa: BLE001 (someone else's workload text: refused as the hook refuses it)
            continue
        candidates, times = replayed(mod, trials)
        if len(candidates) >= MIN_GROUP:
            results = [ms.runner.RunnerResult(run_secs=[secs], error_msg=None) for secs in times]
            model.update(ms.TuneContext(mod=mod, target=target), candidates, results)
            used += len(candidates)
    log.info("schedhub: the search's cost model starts trained on %d logged trials", used)
    # XGBModel retrains only once its data has grown by a fifth since the last training: started on hundreds of
    # logged trials, it would rank a whole search by the log alone and never learn from the workload's own timings
    model.adaptive_training = False
    return model if used else None
