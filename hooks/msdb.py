"""Records ⇄ MetaSchedule: TuningRecords, and JSONDatabase directories for push and pull."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from schedhub.registry import Record

from .identity import plain_json, target_from_text, workload_identity, workload_module


def record_from_tuning_record(tr: ms.database.TuningRecord, op: str | None = None, provenance: dict[str, Any] | None = None) -> Record:
    """A registry record from a MetaSchedule TuningRecord (its workload gives the identity)."""
    run_secs = [float(s) for s in plain_json(tr.run_secs or [])]
    trace, _, target_json, _ = tr.as_json()
    identity = workload_identity(tr.workload.mod, plain_json(target_json), op)
    return Record(identity, json.dumps(trace, separators=(",", ":")), run_secs, dict(provenance or {}))


def tuning_record(record: Record, mod: tvm.IRModule | None = None, args_info: list[Any] | None = None) -> ms.database.TuningRecord:
    """The record as a TuningRecord on ``mod`` (default: its own workload), replaying the trace.

    ``args_info``: the module's own, when the record was tuned for another shape (a transfer).
    Raises TVM's error when the trace does not apply to the module.
    """
    workload = ms.database.Workload(mod if mod is not None else workload_module(record.identity.workload))
    info = args_info if args_info is not None else record.identity.args_info
    as_json = [json.loads(record.trace), record.run_secs, json.loads(record.identity.target), info]
    return ms.database.TuningRecord.from_json(as_json, workload)


def normalize_mod(func: tvm.IRModule | Any) -> tvm.IRModule:
    """The module MetaSchedule replays traces on (and MetaScheduleApplyDatabase queries with)."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    return _normalize_mod(func)


def replayed(mod: tvm.IRModule, trace_text: str) -> tvm.IRModule:
    """``mod`` with a trace's JSON text applied (postprocessing instructions included): one replay."""
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(json.loads(trace_text), sch)
    return sch.mod


def scheduled(mod: tvm.IRModule, trace: Any) -> tvm.IRModule:
    """``mod`` with ``trace`` applied (postprocessing instructions included)."""
    sch = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def read_json_database(work_dir: str | os.PathLike[str], provenance: dict[str, Any] | None = None) -> Iterator[Record]:
    """Records of a MetaSchedule JSONDatabase directory; failed measurements are skipped."""
    directory = Path(work_dir)
    if not (directory / "database_tuning_record.json").is_file():
        raise FileNotFoundError(f"{directory} is not a MetaSchedule JSONDatabase (no database_tuning_record.json)")
    db = ms.database.JSONDatabase(work_dir=str(directory), allow_missing=False)
    prov = {"source": "metaschedule-json", **(provenance or {})}
    for tr in db.get_all_tuning_records():
        secs = [float(s) for s in plain_json(tr.run_secs or [])]
        if secs and all(math.isfinite(s) and 0 < s < 1e9 for s in secs):  # 1e10 marks a failed run
            yield record_from_tuning_record(tr, provenance=prov)


def write_json_database(work_dir: str | os.PathLike[str], records: Iterable[Record]) -> int:
    """Append records to a MetaSchedule JSONDatabase directory (created if absent)."""
    directory = Path(work_dir)
    directory.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(directory))
    count = 0
    for record in records:
        workload = db.commit_workload(workload_module(record.identity.workload))
        tr = tuning_record(record, workload.mod)
        db.commit_tuning_record(ms.database.TuningRecord(tr.trace, workload, tr.run_secs, target_from_text(record.identity.target), tr.args_info))
        count += 1
    return count
