"""A server's answers, read as hostile input: every shape checked, every failure a MalformedAnswer.

The client parses each answer inside :func:`reading`, so a broken proxy, a wrong URL or a hostile
server makes a call raise :class:`MalformedAnswer` (a :class:`RegistryError`, which every caller
already handles: the hook falls back, the worker retries) and never a ``KeyError`` in the middle of a
compile. Typed answers (:func:`typed`) ignore fields they do not know, so a newer server's additions
do not break an older client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import typing
from collections.abc import Iterator
from typing import Any, TypeVar

from ._errors import InvalidRecord, MalformedAnswer
from ._limits import check_depth
from ._records import unpackb
from ._wire import is_msgpack

T = TypeVar("T")


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """Turn whatever parsing ``what`` raises into a MalformedAnswer that names it."""
    try:
        yield
    except MalformedAnswer:
        raise
    except (InvalidRecord, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # InvalidRecord: a record or status that fails validation
        raise MalformedAnswer(f"the answer to {what} is malformed ({exc.__class__.__name__}: {str(exc)[:300]})") from None


def decode(body: bytes, content_type: str, what: str) -> Any:
    """The answer's value: msgpack or JSON by its content type, nested at most as deep as a request may be."""
    with reading(what):
        if is_msgpack(content_type):
            value = unpackb(body)
        elif content_type.split(";")[0].strip().lower() == "application/json":
            try:
                value = json.loads(body)
            except RecursionError:
                raise ValueError("nested too deeply") from None
        else:
            raise MalformedAnswer(f"the answer to {what} is {content_type or 'untyped'!r}, not msgpack or JSON: not a registry's answer")
        check_depth(value)
        return value


def typed(cls: type[T], obj: Any) -> T:
    """A dataclass whose fields are str, int, float, bool or dict, built from a map with each field's type checked."""
    if not isinstance(obj, dict):
        raise TypeError(f"expected a map for {cls.__name__}, got {type(obj).__name__}")
    values = {}
    for name, kind, required in _fields(cls):
        if name not in obj:
            if required:
                raise KeyError(name)
            continue
        value = obj[name]
        if not _is(value, kind):
            raise TypeError(f"{cls.__name__}.{name} must be {kind.__name__}, got {type(value).__name__}")
        values[name] = value
    return cls(**values)


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, type, bool], ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        (f.name, typing.get_origin(hints[f.name]) or hints[f.name],
         f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    )  # fmt: skip


def mapping(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{name!r} must be a map, got {type(value).__name__}")
    return value


def listing(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{name!r} must be a list, got {type(value).__name__}")
    return value


def text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name!r} must be a string, got {type(value).__name__}")
    return value


def number(value: Any, name: str) -> float:
    if not _is(value, float):
        raise TypeError(f"{name!r} must be a finite number, got {value!r:.40}")
    return float(value)
