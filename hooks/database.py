"""RegistryDatabase: a MetaSchedule database whose records live in a schedhub registry.

Queries go through a :class:`HookSession` (cache, batching, fallbacks). Committed tuning records
are pushed to the registry, so the database also serves as a tuning target. It is never loaded
whole: ``get_all_tuning_records`` returns what this process has looked up.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from .msdb import record_from_tuning_record, tuning_record
from .session import HookSession

log = logging.getLogger("schedhub")


@derived_object
class RegistryDatabase(ms.database.PyDatabase):
    def __init__(self, session: HookSession) -> None:
        super().__init__()
        self.session = session

    def has_workload(self, mod: tvm.IRModule) -> bool:
        target = tvm.target.Target.current(allow_none=True)
        return target is not None and bool(self.session.records(self.session.identity(mod, target)))

    def commit_workload(self, mod: tvm.IRModule) -> ms.database.Workload:
        return ms.database.Workload(mod)

    def commit_tuning_record(self, record: ms.database.TuningRecord) -> None:
        secs = [float(s) for s in record.run_secs or []]
        if secs and all(0 < s < 1e9 for s in secs):  # 1e10 marks a failed run
            pushed = record_from_tuning_record(record, provenance={"source": "RegistryDatabase"})
            self.session.registry.put(pushed)
            self.session.committed(pushed)  # read-your-writes: the next query sees it

    def get_top_k(self, workload: ms.database.Workload, top_k: int) -> list[ms.database.TuningRecord]:
        target = tvm.target.Target.current(allow_none=True)
        if target is None:
            return []
        return self._replayed(self.session.records(self.session.identity(workload.mod, target))[:top_k], workload.mod)

    def get_all_tuning_records(self) -> list[ms.database.TuningRecord]:
        return self._replayed([r for records in self.session.cached().values() for r in records])

    def _replayed(self, records: list[Any], mod: tvm.IRModule | None = None) -> list[ms.database.TuningRecord]:
        """``records`` as TuningRecords on ``mod`` (default: each one's own workload), replayed within the session's
        bounds; a record that does not replay within them is left out, as the hook's own pass leaves it."""
        out = []
        for record in records:
            try:
                out.append(tuning_record(record, mod, limits=self.session.limits))
            except Exception as exc:  # TVM's errors, ScheduleTooCostly, Unlaunchable: someone else's data
                log.debug("schedhub: %s left out of the database's answer: %s", record.trace_id, str(exc)[:200])
        return out

    def query_tuning_record(self, mod: tvm.IRModule, target: tvm.target.Target, workload_name: str | None = None) -> Any:
        op = workload_name if workload_name and workload_name != "main" else None
        return self.session.best_tuning_record(mod, target, op)

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
