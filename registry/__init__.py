"""schedhub.registry: tuned TVM schedules keyed by content address, in LMDB, over HTTP.

Needs neither TVM nor Ray. Public surface:

- keys: :func:`record_key`, :func:`canonical_target`, :data:`SCHEMA_VERSION`
- records: :class:`Record`, :class:`Identity` (canonical msgpack codec with validation)
- neighbours: :func:`structure_key`, :func:`workload_key`, :class:`Probe`, :class:`Candidate`:
  records of the same structure offered for a missed key (``lookup_with_candidates``)
- trust: :func:`trust_filter`, :func:`parse_trust`: whose records a reader accepts (verified ones by default)
- measurement log: :class:`Trial`, :class:`TrialLog`: every schedule a tuner measured (``push_trials``, ``iter_trial_logs``)
- served cost models: :class:`CostModelEntry`, :class:`Trees`: a target's ranking model, trained by a worker
  (``push_cost_model``, ``cost_model``)
- storage: :class:`LocalRegistry` over an LMDB root (:class:`Store`, :class:`MissQueue` beneath)
- HTTP: :func:`create_app` (Starlette) and :class:`RegistryClient` (httpx), same method names
- :func:`connect`: an instance, a URL or a directory → a registry
"""

from __future__ import annotations

import os
import re
from typing import Union

from ._auth import ROLES, Principal, TokenFile, load_tokens
from ._client import RegistryClient
from ._errors import (
    Forbidden,
    InvalidRecord,
    KeyMismatch,
    LeaseLost,
    MalformedAnswer,
    NotFound,
    PayloadTooLarge,
    RegistryError,
    RegistryUnavailable,
    StoreFull,
    RequestTimeout,
    TooManyRequests,
    Unauthorized,
)
from ._keys import SCHEMA_VERSION, canonical_target, is_key, record_key, skeleton, structure_key, target_device, target_kind, workload_key
from ._limits import MAX_OP, check_annotations, check_instruction_kinds, check_kind, fit_op, check_object_graphs, check_trace_content, check_workload_source, dotted_name, signature_args_info
from ._models import MAX_TREE_DEPTH, CostModelEntry, Tree, Trees
from ._neighbours import COMPILER, SHAPE, TARGET, Candidate, Probe, shape_distance
from ._networks import MAX_KERNELS as MAX_NETWORK_KERNELS, network_id, parse_name as check_network_name
from ._queue import DEAD, DONE, LEASED, PENDING, REFINE, TUNE, VERIFY, VERIFY_STREAK, Lease, MissQueue, task_label, verify_job_id
from ._usage import by_bytes_held, every_caller, size_text
from ._records import FLUSHED_SECS, Identity, Record, RefusedRecord, Served, keeps_default_schedule, packb, trace_id, trace_instructions, unpackb, vouch_for
from ._serve import InsecureServerError, ServerThread, serve
from ._server import CallerBounds, create_app
from ._service import LocalRegistry
from ._listing import KeyPage, KeySummary
from ._store import PutResult, Store, StoreFormatError
from ._trials import MAX_TRIALS_PER_ENTRY, Trial, TrialLog
from ._trust import Trust, parse_trust, trust_filter, trusted

Registry = Union[LocalRegistry, RegistryClient]
_ADDRESS = re.compile(r"[A-Za-z0-9.\-]+:[0-9]{1,5}(/.*)?")


def connect(spec: Registry | str | os.PathLike[str], **options: object) -> Registry:
    """A registry from an instance (returned as is), an ``http(s)://`` URL or a store directory."""
    if isinstance(spec, (LocalRegistry, RegistryClient)):
        return spec
    text = os.fspath(spec)
    if text.startswith(("http://", "https://")):
        return RegistryClient(text, **options)  # type: ignore[arg-type]
    if "://" in text:
        raise RegistryError(f"{text!r} is not a registry URL: write it as http://HOST:PORT, or give a store directory")
    if _ADDRESS.fullmatch(text) and not os.path.exists(text):
        raise RegistryError(f"{text!r} looks like a server address, not a store directory: write http://{text}")
    return LocalRegistry(text, **options)  # type: ignore[arg-type]


__all__ = [
    "SCHEMA_VERSION", "record_key", "canonical_target", "is_key", "target_kind", "target_device",
    "skeleton", "structure_key", "workload_key", "Probe", "Candidate", "shape_distance", "COMPILER", "SHAPE", "TARGET",
    "Record", "FLUSHED_SECS", "RefusedRecord", "Identity", "Served", "Trust", "trusted", "trust_filter", "parse_trust", "Trial", "TrialLog", "MAX_TRIALS_PER_ENTRY", "CostModelEntry", "Tree", "Trees", "MAX_TREE_DEPTH", "keeps_default_schedule", "vouch_for", "trace_id", "trace_instructions", "packb", "unpackb", "signature_args_info", "check_workload_source", "check_annotations", "check_instruction_kinds", "check_object_graphs", "check_trace_content", "check_kind", "fit_op", "MAX_OP", "dotted_name",
    "MAX_NETWORK_KERNELS", "network_id", "check_network_name",
    "Principal", "TokenFile", "ROLES", "TUNE", "VERIFY", "VERIFY_STREAK", "REFINE", "task_label", "verify_job_id", "by_bytes_held", "every_caller", "size_text",
    "Store", "StoreFormatError", "MissQueue", "Lease", "KeyPage", "KeySummary", "PutResult",
    "PENDING", "LEASED", "DONE", "DEAD",
    "LocalRegistry", "RegistryClient", "Registry", "connect", "create_app", "CallerBounds",
    "serve", "ServerThread", "load_tokens", "InsecureServerError",
    "RegistryError", "InvalidRecord", "KeyMismatch", "PayloadTooLarge", "NotFound", "MalformedAnswer",
    "Unauthorized", "Forbidden", "TooManyRequests", "RequestTimeout", "LeaseLost", "RegistryUnavailable", "StoreFull",
]  # fmt: skip
