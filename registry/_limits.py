"""Bounds on everything a caller sends: nesting, numbers, text, and a workload's signature.

Each check raises :class:`InvalidRecord` (HTTP 400) with a message naming the field, so hostile or
broken input never reaches msgpack, LMDB or the event loop as something that raises a 500.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from ._errors import InvalidRecord

MAX_DEPTH = 32  # nesting of any request body (a record needs 4)
MAX_INT = 2**53  # integers exact in a double: what JSON clients can round-trip
MAX_DIM = 2**31 - 1
MAX_SECS = 86400.0  # lease and renew times
MAX_CURSOR = 2**63 - 1
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline stay allowed in long texts
_OP = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
_KIND = re.compile(r"[a-z][a-z0-9_\-]{0,63}")
_SIGNATURE = re.compile(r"def main\((.*?)\)\s*(?:->[^:\n]*)?:", re.S)
# The printer's usual form, ``arg0: T.Buffer((T.int64(1), 512), "float32")``: parsed without ``ast`` (10x faster).
_BUFFER_ARG = re.compile(r"""\s*(\w+)\s*:\s*T\.Buffer\(\(((?:[^()]|\([^()]*\))*)\)\s*(?:,\s*(['"])(\w+)\3)?\s*\)\s*(?:,|$)""")
_DIM = re.compile(r"\s*(?:T\.int(?:64|32)\(\s*([0-9]+)\s*\)|([0-9]+))\s*")
_MAX_SIGNATURE_CHARS = 64 << 10


def check_depth(obj: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse containers nested deeper than ``limit`` (iterative: a deep body cannot recurse here)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                raise InvalidRecord(f"body is nested deeper than {limit} levels")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))


def check_number(value: Any, name: str, *, low: float, high: float, integer: bool = False) -> float:
    """A finite number in [low, high] (an int when ``integer``); bool is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise InvalidRecord(f"{name} must be {'an integer' if integer else 'a number'}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRecord(f"{name} must be finite, got {value!r}")
    if not low <= value <= high:
        raise InvalidRecord(f"{name} must be within {low:g}..{high:g}, got {value!r:.40}")
    return value


def check_text(value: str, name: str) -> str:
    """No control characters other than tab and newline (NUL would split LMDB index keys)."""
    if _CONTROL.search(value):
        raise InvalidRecord(f"field {name!r} contains control characters")
    return value


def check_op(value: str) -> str:
    if not _OP.fullmatch(value):
        raise InvalidRecord("field 'op' must be 1..200 characters of letters, digits, '_', '.', '-'")
    return value


def check_kind(value: str) -> str:
    if not _KIND.fullmatch(value):
        raise InvalidRecord("the target's 'kind' must be a short lowercase name (llvm, cuda, …)")
    return value


def query_int(text: str | None, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]."""
    if text is None or text == "":
        return default
    if not re.fullmatch(r"-?[0-9]{1,20}", text):
        raise InvalidRecord(f"query parameter {name!r} must be an integer")
    return int(check_number(int(text), f"query parameter {name!r}", low=low, high=high, integer=True))


def signature_args_info(workload: str) -> list[Any]:
    """MetaSchedule ArgInfo JSON derived from the canonical workload's ``def main(...)`` signature.

    Only static tensor buffers are understood (what MetaSchedule can tune); anything else is an
    InvalidRecord, so a job's arguments never come from what a caller claims.
    """
    match = _SIGNATURE.search(workload, 0, _MAX_SIGNATURE_CHARS)
    if match is None:
        raise InvalidRecord("the workload has no 'def main(...):' signature")
    fast = _usual_signature(match.group(1))
    if fast is not None:
        return fast
    try:
        tree = ast.parse(f"def main({match.group(1)}): pass")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise InvalidRecord("the workload's signature does not parse") from None
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    return [_buffer_arg(a.annotation, a.arg) for a in func.args.args]


def _usual_signature(text: str) -> list[Any] | None:
    """ArgInfo of a signature in the printer's usual form, or None to parse it the general way."""
    out, pos = [], 0
    while pos < len(text):
        arg = _BUFFER_ARG.match(text, pos)
        if arg is None or arg.end() == pos:
            return None
        dims = []
        for part in filter(str.strip, arg.group(2).split(",")):
            dim = _DIM.fullmatch(part)
            if dim is None or int(dim.group(1) or dim.group(2)) > MAX_DIM:
                return None
            dims.append(int(dim.group(1) or dim.group(2)))
        out.append(["TENSOR", arg.group(4) or "float32", dims])
        pos = arg.end()
    return out


def _buffer_arg(node: ast.expr | None, name: str) -> list[Any]:
    if not (isinstance(node, ast.Call) and _dotted(node.func) == "T.Buffer" and node.args and not node.keywords):
        raise InvalidRecord(f"workload argument {name!r} is not a static T.Buffer")
    shape_node = node.args[0]
    dims = shape_node.elts if isinstance(shape_node, ast.Tuple) else [shape_node]
    shape = [_dim(d, name) for d in dims]
    dtype = "float32"
    if len(node.args) > 1:
        if not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            raise InvalidRecord(f"workload argument {name!r} has no literal dtype")
        dtype = node.args[1].value
    return ["TENSOR", dtype, shape]


def _dim(node: ast.expr, name: str) -> int:
    if isinstance(node, ast.Call) and _dotted(node.func) in ("T.int64", "T.int32") and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool) and 0 <= node.value <= MAX_DIM:
        return node.value
    raise InvalidRecord(f"workload argument {name!r} has a dimension that is not a static size")


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""
