"""The OpenAPI description served at /openapi.json (hand-written: the API is small and stable)."""

from __future__ import annotations

from typing import Any


_QUERY = {
    "since": {"type": "integer", "minimum": 0},
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    "op": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,200}$"},
    "target": {"type": "string", "maxLength": 4096},
    "include": {"enum": ["records"]},
    "newest": {"enum": ["0", "1"], "description": "1: the last 'limit' matching changes instead of the first"},
    "prefix": {"type": "string", "pattern": "^[0-9a-f]{8,64}$", "description": "only keys that start with it"},
    "state": {"enum": ["pending", "leased", "done", "dead"]},
    "after": {"type": "string", "pattern": "^[0-9a-f]{64}$|^[0-9a-f]{162}$", "description": "a job id; with order=lease, 'next' of the previous page"},
    "order": {"enum": ["id", "lease"], "description": "lease: pending jobs in the order they are handed out"},
    "cursor": {"type": "string", "pattern": "^([0-9a-f]{2}){0,512}$", "description": "'next' of the previous page"},
    "verified": {"enum": ["0", "1"], "description": "1: only logs pushed by workers"},
    "model_target": {"type": "string", "pattern": "^\\{", "maxLength": 4096, "description": "a canonical target (JSON text)"},
    "model_compiler": {"type": "string", "maxLength": 4096, "description": "the compiler fingerprint the model's features come from"},
    "model_features": {"type": "string", "maxLength": 256, "description": "the feature set's name"},
    "log_target": {"type": "string", "pattern": "^\\{", "maxLength": 4096, "description": "a canonical target (JSON text): only its logs"},
    "log_structure": {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "a structure id (an op at any shape on a target kind; "
                      "needs target): only its logs, read from their own index (what a search's cost model starts from)"},
    "caller_after": {"type": "string", "maxLength": 128, "description": "'next' of the previous page: callers after this name"},
    "page_limit": {"type": "integer", "minimum": 1, "maximum": 500},
}


def _op(summary: str, body: str | None = None, ok: str = "200", auth: bool = False, params: list[str] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {ok: {"description": "ok"}, "4XX": {"$ref": "#/components/responses/Error"}}}
    if body:
        op["requestBody"] = {"required": True, "content": {m: {"schema": {"$ref": f"#/components/schemas/{body}"}} for m in ("application/msgpack", "application/json")}}
    if auth:
        op["security"] = [{"bearer": []}]
    if params:
        op["parameters"] = [{"name": p.removeprefix("log_").removeprefix("model_").removeprefix("caller_").removeprefix("page_"), "in": "query", "required": p.startswith("model_"), "schema": _QUERY[p]} for p in params]
    return op


_KEY = {"name": "key", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}
_IDENTITY = {
    "key": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    "schema": {"type": "string"},
    "fingerprint": {"type": "string"},
    "target": {"type": "string", "description": "canonical target JSON text"},
    "workload": {"type": "string", "description": "canonical TVMScript of the fused PrimFunc"},
    "op": {"type": "string"},
    "args_info": {"type": "array"},
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "schedhub registry", "version": "1",
             "description": "Tuned TVM schedules keyed by sha256(schema ‖ fingerprint ‖ target ‖ workload). "
                            "Bodies are msgpack (Content-Type/Accept: application/msgpack) or JSON."},  # fmt: skip
    "paths": {
        "/healthz": {"get": _op("liveness")},
        "/v1/stats": {"get": _op("store, queue and request counters")},
        "/v1/records": {
            "get": _op("page through keys changed after a cursor", params=["since", "limit", "op", "target", "include", "newest", "prefix"]),
            "post": _op("push many records in one transaction (a push token's new records are claims: 429 and nothing stored past its bound of verifications awaiting)", "RecordBatch", auth=True),
        },
        "/v1/records/{key}": {
            "parameters": [_KEY],
            "get": _op("the key's records, best first"),
            "head": _op("does the key have records"),
            "put": _op("push one record; the key must hash from its fields (429 past the pusher's bound of verifications awaiting)", "Record", "201", auth=True),
        },
        "/v1/records/{key}/complaints": {"parameters": [_KEY], "post": _op("report a record that failed here (read role; rate-limited, and 429 past the caller's bound of verifications awaiting); queues its verification", "Complaint", auth=True)},
        "/v1/records/{key}/quarantine": {"parameters": [_KEY], "post": _op("take a record out of service (admin)", "Complaint", auth=True)},
        "/v1/quarantine": {"get": _op("records out of service, with why and whose", params=["limit"])},
        "/v1/callers": {"get": _op("callers that hold anything here, by name, with what each holds (the counts its bounds are checked against) and the bounds", params=["caller_after", "page_limit"])},
        "/v1/callers/{name}/forget": {"parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1, "maxLength": 128}}],
                                      "post": _op("take out what a caller left behind, after revoking its token (admin): its claims (with verified: its "
                                                  "verified records too), the queue jobs it asked for, its measurement log, its ended work", "Forget", auth=True)},
        "/v1/lookup": {"post": _op("records of many keys in one round trip; with probes, candidates of the same structure for keys that have none", "Lookup")},
        "/v1/misses": {"post": _op("report workloads without records (read role; queued for tuning; rate-limited per caller, and 429 past the caller's bound of jobs awaiting tuning)", "MissBatch", auth=True)},
        "/v1/networks": {"post": _op("report which kernels one compile built and each one's calls per forward pass (read role; rate-limited; 429 past "
                                     "the caller's or the registry's bound of networks kept): what the queue refines a network's bottleneck by", "Network", auth=True),
                         "get": _op("the networks reported last, newest first: each one's kernels, how many hold a verified record, the estimate those "
                                    "give (Σ calls × best time) and its goal (read role)", auth=True)},
        "/v1/trials": {
            "get": _op("page through the measurement log: every trial tuners measured, per key and pusher (at most 200 a page)", params=["cursor", "limit", "verified", "log_target", "log_structure"]),
            "post": _op("push a tuning run's measured trials for one workload (push role; merged into your entry, newest 64 kept; 429 past your bound of unverified log bytes)", "TrialLog", auth=True),
        },
        "/v1/models": {
            "get": _op("the cost model served for a target, compiler and feature set (404: none)", params=["model_target", "model_compiler", "model_features"]),
            "put": _op("serve a cost model trained on a target's verified measurement log (worker role; replaces the one served)", "CostModel", auth=True),
        },
        "/v1/queue": {"get": _op("queue job summaries, one page (no lease ids): by job id, or with order=lease the pending jobs in the order they are handed out",
                                 params=["state", "limit", "after", "order"])},
        "/v1/queue/lease": {"post": _op("lease pending jobs (worker role)", "LeaseRequest", auth=True)},
        "/v1/queue/refine": {"post": _op("requeue for one more search the reported networks' bottleneck kernel a worker of this compiler, target kind "
                                         "and device can tune (worker role); answers what was requeued, or null", "RefineRequest", auth=True)},
        "/v1/queue/{key}": {"parameters": [_KEY], "get": _op("one queue job, whole")},
        "/v1/queue/{key}/{action}": {
            "parameters": [_KEY, {"name": "action", "in": "path", "required": True, "schema": {"enum": ["renew", "ack", "fail", "release", "requeue"]}}],
            "post": _op("renew, ack (with a verdict for verify jobs; with refine: true after a tune job's first pass), fail or release a lease you hold (worker); requeue a job (admin)", "LeaseAction", auth=True),
        },
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "responses": {"Error": {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
        "schemas": {
            "Error": {"type": "object", "properties": {"error": {"type": "string"}, "message": {"type": "string"}, "status": {"type": "integer"}}},
            "Identity": {"type": "object", "required": list(_IDENTITY), "properties": _IDENTITY},
            "Record": {
                "type": "object",
                "required": [*_IDENTITY, "trace", "run_secs"],
                "properties": {**_IDENTITY, "trace": {"type": "string"}, "run_secs": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}},
                               "provenance": {"type": "object"}},  # fmt: skip
            },
            "RecordBatch": {"type": "object", "required": ["records"], "properties": {"records": {"type": "array", "items": {"$ref": "#/components/schemas/Record"}}}},
            "TrialLog": {"type": "object", "required": ["identity", "trials"], "properties": {
                "identity": {"$ref": "#/components/schemas/Identity"},
                "trials": {"type": "array", "minItems": 1, "maxItems": 512, "items": {"type": "object", "required": ["trace", "secs"], "properties": {
                    "trace": {"type": "string"}, "secs": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6}}}}}},
            "CostModel": {"type": "object", "required": ["target", "compiler", "features", "trials", "model"], "properties": {
                "target": {"type": "string", "maxLength": 4096}, "compiler": {"type": "string", "maxLength": 4096}, "features": {"type": "string", "maxLength": 256},
                "trials": {"type": "integer", "minimum": 0},
                "model": {"type": "object", "required": ["width", "base", "trees"], "properties": {
                    "width": {"type": "integer", "minimum": 1, "maximum": 16384}, "base": {"type": "number"},
                    "trees": {"type": "array", "minItems": 1, "maxItems": 4096, "items": {"type": "object", "required": ["left", "right", "feature", "value", "default_left"],
                              "description": "node i: children left[i], right[i] (later nodes, or both -1: a leaf), feature[i] < value[i] goes left (missing: default_left[i]); a leaf's value is its output"}}}}}},
            "Network": {"type": "object", "required": ["kernels"], "properties": {"kernels": {"type": "array", "minItems": 1, "maxItems": 512, "items": {
                "type": "object", "required": ["key", "calls"], "additionalProperties": False, "properties": {
                    "key": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "calls": {"type": "integer", "minimum": 1, "maximum": 1048576}}}},
                "name": {"type": "string", "minLength": 1, "maxLength": 80, "description": "printable, no spaces at its ends; the first reporter's stays"},
                "goal": {"type": "object", "required": ["label", "secs"], "additionalProperties": False, "description": "the latency the network aims at",
                         "properties": {"label": {"type": "string", "minLength": 1, "maxLength": 40}, "secs": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600}}}}},
            "RefineRequest": {"type": "object", "required": ["fingerprint", "kind"], "properties": {
                "fingerprint": {"type": "string", "minLength": 1, "maxLength": 4096}, "kind": {"type": "string", "minLength": 1, "maxLength": 64},
                "device": {"type": "string", "maxLength": 64}}},
            "MissBatch": {"type": "object", "required": ["misses"], "properties": {"misses": {"type": "array", "items": {"$ref": "#/components/schemas/Identity"}}}},
            "Lookup": {"type": "object", "required": ["keys"], "properties": {
                "keys": {"type": "array", "items": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "maxItems": 4096},
                "top": {"type": "integer", "minimum": 1, "maximum": 64},
                "candidates": {"type": "integer", "minimum": 0, "maximum": 8},
                "weighing": {"type": "array", "maxItems": 4096, "items": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                             "description": "those of 'keys' asked only to weigh a rewrite the compile may not take: counted apart from its hits and misses"},
                "trust": {"description": "whose records the caller serves: candidates are chosen among them, and a key with none of them gets candidates (absent: any)",
                          "oneOf": [{"type": "string", "enum": ["verified", "any"]},
                                    {"type": "array", "maxItems": 64, "items": {"type": "string", "minLength": 1, "maxLength": 128}}]},
                "probes": {"type": "array", "maxItems": 4096, "items": {"type": "object", "required": ["key", "structure", "workload", "target", "dims"], "properties": {
                    "key": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "structure": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "workload": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "target": {"type": "string", "maxLength": 4096},
                    "dims": {"type": "array", "maxItems": 256, "description": "each argument's dimensions; 0: a symbolic size, which any size matches",
                             "items": {"type": "array", "maxItems": 16, "items": {"type": "integer", "minimum": 0, "maximum": 2147483647}}}}}}}},
            "Forget": {"type": "object", "properties": {"verified": {"type": "boolean"}}},
            "Complaint": {"type": "object", "required": ["trace_id"], "properties": {"trace_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"}, "reason": {"type": "string"}}},
            "LeaseRequest": {"type": "object", "required": ["worker"], "properties": {
                "worker": {"type": "string"}, "max_jobs": {"type": "integer", "minimum": 1, "maximum": 100},
                "lease_secs": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400}, "fingerprint": {"type": "string"}, "kind": {"type": "string"}, "device": {"type": "string", "maxLength": 64},
                "tasks": {"type": "array", "items": {"enum": ["tune", "verify"]}, "minItems": 1}}},
            "LeaseAction": {"type": "object", "properties": {
                "lease_id": {"type": "string"}, "lease_secs": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400}, "error": {"type": "string"}, "refine": {"type": "boolean"},
                "verdict": {"type": "object", "properties": {"run_secs": {"type": ["array", "null"], "items": {"type": "number"}}, "reason": {"type": "string"}}}}},
        },
    },
}
