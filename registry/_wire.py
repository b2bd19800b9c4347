"""HTTP body codecs: msgpack for programs, JSON for people.

Records inside msgpack answers travel as ``bin`` values holding their canonical bytes, so a
client gets exactly the bytes that were stored; JSON answers show them as objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._errors import InvalidRecord, PayloadTooLarge
from ._limits import MAX_DEPTH, check_depth
from ._records import packb, unpackb

MSGPACK = "application/msgpack"
ERROR_HEADER = "x-schedhub-error"  # names the error class of an error answer (a HEAD answer has no body)
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")


@dataclass(frozen=True)
class RawRecord:
    """A stored record's canonical bytes, rendered per the answer's format."""

    data: bytes


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
    if msgpack_out:
        return packb(_render(obj, True))
    return json.dumps(_render(obj, False), separators=(",", ":")).encode()


def _render(obj: Any, msgpack_out: bool) -> Any:
    if isinstance(obj, RawRecord):
        return obj.data if msgpack_out else unpackb(obj.data)
    if isinstance(obj, dict):
        return {k: _render(v, msgpack_out) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_render(v, msgpack_out) for v in obj]
    return obj


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
