"""Tuning a network where its time goes: rounds of trials, each to the kernel a policy picks, until a goal is met.

Each round is one tuning job on the Ray cluster (``round_trials`` trials), warm-started from the registry, where the
kernel's earlier rounds left their best: a kernel's rounds continue one search. Its result is pushed at once, so a
run that stops (a goal, a budget, a killed driver) leaves everything it found in the registry; a run started again
begins from those records (its kernels' first rounds time them again).

A latency goal is met by the estimate first (Σ calls × each kernel's best time alone, on flushed caches where the
tuner timed it so: as the registry ranks the records, and as a network meets its weights); with a ``measure`` the network
compiled from the registry is then timed, and tuning goes on, the estimate corrected by what the network measured,
until the compiled network itself meets the goal or the budget ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from schedhub.registry import Identity, Registry

from ..execution import cluster
from .allocation import Goal, KernelTuning, Policy, network_secs, timed_so_far
from ..workloads.dispatch import push_result, start_tuning
from ..workloads.search import TuneOptions, TuneResult

log = logging.getLogger("schedhub.tuner")


@dataclass(frozen=True)
class Round:
    """One round as it ended: which kernel, its result, and the network's estimate after it."""

    number: int
    kernel: KernelTuning
    result: TuneResult
    network_secs: float | None
    trials_spent: int
    elapsed_secs: float
    timed_kernels: int = 0  # kernels with a time so far (all of them once ``network_secs`` is known)
    timed_secs: float = 0.0  # Σ calls × best time over those: the estimate so far, a lower bound


@dataclass(frozen=True)
class Check:
    """The compiled network timed when the estimate met the latency goal."""

    trials_spent: int
    estimate_secs: float
    measured_secs: float


@dataclass
class NetworkTuning:
    kernels: list[KernelTuning]
    rounds: list[Round] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    stopped_because: str = ""

    @property
    def network_secs(self) -> float | None:
        return network_secs(self.kernels)

    @property
    def scale(self) -> float:
        """The compiled network's latency over the estimate at the last check (1 before any)."""
        return self.checks[-1].measured_secs / self.checks[-1].estimate_secs if self.checks else 1.0

    @property
    def trials(self) -> int:
        return sum(k.trials for k in self.kernels)


def workload_flops(identity: Identity) -> float:
    """TVM's FLOP estimate of one call of the kernel (0 where it has none)."""
    from schedhub.hooks.metaschedule.costmodel import flops
    from schedhub.hooks.kernels.identity import workload_module

    try:
        return flops(workload_module(identity.workload))
    except Exception:  # noqa: BLE001 (TVM's estimate fails on some kernels: then they are ordered by calls only)
        return 0.0


class CalledKernel(Protocol):
    identity: Identity
    calls: int


K = TypeVar("K", bound=CalledKernel)


def heaviest_first(kernels: Iterable[K]) -> list[K]:
    """``kernels`` by their work in a forward pass (calls × :func:`workload_flops`), the most first."""
    return sorted(kernels, key=lambda k: -k.calls * workload_flops(k.identity))


def round_options(options: TuneOptions, kernel: KernelTuning) -> TuneOptions:
    """A round's options: a kernel's first round warm-starts as any job does (the registry's traces of it and of its
    neighbours, their twins postprocessed here, synthesized seeds, the rules' schedule); its later rounds replay only
    its own best records, which its earlier rounds measured and published (as fast as the rules' schedule or faster),
    so they spend their time on the search. With rounds of 16 trials a full warm start timed up to 20 schedules before
    each round's 16 (8 traces, their 8 twins, 3 seeds, the rules')."""
    if not kernel.rounds:
        return options
    return replace(options, warm_start=max(1, options.publish), repostprocess=False, synthesize=0, seeds=0, rules=False)


def _stop(state: NetworkTuning, goal: Goal, elapsed_secs: float, measure: Callable[[], float] | None, on_check: Callable[[Check], None] | None) -> str | None:
    """Why tuning stops now, or None: a latency goal the estimate meets is checked by ``measure`` where there is one; a
    round that would end past the budget (the rounds' mean so far) is not begun."""
    next_round_secs = elapsed_secs / len(state.rounds) if state.rounds else 0.0
    why = goal.reached(state.kernels, elapsed_secs, state.scale, next_round_secs)
    if why is None or measure is None or not goal.latency_met(state.kernels, state.scale):
        return why
    check = Check(state.trials, state.network_secs, measure())  # type: ignore[arg-type]  # met: every kernel timed
    state.checks.append(check)
    if on_check is not None:
        on_check(check)
    if check.measured_secs <= goal.latency_secs:  # type: ignore[operator]  # met: a latency goal
        return (f"the compiled network measured {check.measured_secs * 1e3:.3f} ms, at or under the goal's {goal.latency_secs * 1e3:.3f} ms "  # type: ignore[operator]
                f"(estimate {check.estimate_secs * 1e3:.3f} ms)")  # fmt: skip
    return goal.reached(state.kernels, elapsed_secs, state.scale)


def tune_network(registry: Registry, kernels: Sequence[tuple[Identity, int]], options: TuneOptions, policy: Policy, goal: Goal, *,
                 round_trials: int = 16, pushed_by: str = "", on_round: Callable[[Round], None] | None = None,
                 measure: Callable[[], float] | None = None, on_check: Callable[[Check], None] | None = None) -> NetworkTuning:  # fmt: skip
    """Tune ``kernels`` ((identity, calls per forward pass) each) in rounds of ``round_trials`` trials, each round to
    the kernel ``policy`` picks, until ``goal`` is reached. ``goal`` must bound the trials or the time. ``measure``:
    the network compiled from ``registry`` and timed, in seconds, called when the estimate meets ``goal``'s latency
    (each check is kept in the result and passed to ``on_check``)."""
    if goal.max_trials is None and goal.max_secs is None:
        raise ValueError("a network's tuning needs a budget: trials or minutes (a latency goal alone may never be met)")
    if round_trials < 1:
        raise ValueError("a round needs at least one trial")
    state = NetworkTuning([KernelTuning(identity.key, identity.op, max(1, calls), flops=workload_flops(identity)) for identity, calls in kernels])
    by_key = {identity.key: identity for identity, _ in kernels}
    options = replace(options, trials=round_trials, trials_per_iter=min(options.trials_per_iter, round_trials))
    started = time.monotonic()
    while (why := _stop(state, goal, time.monotonic() - started, measure, on_check)) is None:  # a round's time: the mean so far
        left = [k for k in state.kernels if not k.failed]
        if not left:
            why = "the tuning of every kernel failed"
            break
        kernel = policy.pick(left)
        identity = by_key[kernel.key]
        try:
            job = start_tuning(registry, identity, round_options(options, kernel), f"{identity.op}:{identity.key[:8]}")
            result = TuneResult.from_dict(cluster.result(job))
        except Exception as exc:  # noqa: BLE001 (one kernel MetaSchedule cannot search, or a lost task: the rest go on)
            said = str(exc).strip().splitlines()  # a task's error ends with its own message, after the remote traceback
            kernel.failed = f"{type(exc).__name__}: {said[-1][:300] if said else ''}"
            log.warning("schedhub: tuning %s failed, it keeps its default schedule: %s", identity.op, kernel.failed)
            continue
        push_result(registry, result, pushed_by)
        kernel.record(round_trials, *result.ranked_times())
        done = Round(len(state.rounds) + 1, kernel, result, state.network_secs, state.trials, time.monotonic() - started, *timed_so_far(state.kernels))
        state.rounds.append(done)
        if on_round is not None:
            on_round(done)
    state.stopped_because = why
    return state
