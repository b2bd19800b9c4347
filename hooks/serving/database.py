"""RegistryDatabase: a MetaSchedule database whose records live in a schedhub registry.

Queries go through a :class:`HookSession` (cache, batching, trust). Committed tuning records are pushed to the
registry and read back by this process at once, so the database also serves as a tuning target. It is never loaded
whole.

One rule in every method: a record answers for a module only under its exact key, the module's workload on one
target under this compiler. The target is the query's own (``query_*``), else the one in scope (``with target:``;
``has_workload`` and ``get_top_k`` answer none without one). Transfers from other shapes, targets or compiler
builds are the compile hook's (``use(...)``), never a database answer. Every answer is best first by mean time, this
process's commits among the registry's records, each trace once at its best time.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from schedhub.registry import Record

from ..metaschedule.guard import check_trace_size
from ..kernels.identity import plain_json
from ..metaschedule.msdb import trace_text, tuning_record
from .session import HookSession

log = logging.getLogger("schedhub")


def measured(run_secs: list[float]) -> bool:
    """Whether ``run_secs`` are a measurement the registry keeps: some, each finite and above 0 (MetaSchedule marks a
    failed run 1e10 s; 0.0 is no time at all)."""
    return bool(run_secs) and all(math.isfinite(s) and 0 < s < 1e9 for s in run_secs)


class TraceRefused(RuntimeError):  # not ValueError: what a caller through TVM's FFI sees as it is
    """A committed record whose trace the hook would refuse to replay (too long, or holding what no record may)."""


@derived_object
class RegistryDatabase(ms.database.PyDatabase):
    def __init__(self, session: HookSession) -> None:
        super().__init__()
        self.session = session
        self._workloads: dict[int, list[ms.database.Workload]] = {}  # committed workloads by structural hash

    # -- workloads -------------------------------------------------------------------------

    def _committed_workload(self, mod: tvm.IRModule) -> ms.database.Workload | None:
        return next((w for w in self._workloads.get(tvm_ffi.structural_hash(mod), []) if tvm_ffi.structural_equal(w.mod, mod)), None)

    def has_workload(self, mod: tvm.IRModule) -> bool:
        """Committed here (``commit_workload``, ``commit_tuning_record``), or with records under the target in scope."""
        if self._committed_workload(mod) is not None:
            return True
        target = tvm.target.Target.current(allow_none=True)
        return target is not None and bool(self.session.records(self.session.identity(mod, target)))

    def commit_workload(self, mod: tvm.IRModule) -> ms.database.Workload:
        found = self._committed_workload(mod)
        if found is None:
            found = ms.database.Workload(mod)
            self._workloads.setdefault(tvm_ffi.structural_hash(mod), []).append(found)
        return found

    # -- records ---------------------------------------------------------------------------

    def commit_tuning_record(self, record: ms.database.TuningRecord) -> None:
        """Push ``record`` to the registry and serve it here from now on; not kept where :func:`measured` says its
        ``run_secs`` are no measurement. The workload is canonicalized once per session (:meth:`HookSession.identity`).
        A trace no compile would replay (past the session's bounds: :func:`.guard.check_trace_size`) is refused here,
        with the bound it passes, rather than kept and never answered."""
        secs = [float(s) for s in plain_json(record.run_secs or [])]
        if not measured(secs):
            return
        text = trace_text(record.trace)
        try:
            check_trace_size(text, self.session.limits)
        except ValueError as exc:  # ScheduleTooCostly among them
            raise TraceRefused(f"this record would never be answered, so it is not committed: {exc}") from None
        self.commit_workload(record.workload.mod)
        identity = self.session.identity(record.workload.mod, record.target)
        pushed = Record(identity, text, secs, {"source": "RegistryDatabase"})
        self.session.registry.put(pushed)
        self.session.committed(pushed)  # read-your-writes: the next query sees it

    def _exact(self, mod: tvm.IRModule, target: tvm.target.Target | None) -> list[Record]:
        """The records of ``mod``'s exact key under ``target``, best first ([] without a target)."""
        return self.session.records(self.session.identity(mod, target)) if target is not None else []

    def get_top_k(self, workload: ms.database.Workload, top_k: int) -> list[ms.database.TuningRecord]:
        if top_k <= 0:
            return []
        return self._replayed(self._exact(workload.mod, tvm.target.Target.current(allow_none=True)), workload.mod, top_k)

    def get_all_tuning_records(self) -> list[ms.database.TuningRecord]:
        """What this process looked up (that its trust serves) and committed, each key's best first."""
        looked_up = [r for records in self.session.cached().values() for r in records if self.session.trusts(r)]
        own = self.session.own_commits()
        mine = {r.trace_id for r in own}
        return self._replayed([*own, *(r for r in looked_up if r.trace_id not in mine)])

    def _replayed(self, records: list[Record], mod: tvm.IRModule | None = None, limit: int | None = None) -> list[ms.database.TuningRecord]:
        """``records`` as TuningRecords on ``mod`` (default: each one's own workload), replayed within the session's
        bounds, the first ``limit`` that do; a record that does not replay within them is left out, as the hook's own
        pass leaves it."""
        out = []
        for record in records:
            if limit is not None and len(out) >= limit:
                break
            try:
                out.append(tuning_record(record, mod, limits=self.session.limits))
            except Exception as exc:  # TVM's errors, ScheduleTooCostly, Unlaunchable: someone else's data
                log.debug("schedhub: %s left out of the database's answer: %s", record.trace_id, str(exc)[:200])
        return out

    def query_tuning_record(self, mod: tvm.IRModule, target: tvm.target.Target, workload_name: str | None = None) -> Any:
        found = self._replayed(self._exact(mod, target), mod, 1)
        return found[0] if found else None

    def query_schedule(self, mod: tvm.IRModule, target: tvm.target.Target, workload_name: str | None = None) -> Any:
        record = self.query_tuning_record(mod, target, workload_name)
        if record is None:
            return None
        sch = tvm.s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch

    def query_ir_module(self, mod: tvm.IRModule, target: tvm.target.Target, workload_name: str | None = None) -> Any:
        sch = self.query_schedule(mod, target, workload_name)
        return None if sch is None else sch.mod

    def __len__(self) -> int:
        return 1 + len(self.session.cached())  # never 0: the zero pipeline skips an empty database
