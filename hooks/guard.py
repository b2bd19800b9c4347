"""Bounds on what a record may cost a compile, checked before TVM lowers the scheduled kernel.

A trace is data from someone else. Replaying it is cheap, but what it asks for may not be: a
180-byte trace that unrolls every loop of a matmul turned a 0.2 s compile into 44 s and 665 MiB.
So the hook measures the scheduled kernel before handing it to TVM: how many statements full
unrolling would emit, how far LLVM is asked to unroll, how wide vectors get. A record past a
bound is refused (and complained about), and the kernel falls back.

A GPU kernel is also refused where one launch binds a thread axis to loops of different extents
(:class:`InconsistentLaunch`): TVM launches the largest and guards none of the others, so the threads
past a shorter loop index past its tile and write wrong results. A record's shared-memory copies,
split for its own threads, do that once replayed at a shape whose tiles give other threads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import s_tir, tirx

from schedhub.registry import trace_instructions


class ScheduleTooCostly(ValueError):
    """A record whose kernel would cost the compile more than the hook's bounds allow."""


class InconsistentLaunch(ValueError):
    """A GPU kernel that binds one thread axis to loops of different extents within one launch (it computes wrong)."""


class Unlaunchable(ValueError):
    """A GPU kernel past the target's per-block limits (threads, shared memory, vector width): its launch would fail."""


@dataclass(frozen=True)
class ScheduleLimits:
    """The bounds (MetaSchedule's own search stays inside them: unroll steps ≤ 512, lanes ≤ 64)."""

    max_trace_instructions: int = 4096
    max_unrolled_statements: int = 1 << 16  # statements after expanding ForKind.UNROLLED loops
    max_auto_unroll: int = 4096  # pragma_auto_unroll_max_step / meta_schedule.unroll_* values
    max_vector_lanes: int = 64  # product of vectorized extents around a statement: MetaSchedule's own most on a CPU
    #   (ParallelizeVectorizeUnroll's max_vectorize_extent). A transfer's recorded vectorization can grow past it: a
    #   ResNet-18 copy fused to 121 lanes (11 x 11 where the record had 7 x 7) and auto-unrolled 128 times took LLVM 84 s
    #   to build; a copy of 64 lanes unrolled 128 times 1.3 s, of 81-121 lanes 11-25 s (ARCHITECTURE §8)


_UNROLL_KEYS = ("pragma_auto_unroll_max_step", "meta_schedule.unroll_explicit", "meta_schedule.unroll_implicit")


def check_trace_size(trace_text: str, limits: ScheduleLimits) -> None:
    """Refuse a trace with too many instructions before replaying it."""
    count = trace_instructions(trace_text)
    if count is None:
        raise ValueError("the trace is not JSON")
    if count > limits.max_trace_instructions:
        raise ScheduleTooCostly(f"trace has {count} instructions, over the limit of {limits.max_trace_instructions}")


def check_scheduled(mod: tvm.IRModule, limits: ScheduleLimits) -> None:
    """Refuse a scheduled kernel whose lowering would blow up (see the module docstring)."""
    for _, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            _walk(func.body, limits)


def _walk(root: Any, limits: ScheduleLimits) -> None:
    statements = 0
    extents: dict[tuple[int, str], set[int]] = {}  # (launch, thread axis): the extents bound to it
    launches = itertools.count()  # numbers the launches (not id(): a freed node's id is reused)
    stack: list[tuple[Any, int, int, int | None]] = [(root, 1, 1, None)]  # (node, unrolled copies, vector lanes, launch)
    while stack:
        node, copies, lanes, launch = stack.pop()
        if node is None:
            continue
        if isinstance(node, tirx.For):
            _check_annotations(node.annotations, limits)
            extent = node.extent.value if isinstance(node.extent, tirx.IntImm) else 1
            if node.kind == tirx.ForKind.UNROLLED:
                copies *= max(1, extent)
            elif node.kind == tirx.ForKind.VECTORIZED:
                if not isinstance(node.extent, tirx.IntImm):  # a trace replayed on a symbolic size (a dynamic batch)
                    raise ValueError(f"a vectorized loop of symbolic extent {node.extent}: LLVM's vectorizer needs a constant one")
                lanes *= max(1, extent)
                if lanes > limits.max_vector_lanes:
                    raise ScheduleTooCostly(f"vectorized loops of {lanes} lanes, over the limit of {limits.max_vector_lanes}")
            elif node.kind == tirx.ForKind.THREAD_BINDING and node.thread_binding is not None:
                launch = next(launches) if launch is None else launch  # the outermost bound loop starts a kernel launch
                if isinstance(node.extent, tirx.IntImm):
                    _bind(extents.setdefault((launch, str(node.thread_binding.thread_tag)), set()), str(node.thread_binding.thread_tag), extent)
            stack.append((node.body, copies, lanes, launch))
            continue
        if isinstance(node, s_tir.SBlock):
            _check_annotations(node.annotations, limits)
        inside = nested_statements(node)
        if inside is not None:
            stack.extend((s, copies, lanes, launch) for s in inside)
        else:
            statements += copies
            if statements > limits.max_unrolled_statements:
                raise ScheduleTooCostly(f"unrolling would emit over {limits.max_unrolled_statements} statements")


def _bind(seen: set[int], axis: str, extent: int) -> None:
    """Note that a launch binds ``axis`` to a loop of ``extent``; refuse a second extent."""
    seen.add(extent)
    if len(seen) > 1:
        raise InconsistentLaunch(f"one launch binds {axis} to loops of extents {sorted(seen)}: TVM launches the largest, and the threads "
                                 "past the shorter loops compute wrong")  # fmt: skip


def nested_statements(node: Any) -> list[Any] | None:
    """The statements directly inside ``node`` (a loop's body, a block's body and init, both branches of an ``if``; None
    among them where a branch is absent), or None for a leaf statement (a store, an evaluation)."""
    if isinstance(node, tirx.SeqStmt):
        return list(node.seq)
    if isinstance(node, s_tir.SBlockRealize):
        return [node.block]
    if isinstance(node, s_tir.SBlock):
        return [node.body, node.init]
    if isinstance(node, tirx.IfThenElse):
        return [node.then_case, node.else_case]
    if hasattr(node, "body") and isinstance(getattr(node, "body"), tirx.Stmt):
        return [node.body]
    return None


def _check_annotations(annotations: Any, limits: ScheduleLimits) -> None:
    for name in _UNROLL_KEYS:
        value = annotations.get(name) if annotations is not None else None
        if value is not None and int(getattr(value, "value", value)) > limits.max_auto_unroll:
            raise ScheduleTooCostly(f"{name}={int(getattr(value, 'value', value))}, over the limit of {limits.max_auto_unroll}")
