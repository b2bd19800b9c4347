"""The content address of a workload: sha256 over canonical strings.

The inputs are text so that the registry can verify a key without TVM: the hook side
(``schedhub.hooks.kernels.identity``) produces the canonical strings, this module only hashes them.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

SCHEMA_VERSION = "schedhub/1"
KEY_RE = re.compile(r"^[0-9a-f]{64}$")


def record_key(fingerprint: str, target: str, workload: str, schema: str = SCHEMA_VERSION) -> str:
    """sha256 hex of (schema ‖ compiler fingerprint ‖ canonical target ‖ canonical workload).

    Each field is length-prefixed, so no two field tuples hash the same byte string.
    """
    return _digest(schema, fingerprint, target, workload)


def is_key(text: str) -> bool:
    return isinstance(text, str) and KEY_RE.fullmatch(text) is not None


def _plain(value: Any) -> Any:
    """JSON-ready form of an exported target value (tuples become lists, the rest stays)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def canonical_target(exported: dict[str, Any]) -> str:
    """Canonical text of a target's ``export()`` dict: JSON, sorted keys, empty fields dropped."""
    cleaned = {k: v for k, v in _plain(exported).items() if v not in ("", None, [], {})}
    return json.dumps(cleaned, sort_keys=True, separators=(",", ":"))


def _target_fields(target: str) -> dict[str, Any]:
    """A canonical target text's fields; empty when it is not a JSON object."""
    try:
        parsed = json.loads(target)
    except (ValueError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def target_kind(target: str) -> str:
    """The kind (``llvm``, ``cuda`` …) of a canonical target text; '' when it is not JSON."""
    return str(_target_fields(target).get("kind", ""))


def target_digest(target: str) -> bytes:
    """16 bytes naming a canonical target text in an index row (the text may be longer than an LMDB key)."""
    return hashlib.sha256(target.encode()).digest()[:16]


def target_device(target: str) -> str:
    """The device model a canonical target's kernels are built for (``mcpu`` of a CPU target, ``arch``
    of a GPU one); '' for a generic target, whose kernels run on any device of its kind."""
    fields = _target_fields(target)
    return str(fields.get("mcpu") or fields.get("arch") or "")


# -- neighbours: what a workload shares with others ----------------------------------------------
#
# A trace replays by block and loop names, loop counts and iteration kinds; sizes are re-derived.
# So workloads whose *skeleton* matches (signature ranks and dtypes, buffers, loop nests, blocks,
# iteration kinds; every integer abstracted) are candidates for one another's schedules, and the
# replay on the user's kernel is the check. Index expressions are left out: batch 1 broadcasts a
# bias with the batch index where batch 4 writes a constant, and the same trace serves both.

_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_]\w*|\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|(\d+)')
_SYMBOLIC_SIZE = re.compile(r'^(\w+) = TypeVar\("\1"\)$', re.MULTILINE)  # the printer declares them first
_MAX_DECLARATIONS_CHARS = 4096
_SKELETON_LINE = re.compile(r"\s*(?:def |for |with T\.sblock\(|with T\.init\(|[\w, ]+= T\.axis\.|\w+ = T\.sblock_alloc_buffer\(|T\.where\()")


def skeleton(workload: str) -> str:
    """The lines of a canonical workload a trace depends on, integers replaced by ``?``, and a symbolic size
    (a variable the printer declares ``n = TypeVar("n")``: a dynamic batch or sequence length) written as a
    static one is, ``T.int64(?)``: the same op with a dynamic dimension finds its static neighbours."""
    symbolic = frozenset(_SYMBOLIC_SIZE.findall(workload, 0, _MAX_DECLARATIONS_CHARS))
    lines = (line for line in workload.splitlines() if _SKELETON_LINE.match(line))
    return "\n".join(_TOKEN.sub(lambda m: _abstract(m, symbolic), line) for line in lines)


def _abstract(match: re.Match[str], symbolic: frozenset[str]) -> str:
    if match.group(1) is not None:
        return "?"
    return "T.int64(?)" if match.group(0) in symbolic else match.group(0)


def _digest(*fields: str) -> str:
    h = hashlib.sha256()
    for field in fields:
        data = field.encode("utf-8")
        h.update(b"%d:" % len(data))
        h.update(data)
    return h.hexdigest()


def structure_key(target: str, workload: str, schema: str = SCHEMA_VERSION) -> str:
    """sha256 hex of (schema ‖ target kind ‖ skeleton): the same op at any shape, under any compiler."""
    return _digest(schema, "structure", target_kind(target), skeleton(workload))


def workload_key(target: str, workload: str, schema: str = SCHEMA_VERSION) -> str:
    """sha256 hex of (schema ‖ canonical target ‖ canonical workload): one workload under any compiler."""
    return _digest(schema, "workload", target, workload)
