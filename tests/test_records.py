"""Keys and the record codec: deterministic, unambiguous, strict about what they accept."""

from __future__ import annotations

import json
import math
import re

import pytest

from schedhub.registry import (
    Identity, InvalidRecord, KeyMismatch, PayloadTooLarge, Record, canonical_target, keeps_default_schedule, packb, record_key, target_kind,
    trace_instructions, unpackb,
)  # fmt: skip
from schedhub.registry._records import MAX_TEXT_CHARS

from .conftest import make_record


def test_key_is_sha256_of_length_prefixed_fields() -> None:
    assert record_key("fp", "t", "w") == record_key("fp", "t", "w")
    assert len(record_key("fp", "t", "w")) == 64
    # moving a character from one field to the next must change the key
    assert record_key("fp", "tw", "") != record_key("fp", "t", "w")
    assert record_key("fp", "t", "w", schema="schedhub/2") != record_key("fp", "t", "w")


def test_canonical_target_sorts_and_drops_empty_fields() -> None:
    a = canonical_target({"kind": "llvm", "tag": "", "keys": ("cpu",), "mcpu": "znver5"})
    b = canonical_target({"mcpu": "znver5", "keys": ["cpu"], "kind": "llvm"})
    assert a == b == '{"keys":["cpu"],"kind":"llvm","mcpu":"znver5"}'
    assert target_kind(a) == "llvm"
    assert canonical_target({"kind": "cuda", "arch": "sm_90"}) != canonical_target({"kind": "llvm"})


def test_canonical_bytes_round_trip_and_ignore_field_order() -> None:
    rec = make_record(1, 1e-3)
    data = rec.to_bytes()
    assert Record.from_bytes(data).to_bytes() == data
    shuffled = dict(reversed(list(rec.to_dict().items())))
    assert packb(shuffled) == data
    assert unpackb(data)["op"] == rec.identity.op


def _with(**changes: object) -> dict:
    obj = make_record(1, 1e-3).to_dict()
    obj.update(changes)
    return obj


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"key": "abc"}, "64 lowercase hex"),
        ({"workload": 5}, "'workload' must be a string"),
        ({"run_secs": []}, "run_secs"),
        ({"run_secs": [math.inf]}, "finite positive"),
        ({"run_secs": [-1.0]}, "finite positive"),
        ({"run_secs": [True]}, "finite positive"),
        ({"args_info": [["TENSOR", "float32", ["x"]]]}, "args_info[0]"),
        ({"trace": "not json"}, "JSON text"),
        ({"trace": '{"a": 1}'}, "JSON list"),
        ({"schema": "other/9"}, "not supported"),
        ({"provenance": {"a": [1, 2]}}, "scalars"),
        ({"surprise": 1}, "unknown record fields"),
    ],
)
def test_invalid_records_are_refused_with_a_reason(changes: dict, message: str) -> None:
    with pytest.raises(InvalidRecord, match=message.replace("[", r"\[").replace("]", r"\]")):
        Record.from_obj(_with(**changes))


def test_key_must_hash_from_the_records_own_fields() -> None:
    other = make_record(2, 1e-3)
    with pytest.raises(KeyMismatch, match="does not match its content"):
        Record.from_obj(_with(key=other.key))
    with pytest.raises(KeyMismatch, match="URL names key"):
        Record.from_obj(make_record(1, 1e-3).to_dict(), expected_key=other.key)


def test_oversized_fields_and_records_are_refused() -> None:
    with pytest.raises(PayloadTooLarge):
        Record.from_obj(_with(trace=json.dumps(["x" * MAX_TEXT_CHARS])))
    with pytest.raises(PayloadTooLarge):
        Record.from_bytes(b"\x00" * (2 << 20))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x81\xa1", packb([1, 2]), b"\xd4\x01\x00", packb({1: 2})])
def test_malformed_msgpack_is_invalid_record(data: bytes) -> None:
    with pytest.raises(InvalidRecord):
        Record.from_bytes(data)


@pytest.mark.parametrize(("trace", "count", "default"), [
    (json.dumps([[["GetSBlock", [], ["C"], []], ["Split", [], [], []]], []]), 2, False),
    ("[[], []]", 0, True), ("[]", 0, True), ('{"a": 1}', 0, True),  # nothing to replay: TVM's default schedule
    ("not json", None, False), ("", None, False),  # not a trace: replaying it fails, and that refuses it
])  # fmt: skip
def test_a_trace_counts_its_instructions(trace: str, count: int | None, default: bool) -> None:
    assert trace_instructions(trace) == count
    assert keeps_default_schedule(trace) is default


def _with_workload(text: str) -> dict:
    """A record dict carrying ``text`` as its workload, keyed and typed from it (so only the text can be wrong)."""
    obj = make_record(1, 1e-3).to_dict()
    obj.update(workload=text, key=record_key(obj["fingerprint"], obj["target"], text))
    return obj


PLAIN_MAIN = "@T.prim_func\ndef main(arg0: T.Buffer((1, 64), 'float32')):\n    {}\n"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('T.evaluate(__import__("os").system("id"))', "call to an expression"),
        ('x = ().__class__', "attribute '__class__'"),
        ('T.evaluate(tvm.runtime.load_module("/tmp/x.so"))', "call to tvm.runtime.load_module"),
        ('T = tvm\n    T.evaluate(0)', "name 'T' is not allowed there"),
        ('T.evaluate(T.call_extern("int32", "system", "id"))', "call to T.call_extern"),
        ('T.evaluate(T.call_packed("runtime.x"))', "call to T.call_packed"),
        ('import os', "Import is not allowed"),
        ('T.evaluate([f() for f in ()])', "ListComp is not allowed"),
        ('T.evaluate(T.utils.deferred(0))', "call to T.utils.deferred"),
        ('x = lambda: 0', "Lambda is not allowed"),
        ('x = f"{T}"', "JoinedStr is not allowed"),
        ('(x := 0)', "NamedExpr is not allowed"),
    ],
)
def test_a_workload_that_is_code_rather_than_tvmscript_data_is_refused(body: str, reason: str) -> None:
    """TVMScript's parser evaluates Python: a workload is checked before anything parses it with TVM."""
    with pytest.raises(InvalidRecord, match=re.escape(reason)):
        Record.from_obj(_with_workload(PLAIN_MAIN.format(body)))
    Record.from_obj(_with_workload(PLAIN_MAIN.format("T.evaluate(T.max(T.float32(0.0), T.exp(T.float32(1.0))))")))  # plain data passes


@pytest.mark.parametrize("key", ["pragma_import_llvm", "pragma_import_c", "anything_else", 7])
def test_a_trace_may_annotate_only_schedule_hints(key: object) -> None:
    """``pragma_import_llvm`` / ``pragma_import_c`` values are LLVM IR / C that TVM links into the kernel."""
    hint = [["GetSBlock", [], ["root", "main"], ["b0"]], ["Annotate", ["b0", 16], ["meta_schedule.parallel"], []]]
    Record.from_obj(_with(trace=json.dumps([hint, []])))
    hostile = [*hint, ["Annotate", ["b0", '"define void @f() { ret void }"'], [key], []]]
    with pytest.raises(InvalidRecord, match="only schedule hints"):
        Record.from_obj(_with(trace=json.dumps([hostile, []])))


@pytest.mark.parametrize("kind", ["UnsafeSetDType", "UnsafeHideBufferAccess", "AnnotateBufferAccess"])
def test_a_trace_may_not_change_what_the_kernel_computes(kind: str) -> None:
    """Schedule primitives keep what a kernel computes, except these, which MetaSchedule never emits (a float32 accumulator
    set to float16 computes close to right; hidden accesses escape TVM's checks)."""
    start = [["GetSBlock", [], ["matmul", "main"], ["b0"]]]
    Record.from_obj(_with(trace=json.dumps([[*start, ["StorageAlign", ["b0"], [0, 0, 32, 8], []]], []])))
    with pytest.raises(InvalidRecord, match=f"holds {kind}"):
        Record.from_obj(_with(trace=json.dumps([[*start, [kind, ["b0"], [0, "float16"], []]], []])))


def test_an_identity_read_again_is_checked_once_and_one_changed_in_any_field_is_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The records of one key repeat its identity, so a process checks it once; a record differing from it in any field
    (its workload, its args_info) is no hit on that check, and is refused as it would be alone."""
    from schedhub.registry import _records

    parsed: list[str] = []
    real = _records.check_workload_source
    monkeypatch.setattr(_records, "check_workload_source", lambda text: (parsed.append(text), real(text))[1])
    monkeypatch.setattr(_records, "_CHECKED_IDENTITIES", {})
    obj = make_record(7, 1e-3).to_dict()
    first, again = Record.from_obj(obj), Record.from_obj(dict(obj, run_secs=[2e-3]))
    assert again.identity == first.identity and len(parsed) == 1
    with pytest.raises(KeyMismatch, match="does not match its content"):
        Record.from_obj(dict(obj, workload=obj["workload"] + "\n"))
    with pytest.raises(InvalidRecord, match="args_info"):
        Record.from_obj(dict(obj, args_info=[["TENSOR", "float32", [1]]]))
    with pytest.raises(InvalidRecord, match="64 lowercase hex"):
        Record.from_obj(dict(obj, key=obj["key"].upper()))


def test_a_record_carrying_an_identity_this_process_vouches_for_is_read_without_its_workload_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile hook vouches for the identities it derives from its own kernels: a registry's record of exactly one
    (its op a label, checked and kept) is read without parsing the workload again; one differing in its workload is not."""
    from schedhub.registry import _records, vouch_for

    parsed: list[str] = []
    real = _records.check_workload_source
    monkeypatch.setattr(_records, "check_workload_source", lambda text: (parsed.append(text), real(text))[1])
    obj = make_record(8, 1e-3).to_dict()
    derived = Identity(**{name: obj[name] for name in ("key", "schema", "fingerprint", "target", "workload", "op", "args_info")})
    monkeypatch.setattr(_records, "_CHECKED_IDENTITIES", {})
    vouch_for(derived)  # as the hook does with the identities it derives
    parsed.clear()
    relabelled = Record.from_obj(dict(obj, op="fused_other"))
    assert not parsed and relabelled.identity.op == "fused_other" and relabelled.key == obj["key"]
    with pytest.raises(PayloadTooLarge, match="'op'"):
        Record.from_obj(dict(obj, op="x" * 300))
    hostile = PLAIN_MAIN.format('T.evaluate(__import__("os").system("id"))')
    with pytest.raises(InvalidRecord, match="call to an expression"):
        Record.from_obj(dict(obj, workload=hostile, key=record_key(obj["fingerprint"], obj["target"], hostile)))
    assert parsed == [hostile]
