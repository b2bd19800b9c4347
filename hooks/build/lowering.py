"""Scheduled kernels that TVM cannot lower, found before the model's build meets them.

A record within every bound can still schedule a kernel that TVM's TIR pipeline refuses (an annotation the
registry allows, ``software_pipeline_stage`` without its ``software_pipeline_order``, replays and then fails
``InjectSoftwarePipeline``). Where the hook builds a scheduled kernel's object alone (:mod:`.objects`), that build
finds it. Every other scheduled kernel (a GPU target, ``use(..., link=False)``, a kernel the object cache does not
link) would fail the model's own build, so it is lowered alone first, with the target's default TIR pipeline (what
``tvm.compile`` runs unless told otherwise) and no code generation: ~50 ms a kernel on a CPU, where its code generation
costs LLVM's or NVCC's time. The hook starts each lowering as soon as the kernel is scheduled, on a thread (TVM's
passes run without Python's GIL), so it overlaps the next kernels' lookups and replays. A kernel that lowered is
remembered in the kernel cache under its scheduled-kernel name and the build's configuration, so each is lowered once
per machine; one that did not is the caller's to put back (:meth:`.session.HookSession.unbuildable` then remembers
the record as refused).
"""

from __future__ import annotations

from concurrent.futures import Future

import tvm
from tvm import tirx
from tvm_ffi import DLDeviceType

from ..kernels.background import KernelWork
from ..kernels.cache import KernelCache
from ..kernels.errors import TVM_ERRORS
from .objects import ObjectCache, object_id_of

LOWERED = "lowered"  # kernel-cache kind: a scheduled kernel that TVM's TIR pipeline lowered on this machine


class Lowerings(KernelWork[tuple[str, ...]]):
    """Scheduled kernels lowered alone, ``workers`` at a time (default: one per CPU); each once per machine (``cache``)."""

    def __init__(self, cache: KernelCache, workers: int | None = None) -> None:
        super().__init__(workers, "schedhub-lowering")  # by cache parts: lowering (None once lowered, else TVM's error)
        self.cache = cache

    def start(self, func: tirx.PrimFunc, target: tvm.target.Target) -> None:
        """Begin lowering a scheduled kernel (marked with ``OBJECT_ID``) under the current pass configuration, unless it
        lowered on this machine before or has started."""
        object_id = object_id_of(func)
        if object_id is not None:
            self._lowering((object_id, *ObjectCache.build_id(target)), func, target)

    def failures(self, mod: tvm.IRModule, target: tvm.target.Target) -> tuple[tuple[tvm.ir.GlobalVar, Exception], ...]:
        """Each kernel of ``mod`` scheduled by the hook that TVM's default TIR pipeline for ``target`` refuses, with TVM's
        error (lowered now where :meth:`start` did not begin it); the kernels that lowered are remembered."""
        build = ObjectCache.build_id(target)
        lowering = {gv: self._lowering((object_id, *build), func, target) for gv, func in mod.functions_items() if (object_id := object_id_of(func))}
        found: list[tuple[tvm.ir.GlobalVar, Exception]] = []
        for gv, future in lowering.items():
            exc = None if future is None else future.result()
            if exc is not None:
                found.append((gv, exc))
        for parts, future in list(self._started.items()):
            if future.done():
                if future.result() is None:
                    self.cache.put(LOWERED, parts, {"lowered": True})
                del self._started[parts]
        return tuple(found)

    def _lowering(self, parts: tuple[str, ...], func: tirx.PrimFunc, target: tvm.target.Target) -> Future[Exception | None] | None:
        """The lowering of one scheduled kernel (``parts``: its cache name), started now unless started; None when it
        lowered on this machine before."""
        if parts not in self._started and self.cache.get(LOWERED, *parts) is not None:
            return None
        return self._submit(parts, lambda: lowering_error(func, target), target)


def lowering_error(func: tirx.PrimFunc, target: tvm.target.Target) -> Exception | None:
    """TVM's error lowering ``func`` alone for ``target`` with the target's default TIR pipeline (no code generation), or None."""
    try:
        tvm.tirx.get_default_tir_pipeline(target)[0](bound(func, target))
    except TVM_ERRORS as exc:
        return exc
    return None


def bound(func: tirx.PrimFunc, target: tvm.target.Target) -> tvm.IRModule:
    """``func`` alone in a module bound to ``target`` and its host, as ``tvm.tirx.build`` binds it, and exported as the
    model's build exports it (``MakePackedAPI`` wraps only exported functions, and later passes expect it has)."""
    if target.host is not None:
        host = target.host
    elif target.get_target_device_type() == DLDeviceType.kDLCPU:
        host = target
    else:
        host = tvm.target.Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    return tirx.transform.BindTarget(target.with_host(host))(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
