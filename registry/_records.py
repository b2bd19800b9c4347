"""Record schema and its canonical msgpack codec.

A *record* is one tuned schedule for one workload: what MetaSchedule needs to replay it (trace,
run_secs, target, args_info) plus the canonical workload text and provenance. Its canonical bytes
are msgpack of a map with sorted keys; the store and the wire keep exactly those bytes, so a record
pulled is byte-identical to the record pushed.

A *miss* carries the same identity fields without a schedule: enough to tune the workload later.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ._errors import REFUSED_ON_READ, InvalidRecord, KeyMismatch, PayloadTooLarge
from ._keys import SCHEMA_VERSION, is_key, record_key, structure_key, target_kind, workload_key
from ._limits import MAX_INT, check_kind, check_number, check_op, check_text, check_trace_content, check_workload_source, signature_args_info

MAX_RECORD_BYTES = 1 << 20  # one encoded record
MAX_TEXT_CHARS = 512 << 10  # workload text, trace text
MAX_SHORT_CHARS = 4096  # op, target, fingerprint, provenance values
MAX_RUN_SECS = 1000
MAX_MEASURED_SECS = 1e6  # one measured time
MAX_ARGS = 256
MAX_PROVENANCE_FIELDS = 64


def packb(obj: Any) -> bytes:
    """Canonical msgpack: sorted map keys, str as str, bytes as bin, floats as float64."""
    return msgpack.packb(_sorted(obj), use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """Parse msgpack from an untrusted source; any malformation becomes InvalidRecord."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidRecord("expected msgpack bytes")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except InvalidRecord:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # ExtraData, OutOfData, …
        raise InvalidRecord(f"malformed msgpack: {exc.__class__.__name__}: {exc}") from None


def _no_ext(code: int, data: bytes) -> Any:
    raise InvalidRecord(f"msgpack extension type {code} is not accepted")


def _sorted(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _sorted(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [_sorted(v) for v in obj]
    return obj


# -- field validation -------------------------------------------------------------------------


def _require_map(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise InvalidRecord(f"{what} must be a map/object, got {type(obj).__name__}")
    return obj


def _text(obj: dict[str, Any], name: str, limit: int = MAX_SHORT_CHARS, empty: bool = False) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise InvalidRecord(f"field {name!r} must be a string, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidRecord(f"field {name!r} must not be empty")
    if len(value) > limit:
        raise PayloadTooLarge(f"field {name!r} has {len(value)} characters, the limit is {limit}")
    return check_text(value, name)


def _args_info(value: Any) -> list[Any]:
    """MetaSchedule ArgInfo JSON: ``["TENSOR", dtype, [dims…]]`` per argument."""
    if not isinstance(value, list) or len(value) > MAX_ARGS:
        raise InvalidRecord(f"field 'args_info' must be a list of at most {MAX_ARGS} arguments")
    for i, arg in enumerate(value):
        ok = (
            isinstance(arg, list)
            and len(arg) == 3
            and arg[0] == "TENSOR"
            and isinstance(arg[1], str)
            and isinstance(arg[2], list)
            and all(isinstance(d, int) and not isinstance(d, bool) for d in arg[2])
        )
        if not ok:
            raise InvalidRecord(f"args_info[{i}] must be [\"TENSOR\", dtype, [int, …]], got {arg!r:.200}")
    return value


def run_secs_field(value: Any, name: str = "run_secs") -> list[float]:
    if not isinstance(value, list) or not value or len(value) > MAX_RUN_SECS:
        raise InvalidRecord(f"field {name!r} must be a list of 1..{MAX_RUN_SECS} seconds")
    return [measured_secs(v, name) for v in value]


def measured_secs(value: Any, name: str) -> float:
    """One measured time: a finite positive number of seconds up to :data:`MAX_MEASURED_SECS`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= MAX_MEASURED_SECS:
        raise InvalidRecord(f"{name} must be finite positive numbers of seconds up to {MAX_MEASURED_SECS:g}, got {value!r:.40}")
    return float(value)


def trace_field(obj: dict[str, Any]) -> str:
    """``obj["trace"]``: the JSON text of a MetaSchedule trace (``Trace.as_json()``), bounded, annotating only schedule
    hints, holding no instruction that changes what the kernel computes and no object graph TVM would load unchecked."""
    trace = _text(obj, "trace", MAX_TEXT_CHARS)
    try:
        parsed = json.loads(trace)
    except (ValueError, RecursionError):
        raise InvalidRecord("field 'trace' must be the JSON text of a MetaSchedule trace") from None
    if not isinstance(parsed, list):
        raise InvalidRecord("field 'trace' must be a JSON list (MetaSchedule Trace.as_json())")
    check_trace_content(parsed, trace)
    return trace


def _provenance(value: Any) -> dict[str, Any]:
    prov = _require_map(value if value is not None else {}, "provenance")
    if len(prov) > MAX_PROVENANCE_FIELDS:
        raise InvalidRecord(f"provenance has more than {MAX_PROVENANCE_FIELDS} fields")
    for k, v in prov.items():
        if not isinstance(k, str) or (v is not None and not isinstance(v, (str, int, float, bool))):
            raise InvalidRecord(f"provenance values must be scalars, got {k!r:.80}: {type(v).__name__}")
        if len(k) > 64 or (isinstance(v, str) and len(v) > MAX_SHORT_CHARS):
            raise PayloadTooLarge(f"provenance field {k!r:.80} is over its size limit (64-character names, {MAX_SHORT_CHARS}-character values)")
        check_text(k, "provenance")
        if isinstance(v, str):
            check_text(v, f"provenance.{k}")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            check_number(v, f"provenance.{k}", low=-MAX_INT, high=MAX_INT)
    return dict(prov)


def trace_id(trace: str) -> str:
    """Short content id of a trace's text (a record's ``trace_id``)."""
    return hashlib.sha256(trace.encode()).hexdigest()[:16]


#: An identity's fields as text that name it, in the order :data:`_CHECKED_IDENTITIES` keys them (its ``args_info``
#: follows, as repr; its ``op``, a label, is checked on each read).
_IDENTITY_TEXTS = ("key", "schema", "fingerprint", "target", "workload")
#: Identities this process has checked or vouches for (:func:`vouch_for`), by their fields: the records of one key repeat
#: its identity (a lookup of ResNet-18's kernels reads about 6 records a key), and checking one (its key derived, its
#: workload parsed as Python) cost 2.5 ms the first time a process met it. Only an identity that passed every check, or
#: that this process derived itself, is kept; the table is emptied whole when full.
_CHECKED_IDENTITIES: dict[tuple[str, ...], Identity] = {}
_MAX_CHECKED_IDENTITIES = 4096


def _memo_key(texts: tuple[Any, ...], args_info: Any) -> tuple[str, ...] | None:
    return (*texts, repr(args_info)) if all(type(text) is str for text in texts) else None


def _remember(identity: Identity, memo: tuple[str, ...] | None) -> None:
    if memo is not None:
        if len(_CHECKED_IDENTITIES) >= _MAX_CHECKED_IDENTITIES:
            _CHECKED_IDENTITIES.clear()
        _CHECKED_IDENTITIES[memo] = identity


def vouch_for(identity: Identity) -> None:
    """Take ``identity`` as checked: one this process derived from a kernel it printed itself (the compile hook's, or
    its kernel cache's), so that a record carrying exactly its fields is read without its workload parsed again. Never
    for an identity read from a registry, a file another machine wrote, or a caller."""
    _remember(identity, _memo_key(tuple(getattr(identity, name) for name in _IDENTITY_TEXTS), identity.args_info))


@dataclass(frozen=True)
class Identity:
    """The hashed fields of a workload and what is kept beside them for search."""

    key: str
    schema: str
    fingerprint: str
    target: str
    workload: str
    op: str
    args_info: list[Any]

    @classmethod
    def from_obj(cls, obj: Any, expected_key: str | None = None) -> Identity:
        obj = _require_map(obj, "body")
        key = _text(obj, "key", 64)
        if not is_key(key):
            raise InvalidRecord("field 'key' must be 64 lowercase hex characters (sha256)")
        if expected_key is not None and key != expected_key:
            raise KeyMismatch(f"the URL names key {expected_key} but the body carries key {key}")
        memo = _memo_key(tuple(obj.get(name) for name in _IDENTITY_TEXTS), obj.get("args_info"))
        known = _CHECKED_IDENTITIES.get(memo) if memo is not None else None
        if known is not None:
            op = check_op(_text(obj, "op", 256))
            return known if op == known.op else dataclasses.replace(known, op=op)
        ident = cls._checked(obj, key)
        _remember(ident, memo)
        return ident

    @classmethod
    def _checked(cls, obj: dict[str, Any], key: str) -> Identity:
        ident = cls(
            key=key,
            schema=_text(obj, "schema", 64),
            fingerprint=_text(obj, "fingerprint"),
            target=_text(obj, "target"),
            workload=_text(obj, "workload", MAX_TEXT_CHARS),
            op=check_op(_text(obj, "op", 256)),
            args_info=_args_info(obj.get("args_info")),
        )
        check_kind(target_kind(ident.target))
        if ident.schema != SCHEMA_VERSION:
            raise InvalidRecord(f"schema {ident.schema!r} is not supported; this registry speaks {SCHEMA_VERSION!r}")
        derived = record_key(ident.fingerprint, ident.target, ident.workload, ident.schema)
        if derived != key:
            raise KeyMismatch(
                f"key {key} does not match its content: schema, fingerprint, target and workload hash to {derived}"
            )
        check_workload_source(ident.workload)
        if ident.args_info != signature_args_info(ident.workload):
            raise InvalidRecord("field 'args_info' does not match the workload's signature (it is derived from the workload)")
        return ident

    @functools.cached_property
    def structure(self) -> str:
        """The structure id: this op at any shape, under any compiler (``_keys.structure_key``)."""
        return structure_key(self.target, self.workload, self.schema)

    @property
    def symbolic(self) -> bool:
        """Whether an argument has a symbolic size (``args_info`` ``DYNAMIC``, as the hook writes it for a dynamic
        batch): MetaSchedule cannot tune the kernel, and no record of it exists."""
        return not all(isinstance(arg, list) and arg and arg[0] == "TENSOR" for arg in self.args_info)

    @functools.cached_property
    def workload_id(self) -> str:
        """The workload id: this workload on this target under any compiler (``_keys.workload_key``)."""
        return workload_key(self.target, self.workload, self.schema)

    def to_dict(self) -> dict[str, Any]:
        # not dataclasses.asdict: its deep copy was a third of a batch push's server time
        return {"key": self.key, "schema": self.schema, "fingerprint": self.fingerprint, "target": self.target,
                "workload": self.workload, "op": self.op, "args_info": [list(a) for a in self.args_info]}  # fmt: skip


#: The provenance field of a record's flushed-cache mean time (:attr:`Record.flushed_secs`).
FLUSHED_SECS = "flushed_secs"


@dataclass(frozen=True)
class Served:
    """What the registry says about a stored record besides its bytes: whose it is, who verified it."""

    trace_id: str
    pushed_by: str
    verified_by: str = ""  # a worker (or admin) that replayed, checked and re-measured it; "" for a claim
    verified_secs: float = 0.0  # the verifier's mean run time
    complaints: int = 0  # clients that reported it failing to replay
    verified_flushed_secs: float = 0.0  # the verifier's mean run time on flushed caches; 0.0: not timed so

    @property
    def verified(self) -> bool:
        return bool(self.verified_by)

    @classmethod
    def from_obj(cls, obj: Any) -> Served:
        """A status as a store keeps it or a server answers it, checked (a hostile server's is refused)."""
        obj = _require_map(obj, "entry status")
        names = [obj.get(k, "") for k in ("tid", "by", "vby")]
        times, complaints = [obj.get(k, 0.0) for k in ("vmean", "vfmean")], obj.get("complaints", 0)
        if not all(isinstance(n, str) and len(n) <= 256 for n in names):
            raise InvalidRecord("an entry status's 'tid', 'by' and 'vby' must be strings of at most 256 characters")
        for name, secs in zip(("vmean", "vfmean"), times):
            if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not math.isfinite(secs) or not 0 <= secs <= MAX_MEASURED_SECS:
                raise InvalidRecord(f"an entry status's {name!r} must be a finite number of seconds, got {secs!r:.40}")
        if isinstance(complaints, bool) or not isinstance(complaints, int) or complaints < 0:
            raise InvalidRecord(f"an entry status's 'complaints' must be a count, got {complaints!r:.40}")
        return cls(names[0], names[1], names[2], float(times[0]), complaints, float(times[1]))


@dataclass(frozen=True)
class Record:
    """One tuned schedule of one workload (``served``: the registry's status of it, when fetched)."""

    identity: Identity
    trace: str  # JSON text of a MetaSchedule Trace
    run_secs: list[float]
    provenance: dict[str, Any] = field(default_factory=dict)
    served: Served | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return self.identity.key

    @property
    def mean_secs(self) -> float:
        return sum(self.run_secs) / len(self.run_secs)

    @property
    def flushed_secs(self) -> float | None:
        """The mean time its pusher claims with every argument but the input flushed from the caches (provenance
        ``flushed_secs``, as a network's kernel meets its weights); None when it claims none or one out of bounds."""
        value = self.provenance.get(FLUSHED_SECS)
        try:
            return measured_secs(value, FLUSHED_SECS)
        except InvalidRecord:
            return None

    @functools.cached_property
    def trace_id(self) -> str:
        """Short content id of the schedule: two pushes of one trace are one entry."""
        return trace_id(self.trace)

    @classmethod
    def from_obj(cls, obj: Any, expected_key: str | None = None) -> Record:
        obj = _require_map(obj, "record")
        unknown = set(obj) - _RECORD_FIELDS
        if unknown:
            raise InvalidRecord(f"unknown record fields: {sorted(unknown)}")
        identity = Identity.from_obj(obj, expected_key)
        return cls(identity, trace_field(obj), run_secs_field(obj.get("run_secs")), _provenance(obj.get("provenance")))

    @classmethod
    def from_bytes(cls, data: bytes, expected_key: str | None = None) -> Record:
        if len(data) > MAX_RECORD_BYTES:
            raise PayloadTooLarge(f"record is {len(data)} bytes, the limit is {MAX_RECORD_BYTES}")
        return cls.from_obj(unpackb(data), expected_key)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.identity.to_dict(),
            "trace": self.trace,
            "run_secs": list(self.run_secs),
            "provenance": dict(self.provenance),
        }

    def to_bytes(self) -> bytes:
        data = packb(self.to_dict())
        if len(data) > MAX_RECORD_BYTES:
            raise PayloadTooLarge(f"record is {len(data)} bytes, the limit is {MAX_RECORD_BYTES}")
        return data


def trace_instructions(trace: str) -> int | None:
    """How many instructions a trace (MetaSchedule's JSON, ``[instructions, decisions]``) holds; None when it is not JSON."""
    try:
        parsed = json.loads(trace)
    except ValueError:
        return None
    return len(parsed[0]) if isinstance(parsed, list) and parsed and isinstance(parsed[0], list) else 0


def keeps_default_schedule(trace: str) -> bool:
    """Whether a trace has no instructions: its record keeps TVM's default schedule (what a tuner
    publishes when nothing beat it). Worth serving on its own key (it is tuned), never as a transfer.
    (Not JSON at all is not this: replaying it fails, and that refuses it.)"""
    return trace_instructions(trace) == 0


_RECORD_FIELDS = {"key", "schema", "fingerprint", "target", "workload", "op", "args_info", "trace", "run_secs", "provenance"}


def served_record(data: bytes, status: dict[str, Any]) -> Record:
    """A record parsed from its stored bytes, with the registry's status of it attached."""
    return dataclasses.replace(Record.from_bytes(data), served=Served.from_obj(status))


@dataclass(frozen=True)
class RefusedRecord:
    """A stored record that this version's checks refuse, left out of an answer: stored before a check
    existed, or sent by a hostile server. ``key`` and ``trace_id`` as the answer named them ("" if it did not)."""

    key: str
    trace_id: str
    reason: str


def served_records(entries: Iterable[tuple[bytes, dict[str, Any]]], refused: list[RefusedRecord] | None = None) -> list[Record]:
    """The records of (stored bytes, status) pairs that pass this version's checks, in order; each one that
    does not is left out and appended to ``refused``: one bad record must not cost a reader the others."""
    records = []
    for data, status in entries:
        try:
            records.append(served_record(data, status))
        except REFUSED_ON_READ as exc:
            if refused is not None:
                refused.append(RefusedRecord(_named_key(data), _short(status.get("tid") if isinstance(status, dict) else ""), str(exc)[:300]))
    return records


def _named_key(data: bytes) -> str:
    """The key a record's bytes name, if they name a valid one ("" otherwise)."""
    try:
        value = unpackb(data)
    except InvalidRecord:
        return ""
    key = value.get("key") if isinstance(value, dict) else None
    return key if isinstance(key, str) and is_key(key) else ""


def _short(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= 64 else ""
