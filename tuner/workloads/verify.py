"""Verifying a pushed claim: replay the record's trace, check its output, time it side by side.

A record pushed by a ``push`` token is a claim. A worker leases its verification job, replays
the trace on the workload (refusing one past the hook's cost bounds, and a GPU kernel that would
compute wrong or fail at launch: the hook's launch checks), builds it and the target's
default schedule as CPU tasks, and times both in one measurement task that holds the device,
checking the output against the unscheduled kernel's on the same random inputs. The verdict goes
back with the ack; the registry marks the record verified, or refuses it (far slower than
claimed) or quarantines it (does not replay, build, run or match, or is far slower than the
default schedule beside it, to run or to build) and names its pusher.
"""

from __future__ import annotations

import time
from typing import Any

from schedhub.registry import Identity

from ..execution import cluster, tvm_env
from ..execution.backends import Timeline
from ..execution.kernels import FINAL_TIMING, UNTIMED_MARGIN_SECS


#: A record re-measured this many times slower than the target's default schedule, timed beside it (and by more than
#: SLOWER_BY_AT_LEAST), is quarantined: a compile that served it would have done better without the registry (a 2 KB
#: trace padding a cache of 1,024 integers to 16 MiB runs correctly, within the hook's bounds, 1.2 million times slower)
SLOWER_THAN_DEFAULT = 2.0
SLOWER_BY_AT_LEAST = 10e-6  # seconds: a kernel of a few hundred nanoseconds doubles with one more copy, harmlessly
#: ... and one whose first (checking) call took this many times the default's is quarantined on that call, untimed: its
#: 50 timed calls would hold the device from every other job (a single call is noisy, hence 10x the margin)
UNTIMED_PAST = 10 * SLOWER_THAN_DEFAULT

#: A record whose kernel takes this many times longer to build than the default schedule's, built beside it (and longer
#: than BUILD_SECS_AT_LEAST), is quarantined: every compile that first meets it pays the build, and the hook's bounds
#: cannot see LLVM's time (a trace unrolling a 64-lane gather 32 times, within every bound, took LLVM 28.75 s). MetaSchedule's
#: own records built in at most 8.3x their default's time (0.53 s), on the 133 records of two registries on this project's CPU.
BUILD_SLOWER_THAN_DEFAULT = 50.0
BUILD_SECS_AT_LEAST = 5.0  # seconds

#: A record whose trace takes longer than this to replay on its own workload is quarantined: every compile that first
#: meets it pays the replay, once for each kernel it is a transfer candidate of, and the replay's cost grows with the
#: square of a trace's length (500 chained cache reads, within the hook's bound of 1,024 instructions: 1.1 s; 1,000:
#: 4 s). MetaSchedule's own 286 records of two registries replayed in at most 19 ms (median 6 ms) on this project's CPU.
REPLAY_SECS_AT_MOST = 1.0


def verify_job(job: dict[str, Any], timing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict on one verification job: ``{"run_secs": [...] | None, "reason": str}``, with ``flushed_secs`` where the
    timing took them (:data:`.kernels.FINAL_TIMING` does on a CPU)."""
    from schedhub.hooks.metaschedule.guard import ScheduleLimits
    from schedhub.hooks.kernels.identity import compiler_fingerprint, target_from_text, workload_module
    from schedhub.hooks.metaschedule.msdb import check_launchable, replay_within

    from .search import ToolchainMismatch, default_name, side_by_side

    tvm_env.prepare()
    identity = Identity.from_obj(job["identity"])
    if identity.fingerprint != compiler_fingerprint():
        raise ToolchainMismatch(f"record {identity.key[:12]} was keyed under {identity.fingerprint!r}; this worker runs {compiler_fingerprint()!r}")
    mod = workload_module(identity.workload)
    try:
        started = time.perf_counter()
        replayed = replay_within(mod, job["trace"], ScheduleLimits())
        replay_secs = time.perf_counter() - started
        check_launchable(replayed, target_from_text(identity.target))  # a GPU kernel that would fail at launch
    except Exception as exc:  # ScheduleError, InternalError, ScheduleTooCostly, Unlaunchable…: the verdict, not a crash
        return {"run_secs": None, "reason": f"does not replay within bounds: {exc.__class__.__name__}: {str(exc).strip()[:500]}"}
    if replay_secs > REPLAY_SECS_AT_MOST:
        return {"run_secs": None, "reason": f"its trace took {replay_secs:.3g} s to replay (at most {REPLAY_SECS_AT_MOST:g} s: each compile that meets it pays that)"}
    candidate = replayed.mod
    cluster.check_feasible(identity.target)  # after the replay: a record that does not replay needs no cluster
    timing = {**(timing or FINAL_TIMING), "untimed_past": UNTIMED_PAST, "untimed_margin_secs": UNTIMED_MARGIN_SECS}
    untuned, result = side_by_side(identity, mod, [candidate], timing, Timeline(f"verify:{identity.key[:8]}"))
    if result.get("untimed_call_secs"):
        return {"run_secs": None, "reason": f"far slower than the default schedule, not timed: one call took {result['untimed_call_secs']:.3g} s, over "
                                            f"{UNTIMED_PAST:g}× the default's ({default_name(identity.target)}, called beside it)"}  # fmt: skip
    if not result["run_secs"]:
        return {"run_secs": None, "reason": result["error"] or "did not run"}
    build_secs, default_build_secs = result.get("build_secs"), untuned.get("build_secs")
    if build_secs is not None and default_build_secs and build_secs > max(BUILD_SLOWER_THAN_DEFAULT * default_build_secs, BUILD_SECS_AT_LEAST):
        return {"run_secs": None, "reason": f"its kernel took {build_secs:.3g} s to build, {build_secs / default_build_secs:.3g}× the default schedule's "
                                            f"({default_build_secs:.3g} s, built beside it)"}  # fmt: skip
    untuned_secs = sum(untuned["run_secs"]) / len(untuned["run_secs"])
    secs = sum(result["run_secs"]) / len(result["run_secs"])
    side_by_side_note = f"{default_name(identity.target)}: {untuned_secs * 1e6:.3g} µs side by side"
    if secs > SLOWER_THAN_DEFAULT * untuned_secs and secs - untuned_secs > SLOWER_BY_AT_LEAST:  # correct, and worse than no record
        return {"run_secs": None, "reason": f"{secs / untuned_secs:.3g}× slower than the default schedule ({secs * 1e6:.3g} µs; {side_by_side_note})"}
    flushed = {"flushed_secs": result["flushed_secs"]} if result.get("flushed_secs") else {}
    return {"run_secs": result["run_secs"], **flushed, "reason": f"output matches the unscheduled kernel's; {side_by_side_note}"}

