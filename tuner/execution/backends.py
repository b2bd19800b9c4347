"""MetaSchedule Builder and Runner that hand their work to Ray tasks (see :mod:`.cluster`)."""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from schedhub.hooks.kernels.identity import plain_json, target_text

from . import cluster
from .kernels import TUNING_TIMING

#: Candidates per measurement task: the device is shared between jobs at this granularity.
MEASURE_CHUNK = 8
#: Bytes of built kernels a job keeps for publishing (:class:`BuiltKernels`), the oldest dropped first: a round's 16
#: CPU candidates take a few MB, CUDA ones (unrolled up to 600,000 characters of source) more
KEPT_BYTES = 256 << 20


class Timeline:
    """Wall-clock intervals of the build and measurement tasks one job ran, each with the job's stage then
    (``stage``, set by the job: "warm start", "search", "publish")."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.stage = "search"
        self.events: list[dict[str, Any]] = []

    def add(self, kind: str, answer: dict[str, Any], count: int = 1) -> None:
        """One task's interval (``answer``: what the task returned); a measurement that recalled its reference's outputs
        (``kernels.measure``'s ``reference_recalled``) says ``"recalled"``."""
        self.events.append({"job": self.job, "kind": kind, "stage": self.stage, "start": answer["start"], "end": answer["end"], "host": answer["host"],
                            "pid": answer["pid"], "count": count, **({"recalled": True} if answer.get("reference_recalled") else {})})  # fmt: skip


class BuiltKernels:
    """The kernels one job built, by their module's structure: publishing times the builds its search timed instead of
    building the same modules again (a CUDA candidate's build takes seconds). At most ``limit`` bytes, oldest out first."""

    def __init__(self, limit: int = KEPT_BYTES) -> None:
        self.limit = limit
        self._held: OrderedDict[int, tuple[Any, bytes]] = OrderedDict()
        self._bytes = 0

    def add(self, mod: Any, artifact: bytes) -> None:
        import tvm_ffi

        key = tvm_ffi.structural_hash(mod)
        if (old := self._held.pop(key, None)) is not None:
            self._bytes -= len(old[1])
        self._held[key] = (mod, artifact)
        self._bytes += len(artifact)
        while self._bytes > self.limit and self._held:
            self._bytes -= len(self._held.popitem(last=False)[1][1])

    def get(self, mod: Any) -> bytes | None:
        """The artifact built of a module structurally equal to ``mod``, or None."""
        import tvm_ffi

        held = self._held.get(tvm_ffi.structural_hash(mod))
        return held[1] if held is not None and tvm_ffi.structural_equal(held[0], mod) else None


@derived_object
class RayBuilder(ms.builder.PyBuilder):
    """Builds every candidate of a batch as its own Ray task; artifacts land in ``artifact_root``, and each one built is
    kept in ``kept`` (:class:`BuiltKernels`).

    A candidate whose build is still running ``timeout_secs`` after the builder starts waiting
    for it is cancelled and reported as failed (LLVM can take practically forever on some
    unrolled candidates; MetaSchedule's LocalBuilder gives each 30 s).
    """

    def __init__(self, artifact_root: str, timeline: Timeline, timeout_secs: float = cluster.BUILD_TIMEOUT_SECS) -> None:
        super().__init__()
        self.artifact_root = artifact_root
        self.timeline = timeline
        self.timeout_secs = timeout_secs
        self.kept = BuiltKernels()

    def build(self, build_inputs: list[ms.builder.BuilderInput]) -> list[ms.builder.BuilderResult]:
        refs = []
        for bi in build_inputs:
            text = target_text(bi.target)
            refs.append(cluster.submit("build", placed=cluster.placement("build", text), mod_json=tvm.ir.save_json(bi.mod), target_text=text))
        results = []
        for bi, ref in zip(build_inputs, refs):
            answer = cluster.build_result(ref, self.timeout_secs)
            if "start" in answer:  # it ran (not timed out nor lost)
                self.timeline.add("build", answer)
            if answer["artifact"] is None:
                results.append(ms.builder.BuilderResult(None, answer["error"]))
            else:
                self.kept.add(bi.mod, answer["artifact"])
                results.append(ms.builder.BuilderResult(self._save(answer["artifact"]), None))
        return results

    def _save(self, data: bytes) -> str:
        # MetaSchedule's RemoveBuildArtifact deletes the artifact's directory: one directory each.
        path = os.path.join(tempfile.mkdtemp(dir=self.artifact_root), "kernel.so")
        with open(path, "wb") as f:
            f.write(data)
        return path


class _Chunk:
    """One measurement task's answer, fetched once for all the futures that share it."""

    def __init__(self, ref: Any, size: int, timeline: Timeline) -> None:
        self.ref, self.size, self.timeline = ref, size, timeline
        self._answer: dict[str, Any] | None = None

    def done(self) -> bool:
        import ray

        return self._answer is not None or bool(ray.wait([self.ref], timeout=0)[0])

    def result(self, index: int) -> ms.runner.RunnerResult:
        if self._answer is None:
            try:
                self._answer = cluster.result(self.ref)
                self.timeline.add("measure", self._answer, self.size)
            except Exception as exc:  # the task died after Ray's retries: every candidate failed
                self._answer = {"results": [{"run_secs": None, "error": f"measurement task lost: {exc}"}] * self.size}
        item = self._answer["results"][index]
        return ms.runner.RunnerResult(item["run_secs"], item["error"])


@derived_object
class RayRunner(ms.runner.PyRunner):
    """Times candidates in measurement tasks that hold the device resource, a chunk at a time.

    ``target``: the canonical target text of the kernels (it decides the device and what the task holds)."""

    def __init__(self, timeline: Timeline, target: str, timing: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.timeline = timeline
        self.target = target
        self.placed = cluster.placement("measure", target)
        self.timing = dict(timing or TUNING_TIMING)

    def run(self, runner_inputs: list[ms.runner.RunnerInput]) -> list[ms.runner.RunnerFuture]:
        futures = []
        for lo in range(0, len(runner_inputs), MEASURE_CHUNK):
            batch = runner_inputs[lo : lo + MEASURE_CHUNK]
            artifacts = [read_artifact(ri.artifact_path) for ri in batch]
            each = [[plain_json(a.as_json()) for a in ri.args_info] for ri in batch]  # a schedule that prepacks weights chose their layout
            own = [args if args != each[0] else None for args in each]
            ref = cluster.submit("measure", placed=self.placed, artifacts=artifacts, args_info=each[0], timing=self.timing, target_text=self.target,
                                 **({"own_args": own} if any(own) else {}))  # fmt: skip
            chunk = _Chunk(ref, len(batch), self.timeline)
            for i in range(len(batch)):
                futures.append(ms.runner.RunnerFuture(f_done=chunk.done, f_result=lambda i=i, chunk=chunk: chunk.result(i)))
        return futures


def read_artifact(path: str) -> bytes | None:
    """A built kernel's bytes (None when the file is gone: MetaSchedule removes its candidates' builds)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None
