"""Pipelines that apply registry schedules during an ordinary Relax build.

TVM 0.27's default CPU pipeline never consults ``Database.current()``. ``schedhub_pipeline``
runs the fusion passes of the "zero" pipeline, prefetches every fused kernel in one registry
request, applies the database (MetaScheduleApplyDatabase), then TVM's default build pipeline.
It is registered as ``relax_pipeline="schedhub"``; inside ``use(...)`` the name "default" also
resolves to it, for the current thread only (other threads and code outside keep TVM's own).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.relax import pipeline as relax_pipeline
from tvm.s_tir import meta_schedule as ms

from .session import HookSession

ACTIVE: contextvars.ContextVar[HookSession | None] = contextvars.ContextVar("schedhub_session", default=None)
_install_lock = threading.Lock()
_tvm_default: Callable[..., tvm.transform.Pass] | None = None


def fusion_passes() -> tvm.transform.Pass:
    """The zero pipeline's passes before MetaScheduleApplyDatabase (same passes as task extraction)."""
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(),
    ])  # fmt: skip


@tvm.transform.module_pass(opt_level=0, name="SchedhubPrefetch")
def prefetch(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Look every fused kernel up in one batch request (the cache then answers each query)."""
    session, target = ACTIVE.get(), tvm.target.Target.current(allow_none=True)
    if session is not None and target is not None:
        kernels = [(gv.name_hint, f) for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
        session.prefetch([session.identity(f, target, name) for name, f in kernels])
    return mod


def schedhub_pipeline(**kwargs: Any) -> tvm.transform.Pass:
    """Fuse, prefetch, apply the current database, then TVM's default build."""
    default = _tvm_default or relax_pipeline.default_build_pipeline

    @tvm.transform.module_pass(opt_level=0, name="SchedhubPipeline")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = fusion_passes()(mod)
        session = ACTIVE.get()
        if ms.Database.current() is not None:
            if session is not None:
                session.begin_compile()
            mod = prefetch(mod)
            mod = relax.transform.MetaScheduleApplyDatabase()(mod)
            if session is not None:
                session.end_compile()
        return default(**kwargs)(mod)

    return run


def _default_or_schedhub(**kwargs: Any) -> tvm.transform.Pass:
    """What "default" resolves to once installed: schedhub's pipeline inside use(), else TVM's."""
    assert _tvm_default is not None
    return schedhub_pipeline(**kwargs) if ACTIVE.get() is not None else _tvm_default(**kwargs)


def install() -> None:
    """Register "schedhub" and route "default" through the thread-aware switch (idempotent)."""
    global _tvm_default
    with _install_lock:
        if _tvm_default is None:
            _tvm_default = relax_pipeline.PIPELINE_MAP["default"]
            relax_pipeline.PIPELINE_MAP["default"] = _default_or_schedhub
        relax_pipeline.PIPELINE_MAP.setdefault("schedhub", schedhub_pipeline)
