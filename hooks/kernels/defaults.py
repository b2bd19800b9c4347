"""What a kernel gets without a record: the target's default schedule, the one every record must beat.

On a CPU that is the unscheduled kernel; on a GPU it is DLight's schedule (TVM's GPU default: an
unscheduled GPU kernel builds to host loops with no device code at all).
"""

from __future__ import annotations

import tvm


def is_gpu(target: tvm.target.Target) -> bool:
    return "gpu" in target.keys


def default_contends(target: tvm.target.Target) -> bool:
    """Whether a measured compile times the target's default schedule beside the candidates, keeping it where it
    is faster than all of them: DLight's on a GPU, a real schedule. Not a CPU's unscheduled kernel: every record
    beat it where it was tuned, transfers ran the shipped networks 12-150x faster than it (bench/RESULTS.md), and
    timing it would cost a measured compile up to seconds a kernel (an unscheduled convolution runs for tens of
    milliseconds a call)."""
    return is_gpu(target)


def dlight_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """DLight's default GPU schedules for every kernel of ``mod`` not marked scheduled. ``mod`` is left
    as it was (DLight's pass writes the scheduled kernels into the module it is given)."""
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod.clone())


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` (unscheduled kernels) as ``target`` builds it without records: DLight's on a GPU, itself on a CPU."""
    return dlight_schedule(mod, target) if is_gpu(target) else mod
