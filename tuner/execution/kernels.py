"""What runs inside build and measurement tasks: plain values in, plain values out.

A module travels as TVM's JSON text, a target as its canonical JSON text, a built kernel as
shared-library bytes, arguments as MetaSchedule ``ArgInfo`` JSON. Every result carries the wall
clock interval it ran in (``time.time()``), so a caller can show which work overlapped.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import tvm_env
from .remembered import KernelMemory, Remembered, kernel_key, memory

#: Defaults of a tuning measurement (MetaSchedule's EvaluatorConfig has the same fields).
TUNING_TIMING = {"number": 3, "repeat": 1, "min_repeat_ms": 40, "flush_cache": False}
#: Longer, repeated timing for the few candidates that will be published: the search's own short
#: timings were seen to rise with the budget while re-measurement showed little real gain.
FINAL_TIMING = {"number": 10, "repeat": 5, "min_repeat_ms": 100, "flush_cache": False, "flushed_too": True}
#: A timing's "flushed_too": on a CPU, each kernel is timed on flushed caches as well (``flush_cache``) and its result
#: says ``flushed_secs``: what the registry ranks a key's records by (a warm timing ranked ResNet-18's stage-4 records
#: unlike the network, a flushed one as it does)
#: A timing's optional "untimed_past": a kernel whose checking call took more than that many times the first kernel's
#: (and "untimed_margin_secs" more, default UNTIMED_MARGIN_SECS) is not timed, so a catastrophically slow one costs the
#: device one call, not 50
UNTIMED = "far slower than the first kernel, not timed"  # the error of such a kernel, which also says "untimed_call_secs"
UNTIMED_MARGIN_SECS = 0.01
#: A timing's optional "brief_first_past": where the first kernel's checking call took that many times every other
#: checked kernel's, and at least BRIEF_AT_LEAST_SECS, the first kernel is timed briefly (:func:`_brief`) and its result
#: says "brief": the default schedule a search's best are timed beside. Every one of them beats it by that factor, so a
#: few calls say as much as 100 (an unscheduled 224-px ResNet convolution ran 100 ms a call: 10 of a 20 s round went to
#: timing it again, round after round; BERT's unscheduled matmuls run 0.3-1 s a call)
#: A brief timing's calls beyond the checking call: this many warm (its samples are the checking call's and these) and
#: this many on flushed caches (with "flushed_too" on a CPU), each call timed on its own: no evaluator's warm-up call
BRIEF_CALLS = 1
BRIEF_AT_LEAST_SECS = 0.002


def final_timing(min_repeat_ms: int) -> dict[str, Any]:
    """:data:`FINAL_TIMING` with each repeat lasting at least ``min_repeat_ms`` (a tiny budget's publishing needs less)."""
    return {**FINAL_TIMING, "min_repeat_ms": min_repeat_ms}


def _interval(start: float) -> dict[str, Any]:
    return {"start": start, "end": time.time(), "host": socket.gethostname(), "pid": os.getpid()}


def _short_error(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()[-2000:]


def build(mod_json: str, target_text: str, checkable: bool = False, whole_only: bool = False) -> dict[str, Any]:
    """Build one scheduled module: ``{"artifact": bytes | None, "error": str | None, ...interval}``. A module whose
    weights' layout its schedule rewrites (MetaSchedule's ``RewriteLayout``) is built as MetaSchedule times it, the
    rewrite removed so that it takes its weights prepacked; with ``checkable`` (its outputs will be checked) the answer
    adds that build's ``args_info`` and a ``check_artifact``: the module built whole (rewrite kept), which takes the
    kernel's own arguments. A search's candidates are not checked, so their builds are not doubled. With ``whole_only``
    (the caller holds the timed build: the search made it) only the whole build is made: ``"artifact"`` is None, and
    so is ``"error"`` where it built."""
    import tvm

    from schedhub.hooks.kernels.identity import target_from_text

    start = time.time()
    tvm_env.prepare_kernels()
    target = target_from_text(target_text)
    if target.kind.name == "cuda" and not tvm_env.compiles_cuda():  # it would keep source no GPU loads
        return {"artifact": None, "error": f"this node ({socket.gethostname()}) cannot compile CUDA: its TVM has no CUDA runtime", **_interval(start)}
    try:
        mod = tvm.ir.load_json(mod_json)
        out: dict[str, Any] = {"artifact": None if whole_only else tvm_env.library_bytes(tvm_env.build_kernel(mod, target)), "error": None}
        if (checkable or whole_only) and (packed := tvm_env.packed_args_info(mod)) is not None:  # its weights prepacked: time it on them, check it whole
            out.update(args_info=packed, check_artifact=tvm_env.library_bytes(tvm.tirx.build(mod, target=target)))
    except Exception as exc:  # a candidate that does not build is a result, not a crash
        out = {"artifact": None, "error": f"build failed: {_short_error(exc)}"}
    return {**out, **_interval(start)}


def random_arguments(args_info: list[Any], seed: int = 0) -> list[np.ndarray]:
    """Host arrays for ``ArgInfo`` JSON values (``["TENSOR", dtype, shape]``): the arrays
    ``hooks.kernels.measure.random_inputs`` makes, here without TVM (the PyTorch baselines' process uses it;
    ``schedhub.hooks`` imports TVM), so a baseline and a kernel are timed on the same inputs."""
    rng = np.random.default_rng(seed)
    arrays = []
    for info in args_info:
        if not (isinstance(info, list) and len(info) == 3 and info[0] == "TENSOR"):
            raise ValueError(f"unsupported argument {info!r}: only tensors can be measured")
        _, dtype, shape = info
        if np.dtype(dtype).kind == "f":
            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
        else:  # indices and masks: zero (False) is valid for every op, and draws nothing from the stream
            arrays.append(np.zeros(shape, dtype=dtype))
    return arrays


def _run(rt_mod: Any, arrays: list[np.ndarray], dev: Any) -> tuple[list[np.ndarray], float]:
    """``rt_mod`` called once on copies of ``arrays`` on ``dev``: every argument after the call, and the call's seconds."""
    import tvm

    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    secs = _call_secs(rt_mod, dev, tensors)
    return [t.numpy() for t in tensors], secs


def _call_secs(rt_mod: Any, dev: Any, arguments: list[Any]) -> float:
    """Seconds of one call of ``rt_mod`` on ``arguments`` (device tensors), its device synchronized."""
    started = time.perf_counter()
    rt_mod["main"](*arguments)
    dev.sync()
    return time.perf_counter() - started


def _mismatch(expected: list[np.ndarray], actual: list[np.ndarray], rtol: float) -> str | None:
    for i, (want, got) in enumerate(zip(expected, actual)):
        if want.dtype.kind == "f":
            atol = rtol * max(1.0, float(np.abs(want).max(initial=0.0)))
            if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
                worst = float(np.abs(got.astype(np.float64) - want).max())
                return f"argument {i} differs from the unscheduled build (max abs error {worst:.3g})"
        elif not np.array_equal(got, want):
            return f"argument {i} differs from the unscheduled build"
    return None


def probe_gpu() -> dict[str, Any]:
    """The GPU this task holds: ``{"archs": [...], "name": ..., "error": None}``, the architectures it runs
    code built for (compute 9.0: ``sm_90`` and its arch-specific ``sm_90a``), or ``{"archs": [], "error": …}``."""
    import tvm

    from schedhub.hooks.kernels.measure import gpu_archs

    try:
        archs = gpu_archs()
        if archs:
            return {"archs": archs, "name": str(tvm.cuda(0).device_name), "error": None}
    except Exception as exc:  # a driver that fails to answer
        return {"archs": [], "error": _short_error(exc)}
    return {"archs": [], "error": "no usable CUDA device in this task (no driver, or TVM without the CUDA runtime)"}


def device_for(target_text: str) -> Any:
    """The device kernels of a canonical target run on in this task: the CPU, or the GPU Ray pinned it to.

    Raises when that GPU cannot run code built for the target's architecture.
    """
    import tvm

    from schedhub.registry import target_device, target_kind

    kind = target_kind(target_text)
    if kind == "llvm":
        return tvm.cpu(0)
    if kind != "cuda":
        raise ValueError(f"kernels of {kind or 'unknown'!r} targets cannot be timed here")
    found = probe_gpu()
    wanted = target_device(target_text)
    if not found["archs"]:
        raise RuntimeError(found["error"])
    if wanted and wanted not in found["archs"]:
        raise RuntimeError(f"this task's GPU ({found['name']}) runs {' and '.join(found['archs'])} code; the kernels are built for {wanted}")
    return tvm.cuda(0)


def _nth(items: list[Any] | None, i: int) -> Any:
    """``items[i]``, or None where there are no items or fewer (a per-artifact option given for none or some)."""
    return items[i] if items is not None and i < len(items) else None


def _evaluator(rt_mod: Any, dev: Any, timing: dict[str, Any]) -> Any:
    """``rt_mod``'s time evaluator as ``timing`` says. With ``flush_cache`` on a CPU every run is on caches flushed of
    all arguments but the first (the input, which the kernel before it has just written; a network's kernel finds
    the rest out of cache): TVM flushes before each repeat, not before each of its ``number`` runs, so that is
    ``number × repeat`` repeats of one run each (with ``number`` runs a repeat, only the first was flushed)."""
    import tvm

    if timing.get("flush_cache") and dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type():
        return rt_mod.time_evaluator("main", dev, number=1, repeat=timing["number"] * timing["repeat"], min_repeat_ms=0, f_preproc="cache_flush_cpu_non_first_arg")
    return rt_mod.time_evaluator("main", dev, number=timing["number"], repeat=timing["repeat"], min_repeat_ms=timing["min_repeat_ms"])


def _timed(rt_mod: Any, dev: Any, timing: dict[str, Any], arguments: list[Any]) -> dict[str, Any]:
    """One kernel's result as ``timing`` asks: ``{"run_secs", "error": None}``, and ``flushed_secs`` with ``flushed_too``
    on a CPU (the same figures when ``run_secs`` were timed flushed already)."""
    import tvm

    run_secs = [float(s) for s in _evaluator(rt_mod, dev, timing)(*arguments).results]
    if not timing.get("flushed_too") or dev.dlpack_device_type() != tvm.cpu(0).dlpack_device_type():
        return {"run_secs": run_secs, "error": None}
    flushed = run_secs if timing.get("flush_cache") else [float(s) for s in _evaluator(rt_mod, dev, {**timing, "flush_cache": True})(*arguments).results]
    return {"run_secs": run_secs, "flushed_secs": flushed, "error": None}


def measure(
    artifacts: list[bytes | None], args_info: list[Any], timing: dict[str, Any], reference: bytes | None = None, rtol: float = 1e-3,
    target_text: str = '{"kind":"llvm"}', own_args: list[list[Any] | None] | None = None, checks: list[bytes | None] | None = None,
    first_is_reference: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Time each built kernel on the device of ``target_text``; with ``reference`` (the unscheduled
    kernel built for this CPU) check every output against the reference's on the same inputs first, and
    where ``timing`` says ``"untimed_past"``, time none whose checking call was that many times slower
    than the first kernel's (:data:`UNTIMED`); where it says ``"brief_first_past"``, time the first kernel
    briefly when every other was that many times faster (:func:`_brief`). Every kernel is checked
    before any is timed. With ``first_is_reference`` (a CPU kernel's default schedule: the unscheduled kernel
    itself) the first artifact's own first call gives the outputs the others are checked against, and is its
    checking call: it is neither built nor called twice. A reference this machine called in an earlier task, the same
    build on the same arguments, is not called again (:mod:`.remembered`: on this machine's disk), nor is such a first
    kernel's brief timing made again within the hour (its result says ``"remembered"``).

    ``own_args``: per artifact, the arguments it is timed on where they are not ``args_info`` (a kernel that takes its
    weights prepacked, in the layout its schedule chose); ``checks``: per artifact, the build whose outputs are checked
    in its place where it is not itself (the same kernel with the weights' rewrite kept: it takes ``args_info``).

    Returns ``{"results": [{"run_secs": [...] | None, "error": str | None}], "reference_recalled": bool, ...interval}``
    (and each timed result's ``flushed_secs`` where ``timing`` says ``flushed_too``: :func:`_timed`). The
    caller holds the device's measurement resource for the whole call.
    """
    import tvm

    if first_is_reference and (reference is not None or _nth(own_args, 0) is not None or _nth(checks, 0) is not None):
        raise ValueError("the first kernel is the reference: it takes the kernel's own arguments and no other reference is given")
    start = time.time()
    tvm_env.prepare_kernels()
    dev = device_for(target_text)
    results: list[dict[str, Any] | None] = []  # None: checked, to be timed
    with tempfile.TemporaryDirectory(prefix="schedhub-measure-") as tmp:
        arrays = random_arguments(args_info)
        tensors = [tvm.runtime.tensor(a, dev) for a in arrays]  # timing only: shared by every candidate
        remembered = memory()
        expected, recalled = _outputs_of(remembered, reference, args_info, arrays, tmp) if reference is not None else (None, False)
        checked = _Checked(tmp, args_info, arrays, expected, dev, checks, timing, rtol, remembered, first_is_reference)
        for i, artifact in enumerate(artifacts):
            if artifact is None:
                results.append({"run_secs": None, "error": "not built"})
                continue
            try:
                results.append(checked.add(i, artifact))
            except Exception as exc:  # a kernel that fails to load or run is a result
                results.append({"run_secs": None, "error": f"run failed: {_short_error(exc)}"})
        brief = checked.brief_first()
        for i, rt_mod in checked.loaded.items():
            mine = _nth(own_args, i)
            try:
                timed_on = tensors if mine is None else [tvm.runtime.tensor(a, dev) for a in random_arguments(mine)]
                if i == 0 and brief:
                    results[i] = _brief_first(checked, rt_mod, timing, timed_on, itself=_nth(checks, 0) is None and mine is None)
                else:
                    results[i] = _timed(rt_mod, dev, timing, timed_on)
            except Exception as exc:  # a kernel that fails to run is a result
                results[i] = {"run_secs": None, "error": f"run failed: {_short_error(exc)}"}
    return {"results": results, "reference_recalled": recalled or checked.first_recalled, **_interval(start)}


def _outputs_of(remembered: KernelMemory, reference: bytes, args_info: list[Any], arrays: list[np.ndarray], tmp: str) -> tuple[list[np.ndarray], bool]:
    """Every argument after one call of the ``reference`` build on this CPU on ``arrays``, and whether it was recalled
    (:meth:`.remembered.KernelMemory.recall_or_call`)."""
    import tvm

    key = kernel_key(reference, args_info, str(tvm.cpu(0)))
    known, recalled = remembered.recall_or_call(key, arrays, lambda: _run(tvm_env.load_library(reference, tmp), arrays, tvm.cpu(0)))
    return known.outputs(arrays), recalled


def _brief_first(checked: _Checked, rt_mod: Any, timing: dict[str, Any], arguments: list[Any], itself: bool) -> dict[str, Any]:
    """The first kernel timed briefly (:func:`_brief`; ``itself``: its checking call was this module's, on these
    inputs), or, where it is the reference and this machine timed the same build so in an earlier task
    (:data:`.remembered.BRIEF_KEPT_SECS`), that timing again: it says ``"remembered"``. A timing that is only read
    against candidates 10× faster (``brief_first_past``) says as much a round later; the kernel is not called again."""
    import tvm

    known = checked.first
    flushed = bool(timing.get("flushed_too")) and checked.dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
    if known is not None and (again := known.brief_timing(flushed)) is not None:
        return {**again, "error": None, "brief": True, "remembered": True}
    result = _brief(rt_mod, checked.dev, timing, arguments, checked.calls[0] if itself else None)
    if known is not None:
        checked.memory.remember_brief(known, result)
    return result


def _brief(rt_mod: Any, dev: Any, timing: dict[str, Any], arguments: list[Any], checking_secs: float | None) -> dict[str, Any]:
    """The first kernel's result timed briefly: its checking call (``checking_secs``, the same module on the same
    inputs; None: another module's, so one more call is made) and :data:`BRIEF_CALLS` more calls, and as many on
    flushed caches where ``timing`` says ``flushed_too`` on a CPU, each call timed alone (a time evaluator would add a
    warm-up call to each series). Says ``"brief"``."""
    import tvm

    on_cpu = dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
    flush = tvm.get_global_func("cache_flush_cpu_non_first_arg") if on_cpu else None

    def call(flushed: bool) -> float:
        if flushed:
            flush(*arguments)
        return _call_secs(rt_mod, dev, arguments)

    first = [checking_secs] if checking_secs is not None else [call(False)]
    result: dict[str, Any] = {"run_secs": [*first, *(call(False) for _ in range(BRIEF_CALLS))], "error": None, "brief": True}
    if timing.get("flushed_too") and on_cpu:
        result["flushed_secs"] = [call(True) for _ in range(BRIEF_CALLS)]
    return result


@dataclass
class _Checked:
    """The kernels of one measurement, loaded and checked against the reference's outputs (``expected``; None: not
    checked, unless ``first_is_reference``: the first kernel is then the reference, its outputs and checking call as
    the machine remembers that build from an earlier task (``memory``, :mod:`.remembered`: ``first``) or as it calls
    it now) before any is timed: each one to be timed (``loaded``) and its checking call's seconds (``calls``)."""

    tmp: str
    args_info: list[Any]
    arrays: list[np.ndarray]
    expected: list[np.ndarray] | None
    dev: Any
    checks: list[bytes | None] | None
    timing: dict[str, Any]
    rtol: float
    memory: KernelMemory
    first_is_reference: bool = False
    first: Remembered | None = None
    first_recalled: bool = False
    loaded: dict[int, Any] = field(default_factory=dict)
    calls: dict[int, float] = field(default_factory=dict)

    def add(self, i: int, artifact: bytes) -> dict[str, Any] | None:
        """Load kernel ``i`` and check it: None when it is to be timed, else its result (a mismatch, or :data:`UNTIMED`)."""
        rt_mod = tvm_env.load_library(artifact, self.tmp)
        if i == 0 and self.first_is_reference:  # its first call is the reference's: nothing to check it against
            key = kernel_key(artifact, self.args_info, str(self.dev))
            self.first, self.first_recalled = self.memory.recall_or_call(key, self.arrays, lambda: _run(rt_mod, self.arrays, self.dev))
            self.expected, self.calls[i] = self.first.outputs(self.arrays), self.first.call_secs
        elif self.first_is_reference and self.expected is None:
            return {"run_secs": None, "error": "not checked: the first kernel, the reference, did not run"}
        elif self.expected is not None:
            check = _nth(self.checks, i)
            outputs, call_secs = _run(tvm_env.load_library(check, self.tmp) if check is not None else rt_mod, self.arrays, self.dev)
            if problem := _mismatch(self.expected, outputs, self.rtol):
                return {"run_secs": None, "error": problem}
            first = next(iter(self.calls.values()), None)
            past, margin = self.timing.get("untimed_past"), self.timing.get("untimed_margin_secs", UNTIMED_MARGIN_SECS)
            if first is not None and past and call_secs > past * first + margin:
                return {"run_secs": None, "error": f"{UNTIMED}: one call took {call_secs:.3g} s, {call_secs / first:.3g}× the first kernel's",
                        "untimed_call_secs": call_secs}  # fmt: skip
            self.calls[i] = call_secs
        self.loaded[i] = rt_mod
        return None

    def brief_first(self) -> bool:
        """Whether the first kernel is timed briefly (the timing's ``"brief_first_past"``): its checking call took at least
        :data:`BRIEF_AT_LEAST_SECS` and that many times each other checking call of a kernel to be timed."""
        past = self.timing.get("brief_first_past")
        others = [secs for i, secs in self.calls.items() if i]
        return bool(past) and 0 in self.calls and bool(others) and self.calls[0] >= BRIEF_AT_LEAST_SECS and self.calls[0] >= past * max(others)
