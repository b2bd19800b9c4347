"""Bounds on what a record may cost a compile, checked before TVM lowers the scheduled kernel.

A trace is data from someone else. Replaying it is cheap, but what it asks for may not be: a
180-byte trace that unrolls every loop of a matmul turned a 0.2 s compile into 44 s and 665 MiB.
So the hook measures the scheduled kernel before handing it to TVM: the code TVM's unrolling
hands LLVM (:func:`unrolled_code`: every store once per unrolled copy and per vector lane, in
all and in one run without a loop), how far LLVM is asked to unroll, how wide vectors get, how
deep loops nest, how much memory the kernel allocates itself. Before the replay, the trace itself
is bounded where its replay grows faster than it (:func:`check_trace_size`). A record past a bound
is refused (and complained about), and the kernel falls back.

A GPU kernel is also refused where one launch binds a thread axis to loops of different extents
(:class:`InconsistentLaunch`): TVM launches the largest and guards none of the others, so the threads
past a shorter loop index past its tile and write wrong results. A record's shared-memory copies,
split for its own threads, do that once replayed at a shape whose tiles give other threads.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import tvm
from tvm import s_tir, tirx

from schedhub.registry import InvalidRecord, check_trace_content


class ScheduleTooCostly(ValueError):
    """A record whose kernel would cost the compile more than the hook's bounds allow."""


class WrongLayoutRewrite(ValueError):
    """A weight-layout rewrite (MetaSchedule's ``RewriteLayout``: prepacking) of a buffer that is not one of the kernel's
    layout-free arguments, or one that writes fewer bytes than it reads: a trace tuned where a block's read was a
    weight (a bias), replayed on a kernel of the same structure where it is an activation (a residual input). Its index
    map drops axes and the kernel computes a wrong result."""


class InconsistentLaunch(ValueError):
    """A GPU kernel that binds one thread axis to loops of different extents within one launch (it computes wrong)."""


class Unlaunchable(ValueError):
    """A GPU kernel past the target's per-block limits (threads, shared memory, vector width): its launch would fail."""


@dataclass(frozen=True)
class ScheduleLimits:
    """The bounds (MetaSchedule's own search stays inside them: unroll steps ≤ 512, lanes ≤ 85)."""

    max_trace_instructions: int = 1024  # every instruction that adds a loop or a stage costs the replay more as the kernel
    #   grows: 1024 cache reads of one buffer replayed in 3.7 s and built in 1.9 s, 1500 in 8.4 s and 4.4 s. MetaSchedule's
    #   own traces: at most 74 instructions in the quick fill's records, 95 in a CUDA float16 matmul's sketch
    max_loop_names: int = 1 << 22  # characters of the loop names the replay makes, as :func:`loop_name_chars` counts them: a
    #   fused loop is named after the loops it fuses, so a trace that splits a loop and fuses it back multiplies the name
    #   (in two, 25 times: a 2 KB trace replayed in 2 s and 2.4 GiB; in 64, 5 times: a 6 KB trace past 6 GiB). MetaSchedule's
    #   own: at most 11,125 in a CPU registry's records and trials, 45,999 in CUDA float16 matmul samples (ARCHITECTURE §8)
    max_split_loops: int = 512  # loops the trace's Split (and LoopPartition) instructions make, a Split in k making k: a chain
    #   of splits nests loops, and replaying 1000 of them took 8.7 s, 2000 55 s; one Split in 8,000 crashed the replaying
    #   process (a segmentation fault). MetaSchedule's own: at most 24 on a CPU, 39 in CUDA samples (parts of 4 and 5)
    max_loop_depth: int = 64  # loops nested in the scheduled kernel: TVM's build crashed on 4,000 (3,000 built in 0.2 s), a
    #   hostile review's 250-deep nest built in 29 s; MetaSchedule's own: at most 21 in a CPU registry's records
    max_stages: int = 64  # instructions that add a stage to the kernel (a cache read or write, a reindex): 1,000 cache reads
    #   of one buffer cost a compile 49 s to build and 24 s to replay. MetaSchedule's own add a few (a CPU matmul's: 1)
    max_iteration_ratio: float = 64.0  # statements the scheduled kernel runs a call over the unscheduled one's, where both are
    #   static: a reduction split into [4096, 4096, 64] built at once and took 8.2 s a call (2^30 predicated iterations).
    #   A schedule's copies and padded tiles add iterations (a shared-memory copy per tile, a tile of 63 over 128: 1.5x)
    max_kernel_statements: int = 1 << 13  # statements (a vector once) in all runs of code without a loop, summed over the
    #   kernel: LLVM's time grows with them across runs too. A 64->128 matmul at batch 4 with i unrolled around a kept j
    #   loop, each copy unrolling 32 j by 64 k (four runs of 4,096 statements, each within the run's bound) built in 12 s
    #   against 0.1 s (134 s on a loaded machine); one run of 4,096 built in 1.1 s
    max_unrolled_statements: int = 1 << 17  # the kernel's lane-statements after TVM's unrolling (:func:`unrolled_code`)
    max_straight_statements: int = 1 << 12  # statements (a vector's lanes once) in one run of code without a loop. Scalar
    #   statements cost LLVM far more than the lanes of a vector: a matmul at batch 3 unrolled whole, 49,152 statements
    #   of one lane each (within the lane bound below), took a compile 68 s against 0.47 s. Unrolled scalar matmuls here:
    #   4,096 statements built in 0.36 s, 8,192 in 0.48 s, 16,384 in 1.0-1.6 s. MetaSchedule's own runs stay within its
    #   unroll steps (at most 512 on a CPU, 1024 on a GPU), a block's init beside them
    max_straight_line: int = 1 << 16  # lane-statements in one run of code without a loop. LLVM's time grows faster than the run:
    #   4096 unrolled copies of a 64-lane store built in 44 s, 8192 in 195 s, 1024 auto-unrolled 1.6 s (ARCHITECTURE §8). MetaSchedule's
    #   own schedules stay near half of it (a CPU's 512 auto-unrolled steps of 64 lanes, and a reduction's init beside them)
    max_scratch_ratio: float = 16.0  # bytes of the kernel's own buffers over its arguments': a 2 KB trace that padded a cache of
    #   1,024 integers to 2^30 allocated 4 GiB and ran 5.9 s a call
    min_scratch_bytes: int = 64 << 20  # the kernel's own buffers are allowed this much whatever its arguments
    max_build_secs: float = 20.0  # seconds a served kernel's machine code may take to build (linked builds, :mod:`.objects`):
    #   past them the compile gives it up and goes on with the default schedule, whatever the bounds above let through.
    #   A ResNet-18's tuned kernels build in 0.1-1.1 s each here
    max_auto_unroll: int = 4096  # pragma_auto_unroll_max_step / meta_schedule.unroll_* values
    max_vector_lanes: int = 1024  # product of vectorized extents around a statement. One such vector costs LLVM little
    #   (a copy of 255 lanes built in 0.10 s); copied by unrolling, one wider than WIDE_VECTOR_LANES costs it much more
    #   than its lanes (below). MetaSchedule's own reach 85 on a CPU: ParallelizeVectorizeUnroll's max_vectorize_extent
    #   (64) bounds a block's own loops, not a producer's copy fused at its compute location (17 x 5 lanes, built in 0.2 s)
    max_wide_vector_code: int = 4096  # lane-statements in vectors wider than WIDE_VECTOR_LANES, every unrolled copy counted:
    #   a copy of 85 lanes unrolled 32 times (2,720) built in 1.06 s, 128 times 23.9 s; of 255 lanes 32 times 4.3 s, 128
    #   times 106 s; of 64 lanes 128 times 1.36 s. A transfer's recorded vectorization can grow past it: a ResNet-18 copy
    #   fused to 121 lanes (11 x 11 where the record had 7 x 7) and auto-unrolled 128 times took LLVM 84 s (ARCHITECTURE §8)


WIDE_VECTOR_LANES = 64  # a vector of more lanes than this is wide: LLVM's time for its unrolled copies grows fastest


_UNROLL_KEYS = ("pragma_auto_unroll_max_step", "meta_schedule.unroll_explicit", "meta_schedule.unroll_implicit")


def check_trace_size(trace_text: str, limits: ScheduleLimits) -> None:
    """Refuse a trace before replaying it where its instructions, the loops its ``Split`` instructions make or the loop
    names it makes (:func:`loop_name_chars`), whose replay grows faster than the trace, are too many (see :class:`ScheduleLimits`), or
    where it holds what no record may (``ValueError``: an annotation that is no schedule hint, an instruction that changes
    what the kernel computes, an object graph TVM would load unchecked, which crashed the process: see
    :func:`schedhub.registry.check_object_graphs`)."""
    try:
        parsed = json.loads(trace_text)
    except (ValueError, RecursionError):
        raise ValueError("the trace is not JSON") from None
    instructions = parsed[0] if isinstance(parsed, list) and parsed and isinstance(parsed[0], list) else []
    if len(instructions) > limits.max_trace_instructions:
        raise ScheduleTooCostly(f"trace has {len(instructions)} instructions, over the limit of {limits.max_trace_instructions}")
    try:  # records were checked when parsed; a job's or a caller's trace text may not have been
        check_trace_content(parsed, trace_text)
    except InvalidRecord as exc:
        raise ValueError(str(exc)) from None
    split_loops = sum(len(inst[3]) for inst in instructions
                      if isinstance(inst, list) and len(inst) >= 4 and inst[0] in _LOOP_SPLITS and isinstance(inst[3], list))  # fmt: skip
    if split_loops > limits.max_split_loops:
        raise ScheduleTooCostly(f"trace splits {split_loops} loops, over the limit of {limits.max_split_loops}")
    stages = sum(1 for inst in instructions if isinstance(inst, list) and inst and inst[0] in _STAGE_MAKERS)
    if stages > limits.max_stages:
        raise ScheduleTooCostly(f"trace adds {stages} stages to the kernel, over the limit of {limits.max_stages}")
    names = loop_name_chars(instructions)
    if names > limits.max_loop_names:
        raise ScheduleTooCostly(f"trace makes loop names of about {names:,} characters, over the limit of {limits.max_loop_names:,}")


_STAGE_MAKERS = frozenset({"CacheRead", "CacheWrite", "CacheInplace", "CacheIndex", "ReIndex", "ReadAt", "WriteAt", "RFactor",
                           "DecomposeReduction", "DecomposePadding", "Blockize", "PadEinsum"})  # each adds a block (or more)
_LOOP_SPLITS = frozenset({"Split", "LoopPartition"})  # each part named '<name>_<i>'
_LOOP_FUSES = frozenset({"Fuse", "Merge"})  # named '<name1>_<name2>_…_fused' (Merge: at most as long)
_LOOP_NAME = 16  # a loop name of the workload, or of a block's new loops (ax0, …)


def loop_name_chars(instructions: list[Any]) -> int:
    """About how many characters of loop names replaying a trace's ``instructions`` makes, never fewer. TVM names a
    split loop's parts after it and a fused loop after every loop it fuses, so splitting a loop into k and fusing the
    parts back multiplies its name by k. A loop that comes from any other instruction (``GetLoops``, …) may be one made
    before: it is counted at the longest name made so far."""
    length: dict[str, int] = {}
    longest = total = _LOOP_NAME

    def of(loop: Any) -> int:
        return length.get(loop, longest) if isinstance(loop, str) else longest

    for inst in instructions:
        if not (isinstance(inst, list) and len(inst) >= 4 and isinstance(inst[1], list) and isinstance(inst[3], list)):
            continue
        kind, inputs, outputs = inst[0], inst[1], inst[3]
        if kind in _LOOP_SPLITS and inputs:
            made = [of(inputs[0]) + 1 + len(str(i)) for i in range(len(outputs))]
        elif kind in _LOOP_FUSES:
            made = [sum(of(loop) + 1 for loop in inputs) + len("fused")] * len(outputs)
        else:
            made = []
        length.update((name, chars) for name, chars in zip(outputs, made or [longest] * len(outputs)) if isinstance(name, str))
        total += sum(made)
        longest = max([longest, *made])
    return total


def check_scheduled(mod: tvm.IRModule, limits: ScheduleLimits, unscheduled: tvm.IRModule | None = None) -> None:
    """Refuse a scheduled kernel whose lowering would blow up, or whose buffers of its own would: more bytes than
    ``max_scratch_ratio`` times its arguments' or the ``unscheduled`` kernel's own (a layout padded far past its data
    allocates and fills it on every call; see the module docstring)."""
    kernels = [f for _, f in unscheduled.functions_items() if isinstance(f, tirx.PrimFunc)] if unscheduled else []
    before = sum(allocated_bytes(f.body) for f in kernels)
    iterations_before = sum(loop_iterations(f.body) or 0 for f in kernels)
    for _, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            check_layout_rewrites(func)
            _walk(func.body, limits)
            own, arguments = allocated_bytes(func.body), sum(b for b in map(buffer_bytes, func.params) if b is not None)
            most = max(limits.max_scratch_ratio * max(arguments, before), limits.min_scratch_bytes)
            if own > most:
                raise ScheduleTooCostly(f"buffers of {own:,} bytes of its own, over the limit of {int(most):,} ({limits.max_scratch_ratio:g}× "
                                        f"its arguments' {arguments:,} or the unscheduled kernel's own {before:,})")  # fmt: skip
            iterations = loop_iterations(func.body)
            if iterations is not None and iterations_before and iterations > limits.max_iteration_ratio * iterations_before:
                raise ScheduleTooCostly(f"{iterations:,} statements run a call, over the limit of {limits.max_iteration_ratio:g}× the "
                                        f"unscheduled kernel's {iterations_before:,}")  # fmt: skip


LAYOUT_REWRITE = "meta_schedule.layout_rewrite_preproc"  # the block that lays a weight out as the schedule reads it


def check_layout_rewrites(func: tirx.PrimFunc) -> None:
    """Raise :class:`WrongLayoutRewrite` where a layout-rewrite block of ``func`` reads a buffer that is not one of its
    ``layout_free_buffers`` arguments, or writes fewer bytes than that buffer holds (:func:`buffer_bytes`)."""
    free_attr = func.attrs["layout_free_buffers"] if func.attrs is not None and "layout_free_buffers" in func.attrs else []
    free = [func.params[int(i)] for i in free_attr]
    stack = [func.body]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        if isinstance(node, s_tir.SBlock) and LAYOUT_REWRITE in node.annotations:
            source, target = (_region_buffer(r) for r in (node.reads[0], node.writes[0]))
            if not any(source.same_as(b) or source.data.same_as(b.data) for b in free):
                raise WrongLayoutRewrite(f"a weight-layout rewrite of {source.name}, which is not a layout-free argument of the kernel")
            held, written = (buffer_bytes(b) for b in (source, target))
            if held is not None and written is not None and written < held:
                raise WrongLayoutRewrite(f"a weight-layout rewrite of {source.name} into {written:,} bytes of its {held:,}")
        if isinstance(node, tirx.For):
            stack.append(node.body)
        else:
            stack.extend(nested_statements(node) or [])


def _region_buffer(region: Any) -> Any:
    """The buffer a block's read or write region is of (TVM 0.27's ``TensorRegion.source``; ``buffer`` before)."""
    source = getattr(region, "source", None)
    return source if source is not None else region.buffer


def loop_iterations(root: Any) -> int | None:
    """How many statements a kernel runs a call (a block's init beside its body), loops' extents multiplied and what
    runs one after the other added, conditions ignored (a predicated iteration costs its test); None where an extent is
    not static."""
    done: list[int] = []
    stack: list[tuple[Any, list[int], list[int] | None]] = [(root, done, None)]
    while stack:
        node, sink, kids = stack.pop()
        if kids is not None:
            total = sum(kids)
            if isinstance(node, tirx.For):
                if not isinstance(node.extent, tirx.IntImm):
                    return None
                total *= max(0, node.extent.value)
            sink.append(total)
            continue
        inside = [node.body] if isinstance(node, tirx.For) else nested_statements(node)
        if node is None:
            sink.append(0)
        elif inside is None:
            sink.append(1)
        else:
            counted: list[int] = []
            stack.append((node, sink, counted))
            stack.extend((s, counted, None) for s in inside)
    return done[0]


def buffer_bytes(buffer: Any, aligned: Sequence[tuple[int, int, int]] = ()) -> int | None:
    """A buffer's (or a buffer parameter's) size in bytes, its rows padded as ``aligned`` asks (``storage_align``'s
    (axis, factor, offset): the axis's stride made ``offset`` modulo ``factor``, as TVM lays it out); None where its
    shape is not static or it has none."""
    shape = getattr(buffer, "shape", None)
    if shape is None or not all(isinstance(d, (int, tirx.IntImm)) for d in shape):
        return None
    elements = 1
    for axis in reversed(range(len(shape))):
        for factor, offset in ((f, o) for a, f, o in aligned if a == axis and f > 0):
            elements += (offset - elements) % factor
        elements *= int(shape[axis])
    return elements * max(1, buffer.dtype.bits * buffer.dtype.lanes // 8)


def allocated_bytes(root: Any) -> int:
    """The bytes of the buffers a kernel's blocks allocate (those of static shape), rows padded as the blocks that
    write them align them (``buffer_dim_align``: a 132-byte trace aligned a cache's rows to 2^28 elements, whose 16
    rows then indexed past 32 bits and computed NaN)."""
    allocated: list[Any] = []
    aligned: list[tuple[Any, tuple[int, int, int]]] = []  # (buffer, (axis, factor, offset))
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, s_tir.SBlock):
            allocated += node.alloc_buffers
            for index, axis, factor, offset in _dim_aligns(node):
                if 0 <= index < len(node.writes):
                    aligned.append((node.writes[index].source, (axis, factor, offset)))
        stack.extend(nested_statements(node) or [])
    sizes = (buffer_bytes(b, [align for other, align in aligned if other.same_as(b)]) for b in allocated)
    return sum(size for size in sizes if size is not None)


def _dim_aligns(block: Any) -> list[tuple[int, int, int, int]]:
    """A block's ``buffer_dim_align`` annotation: (write buffer index, axis, factor, offset) each."""
    value = block.annotations.get("buffer_dim_align") if block.annotations is not None else None
    try:
        return [(int(i), int(a), int(f), int(o)) for i, a, f, o in (value or [])]
    except (TypeError, ValueError):
        return []


def _walk(root: Any, limits: ScheduleLimits) -> None:
    extents: dict[tuple[int, str], set[int]] = {}  # (launch, thread axis): the extents bound to it
    launches = itertools.count()  # numbers the launches (not id(): a freed node's id is reused)
    stack: list[tuple[Any, int, int | None, int]] = [(root, 1, None, 0)]  # (node, vector lanes, launch, loops around it)
    while stack:
        node, lanes, launch, depth = stack.pop()
        if node is None:
            continue
        if isinstance(node, tirx.For):
            depth += 1
            if depth > limits.max_loop_depth:
                raise ScheduleTooCostly(f"loops nested {depth} deep, over the limit of {limits.max_loop_depth}")
            _check_annotations(node.annotations, limits)
            if node.kind == tirx.ForKind.VECTORIZED:
                if not isinstance(node.extent, tirx.IntImm):  # a trace replayed on a symbolic size (a dynamic batch)
                    raise ValueError(f"a vectorized loop of symbolic extent {node.extent}: LLVM's vectorizer needs a constant one")
                lanes *= max(1, node.extent.value)
                if lanes > limits.max_vector_lanes:
                    raise ScheduleTooCostly(f"vectorized loops of {lanes} lanes, over the limit of {limits.max_vector_lanes}")
            elif node.kind == tirx.ForKind.THREAD_BINDING and node.thread_binding is not None:
                launch = next(launches) if launch is None else launch  # the outermost bound loop starts a kernel launch
                if isinstance(node.extent, tirx.IntImm):
                    axis = str(node.thread_binding.thread_tag)
                    _bind(extents.setdefault((launch, axis), set()), axis, node.extent.value)
            stack.append((node.body, lanes, launch, depth))
            continue
        if isinstance(node, s_tir.SBlock):
            _check_annotations(node.annotations, limits)
        stack.extend((s, lanes, launch, depth) for s in nested_statements(node) or [])
    code = unrolled_code(root)
    if code.total > limits.max_unrolled_statements:
        raise ScheduleTooCostly(f"unrolling would hand LLVM {code.total} lane-statements, over the limit of {limits.max_unrolled_statements}")
    if code.longest_statements > limits.max_straight_statements:
        raise ScheduleTooCostly(f"unrolling would hand LLVM {code.longest_statements} statements without a loop between them, over the "
                                f"limit of {limits.max_straight_statements}")  # fmt: skip
    if code.longest_run > limits.max_straight_line:
        raise ScheduleTooCostly(f"unrolling would hand LLVM {code.longest_run} lane-statements without a loop between them, over the "
                                f"limit of {limits.max_straight_line}")  # fmt: skip
    if code.statements > limits.max_kernel_statements:
        raise ScheduleTooCostly(f"unrolling would hand LLVM {code.statements} statements in all, over the limit of {limits.max_kernel_statements}")
    if code.wide > limits.max_wide_vector_code:
        raise ScheduleTooCostly(f"unrolling would hand LLVM {code.wide} lane-statements in vectors of over {WIDE_VECTOR_LANES} lanes, over "
                                f"the limit of {limits.max_wide_vector_code}")  # fmt: skip


class UnrolledCode(NamedTuple):
    """What TVM's unrolling (``tir.UnrollLoop``) makes of a statement, counted as :func:`unrolled_code` counts it."""

    steps: int  # stores after unrolling, as UnrollLoop counts them to decide whether an enclosing loop is unrolled
    loops: int  # depth of loops kept as loops inside (UnrollLoop unrolls no loop around one)
    unrolled: int  # depth of unrolled loops inside
    open_run: int  # lane-statements of the run of code without a loop that reaches the statement's edges
    longest_run: int  # the longest run closed inside (by a loop kept as a loop)
    total: int  # lane-statements in all
    wide: int  # of those, in vectors of more than WIDE_VECTOR_LANES lanes
    open_statements: int = 0  # statements (a vector once) of the run that reaches the statement's edges
    longest_statements: int = 0  # the most of them in a run closed inside
    statements: int = 0  # statements (a vector once) in all

    def looped(self) -> UnrolledCode:
        """This, as the body of a loop kept as a loop."""
        return UnrolledCode(self.steps, self.loops + 1, self.unrolled, 0, max(self.longest_run, self.open_run), self.total, self.wide,
                            0, max(self.longest_statements, self.open_statements), self.statements)  # fmt: skip

    def repeated(self, copies: int) -> UnrolledCode:
        """This, as the body of a loop unrolled into ``copies``."""
        return UnrolledCode(self.steps * copies, self.loops, self.unrolled + 1, self.open_run * copies, self.longest_run, self.total * copies,
                            self.wide * copies, self.open_statements * copies, self.longest_statements, self.statements * copies)  # fmt: skip


NOTHING = UnrolledCode(0, 0, 0, 0, 0, 0, 0)
AUTO_UNROLL_DEPTH = 8  # tir.UnrollLoop's auto_max_depth


def unrolled_code(root: Any) -> UnrolledCode:
    """The code TVM's lowering hands LLVM for a scheduled kernel's body, in lane-statements: every store once per copy
    that unrolling makes and once per vector lane (``longest_run``: the most of them without a loop between, where
    LLVM's time grows fastest). Unrolling as ``tir.UnrollLoop`` decides it after vectorization: an ``unroll``ed loop
    always; a serial loop under ``pragma_auto_unroll_max_step`` where no loop stays inside it, at most 8 unrolled
    loops deep, and its extent times the stores of its body (themselves unrolled) is within the pragma's steps. A
    vectorized loop TVM scalarizes (a condition that varies by lane) is counted as vectorized, which counts no fewer
    lane-statements in all than its scalar loop gives."""
    done: list[UnrolledCode] = []
    stack: list[tuple[Any, int, int, list[UnrolledCode], list[UnrolledCode] | None]] = [(root, 0, 1, done, None)]
    while stack:  # (node, the pragma's steps, vector lanes, where its code goes, its children's code once they are counted)
        node, steps, lanes, sink, kids = stack.pop()
        if kids is not None:
            sink.append(_unrolled(node, steps, kids))
            continue
        if isinstance(node, tirx.For):
            pragma = node.annotations.get("pragma_auto_unroll_max_step") if node.annotations is not None else None
            steps = int(getattr(pragma, "value", pragma)) if pragma is not None else steps
            vector = node.kind == tirx.ForKind.VECTORIZED and isinstance(node.extent, tirx.IntImm)
            inside: list[Any] | None = [node.body]
            inner = lanes * max(1, node.extent.value) if vector else lanes
        else:
            inside, inner = nested_statements(node), lanes
        if node is None:
            sink.append(NOTHING)
        elif inside is None:  # a store or an evaluation: one step
            sink.append(UnrolledCode(1, 0, 0, lanes, 0, lanes, lanes if lanes > WIDE_VECTOR_LANES else 0, 1, 0, 1))
        else:
            counted: list[UnrolledCode] = []
            stack.append((node, steps, lanes, sink, counted))
            stack.extend((s, steps, inner, counted, None) for s in reversed(inside))
    (code,) = done
    return code._replace(longest_run=max(code.longest_run, code.open_run), longest_statements=max(code.longest_statements, code.open_statements))


def _unrolled(node: Any, steps: int, kids: list[UnrolledCode]) -> UnrolledCode:
    """A statement's code from its children's (see :func:`unrolled_code`)."""
    if isinstance(node, tirx.For):
        (body,) = kids
        extent = node.extent.value if isinstance(node.extent, tirx.IntImm) else None
        if node.kind in (tirx.ForKind.VECTORIZED, tirx.ForKind.THREAD_BINDING):  # lanes of a vector; a GPU's threads
            return body
        within_steps = extent is not None and extent * body.steps <= steps
        auto = node.kind == tirx.ForKind.SERIAL and within_steps and body.loops == 0 and body.unrolled <= AUTO_UNROLL_DEPTH
        if auto or node.kind == tirx.ForKind.UNROLLED:
            return body.repeated(max(1, extent or 1))
        return body.looped()
    if not kids:
        return NOTHING
    # UnrollLoop counts each statement of a sequence (and a block's init and body) afresh; one branch of an `if` after the other
    depth = max if isinstance(node, (tirx.SeqStmt, s_tir.SBlock)) else sum
    return UnrolledCode(sum(k.steps for k in kids), depth(k.loops for k in kids), depth(k.unrolled for k in kids),
                        sum(k.open_run for k in kids), max(k.longest_run for k in kids), sum(k.total for k in kids), sum(k.wide for k in kids),
                        sum(k.open_statements for k in kids), max(k.longest_statements for k in kids), sum(k.statements for k in kids))  # fmt: skip


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
    if isinstance(getattr(node, "body", None), tirx.Stmt):
        return [node.body]
    return None


def _check_annotations(annotations: Any, limits: ScheduleLimits) -> None:
    for name in _UNROLL_KEYS:
        value = annotations.get(name) if annotations is not None else None
        if value is not None and int(getattr(value, "value", value)) > limits.max_auto_unroll:
            raise ScheduleTooCostly(f"{name}={int(getattr(value, 'value', value))}, over the limit of {limits.max_auto_unroll}")
