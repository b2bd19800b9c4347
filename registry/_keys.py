"""The content address of a workload: sha256 over canonical strings.

The inputs are text so that the registry can verify a key without TVM: the hook side
(``schedhub.hooks.identity``) produces the canonical strings, this module only hashes them.
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
    h = hashlib.sha256()
    for field in (schema, fingerprint, target, workload):
        data = field.encode("utf-8")
        h.update(b"%d:" % len(data))
        h.update(data)
    return h.hexdigest()


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


def target_kind(target: str) -> str:
    """The kind (``llvm``, ``cuda`` …) of a canonical target text; '' when it is not JSON."""
    try:
        parsed = json.loads(target)
    except (ValueError, RecursionError):
        return ""
    return str(parsed.get("kind", "")) if isinstance(parsed, dict) else ""
