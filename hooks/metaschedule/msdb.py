"""Records ⇄ MetaSchedule: TuningRecords, and JSONDatabase directories for push and pull.

A JSONDatabase has no room for op names or provenance, so a pull writes them beside it
(``schedhub_records.jsonl``: workload id, trace id, op, provenance) and a push reads them back: a
round trip through MetaSchedule keeps both. Lines that do not parse or do not match are ignored;
what they claim is validated like any record.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api as ms_ffi

from schedhub.registry import Record, RegistryError

from ..kernels.errors import TVM_ERRORS
from .guard import InconsistentLaunch, ScheduleLimits, Unlaunchable, check_scheduled, check_trace_size
from ..kernels.identity import block_names, plain_json, target_from_text, workload_identity, workload_module
from ..build.lowering import lowering_error
from .ranking import retiled


def record_from_tuning_record(tr: ms.database.TuningRecord, op: str | None = None, provenance: dict[str, Any] | None = None) -> Record:
    """A registry record from a MetaSchedule TuningRecord (its workload gives the identity)."""
    run_secs = [float(s) for s in plain_json(tr.run_secs or [])]
    trace, _, target_json, _ = tr.as_json()
    identity = workload_identity(tr.workload.mod, plain_json(target_json), op)
    return Record(identity, json.dumps(trace, separators=(",", ":")), run_secs, dict(provenance or {}))


def tuning_record(record: Record, mod: tvm.IRModule | None = None, args_info: list[Any] | None = None,
                  limits: ScheduleLimits | None = None) -> ms.database.TuningRecord:  # fmt: skip
    """The record as a TuningRecord on ``mod`` (default: its own workload), replaying the trace within ``limits``
    (default: :class:`.guard.ScheduleLimits`), launchable on a GPU (:func:`replay_launchable`).

    ``args_info``: the module's own, when the record was tuned for another shape (a transfer).
    Raises TVM's error when the trace does not apply to the module, with the instruction and block
    named (``TuningRecord.from_json`` replays with TVM's error rendering off: "(not rendered)").
    """
    mod = mod if mod is not None else workload_module(record.identity.workload)
    sch = replay_launchable(mod, record.trace, target_from_text(record.identity.target), limits or ScheduleLimits())
    info = args_info if args_info is not None else record.identity.args_info
    return ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), [float(s) for s in record.run_secs],
                                    target_from_text(record.identity.target), [ms.arg_info.ArgInfo.from_json(a) for a in info])  # fmt: skip


TENSORIZING = ("Blockize", "Tensorize")  # instructions of a sketch that tensorizes


def postprocessing_starts(insts: list[Any]) -> int:
    """The index of a trace's ``EnterPostproc`` instruction (its length where there is none)."""
    return next((i for i, inst in enumerate(insts) if inst[0] == "EnterPostproc"), len(insts))


def sketch(trace: list[Any]) -> list[Any]:
    """A copy of a trace's JSON up to its postprocessing (its decisions with it)."""
    insts, decisions = trace
    cut = postprocessing_starts(insts)
    return copy.deepcopy([insts[:cut], [d for d in decisions if d[0] < cut]])


def tensorizes(sketched: list[Any]) -> bool:
    """Whether a sketch's JSON tensorizes (int8 dot products, AMX): its postprocessing needs TVM's tensor intrinsics."""
    return any(inst[0] in TENSORIZING for inst in sketched[0])


REPOSTPROCESSED_KINDS = ("llvm", "cuda")  # target kinds with MetaSchedule postprocessors that schedhub also measures on


def tuning_target(target: tvm.target.Target) -> tvm.target.Target:
    """The target MetaSchedule searches and postprocesses under. A CUDA target as users write it (``{"kind": "cuda",
    "arch": "sm_90"}``) lacks the per-block limits MetaSchedule's GPU rules and postprocessors read: it gets CUDA's
    (``max_threads_per_block`` = ``max_num_threads``; 48 KiB of static shared memory, what every architecture gives
    a block). Records are still keyed by the target as given."""
    if target.kind.name != "cuda":
        return target
    attrs = dict(target.export())
    attrs.setdefault("max_threads_per_block", attrs.get("max_num_threads", 1024))
    attrs.setdefault("max_shared_memory_per_block", 48 * 1024)
    return tvm.target.Target(attrs)


def postprocessors(target: tvm.target.Target) -> list[Any]:
    """The postprocessors MetaSchedule's tuner applies for ``target``'s kind, but for refusing loops of symbolic extent
    (a trace replays on a kernel of symbolic size as it is, and :func:`.guard.check_scheduled` bounds it), initialized
    with ``target`` (:func:`tuning_target`). A GPU's read its limits from it (threads and shared memory per block, the
    warp size): left uninitialized, ``VerifyGPUCode`` refuses every schedule. Initialized from a ``TuneContext`` that
    holds only the target, made without ``TuneContext.__init__``, which imports TVM's tensor intrinsics (seconds to
    tens of seconds) and needs a module."""
    procs = [p for p in ms.postproc.Postproc.create(target.kind.name) if not isinstance(p, ms.postproc.DisallowDynamicLoop)]
    context = ms.TuneContext.__new__(ms.TuneContext)
    context.__init_handle_by_constructor__(ms_ffi.TuneContext, None, tuning_target(target), None, None, "schedhub", 1, -1, None)
    for proc in procs:
        proc._initialize_with_tune_context(context)
    return procs


def sketch_replayed(normalized: tvm.IRModule, sketched: list[Any], decided: dict[int, Any], postprocs: list[Any],
                    limits: ScheduleLimits) -> tvm.s_tir.Schedule | None:  # fmt: skip
    """A sketch's JSON replayed on ``normalized`` with the decisions in ``decided`` (instruction index to decision) in
    place of its own, then ``postprocs`` applied; None where it does not replay, a postprocessor refuses it, or the
    result is past ``limits``."""
    insts, decisions = sketched
    sch = tvm.s_tir.Schedule(normalized)
    try:
        tvm.s_tir.schedule.Trace.apply_json_to_schedule([insts, [[i, decided.get(i, d)] for i, d in decisions]], sch)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            return None
        check_scheduled(sch.mod, limits, normalized)
    except (*TVM_ERRORS, ValueError):  # ScheduleTooCostly is a ValueError, as is a vectorized symbolic loop
        return None
    return sch


def repostprocessed(normalized: tvm.IRModule, trace: list[Any], target: tvm.target.Target, limits: ScheduleLimits) -> tvm.s_tir.Schedule | None:
    """``normalized`` scheduled by the sketch of ``trace`` (a trace's JSON; its decisions as recorded) with ``target``'s
    postprocessors applied again here, where the recorded postprocessing was decided for the record's own loop extents;
    None for a sketch that tensorizes or where :func:`sketch_replayed` gives none."""
    sketched = sketch(trace)
    return None if tensorizes(sketched) else sketch_replayed(normalized, sketched, {}, postprocessors(target), limits)


def repostprocesses(target: tvm.target.Target) -> bool:
    """Whether schedules for ``target`` get a twin postprocessed here (:func:`postprocessed_here`): CPUs and CUDA GPUs
    (:data:`REPOSTPROCESSED_KINDS`)."""
    return target.kind.name in REPOSTPROCESSED_KINDS


def postprocessed_here(normalized: tvm.IRModule, recorded: str, target: tvm.target.Target, limits: ScheduleLimits,
                       replayed: tvm.IRModule | None = None) -> tvm.s_tir.Schedule | None:  # fmt: skip
    """:func:`repostprocessed` of ``recorded`` (a trace's JSON text) where it schedules the kernel otherwise than the
    trace replayed as recorded (``replayed``, or replayed here) does; None where :func:`repostprocesses` says no, or
    where it postprocesses the kernel the same way or not at all. Neither is better everywhere (on a quick fill's
    convnets it ran 0.10-1.72x the time of the replay as recorded): served or kept only once timed. Raises TVM's
    error where ``recorded`` does not replay."""
    if not repostprocesses(target):
        return None
    sch = repostprocessed(normalized, json.loads(recorded), target, limits)
    if sch is None:
        return None
    return None if tvm_ffi.structural_equal(sch.mod, replayed if replayed is not None else replay_within(normalized, recorded, limits).mod) else sch


def trace_text(trace: Any) -> str:
    """A Trace as the JSON text records carry (postprocessing instructions included)."""
    return json.dumps(plain_json(trace.as_json()), separators=(",", ":"))


def normalize_mod(func: tvm.IRModule | Any) -> tvm.IRModule:
    """The module MetaSchedule replays traces on (and MetaScheduleApplyDatabase queries with)."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    return _normalize_mod(func)


def replay_schedule(mod: tvm.IRModule, recorded: Any) -> tvm.s_tir.Schedule:
    """A Schedule of ``mod`` with a trace's JSON applied (postprocessing instructions included): the one
    replay route of the hook and the tuner. Raises TVM's error when the trace does not fit ``mod``."""
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(recorded, sch)
    return sch


def replay_within(mod: tvm.IRModule, trace_text: str, limits: ScheduleLimits) -> tvm.s_tir.Schedule:
    """:func:`replay_schedule` of a trace that is someone else's data: refused before the replay when it is
    too long and after it when the scheduled kernel would cost a build more than ``limits`` allow
    (:class:`.guard.ScheduleTooCostly`); raises TVM's error when it does not fit ``mod``."""
    check_trace_size(trace_text, limits)
    sch = replay_schedule(mod, json.loads(trace_text))
    check_scheduled(sch.mod, limits, mod)
    return sch


def replay_launchable(mod: tvm.IRModule, trace_text: str, target: tvm.target.Target, limits: ScheduleLimits) -> tvm.s_tir.Schedule:
    """:func:`replay_within`, for a CUDA GPU also launchable: where the replay launches a kernel's threads
    inconsistently (:class:`.guard.InconsistentLaunch`: shared-memory copies split for the threads of the record's own
    tiles), the trace's sketch postprocessed again here (:func:`repostprocessed`) instead; and the kernel within the
    target's per-block limits (MetaSchedule's ``VerifyGPUCode``, else :class:`.guard.Unlaunchable`: a transfer's
    re-derived tiles can ask for more threads or shared memory than a block has). Raises where none of it holds."""
    try:
        sch = replay_within(mod, trace_text, limits)
    except InconsistentLaunch:
        again = repostprocessed(mod, json.loads(trace_text), target, limits) if repostprocesses(target) else None
        if again is None:
            raise
        return again  # its postprocessors verified it
    check_launchable(sch, target)
    return sch


def check_launchable(sch: tvm.s_tir.Schedule, target: tvm.target.Target) -> None:
    """Raise :class:`.guard.Unlaunchable` for a CUDA kernel past the target's per-block limits (threads, shared memory,
    vector width: MetaSchedule's ``VerifyGPUCode``). Such a kernel compiles and fails at launch; other targets pass."""
    if target.kind.name == "cuda" and not all(p.apply(sch) for p in postprocessors(target) if isinstance(p, ms.postproc.VerifyGPUCode)):
        if (exc := lowering_error(sch.mod["main"], target)) is not None:  # VerifyGPUCode lowers it, and says False on an error too
            raise Unlaunchable(f"the kernel does not lower for {target.kind.name}: {exc.__class__.__name__}: {str(exc).strip()[:500]}")
        raise Unlaunchable(f"the kernel is past {target.kind.name}'s per-block limits (threads, shared memory or vector width: VerifyGPUCode)")


def replay(mod: tvm.IRModule, trace_text: str) -> tuple[tvm.IRModule, int]:
    """``mod`` with a trace's JSON text applied within the default bounds (:func:`replay_within`: a trace is someone
    else's data), and how many of its tile sizes TVM re-derived to fit ``mod`` (:func:`.ranking.retiled`): one replay."""
    sch = replay_within(mod, trace_text, ScheduleLimits())
    return sch.mod, retiled(json.loads(trace_text), sch.trace)


def replayed(mod: tvm.IRModule, trace_text: str) -> tvm.IRModule:
    """``mod`` with a trace's JSON text applied (postprocessing instructions included) within the default bounds: one replay."""
    return replay(mod, trace_text)[0]


def scheduled(mod: tvm.IRModule, trace: Any) -> tvm.IRModule:
    """``mod`` with ``trace`` applied (postprocessing instructions included)."""
    sch = tvm.s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


SIDECAR = "schedhub_records.jsonl"
MAX_SIDECAR_BYTES = 256 << 20


def read_json_database(work_dir: str | os.PathLike[str], provenance: dict[str, Any] | None = None) -> Iterator[Record]:
    """Records of a MetaSchedule JSONDatabase directory; failed measurements are skipped. Op names
    and provenance come from the sidecar a pull wrote, where it has the record."""
    directory = Path(work_dir)
    if not (directory / "database_tuning_record.json").is_file():
        raise FileNotFoundError(f"{directory} is not a MetaSchedule JSONDatabase (no database_tuning_record.json)")
    db = ms.database.JSONDatabase(work_dir=str(directory), allow_missing=False)
    prov = {"source": "metaschedule-json", **(provenance or {})}
    known = _read_sidecar(directory / SIDECAR)
    for tr in db.get_all_tuning_records():
        secs = [float(s) for s in plain_json(tr.run_secs or [])]
        if secs and all(math.isfinite(s) and 0 < s < 1e9 for s in secs):  # 1e10 marks a failed run
            record = record_from_tuning_record(tr, provenance=prov)
            yield _restored(record, known.get((record.identity.workload_id, record.trace_id)))


def _read_sidecar(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    known: dict[tuple[str, str], dict[str, Any]] = {}
    if not path.is_file() or path.stat().st_size > MAX_SIDECAR_BYTES:
        return known
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                entry = json.loads(line)
                known[(str(entry["workload_id"]), str(entry["trace_id"]))] = {"op": entry["op"], "provenance": entry["provenance"]}
            except (ValueError, KeyError, TypeError):
                continue
    return known


def _restored(record: Record, entry: dict[str, Any] | None) -> Record:
    """``record`` with the op name and provenance a pull wrote for it (kept as read when they do not validate)."""
    if entry is None:
        return record
    obj = record.to_dict()
    obj["op"], obj["provenance"] = entry["op"], entry["provenance"]
    try:
        return Record.from_obj(obj)
    except RegistryError:  # InvalidRecord, PayloadTooLarge
        return record


def write_json_database(work_dir: str | os.PathLike[str], records: Iterable[Record], limits: ScheduleLimits | None = None) -> tuple[int, dict[str, str]]:
    """Append records to a MetaSchedule JSONDatabase directory (created if absent); returns how many were
    written and, by trace id, why each other one was left out.

    MetaSchedule loads such a directory whole or not at all, replaying every record on the workload it
    stored for its structure, and applies what it loads unchecked. So a record is written only when its
    trace replays on that workload within the hook's bounds. Not the same thing as its own workload:
    MetaSchedule's workload equality ignores block names, which traces address blocks by, so of two
    workloads that differ only in block names the second one's records do not replay there.
    """
    limits = limits or ScheduleLimits()
    directory = Path(work_dir)
    directory.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(directory))
    count, unusable = 0, {}
    with (directory / SIDECAR).open("a", encoding="utf-8") as sidecar:
        for record in records:
            try:
                own = workload_module(record.identity.workload)
                workload = db.commit_workload(own)
                if not workload.mod.same_as(own) and block_names(workload.mod) != block_names(own):
                    raise ValueError("MetaSchedule takes its workload for another one stored here that differs only in block names, which the trace addresses blocks by")
                tr = tuning_record(record, workload.mod, limits=limits)
            except Exception as exc:  # TVM raises ScheduleError, InternalError, ValueError… on a trace that does not fit
                unusable[record.trace_id] = f"{type(exc).__name__}: {first_line(exc)}"
                continue
            db.commit_tuning_record(ms.database.TuningRecord(tr.trace, workload, tr.run_secs, target_from_text(record.identity.target), tr.args_info))
            entry = {"workload_id": record.identity.workload_id, "trace_id": record.trace_id, "op": record.identity.op, "provenance": record.provenance}
            sidecar.write(json.dumps(entry, separators=(",", ":")) + "\n")
            count += 1
    return count, unusable


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an error's message, cut at ``limit`` characters."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:limit]
