"""Which kernel of a network the next round of tuning goes to, and when the network has been tuned enough.

A network's latency is estimated as each kernel's best time times its calls per forward pass, summed (Ansor's task
scheduler's objective; MetaSchedule's ``GradientBased``). :class:`GradientPolicy` gives the next round to the kernel
whose tuning is expected to lower that sum most per trial: its calls times a blend of how fast its best time has been
falling over its last rounds (the backward gradient) and an optimistic forward estimate (its best time over the trials
spent on it: what the next trials give if they improve it as fast as the average trial did). As in MetaSchedule's
``GradientBased``, a kernel has no backward gradient until it has more rounds than the window: measured from its
default schedule instead, the gradient ranked kernels by how slow their defaults were (ResNet-18's direct convolutions,
100+ ms untuned, took the rounds after the first pass from the Winograd kernels, whose defaults were not timed, although
one more round on a Winograd kernel then cut the network's estimate by 1.7 ms). Every kernel gets a
first round before any gets a second, the costliest (calls × FLOPs) first: until a round has timed its default
schedule nothing says what a kernel costs. Its FLOPs do not: on ResNet-18 at 64 px, deferring the kernels of under
0.5% of the network's FLOPs left three 1×1 convolutions, the classifier and the pooling on their default schedules,
and the network ran 1.27× slower than with trials spread evenly (``bench.studies.policy``). :class:`EvenPolicy`
spreads trials evenly: the baseline the policy is measured against.

"Nothing beat the default schedule" is a result like any other: the round counts, the kernel keeps the default's time
as its best, and its gain falls with each such round, so it is refined again only when it still matters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class KernelTuning:
    """One kernel of the network being tuned: its calls per forward pass and its best time after each round."""

    key: str
    op: str
    calls: int
    default_secs: float | None = None  # the target's default schedule, once a round timed it
    flops: float = 0.0  # TVM's estimate of one call's arithmetic (0: unknown)
    rounds: list[tuple[int, float]] = field(default_factory=list)  # (trials spent so far, best seconds so far) after each round
    failed: str = ""  # why its tuning failed (MetaSchedule could not search it): it gets no more rounds

    @property
    def trials(self) -> int:
        return self.rounds[-1][0] if self.rounds else 0

    @property
    def best_secs(self) -> float | None:
        """The best time known: tuned, or the default schedule's where nothing beat it (None before any round)."""
        return self.rounds[-1][1] if self.rounds else self.default_secs

    def record(self, trials: int, best_secs: float | None, default_secs: float | None) -> None:
        """A round of ``trials`` ended with ``best_secs`` (None: nothing measured beat or matched the default)."""
        if default_secs is not None and default_secs > 0:
            self.default_secs = default_secs if self.default_secs is None else min(self.default_secs, default_secs)
        known = [s for s in (best_secs, self.best_secs, self.default_secs) if s is not None and s > 0]
        if known:
            self.rounds.append((self.trials + trials, min(known)))


def network_secs(kernels: Sequence[KernelTuning]) -> float | None:
    """Σ calls × best time: the network's estimated latency (None while a kernel has not been timed)."""
    if any(k.best_secs is None for k in kernels):
        return None
    return sum(k.calls * k.best_secs for k in kernels)  # type: ignore[operator]


class Policy(Protocol):
    name: str

    def pick(self, kernels: Sequence[KernelTuning]) -> KernelTuning: ...


@dataclass(frozen=True)
class EvenPolicy:
    """Every kernel the same trials: the next round to the kernel with the fewest trials, in the network's order."""

    name: str = "even"

    def pick(self, kernels: Sequence[KernelTuning]) -> KernelTuning:
        return min(kernels, key=lambda k: k.trials)


@dataclass(frozen=True)
class GradientPolicy:
    """The next round to the kernel with the largest :meth:`expected_gain` (see the module's docstring).

    ``alpha`` weighs the backward gradient against the forward estimate and ``window`` is how many rounds back the
    backward gradient looks: MetaSchedule's ``GradientBased`` defaults (0.2, 3)."""

    alpha: float = 0.2
    window: int = 3
    name: str = "gradient"

    def expected_gain(self, kernel: KernelTuning) -> float:
        """Network seconds the next trial on ``kernel`` is expected to save (infinite before its first round)."""
        if not kernel.rounds:
            return math.inf
        trials, best = kernel.rounds[-1]
        backward = 0.0
        if len(kernel.rounds) > self.window:
            then_trials, then_best = kernel.rounds[-1 - self.window]
            backward = max(0.0, then_best - best) / max(1, trials - then_trials)
        forward = best / max(1, trials)
        return kernel.calls * (self.alpha * backward + (1 - self.alpha) * forward)

    def pick(self, kernels: Sequence[KernelTuning]) -> KernelTuning:
        untried = [k for k in kernels if not k.rounds]
        if untried:  # a first round for each, the costliest by what is known (calls x FLOPs) first
            return max(untried, key=lambda k: (k.calls * k.flops, k.calls))
        return max(kernels, key=self.expected_gain)


POLICIES: dict[str, Policy] = {"gradient": GradientPolicy(), "even": EvenPolicy()}


@dataclass(frozen=True)
class Goal:
    """When a network's tuning stops: its estimated latency at or under ``latency_secs`` (a stated latency, or its
    PyTorch twin's), or ``max_trials`` spent, or ``max_secs`` of wall time gone: whichever comes first.

    The estimate (Σ calls × each kernel's best time alone) runs ahead of the compiled network: on ResNet-18 at 224 the
    network ran 15–25% slower than its kernels alone, their weights out of the caches. A ``scale`` (the network's
    measured latency over its estimate at the last check, :func:`.network.tune_network`) corrects it."""

    latency_secs: float | None = None
    max_trials: int | None = None
    max_secs: float | None = None

    def latency_met(self, kernels: Sequence[KernelTuning], scale: float = 1.0) -> bool:
        """Whether the estimate, times ``scale``, is at or under the latency goal."""
        estimate = network_secs(kernels)
        return self.latency_secs is not None and estimate is not None and estimate * scale <= self.latency_secs

    def reached(self, kernels: Sequence[KernelTuning], elapsed_secs: float, scale: float = 1.0, next_round_secs: float = 0.0) -> str | None:
        """Why tuning stops now, or None to go on; ``next_round_secs``: about how long the next round takes (a round is
        not stopped once begun, so one that would end past ``max_secs`` is not begun)."""
        if self.latency_met(kernels, scale):
            estimate = network_secs(kernels) * scale  # type: ignore[operator]
            corrected = f" (corrected by the compiled network's {scale:.2f}× at the last check)" if scale != 1.0 else ""
            return f"the network's estimated latency {estimate * 1e3:.3f} ms{corrected} is at or under the goal's {self.latency_secs * 1e3:.3f} ms"  # type: ignore[operator]
        spent = sum(k.trials for k in kernels)
        if self.max_trials is not None and spent >= self.max_trials:
            return f"{spent} trials spent (the budget: {self.max_trials})"
        if self.max_secs is not None and elapsed_secs >= self.max_secs:
            return f"{elapsed_secs / 60:.1f} min spent (the budget: {self.max_secs / 60:.1f} min)"
        if self.max_secs is not None and elapsed_secs + next_round_secs > self.max_secs:
            return (f"{elapsed_secs / 60:.1f} min spent, and the next round (about {next_round_secs / 60:.1f} min) would end past the "
                    f"budget of {self.max_secs / 60:.1f} min")  # fmt: skip
        return None


def timed_so_far(kernels: Sequence[KernelTuning]) -> tuple[int, float]:
    """How many kernels have a time, and Σ calls × best time over them: the network's estimate so far, a lower bound."""
    timed = [k for k in kernels if k.best_secs is not None]
    return len(timed), sum(k.calls * k.best_secs for k in timed)  # type: ignore[operator]
