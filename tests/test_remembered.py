"""A measurement worker remembers, between its tasks, a reference's outputs and the default's brief timing
(``tuner.remembered``): a tuning round of a kernel does not call its unscheduled kernel again, and a candidate that
computes otherwise is still refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tvm
from tvm import te

from schedhub.hooks.identity import workload_identity
from schedhub.tuner import kernels
from schedhub.tuner.remembered import KernelMemory, kernel_key

TARGET = {"kind": "llvm", "mcpu": "znver1", "num-cores": 2}
#: The default's brief timing, as publishing asks for it (every candidate 10x faster), here with a few repeats.
TIMING = {"number": 2, "repeat": 2, "min_repeat_ms": 0, "flushed_too": True, "brief_first_past": 10.0}


def _matmul(n: int, extra: float = 0.0, scheduled: bool = False) -> Any:
    a, b = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    r = te.reduce_axis((0, n), name="k")
    func = te.create_prim_func([a, b, te.compute((n, n), lambda i, j: te.sum(a[i, r] * b[r, j] + extra / n, axis=r), name="C")])
    if not scheduled:
        return func
    sch = tvm.s_tir.Schedule(func)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    sch.reorder(i, k, j)
    sch.parallel(i)
    sch.vectorize(j)
    return sch.mod["main"]


def _built(func: Any, target: str) -> bytes:
    return kernels.build(tvm.ir.save_json(tvm.IRModule({"main": func})), target)["artifact"]


@pytest.fixture
def counted_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A fresh memory for the test, and the kernel calls the measurement makes one at a time: each checking call
    says "check" and "time", each call of a brief timing "time" alone (:func:`_brief_calls`)."""
    monkeypatch.setattr(kernels, "MEMORY", KernelMemory())
    calls: list[str] = []
    run, call_secs = kernels._run, kernels._call_secs

    def counted_run(*args: Any) -> Any:
        calls.append("check")
        return run(*args)

    def counted_call_secs(*args: Any) -> float:
        calls.append("time")
        return call_secs(*args)

    monkeypatch.setattr(kernels, "_run", counted_run)
    monkeypatch.setattr(kernels, "_call_secs", counted_call_secs)
    return calls


def _brief_calls(calls: list[str]) -> int:
    return calls.count("time") - calls.count("check")


def test_a_worker_remembers_only_what_a_kernel_changed_within_its_byte_budget() -> None:
    """An entry holds the arguments a call changed (the others come back as the inputs given); past the byte budget
    the least recently used entry goes first, and one that alone exceeds it is not kept."""
    memory = KernelMemory(limit=3 * 8 * 4)
    inputs = [np.arange(8, dtype="float32"), np.zeros(8, dtype="float32")]
    entry = memory.remember("a", inputs, [inputs[0].copy(), np.ones(8, dtype="float32")], 0.5)
    assert entry.changed[0] is None and entry.nbytes == 32
    again = entry.outputs(inputs)
    assert again[0] is inputs[0] and again[1].tolist() == [1.0] * 8
    memory.remember("b", inputs, [inputs[0] + 1, inputs[1]], 0.1)
    memory.remember("c", inputs, [inputs[0] + 2, inputs[1]], 0.1)
    assert memory.get("a") is not None  # a is now the most recently used: b goes next
    memory.remember("d", inputs, [inputs[0] + 3, inputs[1]], 0.1)
    assert memory.get("b") is None and all(memory.get(k) is not None for k in "acd")
    memory.remember("huge", [np.zeros(64, dtype="float32")], [np.ones(64, dtype="float32")], 0.1)
    assert memory.get("huge") is None and len(memory) == 3
    key = kernel_key(b"build", [["TENSOR", "float32", [8]]], "cpu(0)")
    assert key != kernel_key(b"build", [["TENSOR", "float32", [9]]], "cpu(0)") != kernel_key(b"other", [["TENSOR", "float32", [8]]], "cpu(0)")


def test_a_default_timed_briefly_in_an_earlier_task_is_not_called_again(counted_calls: list[str]) -> None:
    """On a CPU the default (the unscheduled kernel) is the reference. The first measurement calls it for the
    reference outputs, then briefly times it beside a candidate 10x faster; a second measurement of the same builds
    in this worker calls it not at all, gives the same brief timing ("remembered"), and still refuses a kernel that
    computes otherwise. A timing that asks for another kind of brief timing (no flushed calls) times it again."""
    ident = workload_identity(_matmul(256), TARGET, "matmul_nn")
    default, fast, wrong = (_built(f, ident.target) for f in (_matmul(256), _matmul(256, scheduled=True), _matmul(256, 1.0, scheduled=True)))
    first = kernels.measure([default, fast, wrong], ident.args_info, TIMING, target_text=ident.target, first_is_reference=True)["results"]
    assert first[0].get("brief") and not first[0].get("remembered"), first[0]
    assert first[1]["run_secs"] and "differs from the unscheduled build" in first[2]["error"]
    assert counted_calls.count("check") == 3 and _brief_calls(counted_calls) == 2 * kernels.BRIEF_CALLS  # warm and flushed
    counted_calls.clear()
    second = kernels.measure([default, fast, wrong], ident.args_info, TIMING, target_text=ident.target, first_is_reference=True)["results"]
    assert second[0]["remembered"] and second[0]["run_secs"] == first[0]["run_secs"] and second[0]["flushed_secs"] == first[0]["flushed_secs"]
    assert second[1]["run_secs"] and "differs from the unscheduled build" in second[2]["error"]
    assert counted_calls.count("check") == 2 and _brief_calls(counted_calls) == 0, counted_calls  # the candidates' checks alone
    counted_calls.clear()
    warm_only = kernels.measure([default, fast], ident.args_info, {**TIMING, "flushed_too": False}, target_text=ident.target, first_is_reference=True)
    assert not warm_only["results"][0].get("remembered") and "flushed_secs" not in warm_only["results"][0]
    assert counted_calls.count("check") == 1 and _brief_calls(counted_calls) == kernels.BRIEF_CALLS


def test_a_reference_called_in_an_earlier_task_is_not_called_again(counted_calls: list[str]) -> None:
    """A reference given apart from the kernels (a GPU kernel's: the unscheduled kernel on the host) is called once
    per worker: the second measurement checks against its remembered outputs and still refuses the wrong kernel. A
    reference of other arguments is another entry."""
    ident = workload_identity(_matmul(64), TARGET, "matmul_nn")
    reference, right, wrong = (_built(f, ident.target) for f in (_matmul(64), _matmul(64, scheduled=True), _matmul(64, 1.0, scheduled=True)))
    timing = {"number": 1, "repeat": 2, "min_repeat_ms": 0}
    for calls in (3, 2):  # the reference's, then each kernel's checking call; then only the kernels'
        counted_calls.clear()
        answer = kernels.measure([right, wrong], ident.args_info, timing, reference=reference, target_text=ident.target)["results"]
        assert answer[0]["run_secs"] and "differs from the unscheduled build" in answer[1]["error"], answer
        assert counted_calls.count("check") == calls
    assert kernels.MEMORY.get(kernel_key(reference, ident.args_info, str(tvm.cpu(0)))) is not None
    assert kernels.MEMORY.get(kernel_key(reference, [["TENSOR", "float32", [64, 65]], *ident.args_info[1:]], str(tvm.cpu(0)))) is None
