"""A machine's measurement tasks remember, between rounds, a reference's outputs and the default's brief timing
(``tuner.execution.remembered``): a tuning round of a kernel does not call its unscheduled kernel again, and a candidate that
computes otherwise is still refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tvm
from tvm import te

from schedhub.hooks.kernels.identity import workload_identity
from schedhub.tuner.execution import kernels
from schedhub.hooks.kernels.cache import CACHE_ENV
from schedhub.tuner.execution.remembered import BRIEF_KEPT_SECS, FOLDER, KernelMemory, forget_all, kernel_key, memory

TARGET = {"kind": "llvm", "mcpu": "znver1", "num-cores": 2}
#: The default's brief timing as publishing asks for it, here with a few repeats and for candidates 3x faster, not
#: publishing's 10x: the unscheduled 256 matmul takes ~16 ms and a candidate's first, checking call took more than
#: 1.6 ms on a busy CI machine, and this file is about what is remembered, not where the line is drawn.
TIMING = {"number": 2, "repeat": 2, "min_repeat_ms": 0, "flushed_too": True, "brief_first_past": 3.0}


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
def counted_calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """A fresh kernel cache for the test, and the kernel calls the measurement makes one at a time: each checking call
    says "check" and "time", each call of a brief timing "time" alone (:func:`_brief_calls`)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
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


def test_a_machine_remembers_only_what_a_kernel_changed_and_forgets_what_it_cannot_read(tmp_path: Path) -> None:
    """An entry holds the arguments a call changed (the others come back as the inputs given) and, once made, its brief
    timing for an hour. A file cut short, or one whose arrays do not fit the arguments, is a miss; with no folder
    nothing is remembered."""
    memory = KernelMemory(tmp_path)
    inputs = [np.arange(8, dtype="float32"), np.zeros(8, dtype="float32")]
    key = kernel_key(b"build", [["TENSOR", "float32", [8]]] * 2, "cpu(0)")
    assert key != kernel_key(b"build", [["TENSOR", "float32", [9]]] * 2, "cpu(0)") != kernel_key(b"other", [["TENSOR", "float32", [8]]] * 2, "cpu(0)")
    assert memory.recall(key, inputs) is None
    entry = memory.remember(key, inputs, [inputs[0].copy(), np.ones(8, dtype="float32")], 0.5)
    assert entry.changed[0] is None
    again = memory.recall(key, inputs)
    assert again is not None and again.call_secs == 0.5 and again.brief is None
    outputs = again.outputs(inputs)
    assert outputs[0] is inputs[0] and outputs[1].tolist() == [1.0] * 8
    memory.remember_brief(again, {"run_secs": [0.5, 0.4], "flushed_secs": [0.6], "error": None, "brief": True})
    timed = memory.recall(key, inputs)
    assert timed is not None and timed.brief_timing(flushed=True) == {"run_secs": [0.5, 0.4], "flushed_secs": [0.6]}
    assert timed.brief_timing(flushed=False) is None  # asked without flushed calls: made again
    assert timed.brief_timing(flushed=True, now=timed.brief_at + BRIEF_KEPT_SECS + 1) is None  # an hour on: made again
    assert memory.recall(key, [inputs[0], np.zeros(9, dtype="float32")]) is None
    path = tmp_path / FOLDER / f"{key}.npz"
    whole = path.read_bytes()
    path.write_bytes(whole[:100])
    assert memory.recall(key, inputs) is None
    with open(path, "wb") as f:  # one array, not an archive of them
        np.save(f, inputs[0])
    assert memory.recall(key, inputs) is None
    with open(path, "wb") as f:  # an argument index that is not one
        np.savez(f, changed=np.array([-1]), **{"arg-1": inputs[1]}, call_secs=np.float64(0.1))
    assert memory.recall(key, inputs) is None
    path.write_bytes(whole)
    assert memory.recall(key, inputs) is not None
    nowhere = KernelMemory(None)
    nowhere.remember(key, inputs, inputs, 0.1)
    assert nowhere.recall(key, inputs) is None


def test_a_default_timed_briefly_in_an_earlier_task_is_not_called_again(counted_calls: list[str]) -> None:
    """On a CPU the default (the unscheduled kernel) is the reference. The first measurement calls it for the
    reference outputs, then briefly times it beside candidates several times faster; a second measurement of the same builds
    on this machine calls it not at all, gives the same brief timing ("remembered"), and still refuses a kernel that
    computes otherwise. A timing that asks for another kind of brief timing (no flushed calls) times it again."""
    ident = workload_identity(_matmul(256), TARGET, "matmul_nn")
    default, fast, wrong = (_built(f, ident.target) for f in (_matmul(256), _matmul(256, scheduled=True), _matmul(256, 1.0, scheduled=True)))
    answer = kernels.measure([default, fast, wrong], ident.args_info, TIMING, target_text=ident.target, first_is_reference=True)
    first = answer["results"]
    assert not answer["reference_recalled"]
    assert first[0].get("brief") and not first[0].get("remembered"), first[0]
    assert first[1]["run_secs"] and "differs from the unscheduled build" in first[2]["error"]
    assert counted_calls.count("check") == 3 and _brief_calls(counted_calls) == 2 * kernels.BRIEF_CALLS  # warm and flushed
    counted_calls.clear()
    answer = kernels.measure([default, fast, wrong], ident.args_info, TIMING, target_text=ident.target, first_is_reference=True)
    second = answer["results"]
    assert answer["reference_recalled"]
    assert second[0]["remembered"] and second[0]["run_secs"] == first[0]["run_secs"] and second[0]["flushed_secs"] == first[0]["flushed_secs"]
    assert second[1]["run_secs"] and "differs from the unscheduled build" in second[2]["error"]
    assert counted_calls.count("check") == 2 and _brief_calls(counted_calls) == 0, counted_calls  # the candidates' checks alone
    counted_calls.clear()
    warm_only = kernels.measure([default, fast], ident.args_info, {**TIMING, "flushed_too": False}, target_text=ident.target, first_is_reference=True)
    assert not warm_only["results"][0].get("remembered") and "flushed_secs" not in warm_only["results"][0]
    assert counted_calls.count("check") == 1 and _brief_calls(counted_calls) == kernels.BRIEF_CALLS


def test_a_reference_called_in_an_earlier_task_is_not_called_again(counted_calls: list[str], tmp_path: Path) -> None:
    """A reference given apart from the kernels (a GPU kernel's: the unscheduled kernel on the host) is called once
    per machine: the second measurement checks against its remembered outputs and still refuses the wrong kernel."""
    ident = workload_identity(_matmul(64), TARGET, "matmul_nn")
    reference, right, wrong = (_built(f, ident.target) for f in (_matmul(64), _matmul(64, scheduled=True), _matmul(64, 1.0, scheduled=True)))
    timing = {"number": 1, "repeat": 2, "min_repeat_ms": 0}
    for calls in (3, 2):  # the reference's, then each kernel's checking call; then only the kernels'
        counted_calls.clear()
        measured = kernels.measure([right, wrong], ident.args_info, timing, reference=reference, target_text=ident.target)
        answer = measured["results"]
        assert answer[0]["run_secs"] and "differs from the unscheduled build" in answer[1]["error"], answer
        assert counted_calls.count("check") == calls and measured["reference_recalled"] == (calls == 2)
    assert (tmp_path / FOLDER / f"{kernel_key(reference, ident.args_info, str(tvm.cpu(0)))}.npz").is_file()


def test_a_benchmark_arm_forgets_what_the_machine_remembers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``forget_all`` empties this machine's memory (the kernel cache's folder), and only that: an arm of a benchmark
    then pays for its references as a machine that never tuned these kernels does."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    inputs = [np.zeros(4, dtype="float32")]
    memory().remember("k", inputs, [np.ones(4, dtype="float32")], 0.1)
    (tmp_path / "identity").mkdir()
    assert memory().recall("k", inputs) is not None
    forget_all()
    assert memory().recall("k", inputs) is None and (tmp_path / "identity").is_dir()
