"""Publishing cost models: a worker trains a target's model on the verified measurement log and serves it.

A compile that misses ranks its transfer candidates with the registry's model (``schedhub.hooks.serving.session``)
and synthesizes from it, for one download instead of 14–29 s of training on a fresh machine. The model is
trained where the log grows: a worker that pushed trials of a target publishes its model when the queue
runs dry (:class:`schedhub.tuner.worker.Worker`), and ``schedhub tune`` after its jobs. A model is trained
again only once the trials it would learn from hold :data:`MIN_GROWTH` - 1 times the served one's number
of trials it did not learn from (and at least :data:`MIN_NEW_TRIALS`), so an idle worker does not retrain
what nothing changed. A model learns from at most ``MAX_LOG_TRIALS`` of the log, and which ones changes as
workloads arrive: the machine that published the served model remembers which trials it learned from and
counts the new ones; another counts the log's growth.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from schedhub.registry import CostModelEntry, Registry

log = logging.getLogger("schedhub.tuner")

MIN_GROWTH = 1.25
MIN_NEW_TRIALS = 32


@dataclass(frozen=True)
class Published:
    """What publishing a target's model did: ``trials`` it learned from (of the log), ``served_before``: the
    trials of the model that was served (0: none), ``stored``: whether the registry serves it now."""

    target: str
    trials: int
    served_before: int
    stored: bool
    nodes: int = 0
    reason: str = ""


def publish_cost_model(registry: Registry, target: str, cache: Any = None, pushed_by: str = "", *, force: bool = False) -> Published:
    """Train canonical ``target``'s model on its verified measurement log (this machine's kernel cache keeps each
    trial's features, so a grown log costs only its new trials) and push it, unless the served model learned from
    nearly as much (``force``: push all the same). Raises RegistryError when the registry cannot be read or refuses the push."""
    from schedhub.hooks.kernels.cache import KernelCache, default_dir
    from schedhub.hooks.metaschedule.costmodel import FEATURES
    from schedhub.hooks.kernels.identity import compiler_fingerprint
    from schedhub.hooks.kernels.measure import Budget
    from schedhub.hooks.metaschedule.synthesis import LogModel

    compiler = compiler_fingerprint()
    served = registry.cost_model(target, compiler, FEATURES)
    before = served.trials if served is not None and served.verified else 0
    cache = cache or KernelCache(default_dir())
    models = LogModel(registry, cache, lambda entry: entry.verified, verified_only=True, use_served=False)
    learning = models.log_trials(target)
    logged = len(learning)
    parts = (target, compiler, FEATURES)
    published = cache.get("published-model", *parts) or {}
    known = published.get("trials") if published.get("served") == before and served is not None else None
    new = (Counter(learning) - Counter(map(str, known))).total() if isinstance(known, list) else logged - before  # another's: the growth
    if served is not None and not force and new < max(before * (MIN_GROWTH - 1), MIN_NEW_TRIALS):
        return Published(target, logged, before, False, reason=f"the served model learned from {before} trials; {new} of the log's {logged} are new to it")
    trained = models.get(target, Budget(math.inf))
    if trained is None:
        return Published(target, logged, before, False, reason=f"{logged} logged trials train no model")
    answer = registry.push_cost_model(CostModelEntry(target, compiler, FEATURES, logged, trained.trees), pushed_by)
    stored = answer.get("stored") is True
    if stored:
        cache.put("published-model", parts, {"served": logged, "trials": learning})
    log.info("schedhub: cost model of %s from %d logged trials %s", target, logged, "published" if stored else f"not stored: {answer.get('reason')}")
    return Published(target, logged, before, stored, trained.trees.nodes, "" if stored else str(answer.get("reason", ""))[:300])
