"""What a :class:`.session.HookSession` reports of its compiles, in a part that owns it: the misses, buffered during a
compile and reported in one request at its end, the kernel expected to cost the module most first; and the module's
kernels and calls (its network), once a machine. The costs that order the misses are the session's to estimate
(:meth:`.session.HookSession.miss_cost`), from what it served."""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter
from collections.abc import Callable

from schedhub.registry import (
    MAX_NETWORK_KERNELS,
    Identity,
    Record,
    Registry,
    RegistryError,
    network_id,
    signature_args_info,
)

from ..kernels.cache import KernelCache
from ..kernels.measure import host_cpu
from ..metaschedule.ranking import effort, speed, work
from .report import CompileReport, RegistryFallbackWarning
from ..kernels.threads import stranded_cpu

log = logging.getLogger("schedhub")


class MissReporter:
    """The misses one session buffers and the networks it has told the registry of (see the module's docstring)."""

    def __init__(self, registry: Registry, cache: KernelCache, *, enabled: bool = True, name: str | None = None) -> None:
        self.registry, self.cache = registry, cache
        self.enabled = enabled  # use(..., report_misses=)
        self.name = name  # what the registry's page calls the network compiled (use(..., name=))
        self._pending: dict[str, Identity] = {}
        self._told: set[frozenset[tuple[str, int]]] = set()  # the modules this session told the registry of

    def add(self, identity: Identity) -> None:
        """Buffer a kernel the compile missed (a transfer too: its exact schedule is still to tune)."""
        self._pending[identity.key] = identity

    def flush(self, report: CompileReport, offline: bool, cost: Callable[[Identity], float], say: Callable[[str], None]) -> None:
        """Report buffered misses in one request (skipped when offline or disabled), the kernel that costs the
        compiled module the most time first (``cost``): the registry's queue hands out one caller's jobs in the order
        they were first reported, so a worker's first passes speed the module up soonest."""
        if not self._pending or not self.enabled or offline:
            return
        misses = sorted((m for m in self._pending.values() if tunable(m)), key=cost, reverse=True)
        skipped = len(self._pending) - len(misses)
        if skipped:  # dynamic shapes: nothing MetaSchedule could tune, and the registry refuses them
            report.problems.append(f"{skipped} kernels with non-static arguments not reported")
        self._pending.clear()
        if not misses:
            return
        try:
            self.registry.report_misses(misses)
            report.misses_reported += len(misses)
            for cpu, count in Counter(c for c in map(stranded_cpu, (m.target for m in misses)) if c).items():
                say(f"{count} misses queued for {cpu}: a worker tunes only its own CPU model and this machine is a {host_cpu()}: run "
                    f"`schedhub worker` on a {cpu} machine, or compile for this one (schedhub.hooks.host_target())")  # fmt: skip
        except RegistryError as exc:
            report.problems.append(f"misses not reported: {exc}")
            warnings.warn(f"schedhub could not report {len(misses)} misses: {exc}", RegistryFallbackWarning, stacklevel=2)

    def report_network(self, calls: dict[str, int], offline: bool) -> None:
        """Tell the registry which kernels this compile's module calls and how often (``calls``; once a machine for
        each module, where the kernel cache keeps a mark, else once a session; skipped when offline or not reporting):
        what lets a worker refine the module's bottleneck (``registry._networks``). A request costs a compile 1-3 ms,
        so a module compiled again on this machine sends none. A module of more kernels than a report holds names its
        most-called ones."""
        network = frozenset(calls.items())
        if not network or not self.enabled or offline or network in self._told:
            return
        self._told.add(network)
        kernels = sorted(network, key=lambda kc: -kc[1])[:MAX_NETWORK_KERNELS]
        named = f"-{hashlib.sha256(self.name.encode()).hexdigest()[:16]}" if self.name else ""  # a name given later is sent
        mark = self.cache.root / "networks" / (network_id(kernels) + named) if self.cache.root is not None else None
        if mark is not None and mark.exists():
            return
        try:
            self.registry.report_network(kernels, name=self.name)
        except RegistryError as exc:  # refinement is the registry's extra: the compile and its report are whole without it
            log.info("schedhub: this module's kernels were not reported for refinement: %s", exc)
            return
        if mark is not None:
            try:
                mark.parent.mkdir(parents=True, exist_ok=True)
                mark.touch()
            except OSError:  # an unwritable cache: the next session reports it again
                pass


#: Work per second (:func:`.ranking.effort` units: about FLOP/s, or elements written per second) assumed of a
#: kernel left to TVM's default schedule: unscheduled CPU convolutions ran at 1–2 GFLOPS (``schedhub profile``),
#: MobileNet-V2's classifier-weight transpose (1.3M elements) in 1.2 ms; it only orders misses.
UNTUNED_SPEED = 1e9


def transferred_secs(identity: Identity, record: Record) -> float:
    """Seconds per call ``record``'s schedule is expected to take on ``identity``'s kernel: the record's speed
    on its own workload (:func:`.ranking.speed`) applied to this kernel's work."""
    return work(identity.workload) / max(speed(work(record.identity.workload), record.mean_secs), 1.0)


def untuned_secs(identity: Identity) -> float:
    """Seconds per call assumed of ``identity``'s kernel on TVM's default schedule: its :func:`.ranking.effort` at :data:`UNTUNED_SPEED`."""
    return effort(identity.workload) / UNTUNED_SPEED


def tunable(identity: Identity) -> bool:
    """Whether the registry can derive the kernel's arguments from its workload (static tensors)."""
    try:
        return signature_args_info(identity.workload) == identity.args_info
    except RegistryError:
        return False
