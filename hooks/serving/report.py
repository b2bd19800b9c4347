"""What a compile inside ``use(...)`` reports: each kernel's outcome (hit, transfer, synthesized, miss, fallback,
offline) and the compile's lookups, problems and linked objects, with a one-line summary."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..metaschedule.ranking import SYNTHESIZED

HIT, TRANSFER, MISS, FALLBACK, OFFLINE = "hit", "transfer", "miss", "fallback", "offline"  # and SYNTHESIZED
RULED = "ruled"  # a miss's detail begins so where it got the CPU rules' schedule (:mod:`.rules`), not the default


@dataclass(frozen=True)
class KeptDefault:
    """A measured compile's verdict on a missed kernel: the target's default schedule (DLight's on a GPU) ran faster
    than every candidate timed, so the kernel keeps it (``detail`` says by how much; ``measured``: the candidates' seconds)."""

    detail: str
    measured: dict[str, float | None]


@dataclass(frozen=True)
class RuledFaster:
    """A measured compile's verdict on a missed CPU kernel: the CPU rules' schedule ran faster than every candidate
    timed, so the kernel keeps it (``measured``: the seconds of each schedule timed, the rules' among them)."""

    measured: dict[str, float | None]


class RegistryFallbackWarning(UserWarning):
    """The registry could not be used; kernels keep TVM's default schedules."""


@dataclass
class KernelOutcome:
    op: str
    key: str
    outcome: str  # hit | transfer | synthesized | miss | fallback (a record failed to replay) | offline
    detail: str = ""  # hit: the trace id ("default:" before it where the record says nothing beat the default schedule); transfer, synthesized: "relation:trace id:source op"; miss: "ruled:trace id" where it got the CPU rules' schedule, "default:…" where the default beat every candidate timed
    measured: dict[str, float | None] = field(default_factory=dict)  # candidates timed here: trace id → seconds (None: refused)


@dataclass
class CompileReport:
    kernels: list[KernelOutcome] = field(default_factory=list)
    lookups: int = 0  # registry round trips
    lookup_secs: float = 0.0
    misses_reported: int = 0
    problems: list[str] = field(default_factory=list)
    linked: int = 0  # scheduled kernels whose machine code came from this machine's object cache
    objects_compiled: int = 0  # of those, compiled in this build (the rest were cached)
    ranked_by: str = ""  # the cost model that ranked this compile's transfers ('': the fit ranking, hooks.metaschedule.ranking.rank_key)
    model_ranked: int = 0  # kernels whose candidates it ranked (the rest: the fit ranking)
    rewrites: str = ""  # where the compile chose its rewrites ("auto"): the option compiled, in words (:mod:`.choice`)
    rewrite_options: list[str] = field(default_factory=list)  # and what the registry held for each option it weighed
    rewrites_by: str = "the registry's records"  # what chose them

    def count(self, outcome: str) -> int:
        return sum(k.outcome == outcome for k in self.kernels)

    @property
    def hits(self) -> int:
        return self.count(HIT)

    @property
    def default_hits(self) -> int:
        """Hits whose record says nothing beat the target's default schedule: the kernel keeps it (a result, not a speedup)."""
        return sum(k.outcome == HIT and k.detail.startswith("default:") for k in self.kernels)

    @property
    def transfers(self) -> int:
        return self.count(TRANSFER)

    @property
    def synthesized(self) -> int:
        return self.count(SYNTHESIZED)

    @property
    def misses(self) -> int:
        return self.count(MISS) + self.count(OFFLINE)

    @property
    def fallbacks(self) -> int:
        return self.count(FALLBACK)

    def ruled(self, outcome: str) -> int:
        """How many kernels of ``outcome`` (a miss, a fallback, offline) got the CPU rules' schedule (:mod:`.rules`)."""
        return sum(k.outcome == outcome and k.detail.startswith(f"{RULED}:") for k in self.kernels)

    def summary(self) -> str:
        linked = f"; {self.linked} kernel objects linked ({self.objects_compiled} compiled now)" if self.linked else ""
        linked += f"; {self.model_ranked} kernels' transfers ranked by {self.ranked_by}" if self.ranked_by else ""
        synthesized = f", {self.synthesized} synthesized" if self.synthesized else ""
        kept = sum(k.outcome == MISS and k.detail.startswith("default:") for k in self.kernels)
        if offline := self.count(OFFLINE):  # not "misses" as if the registry had answered: it did not
            ruled_offline = self.ruled(OFFLINE)
            how = f": {ruled_offline} got the CPU rules' schedules, {offline - ruled_offline} TVM's default ones" if ruled_offline else " kept TVM's default schedules"
            linked = f"; the registry could not be reached: {offline} kernels{how}, unreported" + linked
        linked += f"; {kept} misses kept the default schedule, faster than every candidate timed" if kept else ""
        if self.rewrite_options:
            linked += f"; rewrites chosen by {self.rewrites_by}: {self.rewrites} (weighed: {'; '.join(self.rewrite_options)})"
        ruled = self.ruled(MISS)
        ruled_misses = f" ({ruled} of them given the CPU rules' schedules until a worker tunes them: `schedhub worker`)" if ruled else ""
        hits = f"{self.hits} hits ({self.default_hits} of them keep the default schedule: nothing beat it)" if self.default_hits else f"{self.hits} hits"
        return (f"schedhub: {len(self.kernels)} kernels: {hits}, {self.transfers} transfers{synthesized}, {self.count(MISS)} misses{ruled_misses}, {self.fallbacks} fallbacks "
                f"({_count(self.lookups, 'lookup')} in {self.lookup_secs * 1e3:.1f} ms, {_count(self.misses_reported, 'miss', 'misses')} reported){linked}")  # fmt: skip


def _count(n: int, one: str, many: str = "") -> str:
    """``n`` things in words: "1 lookup", "2 lookups"."""
    return f"{n} {one if n == 1 else many or one + 's'}"
