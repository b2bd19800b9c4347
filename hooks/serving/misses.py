"""Which misses a :class:`.session.HookSession` reports and in what order: buffered during a compile, reported in one
request at its end, the kernel expected to cost the module most first. A part of the session: it reads its state."""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter

from schedhub.registry import (
    MAX_NETWORK_KERNELS,
    Identity,
    Record,
    RegistryError,
    keeps_default_schedule,
    network_id,
    signature_args_info,
)

from ..kernels.measure import host_cpu
from ..metaschedule.ranking import effort, speed, work
from .report import RegistryFallbackWarning
from ..kernels.threads import stranded_cpu

log = logging.getLogger("schedhub")


class MissReporting:
    """:class:`.session.HookSession`'s miss reports (see the module's docstring)."""

    def flush_misses(self) -> None:
        """Report buffered misses in one request (skipped when offline or disabled), the kernel that costs the
        compiled module the most time first (:meth:`miss_cost`): the registry's queue hands out one caller's jobs
        in the order they were first reported, so a worker's first passes speed the module up soonest."""
        if not self._pending_misses or not self.report_misses or self.offline:
            return
        misses = sorted((m for m in self._pending_misses.values() if tunable(m)), key=self.miss_cost, reverse=True)
        skipped = len(self._pending_misses) - len(misses)
        if skipped:  # dynamic shapes: nothing MetaSchedule could tune, and the registry refuses them
            self.report.problems.append(f"{skipped} kernels with non-static arguments not reported")
        self._pending_misses.clear()
        if not misses:
            return
        try:
            self.registry.report_misses(misses)
            self.report.misses_reported += len(misses)
            for cpu, count in Counter(c for c in map(stranded_cpu, (m.target for m in misses)) if c).items():
                self.say(f"{count} misses queued for {cpu}: a worker tunes only its own CPU model and this machine is a {host_cpu()}: run "
                         f"`schedhub worker` on a {cpu} machine, or compile for this one (schedhub.hooks.host_target())")  # fmt: skip
        except RegistryError as exc:
            self.report.problems.append(f"misses not reported: {exc}")
            warnings.warn(f"schedhub could not report {len(misses)} misses: {exc}", RegistryFallbackWarning, stacklevel=2)

    def report_network(self) -> None:
        """Tell the registry which kernels this compile's module calls and how often (once a machine for each module,
        where the kernel cache keeps a mark, else once a session; skipped when offline or not reporting): what lets a
        worker refine the module's bottleneck (``registry._networks``). A request costs a compile 1-3 ms, so a module
        compiled again on this machine sends none. A module of more kernels than a report holds names its most-called ones."""
        network = frozenset(self._calls.items())
        if not network or not self.report_misses or self.offline or network in self._networks_reported:
            return
        self._networks_reported.add(network)
        kernels = sorted(network, key=lambda kc: -kc[1])[:MAX_NETWORK_KERNELS]
        named = f"-{hashlib.sha256(self.network_name.encode()).hexdigest()[:16]}" if self.network_name else ""  # a name given later is sent
        mark = self.cache.root / "networks" / (network_id(kernels) + named) if self.cache.root is not None else None
        if mark is not None and mark.exists():
            return
        try:
            self.registry.report_network(kernels, name=self.network_name)
        except RegistryError as exc:  # refinement is the registry's extra: the compile and its report are whole without it
            log.info("schedhub: this module's kernels were not reported for refinement: %s", exc)
            return
        if mark is not None:
            try:
                mark.parent.mkdir(parents=True, exist_ok=True)
                mark.touch()
            except OSError:  # an unwritable cache: the next session reports it again
                pass

    def measure_priority(self, identity: Identity) -> float:
        """How much measuring a kernel's candidates may matter, before it is served: nothing for a hit, else the
        seconds it is expected to cost one run of the module, its call sites times its work at the home speed
        (:func:`.ranking.speed`) of its nearest trusted candidate, or, with none, at :data:`UNTUNED_SPEED` (a
        kernel only synthesis can serve). A compile that measures serves its misses in this order, so a budget
        that runs out has been spent where the module spends its time."""
        if self.records(identity):
            return 0.0
        near = next((c.record for c in self._candidates.get(identity.key, []) if self.trusts(c.record) and not keeps_default_schedule(c.record.trace)), None)
        return self._calls.get(identity.key, 1) * (transferred_secs(identity, near) if near else untuned_secs(identity))

    def miss_cost(self, identity: Identity) -> float:
        """Estimated seconds a missed kernel costs one run of the module compiled: its call sites times the
        seconds per call of what it was served (the transfer's time measured here, or its record's speed on
        its own workload applied to this kernel's work: :func:`.ranking.work`), or, for a kernel left to
        TVM's default schedule, its work, data movement included (:func:`.ranking.effort`), at :data:`UNTUNED_SPEED`."""
        secs = self._served_secs.get(identity.key)
        return self._calls.get(identity.key, 1) * (untuned_secs(identity) if secs is None else secs)


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
