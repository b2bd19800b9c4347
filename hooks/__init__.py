"""schedhub.hooks: TVM builds that pick up registry schedules.

    with schedhub.hooks.use("http://registry:8470", target=target) as session:
        ex = tvm.compile(mod, target)          # unchanged user code
    print(session.report.summary())

Inside ``use`` every fused kernel is looked up (one batch request per compile); a record is
replayed on the user's own kernel; on a miss, a record of the same structure that replays (another
shape, compiler build or target; ranked by :mod:`.ranking`) is served as a transfer, or with
``measure=``/``synthesize=`` whichever of those and of schedules drawn from the kernel's own design
space (:mod:`.synthesis`) ran fastest here; misses are reported to the registry's queue in one request; a
registry that is down or stalls costs at most ``timeout``, one that trickles its answer or answers
something that is not a registry's at most 6 × ``timeout``, and one warning: the compile goes on
with TVM's default schedules. Outside it, TVM behaves as it always does. ``relax_pipeline="schedhub"`` names the same pipeline explicitly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tvm

from schedhub.registry import InvalidRecord, LocalRegistry, Registry, RegistryClient, Trust, check_network_name, connect

from .kernels.cache import KernelCache, default_dir, max_bytes, prune
from .serving.database import RegistryDatabase
from .kernels.identity import canonical_workload, compiler_fingerprint, target_text, workload_identity
from .pipeline import ACTIVE, install, schedhub_pipeline
from .metaschedule.guard import ScheduleLimits, ScheduleTooCostly
from .rewrites.layouts import Layout
from .serving.choice import AUTO, Auto, RewriteOptions
from .rewrites import Math, Rewrites
from .rewrites.winograd import Conv
from .build.objects import ObjectCache, c_compiler_available
from .serving.report import CompileReport, KernelOutcome, RegistryFallbackWarning
from .serving.session import HookSession
from .kernels.threads import IdleCoresWarning, UnknownCPU, check_cpu, host_target, runtime_threads

DEFAULT_TIMEOUT = 2.0
ANSWER_DEADLINE = 5  # × timeout: the longest a registry may take to send one whole answer


def _open(registry: Registry | str | os.PathLike[str], timeout: float) -> tuple[Registry, bool]:
    """The registry and whether this block opened it (and so closes it)."""
    if isinstance(registry, (LocalRegistry, RegistryClient)):
        return registry, False
    spec = os.fspath(registry)
    http_options = {"timeout": timeout, "deadline": ANSWER_DEADLINE * timeout, "retries": 0} if spec.startswith(("http://", "https://")) else {}
    return connect(spec, **http_options), True


@contextlib.contextmanager
def use(
    registry: HookSession | Registry | str | os.PathLike[str],
    target: tvm.target.Target | str | dict[str, Any] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    report_misses: bool = True,
    trust: Trust = "verified",
    limits: ScheduleLimits | None = None,
    transfer: bool = True,
    cache: str | os.PathLike[str] | bool = True,
    measure: float = 0.0,
    synthesize: int = 0,
    rank_by_model: bool | None = None,
    link: bool = True,
    pad: bool = True,
    relocate: bool = True,
    repostprocess: bool = True,
    layout: Layout | Auto = AUTO,
    math: Math = "exact",
    prepack: bool | Auto = AUTO,
    conv: Conv = "direct",
    rules: bool = True,
    name: str | None = None,
) -> Iterator[HookSession]:
    """Apply registry schedules to every Relax build in this block (this thread).

    ``registry`` is a URL, a store directory, a registry instance, or the session of an earlier
    block, whose read-through cache (and registry) this block then reuses. ``trust`` says which
    records are served ("verified", "any", or pusher names besides verified records); ``limits``
    bounds what a record may cost the compile. ``transfer``: on a miss, serve the best-fitting record
    of the same structure (another shape, compiler build or target) that replays on the kernel (:mod:`.ranking`).
    ``cache``: where this machine keeps kernel identities and replayed schedules between compiles
    (True: ``~/.cache/schedhub/kernels`` or ``$SCHEDHUB_CACHE_DIR``; False: nowhere).
    ``measure``: seconds per compile (0: none) to build, check and time a missed kernel's transfer
    candidates on this machine (its CPU, or its GPU for a CUDA target) and serve the fastest; on a GPU
    DLight's schedule is timed beside them and kept where it is faster. Results are cached, so each is measured once.
    ``synthesize``: with ``measure``, also draw this many schedules from each missed kernel's own design
    space, rank them with a cost model trained on the registry's measurement log and time the best
    few beside the transfer candidates (:mod:`.synthesis`; 64 is a good size; 0: off). What it draws
    is cached, so a kernel is synthesized once a machine.
    ``rank_by_model``: whether transfers are ranked by the speed the registry's served cost model predicts for
    each on this kernel, after the fewest re-derived tiles (:func:`.ranking.model_rank_key`), where it serves one
    the trust accepts. None (the default): for the kernels whose competing candidates hold their own layer at
    two shapes or more (:func:`.ranking.model_decides`), the fit ranking elsewhere; True: for every kernel;
    False: never (ARCHITECTURE §8 has the figures).
    ``link``: compile each scheduled kernel once per machine and link its object into later builds
    (kept beside the kernel cache; needs a cache and the C compiler TVM links with, else it is off).
    ``pad``: where a transfer's recorded tiles do not fit a matmul-like kernel's loop (its size is symbolic, or
    they no longer divide it), pad the loop to them rather than let TVM re-derive them (:mod:`.padding`; CPU targets).
    ``relocate``: where a transfer computes a producer (a reduction) again for every element of its consumer, so that
    it stores over twice what the unscheduled kernel does, move its compute locations outward (:mod:`.recompute`; CPU
    targets).
    ``repostprocess``: with ``measure``, also time each transfer's sketch with the target's postprocessors applied again
    at this kernel (which loops are parallel, vectorized, unrolled: the record's were decided for its own sizes), served
    where it is faster (CPU targets).
    ``layout``: what the compile converts the network's 2-D convolutions to before its kernels are looked up:
    ``"given"`` (the frontend's, NCHW from PyTorch and ONNX) or ``"NHWC"`` (:mod:`.layouts`). A record is found only
    under the layout it was tuned in. ``"auto"`` (the default): whichever layout the registry's records say runs the
    network fastest (:mod:`.choice`; ``"given"`` where they hold no more of one, and for a network without convolutions;
    where the registry holds nothing of the network, the layout this CPU is best tuned with, NHWC on AVX2 or AVX-512, its
    misses queued so).
    ``math``: ``"exact"``, or ``"fast"``: GELU, erf, exp, tanh and softmax by TVM's vectorizable approximations, a few
    float32 ulps from exact (:mod:`.fastmath`). Its kernels are other kernels: tune with the same ``--math``.
    ``prepack``: kernels whose records lay their weights out as their schedule reads them (MetaSchedule's
    ``RewriteLayout``), the weights rewritten once, at compile time (:mod:`.rewrites`; CPU). Tune with ``--prepack``.
    ``"auto"`` (the default): prepacked or not, as the registry's records say runs the network fastest (:mod:`.choice`;
    with ``layout="auto"``, the combinations are weighed together; unpacked where the records hold no more of either,
    and on a GPU; prepacked on AVX2 or AVX-512 where the registry holds nothing of the network). Name both (``layout="given",
    prepack=False``) for a compile that weighs nothing.
    ``conv``: ``"direct"``, or ``"winograd"``: 3×3 stride-1 convolutions with enough output tiles by Winograd's
    F(4×4, 3×3), 4× fewer multiplications (F(2×2, 3×3), 2.25×, where 4×4 tiles are too few), float32 rounding apart from direct (:mod:`.winograd`). Tune with ``--conv``.
    ``rules``: a CPU kernel the registry cannot serve (a miss, still reported and queued) gets its own design space's
    schedule with every decision taken by rule, untimed (:mod:`.rules`), rather than TVM's unscheduled default;
    False: the default, as TVM compiles without schedhub.
    ``name``: what the registry's page calls the network this block compiles (a compile reports its kernels and their
    calls once, for the queue to refine its slowest; the page shows how much of it is tuned). None: unnamed.
    """
    rewrites = RewriteOptions.of(layout, math, prepack, conv)  # checked before anything opens
    if name is not None:
        try:
            check_network_name(name)
        except InvalidRecord as exc:
            raise ValueError(str(exc)) from None
    if target is not None:
        check_cpu(target)
    install()
    cache_dir: str | os.PathLike[str] | None = None  # this block's own cache, bounded when it ends
    objects: ObjectCache | None = None
    owned = not isinstance(registry, HookSession)  # a session made here is this block's to close
    if isinstance(registry, HookSession):
        session, opened = registry, False
        reg = session.registry
    else:
        reg, opened = _open(registry, timeout)
        cache_dir = default_dir() if cache is True else (cache or None)
        objects = ObjectCache(Path(cache_dir) / "objects") if link and cache_dir is not None and c_compiler_available() else None
        session = HookSession(reg, report_misses=report_misses, trust=trust, limits=limits, transfer=transfer, cache=KernelCache(cache_dir),
                              measure=measure, objects=objects, synthesize=synthesize, rank_by_model=rank_by_model, pad=pad,
                              relocate=relocate, repostprocess=repostprocess, rewrites=rewrites, rules=rules, network_name=name)  # fmt: skip
    if name is not None:
        session.reporting.name = name
    token = ACTIVE.set(session)
    try:
        with contextlib.ExitStack() as stack:
            if target is not None:
                stack.enter_context(tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target)
            stack.enter_context(RegistryDatabase(session))
            yield session
    finally:
        ACTIVE.reset(token)
        if objects is not None:
            objects.close()
        if owned:
            session.lowerings.close()
        if opened:
            reg.close()
        if cache_dir is not None and (session.cache.writes or (objects is not None and objects.compiled)):
            prune(Path(cache_dir), max_bytes())  # only a block that wrote can have grown the cache


__all__ = [
    "use", "host_target", "schedhub_pipeline", "KernelCache", "RegistryDatabase", "HookSession", "CompileReport", "KernelOutcome",
    "RegistryFallbackWarning", "IdleCoresWarning", "UnknownCPU", "Rewrites", "RewriteOptions", "AUTO", "runtime_threads", "ScheduleLimits", "ScheduleTooCostly", "Trust", "workload_identity", "canonical_workload", "target_text", "compiler_fingerprint",
]  # fmt: skip
