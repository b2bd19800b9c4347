"""Neighbours of a missed key: records of the same structure that may transfer to it.

A :class:`Probe` is what a client sends for a key it looks up: the key, its structure and workload
ids (see ``_keys.structure_key`` / ``workload_key``), its canonical target and its argument shapes.
The store finds keys of the same structure and ranks them:

1. ``compiler``: the same workload on the same target under another compiler fingerprint (a TVM
   upgrade); the trace was tuned for exactly this loop nest;
2. ``shape``: the same target, other shapes, nearest first (sum of |log2| size ratios over the
   arguments' dimensions);
3. ``target``: another target of the same kind (e.g. another ``-mcpu``), nearest shapes first.

Nothing here says a candidate applies: the client replays it on its own kernel and keeps it only
if the replay succeeds within its bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._errors import InvalidRecord
from ._keys import is_key
from ._limits import MAX_DIM, check_text, signature_dims
from ._records import MAX_ARGS, Identity, Record, RefusedRecord, served_records

COMPILER, SHAPE, TARGET = "compiler", "shape", "target"
RELATIONS = (COMPILER, SHAPE, TARGET)
MAX_RANK = 16  # dimensions per argument in a probe
MAX_TARGET_CHARS = 4096
MISMATCH = 1000.0  # distance of argument lists that do not line up


def shape_distance(a: list[list[int]], b: list[list[int]]) -> float:
    """Sum of |log2(x/y)| over corresponding dimensions; MISMATCH per argument of another rank. A dimension
    of 0 in ``a`` (the probe) is a symbolic size: any size matches it."""
    if len(a) != len(b):
        return MISMATCH * max(len(a), len(b))
    total = 0.0
    for dims_a, dims_b in zip(a, b):
        if len(dims_a) != len(dims_b):
            total += MISMATCH
            continue
        total += sum(abs(math.log2(x / max(y, 1))) for x, y in zip(dims_a, dims_b) if x > 0)
    return total


def dims_of(identity: Identity) -> list[list[int]]:
    """The dimensions of each argument of ``identity``'s kernel: its ``args_info``'s, or where its shapes are
    symbolic (``DYNAMIC``), its signature's, a symbolic size as 0 (:func:`shape_distance`)."""
    if not identity.symbolic:
        return [list(arg[2]) for arg in identity.args_info]
    dims = signature_dims(identity.workload)
    return dims if len(dims) <= MAX_ARGS and all(len(d) <= MAX_RANK for d in dims) else []


@dataclass(frozen=True)
class Probe:
    """What a client tells the registry about a key, so that it can name neighbours on a miss."""

    key: str
    structure: str
    workload: str  # workload id: target and workload without the compiler fingerprint
    target: str
    dims: list[list[int]]

    @classmethod
    def of(cls, identity: Identity) -> Probe:
        return cls(identity.key, identity.structure, identity.workload_id, identity.target, dims_of(identity))

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "structure": self.structure, "workload": self.workload, "target": self.target, "dims": self.dims}

    @classmethod
    def from_obj(cls, obj: Any) -> Probe:
        if not isinstance(obj, dict):
            raise InvalidRecord("each probe must be a map/object")
        ids = [obj.get(name) for name in ("key", "structure", "workload")]
        if not all(isinstance(v, str) and is_key(v) for v in ids):
            raise InvalidRecord("a probe's 'key', 'structure' and 'workload' must be sha256 hex strings")
        target = obj.get("target")
        if not isinstance(target, str) or len(target) > MAX_TARGET_CHARS:
            raise InvalidRecord(f"a probe's 'target' must be a string of at most {MAX_TARGET_CHARS} characters")
        dims = obj.get("dims")
        if not isinstance(dims, list) or len(dims) > MAX_ARGS or not all(_dims_ok(d) for d in dims):
            raise InvalidRecord(f"a probe's 'dims' must be at most {MAX_ARGS} lists of at most {MAX_RANK} dimensions in 0..{MAX_DIM}")
        return cls(ids[0], ids[1], ids[2], check_text(target, "target"), [list(d) for d in dims])

    def rank(self, target: str, workload: str, dims: list[list[int]]) -> tuple[int, float, str]:
        """(tier, distance, relation) of a neighbour with these fields: lower is better."""
        if target == self.target:
            if workload == self.workload:
                return (0, 0.0, COMPILER)
            return (1, shape_distance(self.dims, dims), SHAPE)
        return (2, shape_distance(self.dims, dims), TARGET)


def _dims_ok(dims: Any) -> bool:
    return (isinstance(dims, list) and len(dims) <= MAX_RANK
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in dims))  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """A neighbour's best record offered for a missed key, and how it relates to that key."""

    record: Record
    relation: str  # compiler | shape | target
    distance: float


def served_candidates(near: dict[str, list[tuple[bytes, dict[str, Any], str, float]]],
                      refused: list[RefusedRecord] | None = None) -> dict[str, list[Candidate]]:  # fmt: skip
    """Each missed key's candidates from (record bytes, status, relation, distance) items, in order; a record
    this version refuses is left out and appended to ``refused`` (see :func:`served_records`)."""
    return {key: [Candidate(record, relation, distance)
                  for data, status, relation, distance in items
                  for record in served_records([(data, status)], refused)] for key, items in near.items()}  # fmt: skip
