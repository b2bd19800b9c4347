"""HTTP body codecs: msgpack for programs, JSON for people.

Records inside msgpack answers travel as ``bin`` values holding their canonical bytes, so a
client gets exactly the bytes that were stored; JSON answers show them as objects.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack

from ._errors import InvalidRecord, PayloadTooLarge
from ._limits import MAX_DEPTH, check_depth
from ._records import unpackb

MSGPACK = "application/msgpack"
ERROR_HEADER = "x-schedhub-error"  # names the error class of an error answer (a HEAD answer has no body)
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")


class RawRecord:
    """A stored record's canonical bytes, rendered per the answer's format (a plain slotted class: an answer makes
    one per record, and a frozen dataclass's constructor costs several times as much)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawRecord) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)


def wants_msgpack(accept: str) -> bool:
    return any(t in accept for t in _MSGPACK_TYPES)


def is_msgpack(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() in _MSGPACK_TYPES


def decode_body(body: bytes, content_type: str) -> Any:
    """Parse a request body by its Content-Type (msgpack, else JSON), at most MAX_DEPTH levels deep."""
    if is_msgpack(content_type):
        obj = unpackb(body)
    else:
        try:
            obj = json.loads(body)
        except RecursionError:
            raise InvalidRecord(f"body is nested deeper than {MAX_DEPTH} levels") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRecord(f"malformed JSON body: {str(exc)[:200]}; send JSON or Content-Type: {MSGPACK}") from None
    check_depth(obj)
    return obj


def encode_body(obj: Any, msgpack_out: bool) -> bytes:
    """An answer in msgpack (records as their stored bytes, in one pass: an answer's map order carries no meaning,
    so it is not sorted as a record's canonical bytes are) or JSON (records decoded to render them)."""
    if msgpack_out:
        return msgpack.packb(obj, use_bin_type=True, default=_stored_bytes)
    out: list[str] = []
    _json_parts(obj, out)
    return "".join(out).encode()


def _stored_bytes(obj: Any) -> bytes:
    if isinstance(obj, RawRecord):
        return obj.data
    raise TypeError(f"an answer cannot hold a {type(obj).__name__}")


def _json_parts(obj: Any, out: list[str]) -> None:
    """``obj`` as JSON text appended to ``out`` a record at a time: json.dumps holds the GIL for the whole of what it is
    given, so one call on a large answer stalls every other thread (the server's event loop among them) for as long;
    a record at a time, the loop gets its turn between records."""
    if isinstance(obj, RawRecord):
        out.append(_dumps(unpackb(obj.data)))
    elif isinstance(obj, dict) and _holds_records(obj):
        out.append("{")
        for n, (k, v) in enumerate(obj.items()):
            out.append(f"{',' if n else ''}{_dumps(str(k))}:")
            _json_parts(v, out)
        out.append("}")
    elif isinstance(obj, (list, tuple)) and _holds_records(obj):
        out.append("[")
        for n, v in enumerate(obj):
            if n:
                out.append(",")
            _json_parts(v, out)
        out.append("]")
    else:
        out.append(_dumps(obj))


def _holds_records(obj: Any) -> bool:
    if isinstance(obj, RawRecord):
        return True
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return any(_holds_records(v) for v in values)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def check_length(declared: str | None, limit: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {limit} bytes")


def field(body: Any, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """A typed field of a request body, with a clear error when it is missing or of the wrong type."""
    if not isinstance(body, dict):
        raise InvalidRecord(f"body must be a map/object, got {type(body).__name__}")
    if name not in body:
        if default is ...:
            raise InvalidRecord(f"body lacks field {name!r}")
        return default
    value = body[name]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise InvalidRecord(f"field {name!r} has type {type(value).__name__}")
    return value
