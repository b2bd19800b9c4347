"""How the hook ranks transfer candidates without timing them.

A candidate is a record tuned for another kernel of the same structure. Replayed on the user's
kernel, every tile size that no longer multiplies out to its loop's new extent is re-derived by
TVM, and a re-derived tiling is where a transferred schedule loses its speed (a convolution tuned
at 4×4 pixels ran at 66 GFLOPS; replayed at 6×6, 5). So the hook serves, in order:

1. a record of the very workload under another compiler build (relation ``compiler``);
2. the candidate with the fewest tile sizes re-derived on this kernel;
3. among those, the fastest for its work on its own workload (GFLOPS: TVM's FLOP estimate over the
   record's seconds, which a verifier measured for a verified record);
4. then the registry's order (nearest shapes first).

bench/ (``python -m bench.ranking``) judges this against nearest-first and the others on
measured candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import tvm

from schedhub.registry import COMPILER, Candidate


def flops(mod: tvm.IRModule) -> float:
    """TVM's FLOP estimate of a kernel (1 for a kernel without arithmetic, so speeds stay finite)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    return max(float(estimate_tir_flops(mod)), 1.0)


def retiled(recorded: list[Any], replayed_trace: Any) -> int:
    """How many ``SamplePerfectTile`` decisions of a trace (its JSON form, ``recorded``) changed when it
    was replayed (``replayed_trace``, the schedule's Trace): tile sizes TVM re-derived for new extents."""
    decisions = {int(i): d for i, d in recorded[1]} if len(recorded) > 1 else {}
    changed = 0
    for i, inst in enumerate(replayed_trace.insts):
        if inst.kind.name == "SamplePerfectTile" and i in decisions:
            now = replayed_trace.decisions.get(inst)
            changed += now is None or [int(x) for x in now] != [int(x) for x in decisions[i]]
    return changed


def gflops(work: float, secs: float) -> float:
    """Speed of a record on its own workload; 0 for a time that is not a positive finite number."""
    return work / secs / 1e9 if math.isfinite(secs) and secs > 0 else 0.0


@dataclass(frozen=True)
class Fit:
    """What the ranking knows of one candidate on one kernel."""

    retiled: int  # tile sizes re-derived on replay
    source_gflops: float  # speed on its own workload


def rank_key(candidate: Candidate, fit: Fit, order: int) -> tuple[int, int, float, int]:
    """Sort key: smaller is served first (see the module's docstring)."""
    return (0 if candidate.relation == COMPILER else 1, fit.retiled, -fit.source_gflops, order)
