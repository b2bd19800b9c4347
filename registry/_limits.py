"""Bounds on everything a caller sends: nesting, numbers, text, and a workload's signature.

Each check raises :class:`InvalidRecord` (HTTP 400) with a message naming the field, so hostile or
broken input never reaches msgpack, LMDB or the event loop as something that raises a 500.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

from ._errors import InvalidRecord, RegistryError

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


T = TypeVar("T")


def parse_each(items: list[Any], parse: Callable[[Any], T], name: str) -> list[T]:
    """Validate every item of a batch; the first bad one fails the batch, named by its index."""
    parsed = []
    for i, item in enumerate(items):
        try:
            parsed.append(parse(item))
        except RegistryError as exc:
            raise type(exc)(f"{name}[{i}]: {exc}") from None
    return parsed


def check_text(value: str, name: str) -> str:
    """No control characters other than tab and newline (NUL would split LMDB index keys)."""
    if _CONTROL.search(value):
        raise InvalidRecord(f"field {name!r} contains control characters")
    return value


MAX_OP = 200  # characters of an op name, as the registry keeps it (an index key of LMDB's is at most 511 bytes)


def fit_op(name: str) -> str:
    """``name`` as an op name the registry keeps (:func:`check_op`): characters other than letters, digits, '_', '.' and
    '-' as '_', and a name over :data:`MAX_OP` characters cut to its head, '-' and 16 hex characters of its SHA-256, so
    that every process names one kernel alike. The op only describes a record: its key is the workload's."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", name) or "main"
    if len(name) <= MAX_OP:
        return name
    tail = "-" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return name[: MAX_OP - len(tail)] + tail


def check_op(value: str) -> str:
    if not _OP.fullmatch(value):
        raise InvalidRecord("field 'op' must be 1..200 characters of letters, digits, '_', '.', '-'")
    return value


def check_kind(value: str) -> str:
    if not _KIND.fullmatch(value):
        raise InvalidRecord("the target's 'kind' must be a short lowercase name (llvm, cuda, …)")
    return value


MAX_TARGET_QUERY = 4096  # a canonical target's bound (a record's target field)


def query_int(text: str | None, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]."""
    if text is None or text == "":
        return default
    if not re.fullmatch(r"-?[0-9]{1,20}", text):
        raise InvalidRecord(f"query parameter {name!r} must be an integer")
    return int(check_number(int(text), f"query parameter {name!r}", low=low, high=high, integer=True))


def query_target(params: Any) -> str:
    """The ``target`` query parameter ('' when absent): text of at most :data:`MAX_TARGET_QUERY` characters."""
    target = check_text(params.get("target") or "", "target")
    if len(target) > MAX_TARGET_QUERY:
        raise InvalidRecord(f"query parameter 'target' is over {MAX_TARGET_QUERY} characters: it is a kind or a canonical target")
    return target


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
    return [_buffer_arg(a.annotation, a.arg) for a in _signature_args(match.group(1))]


def signature_dims(workload: str) -> list[list[int]]:
    """Each argument's dimensions as the workload's ``def main(...)`` signature declares them, a dimension that is
    not a literal size (a symbolic one) as 0; [] where the signature does not parse as buffers."""
    match = _SIGNATURE.search(workload, 0, _MAX_SIGNATURE_CHARS)
    try:
        return [[_dim_or_zero(d, a.arg) for d in _buffer_shape(a.annotation, a.arg)] for a in _signature_args(match.group(1) if match else "")]
    except InvalidRecord:
        return []


def _signature_args(params: str) -> list[ast.arg]:
    """The arguments of a ``def main(...)`` signature's parameter text (raises InvalidRecord when it does not parse)."""
    try:
        tree = ast.parse(f"def main({params}): pass")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise InvalidRecord("the workload's signature does not parse") from None
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    return func.args.args


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
    shape = [_dim(d, name) for d in _buffer_shape(node, name)]
    assert isinstance(node, ast.Call)
    dtype = "float32"
    if len(node.args) > 1:
        if not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            raise InvalidRecord(f"workload argument {name!r} has no literal dtype")
        dtype = node.args[1].value
    return ["TENSOR", dtype, shape]


def _buffer_shape(node: ast.expr | None, name: str) -> list[ast.expr]:
    """The dimension nodes of a ``T.Buffer(shape, …)`` annotation (raises InvalidRecord for anything else)."""
    if not (isinstance(node, ast.Call) and dotted_name(node.func) == "T.Buffer" and node.args and not node.keywords):
        raise InvalidRecord(f"workload argument {name!r} is not a static T.Buffer")
    shape_node = node.args[0]
    return list(shape_node.elts) if isinstance(shape_node, ast.Tuple) else [shape_node]


def _dim_or_zero(node: ast.expr, name: str) -> int:
    """:func:`_dim`, or 0 for a dimension that is not a literal size (a symbolic one)."""
    try:
        return _dim(node, name)
    except InvalidRecord:
        return 0


def _dim(node: ast.expr, name: str) -> int:
    if isinstance(node, ast.Call) and dotted_name(node.func) in ("T.int64", "T.int32") and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool) and 0 <= node.value <= MAX_DIM:
        return node.value
    raise InvalidRecord(f"workload argument {name!r} has a dimension that is not a static size")


def dotted_name(node: ast.expr) -> str:
    """``T.axis.spatial`` for a chain of attributes on a name (``range`` for a name); "" for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


# -- workload text: data, never code -----------------------------------------------------------------
#
# TVM parses a workload with TVMScript, whose parser evaluates Python expressions: a workload
# ``T.evaluate(__import__("os").system(...))`` runs that command in every tuner, worker and hook that
# parses it. So a workload must be what TVM's printer writes: a PrimFunc (or an IRModule of one) built
# from ``T.*`` calls, ``range``, literals and arithmetic; no dunder names, no other calls, no imports,
# no rebinding of the parser's globals, and none of TIR's calls out of the kernel (packed functions,
# extern C symbols, external kernels), which would run whatever they name when the kernel runs.

_WORKLOAD_NODES = (
    ast.Module, ast.ClassDef, ast.FunctionDef, ast.arguments, ast.arg, ast.keyword, ast.Expr, ast.Assign, ast.AugAssign,
    ast.AnnAssign, ast.For, ast.While, ast.If, ast.With, ast.withitem, ast.Return, ast.Pass, ast.Assert, ast.Call,
    ast.Attribute, ast.Name, ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.Subscript, ast.Slice, ast.BinOp, ast.BoolOp,
    ast.UnaryOp, ast.Compare, ast.IfExp, ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)  # fmt: skip
_PARSER_GLOBALS = frozenset({"T", "I", "R", "Tx", "TypeVar", "ir", "relax", "tir", "tirx", "tvm", "Axis", "range"})
_CALLS_OUT = re.compile(r"call|packed|extern|external|kernel|launch|asm|ptx|print|profile|ffi|env_thread|import|load_module|source")
_DECORATORS = frozenset({"T.prim_func", "I.ir_module"})


def check_workload_source(text: str) -> None:
    """Refuse a workload text that is not plain TVMScript data (see above): an InvalidRecord saying why."""
    problem = _workload_problem(text)
    if problem is not None:
        raise InvalidRecord(f"field 'workload' is not a plain TVMScript PrimFunc: {problem}")


def _subclasses(*bases: type) -> frozenset[type]:
    """Every class that is one of ``bases`` or derives from one: what ``isinstance(node, bases)`` accepts of ``ast``'s nodes."""
    found: set[type] = set()
    pending = list(bases)
    while pending:
        cls = pending.pop()
        found.add(cls)
        pending.extend(cls.__subclasses__())
    return frozenset(found)


_WORKLOAD_NODE_TYPES = _subclasses(*_WORKLOAD_NODES)


def _name_problem(node: ast.Name) -> str | None:
    if node.id.startswith("_") or (node.id in _PARSER_GLOBALS and not isinstance(node.ctx, ast.Load)):
        return f"name {node.id!r} is not allowed there"
    return None


def _attribute_problem(node: ast.Attribute) -> str | None:
    return f"attribute {node.attr!r} is not allowed" if node.attr.startswith("_") else None


def _definition_problem(node: ast.FunctionDef | ast.ClassDef) -> str | None:
    if isinstance(node, ast.ClassDef) and (node.bases or node.keywords):
        return "a class with bases"
    for d in node.decorator_list:
        if dotted_name(d.func if isinstance(d, ast.Call) else d) not in _DECORATORS:
            return "a decorator other than T.prim_func / I.ir_module"
    return None


def _call_problem(node: ast.Call) -> str | None:
    name = dotted_name(node.func)
    parts = name.split(".")
    allowed = name == "range" or (parts[0] == "T" and (len(parts) == 2 or (len(parts) == 3 and parts[1] == "axis")))
    return None if allowed and not _CALLS_OUT.search(name.lower()) else f"a call to {name or 'an expression'} is not allowed"


#: The nodes checked beyond their kind, by their exact type.
_NODE_PROBLEMS: dict[type, Callable[[Any], str | None]] = {
    ast.Name: _name_problem, ast.Attribute: _attribute_problem, ast.FunctionDef: _definition_problem, ast.ClassDef: _definition_problem,
    ast.Call: _call_problem,
}  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _workload_problem(text: str) -> str | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "it does not parse as Python"
    nodes: list[ast.AST] = [tree]
    for node in nodes:  # breadth first, as ast.walk, by exact type (what parsing makes): 0.5 ms a 3 KB workload, against 1.4
        kind = type(node)
        if kind not in _WORKLOAD_NODE_TYPES:
            return f"{kind.__name__} is not allowed"
        check = _NODE_PROBLEMS.get(kind)
        if check is not None and (problem := check(node)) is not None:
            return problem
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                nodes.append(value)
            elif type(value) is list:
                nodes.extend(item for item in value if isinstance(item, ast.AST))
    return None


# -- trace annotations: schedule hints only ------------------------------------------------------------
#
# An ``Annotate`` instruction puts a key and a value on a loop or block, and some keys are code: TVM's
# LLVM backend links the value of ``pragma_import_llvm`` (LLVM IR) or ``pragma_import_c`` (C source)
# into the kernel. A trace may carry only the hints MetaSchedule's rules and postprocessors write.

_ANNOTATION_PREFIXES = ("meta_schedule.", "software_pipeline_")
_ANNOTATION_KEYS = frozenset({"pragma_auto_unroll_max_step", "pragma_unroll_explicit", "pragma_loop_partition_hint", "warp_execution"})


def check_trace_content(trace: list[Any], text: str | None = None) -> None:
    """Every check of what a parsed trace may hold, whoever reads it (a record's field, a job's or a caller's trace):
    only schedule hints annotated (:func:`check_annotations`), no instruction that changes what the kernel computes
    (:func:`check_instruction_kinds`), no object graph TVM would load unchecked (:func:`check_object_graphs`; given the
    JSON ``text`` the trace was parsed from, one whose text cannot hold a graph is not walked for them)."""
    check_annotations(trace)
    check_instruction_kinds(trace)
    check_object_graphs(trace, text)


def check_annotations(trace: list[Any]) -> None:
    """Refuse a trace (MetaSchedule's JSON, ``[instructions, decisions]``) that annotates anything but a schedule hint."""
    instructions = trace[0] if trace and isinstance(trace[0], list) else []
    for inst in instructions:
        if isinstance(inst, list) and inst and inst[0] == "Annotate":
            attrs = inst[2] if len(inst) > 2 and isinstance(inst[2], list) else []
            key = attrs[0] if attrs else None
            if not (isinstance(key, str) and (key in _ANNOTATION_KEYS or key.startswith(_ANNOTATION_PREFIXES))):
                raise InvalidRecord(f"field 'trace' annotates {str(key)[:64]!r}: only schedule hints "
                                    f"({', '.join(_ANNOTATION_PREFIXES)}…, {', '.join(sorted(_ANNOTATION_KEYS))}) are allowed")


# -- instructions that change what a kernel computes ---------------------------------------------------------
#
# Schedule primitives keep what a kernel computes, except the unsafe ones, which MetaSchedule never emits:
# ``UnsafeSetDType`` gives a buffer another element type (a float32 accumulator in float16 computes close to
# right), ``UnsafeHideBufferAccess`` and ``AnnotateBufferAccess`` change the accesses TVM's checks see.

_UNSAFE_INSTRUCTIONS = frozenset({"UnsafeSetDType", "UnsafeHideBufferAccess", "AnnotateBufferAccess"})


def check_instruction_kinds(trace: list[Any]) -> None:
    """Refuse a trace (MetaSchedule's JSON) holding an instruction that may change what the kernel computes."""
    instructions = trace[0] if trace and isinstance(trace[0], list) else []
    unsafe = {inst[0] for inst in instructions if isinstance(inst, list) and inst and inst[0] in _UNSAFE_INSTRUCTIONS}
    if unsafe:
        raise InvalidRecord(f"field 'trace' holds {', '.join(sorted(unsafe))}: an instruction that may change what the kernel "
                            "computes, which MetaSchedule never emits")


# -- object graphs inside a trace ----------------------------------------------------------------------
#
# Some instructions carry a TVM object as a string: ``TransformLayout`` and ``TransformBlockLayout`` an IndexMap
# in tvm-ffi's JSON graph form (``{"root_index": …, "nodes": [{"type": …, "data": …}, …]}``), where an object's
# fields name other nodes by index. TVM loads such a graph without checking it: an 806-byte trace whose graph
# has a node naming itself, or one naming a later node, crashed the replaying process (a segmentation fault),
# and so did a chain of 5,000 additions (1,000 loaded). A graph may hold only what an IndexMap is made of, each
# node naming earlier nodes only, at most MAX_GRAPH_DEPTH deep.

MAX_GRAPH_NODES = 1024
MAX_GRAPH_DEPTH = 64
_GRAPH_LITERALS = {"int": int, "float": float, "bool": bool, "ffi.String": str}
_GRAPH_OBJECTS = frozenset({"ir.PrimType", "ir.Var", "ir.IntImm", "ir.FloatImm", "tirx.IndexMap"} | {f"prim.{op}" for op in (
    "Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max", "Cast")})  # fmt: skip  (Cast: RewriteLayout's maps cast indices to int64)
#: Fields a graph writes inline, not as a node's index, by object type ("" any): a type's dtype (short text), a float
#: constant's value (a pad value: ``transform_layout(..., pad_value=0.0)``).
_INLINE_FIELDS: dict[tuple[str, str], Callable[[Any], bool]] = {("", "dtype"): lambda v: isinstance(v, str) and len(v) <= 32,
                                                                ("ir.FloatImm", "value"): lambda v: type(v) is float}  # fmt: skip


def _inline(kind: str, field: str, value: Any) -> bool:
    check = _INLINE_FIELDS.get((kind, field)) or _INLINE_FIELDS.get(("", field))
    return check is not None and check(value)


def check_object_graphs(trace: Any, text: str | None = None) -> None:
    """Refuse a trace (MetaSchedule's JSON) holding a string that is an object graph TVM would load unchecked (a
    JSON object) unless it is a small IndexMap whose nodes name earlier nodes only (see the comment above). Given the
    JSON ``text`` the trace was parsed from, a trace whose text cannot hold one is not walked (:func:`may_hold_graphs`)."""
    if text is not None and not may_hold_graphs(text):
        return
    for item in graph_strings(trace):
        problem = _graph_problem_of(item)
        if problem:
            raise InvalidRecord(f"field 'trace' holds an object graph TVM would load unchecked: {problem}")


def may_hold_graphs(text: str) -> bool:
    """Whether JSON ``text`` may hold a string that is a JSON object: only where it holds a ``{``, or an escape
    (``\\u007b`` is one). Most traces hold neither, and reading one costs no walk of its thousands of items."""
    return "{" in text or "\\u" in text


def graph_strings(value: Any) -> list[str]:
    """Every string anywhere in a parsed JSON ``value`` (lists, objects' keys and values) that is a JSON object."""
    found: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, str) and item.lstrip().startswith("{"):
            found.append(item)
    return found


#: Object graphs this long and shorter are checked once a process: the same layout rewrite recurs across a key's records.
_MEMO_GRAPH_CHARS = 16 << 10


def _graph_problem_of(text: str) -> str | None:
    return _memo_graph_problem(text) if len(text) <= _MEMO_GRAPH_CHARS else _graph_problem(text)


@functools.lru_cache(maxsize=1024)
def _memo_graph_problem(text: str) -> str | None:
    return _graph_problem(text)


def _graph_problem(text: str) -> str | None:
    try:
        graph = json.loads(text)
    except (ValueError, RecursionError):
        return "not JSON"
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    root = graph.get("root_index") if isinstance(graph, dict) else None
    if not isinstance(nodes, list) or not 0 < len(nodes) <= MAX_GRAPH_NODES or type(root) is not int or not 0 <= root < len(nodes):
        return f"not a graph of at most {MAX_GRAPH_NODES} nodes with its root among them"
    depth: list[int] = []
    for index, node in enumerate(nodes):
        kind = node.get("type") if isinstance(node, dict) else None
        data = node.get("data") if isinstance(node, dict) else None
        if kind == "None":
            refs: list[Any] = []
        elif kind in _GRAPH_LITERALS:
            if type(data) is not _GRAPH_LITERALS[kind] or (kind == "ffi.String" and len(data) > 256):
                return f"node {index} is not a {kind}"
            refs = []
        elif kind == "ffi.Array" and isinstance(data, list):
            refs = data
        elif kind in _GRAPH_OBJECTS and isinstance(data, dict):  # fields name nodes, but a few are written inline
            refs = [v for k, v in data.items() if not _inline(kind, k, v)]
        else:
            return f"node {index} is a {str(kind)[:40]!r}, not part of an IndexMap"
        if not all(type(r) is int and 0 <= r < index for r in refs):
            return f"node {index} names a node that is not before it"
        depth.append(1 + max((depth[r] for r in refs), default=0))
        if depth[-1] > MAX_GRAPH_DEPTH:
            return f"node {index} is {depth[-1]} deep, over the limit of {MAX_GRAPH_DEPTH}"
    return None
