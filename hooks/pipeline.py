"""Pipelines that apply registry schedules during an ordinary Relax build.

TVM 0.27's default pipelines never consult ``Database.current()``. ``schedhub_pipeline`` runs
the fusion passes of the "zero" pipeline, prefetches every fused kernel in one registry request,
applies the database (MetaScheduleApplyDatabase), then finishes the build per target:

- CPU: TVM's default build pipeline;
- GPU (cuda, rocm, and the generic GPU backend's kinds: vulkan, metal, opencl, webgpu): the
  backend's library dispatch first, then DLight's default schedules for every kernel the
  registry did not schedule (DLight skips scheduled kernels), then the backend's lowering.
  On a GPU, DLight is the default a record has to beat, not an unscheduled kernel.

It is registered as ``relax_pipeline="schedhub"``. Inside ``use(...)``, for the current thread
only, the name "default" resolves to it on CPU targets and ``relax.get_default_pipeline`` (what
``tvm.compile`` takes for targets whose keys include "gpu") on GPU targets; other threads and
code outside keep TVM's own.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.relax import pipeline as relax_pipeline
from tvm.s_tir import meta_schedule as ms

from .serving.choice import Kernel, choose, holding, keep_failure, keep_kernels, kept_failure, kept_kernels, leading, network_parts
from .rewrites.constants import constant_passes
from .kernels.defaults import dlight_schedule, is_gpu
from .kernels.errors import error_line
from .rewrites import NO_REWRITES, Rewrites, unlowered_operators
from .build.objects import OBJECT_ID, ObjectCache, links_here
from .rewrites.prepack import IS_SCHEDULED, PACKED_OBJECT_ID, fold_constant_rewrites, is_weight_rewrite, split_packed_kernels
from .serving.session import HookSession

ACTIVE: contextvars.ContextVar[HookSession | None] = contextvars.ContextVar("schedhub_session", default=None)
_install_lock = threading.Lock()
_tvm_default: Callable[..., tvm.transform.Pass] | None = None
_tvm_gpu_default: Callable[[tvm.target.Target], tvm.transform.Pass] | None = None


def fusion_passes(rewrites: Rewrites = NO_REWRITES) -> tvm.transform.Pass:
    """The zero pipeline's passes before MetaScheduleApplyDatabase (same passes as task extraction), after BatchNorm is
    folded into the convolution before it: ``torch.export`` keeps them apart, and a model must have one set of keys
    whether a user imported it with ``from_exported_program`` or ``schedhub tune`` did (``plan.from_torch_export``);
    and after the network is rewritten as ``rewrites`` says (:mod:`.rewrites`: convolution layout, fast math) and its
    constants' transposes and reshapes are done in numpy (:mod:`.constants`). BatchNorm's folded arithmetic is computed
    in numpy before the rewrites too: ``ConvertLayout`` must not meet it."""
    return tvm.transform.Sequential([unpacked_fusion_passes(rewrites), *rewrites.fused_passes()])


def unpacked_fusion_passes(rewrites: Rewrites) -> tvm.transform.Pass:
    """:func:`fusion_passes` less what ``prepack`` adds after fusion: the same for a network prepacked or not."""
    rewriting = rewrites.passes()
    return tvm.transform.Sequential([
        relax.transform.FoldBatchnormToConv2D(), *constant_passes(), *rewriting, *(constant_passes() if rewriting else []),
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])  # fmt: skip


def call_counts(mod: tvm.IRModule) -> dict[str, int]:
    """How many times the module's Relax functions call each kernel (``call_tir``), by the kernel's name."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    counts: dict[str, int] = {}

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and expr.op == call_tir:
            name = expr.args[0].name_hint
            counts[name] = counts.get(name, 0) + 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return counts


@tvm.transform.module_pass(opt_level=0, name="SchedhubPrefetch")
def prefetch(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Look every fused kernel up in one batch request (the cache then answers each query), and tell
    the session how often the module calls each one (it reports the slowest misses first)."""
    session, target = ACTIVE.get(), tvm.target.Target.current(allow_none=True)
    if session is not None and target is not None:
        session.check_threads(target)
        kernels = module_kernels(session, mod, target)
        session.prefetch([identity for identity, _ in kernels])
        session.count_calls(kernels)
    return mod


def module_kernels(session: HookSession, mod: tvm.IRModule, target: tvm.target.Target) -> list[Kernel]:
    """Each fused kernel of ``mod``: its identity on ``target`` and how many times the module calls it."""
    calls = call_counts(mod)
    return [(session.identity(f, target, gv.name_hint), calls.get(gv.name_hint, 1)) for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]


def fused(session: HookSession, mod: tvm.IRModule, target: tvm.target.Target | None) -> tvm.IRModule:
    """``mod`` rewritten and fused as the session's rewrites say; where it may choose among several
    (:mod:`.choice`), fused once for each, every option's kernels looked up in one request, and the option
    the registry's records favour kept (it becomes ``session.rewrites`` for this compile, and is reported)."""
    options = session.rewrite_options.for_target(target).for_module(mod).options
    if len(options) == 1 or target is None:
        session.rewrites = options[0]
        return rewritten(options[0], lambda: fusion_passes(options[0])(mod))
    unpacked: dict[Rewrites, tvm.IRModule | Exception] = {}  # an option and its prepacked twin share their fusion
    modules: dict[Rewrites, tvm.IRModule] = {}

    def fuse(rewrites: Rewrites) -> tvm.IRModule:
        base = dataclasses.replace(rewrites, prepack=False)
        if base not in unpacked:
            try:
                unpacked[base] = unpacked_fusion_passes(base)(mod)
            except Exception as exc:  # noqa: BLE001 (TVM raises InternalError, ValueError…; the twin fails alike)
                unpacked[base] = exc
        if isinstance(done := unpacked[base], Exception):
            raise done
        modules[rewrites] = tvm.transform.Sequential(rewrites.fused_passes())(done)
        return modules[rewrites]

    network = network_parts(mod, target)
    kernels: dict[Rewrites, list[Kernel]] = {}
    for rewrites in options:  # each option's kernels as this machine found them before, else fused now and kept
        parts = (*network, repr(rewrites))
        kept = kept_kernels(session.cache, parts)
        if kept is None and rewrites != options[0] and (failed := kept_failure(session.cache, parts)) is not None:
            session.say(f"not weighed: {failed}")  # as an earlier compile here found, with this version
            continue
        if kept is None:
            try:
                fused_now = rewritten(rewrites, lambda rewrites=rewrites: fuse(rewrites))
            except RewriteFailed as exc:  # an option weighed, not asked for, never breaks the compile
                if rewrites == options[0]:
                    raise
                session.say(f"not weighed: {exc}")
                keep_failure(session.cache, parts, str(exc))
                continue
            kept = module_kernels(session, fused_now, target)
            keep_kernels(session.cache, parts, kept)
        kernels[rewrites] = kept
    lead = leading(options, target)
    lead = lead if lead in kernels else options[0]  # the first is always weighed: a fixed compile of it raised above
    order = sorted(kernels, key=lambda rewrites: rewrites != lead)  # the lead first: it wins a tie
    others = [identity for rewrites in order[1:] for identity, _ in kernels[rewrites]]
    session.prefetch([i for i, _ in kernels[lead]], exact_only=others)  # another option chosen: its misses ask after
    holdings = [holding(rewrites, kernels[rewrites], session.fetched_records) for rewrites in order]
    chosen = choose(holdings)  # nothing held: every option ties, and the lead is taken
    session.rewrites = chosen.rewrites
    session.report.rewrites = chosen.rewrites.describe() or "none"
    if chosen.rewrites != options[0] and not any(h.held for h in holdings):
        session.report.rewrites_by = "what this CPU is best tuned with (the registry holds no record of this network)"
    session.report.rewrite_options = [each.describe() for each in holdings]
    if chosen.rewrites in modules:
        return modules[chosen.rewrites]
    try:
        return rewritten(chosen.rewrites, lambda: fuse(chosen.rewrites))
    except RewriteFailed as exc:  # weighed from what this machine kept; a fixed compile raised above
        if chosen.rewrites == options[0]:
            raise
        session.say(f"not taken: {exc}")
        keep_failure(session.cache, (*network, repr(chosen.rewrites)), str(exc))
        session.rewrites, session.report.rewrites, session.report.rewrites_by = options[0], options[0].describe() or "none", "what TVM could rewrite"
        return rewritten(options[0], lambda: fuse(options[0]))


class RewriteFailed(RuntimeError):  # not ValueError: tvm.compile swallows those and builds for the CPU
    """TVM could not rewrite the network as a compile's rewrites say (its error names the pass)."""


def rewritten(rewrites: Rewrites, fuse: Callable[[], tvm.IRModule]) -> tvm.IRModule:
    """``fuse()``, the network rewritten and fused as ``rewrites`` say; where TVM cannot (a rewrite's pass raises, or
    leaves an operator in a form legalization cannot lower: :func:`.rewrites.unlowered_operators`), a
    :class:`RewriteFailed` that names the rewrites and the compile that does without them. A network TVM cannot fuse
    without rewrites raises TVM's own error."""
    if not rewrites.describe():
        return fuse()
    undo = ", ".join(f"{name}={plain!r}" for name, plain in dataclasses.asdict(NO_REWRITES).items() if getattr(rewrites, name) != plain)
    try:
        mod = fuse()
    except Exception as exc:
        raise RewriteFailed(f"TVM could not compile this network with {rewrites.describe()} ({error_line(exc)}); "
                            f"compile it without them: use(..., {undo})") from exc
    if left := unlowered_operators(mod):  # the build would fail in VM codegen, after the misses were reported
        raise RewriteFailed(f"TVM could not compile this network with {rewrites.describe()} (it cannot lower {', '.join(left)} "
                            f"as rewritten); compile it without them: use(..., {undo})")
    return mod


class UnsupportedTarget(RuntimeError):  # not ValueError: tvm.compile swallows those and builds for the CPU
    """A GPU target whose backend schedhub's pipeline does not know yet."""


_GPU_BACKENDS = {"cuda": "cuda", "rocm": "rocm", "vulkan": "gpu_generic", "metal": "gpu_generic", "opencl": "gpu_generic", "webgpu": "gpu_generic"}


def gpu_backend(target: tvm.target.Target) -> Any:
    """The ``tvm.relax.backend.<name>.pipeline`` module whose passes build for ``target``."""
    import importlib

    name = _GPU_BACKENDS.get(target.kind.name)
    if name is None or "adreno" in target.keys:
        raise UnsupportedTarget(
            f"schedhub's compile hook does not support {target.kind.name} targets ({', '.join(target.keys)}) yet: "
            f"it supports llvm and {', '.join(sorted(_GPU_BACKENDS))}; compile outside schedhub.hooks.use() for now"
        )
    return importlib.import_module(f"tvm.relax.backend.{name}.pipeline")


def linkable_objects(session: HookSession, target: tvm.target.Target) -> ObjectCache | None:
    """The session's object cache where a build for ``target`` links its kernels from it (:func:`.objects.links_here`)."""
    return session.objects if session.objects is not None and links_here(target) else None


@tvm.transform.module_pass(opt_level=0, name="SchedhubApplyRecords")
def apply_records(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """MetaScheduleApplyDatabase for the session: the same kernels, attributes and marks, but each
    trace replayed once (not three times) and, from the per-machine cache, not at all."""
    session, target = ACTIVE.get(), tvm.target.Target.current(allow_none=True)
    if session is None or target is None:
        return mod
    objects = linkable_objects(session, target)
    updates = {}
    kernels = [(gv, func) for gv, func in mod.functions_items() if isinstance(func, tirx.PrimFunc) and not (func.attrs is not None and func.attrs.get(IS_SCHEDULED))]
    if session.measure > 0:  # the compile's measurement budget goes first to the kernels that cost the module most
        kernels.sort(key=lambda kernel: session.measure_priority(session.identity(kernel[1], target, kernel[0].name_hint)), reverse=True)
    for gv, func in kernels:
        scheduled = session.scheduled(func, target, gv.name_hint)
        if scheduled is not None:
            new, attrs = scheduled["main"], dict(func.attrs or {})
            packs = session.rewrites.prepack and LAYOUT_FREE in attrs  # its weights' rewrite is split out after (:mod:`.prepack`)
            for name in [n for n in dict(new.attrs or {}) if n not in attrs and (n != OBJECT_ID or packs)]:  # global_symbol "main" of the normalized module
                new = new.without_attr(name)
            if packs and (object_id := (scheduled["main"].attrs or {}).get(OBJECT_ID)) is not None:  # what is split out of it is linked
                new = new.with_attr(PACKED_OBJECT_ID, object_id)
            for name, value in attrs.items():
                new = new.with_attr(name, value)
            updates[gv] = new.with_attr(IS_SCHEDULED, True)
            session.originals[gv.name_hint] = func
            if objects is not None and not packs:  # its machine code compiles while the next kernels are looked up and replayed
                objects.start(updates[gv], target)
            else:  # or it is lowered alone, in the same way (:func:`check_lowering`)
                session.lowerings.start(updates[gv], target)
    if not updates:
        return mod
    out = mod.clone()
    for gv, func in updates.items():
        out.update_func(gv, func)
    return out


@tvm.transform.module_pass(opt_level=0, name="SchedhubLinkObjects")
def link_objects(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Scheduled kernels of a build for this machine: their machine code from the session's object cache."""
    session, target = ACTIVE.get(), tvm.target.Target.current(allow_none=True)
    if session is None or target is None or (objects := linkable_objects(session, target)) is None:
        return mod
    mod, done = objects.link(mod, target, session.limits.max_build_secs)
    session.report.linked += done.linked
    session.report.objects_compiled += done.compiled
    return session.unbuildable(mod, done.unbuildable) if done.unbuildable else mod


@tvm.transform.module_pass(opt_level=0, name="SchedhubCheckLowering")
def check_lowering(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Scheduled kernels left to the model's build (not linked): each that TVM cannot lower goes back to its unscheduled form."""
    session, target = ACTIVE.get(), tvm.target.Target.current(allow_none=True)
    if session is None or target is None:
        return mod
    failures = session.lowerings.failures(mod, target)
    return session.unbuildable(mod, failures) if failures else mod


#: The attribute ``AttachAttrLayoutFreeBuffers`` marks a kernel's weights with.
LAYOUT_FREE = "layout_free_buffers"


def start_objects(session: HookSession, mod: tvm.IRModule) -> None:
    """Begin compiling the object of each kernel of ``mod`` to be linked but a weights' rewrite (one of constant weights
    is done at compile time, and leaves the module)."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or (objects := linkable_objects(session, target)) is None:
        return
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and not is_weight_rewrite(gv.name_hint):
            objects.start(func, target)


def apply_database(mod: tvm.IRModule) -> tvm.IRModule:
    """Fuse, then (with a database in scope) prefetch every kernel and apply the database's records:
    the session's through :func:`apply_records`, another MetaSchedule database through TVM's pass."""
    session = ACTIVE.get()
    if session is None:
        mod = fusion_passes(NO_REWRITES)(mod)
        return relax.transform.MetaScheduleApplyDatabase()(mod) if ms.Database.current() is not None else mod
    session.begin_compile()
    mod = fused(session, mod, tvm.target.Target.current(allow_none=True))
    mod = check_lowering(link_objects(apply_records(prefetch(mod))))
    if session.rewrites.prepack:
        mod = split_packed_kernels(mod)
        start_objects(session, mod)  # compiled while the weights are rewritten
        mod = link_objects(fold_constant_rewrites(mod, session.cache))
    session.end_compile()
    return mod


def gpu_build(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The GPU route: library dispatch, fusion and the registry's records, DLight for the rest, lowering."""
    backend = gpu_backend(target)
    with target:
        mod = tvm.transform.Sequential(backend.library_dispatch_passes(target))(mod)
        mod = dlight_schedule(apply_database(mod), target)
        return tvm.transform.Sequential(backend.dataflow_lower_passes(target) + backend.finalize_passes(target))(mod)


def schedhub_pipeline(**kwargs: Any) -> tvm.transform.Pass:
    """Fuse, prefetch and apply the current database, then build the rest as the target's default does."""
    default = _tvm_default or relax_pipeline.default_build_pipeline

    @tvm.transform.module_pass(opt_level=0, name="SchedhubPipeline")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is not None and is_gpu(target):
            return gpu_build(mod, target)
        return default(**kwargs)(apply_database(mod))

    return run


def _default_or_schedhub(**kwargs: Any) -> tvm.transform.Pass:
    """What "default" resolves to once installed: schedhub's pipeline inside use(), else TVM's."""
    assert _tvm_default is not None
    return schedhub_pipeline(**kwargs) if ACTIVE.get() is not None else _tvm_default(**kwargs)


def _gpu_default_or_schedhub(target: tvm.target.Target) -> tvm.transform.Pass:
    """What ``relax.get_default_pipeline`` returns once installed: schedhub's GPU route inside use()."""
    assert _tvm_gpu_default is not None
    if ACTIVE.get() is None or not is_gpu(target):
        return _tvm_gpu_default(target)
    gpu_backend(target)  # an unsupported GPU kind fails here, before the build starts

    @tvm.transform.module_pass(opt_level=0, name="SchedhubGpuPipeline")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return gpu_build(mod, target)

    return run


def install() -> None:
    """Register "schedhub"; route "default" and ``relax.get_default_pipeline`` through the thread-aware switches (idempotent)."""
    global _tvm_default, _tvm_gpu_default
    with _install_lock:
        if _tvm_default is None:
            _tvm_default = relax_pipeline.PIPELINE_MAP["default"]
            relax_pipeline.PIPELINE_MAP["default"] = _default_or_schedhub
        if _tvm_gpu_default is None:  # tvm.compile looks it up on the relax package for GPU targets
            _tvm_gpu_default = relax.get_default_pipeline
            relax.get_default_pipeline = _gpu_default_or_schedhub
        relax_pipeline.PIPELINE_MAP.setdefault("schedhub", schedhub_pipeline)
