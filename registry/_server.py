"""The registry's HTTP API: a Starlette app whose LMDB store opens in its lifespan.

msgpack in and out by Content-Type / Accept, JSON otherwise. Writes need a bearer token when
tokens are configured; the server re-derives every key from the record's fields; bodies are
size-limited; malformed input is a 4xx with a message, never a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from ._commit import GroupCommitter
from ._errors import InvalidRecord, NotFound, PayloadTooLarge, RegistryError, Unauthorized
from ._keys import is_key
from ._openapi import OPENAPI
from ._records import Identity, Record
from ._service import LocalRegistry
from ._wire import RawRecord, check_length, decode_body, encode_body, field, wants_msgpack

DEFAULT_MAX_BODY = 16 << 20
MAX_LOOKUP_KEYS = 4096
MAX_PAGE = 1000


class RegistryApp:
    """Holds the open registry, the committer and counters for one serving process."""

    def __init__(self, root: str | os.PathLike[str], tokens: dict[str, str] | None, max_body: int, sync: bool, read_only: bool) -> None:
        self.root = root
        self.tokens = dict(tokens or {})
        self.max_body = max_body
        self.sync = sync
        self.read_only = read_only
        self.registry: LocalRegistry | None = None
        self.committer: GroupCommitter | None = None
        self.counters: Counter[str] = Counter()
        self.started = time.time()

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.registry = LocalRegistry(self.root, sync=self.sync, readonly=self.read_only)
        self.committer = None if self.read_only else GroupCommitter(self.registry.store.env)
        try:
            yield
        finally:
            if self.committer is not None:
                self.committer.close()
            self.registry.close()

    # -- plumbing --------------------------------------------------------------------------

    @property
    def reg(self) -> LocalRegistry:
        assert self.registry is not None, "the app is not started (lifespan)"
        return self.registry

    def writer(self, request: Request) -> str:
        """The name behind the request's bearer token; Unauthorized without a valid one."""
        if self.read_only or self.committer is None:
            raise Unauthorized("this registry is read-only")
        if not self.tokens:
            return "anonymous"
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("writes need 'Authorization: Bearer <token>' (schedhub --token or SCHEDHUB_TOKEN)")
        for known, name in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return name
        raise Unauthorized("the bearer token is not accepted by this registry")

    async def body(self, request: Request) -> Any:
        check_length(request.headers.get("content-length"), self.max_body)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise PayloadTooLarge(f"body is over the limit of {self.max_body} bytes")
            chunks.append(chunk)
        return decode_body(b"".join(chunks), request.headers.get("content-type", ""))

    async def write(self, fn: Callable[..., Any]) -> Any:
        assert self.committer is not None
        return await asyncio.wrap_future(self.committer.submit(fn))


def reply(request: Request, obj: Any, status: int = 200) -> Response:
    as_msgpack = wants_msgpack(request.headers.get("accept", ""))
    media = "application/msgpack" if as_msgpack else "application/json"
    return Response(encode_body(obj, as_msgpack), status_code=status, media_type=media)


def path_key(request: Request) -> str:
    key = request.path_params["key"]
    if not is_key(key):
        raise InvalidRecord(f"{key!r:.80} is not a key: expected 64 lowercase hex characters (sha256)")
    return key


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


def _records_body(raws: list[bytes]) -> list[RawRecord]:
    return [RawRecord(b) for b in raws]


def create_app(
    root: str | os.PathLike[str],
    *,
    tokens: dict[str, str] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    sync: bool = True,
    read_only: bool = False,
) -> Starlette:
    """The registry as an ASGI app over the store at ``root`` (opened when the app starts).

    ``tokens`` maps bearer token → writer name; None or empty lets anyone write, which the CLI
    only allows on a loopback address.
    """
    state = RegistryApp(root, tokens, max_body, sync, read_only)

    async def get_record(request: Request) -> Response:
        key = path_key(request)
        raws = state.reg.get_raw(key)
        state.counters["hits" if raws else "misses"] += 1
        if request.method == "HEAD":
            return Response(status_code=200 if raws else 404)
        if not raws:
            raise NotFound(f"no records for key {key}")
        return reply(request, {"key": key, "records": _records_body(raws)})

    async def put_record(request: Request) -> Response:
        key = path_key(request)
        who = state.writer(request)
        record = Record.from_obj(await state.body(request), expected_key=key)
        result = (await state.write(lambda txn: state.reg.put_many([record], who, txn=txn)))[0]
        state.counters["puts"] += 1
        return reply(request, result.__dict__, 201 if result.kept else 200)

    async def post_records(request: Request) -> Response:
        who = state.writer(request)
        records = parse_each(field(await state.body(request), "records", list), Record.from_obj, "records")
        results = await state.write(lambda txn: state.reg.put_many(records, who, txn=txn))
        state.counters["puts"] += len(records)
        return reply(request, {"results": [r.__dict__ for r in results]})

    async def list_records(request: Request) -> Response:
        q = request.query_params
        try:
            since = int(q.get("since", "0"))
            limit = min(int(q.get("limit", str(MAX_PAGE))), MAX_PAGE)
        except ValueError:
            raise InvalidRecord("'since' and 'limit' must be integers") from None
        page = state.reg.summaries(q.get("op") or None, q.get("target") or None, since, limit)
        items: list[dict[str, Any]] = [s.to_dict() for s in page]
        if q.get("include") == "records":
            found = state.reg.lookup_raw([s.key for s in page])
            for item in items:
                item["records"] = _records_body(found.get(item["key"], []))
        cursor = page[-1].seq if page else since
        return reply(request, {"items": items, "next": cursor, "more": len(page) == limit and not q.get("op")})

    async def lookup(request: Request) -> Response:
        keys = field(await state.body(request), "keys", list)
        if len(keys) > MAX_LOOKUP_KEYS or not all(isinstance(k, str) and is_key(k) for k in keys):
            raise InvalidRecord(f"'keys' must be at most {MAX_LOOKUP_KEYS} sha256 hex keys")
        found = state.reg.lookup_raw(keys)
        state.counters["hits"] += len(found)
        state.counters["misses"] += len(set(keys) - set(found))
        return reply(request, {
            "records": {k: _records_body(v) for k, v in found.items()},
            "missing": [k for k in keys if k not in found],
        })  # fmt: skip

    async def quarantine(request: Request) -> Response:
        key = path_key(request)
        state.writer(request)
        body = await state.body(request)
        trace_id, reason = field(body, "trace_id", str), field(body, "reason", str, "")
        moved = await state.write(lambda txn: state.reg.quarantine(key, trace_id, reason[:4000], txn=txn))
        if not moved:
            raise NotFound(f"key {key} has no record with trace_id {trace_id}")
        return reply(request, {"key": key, "trace_id": trace_id, "quarantined": True})

    async def report_misses(request: Request) -> Response:
        state.writer(request)
        misses = parse_each(field(await state.body(request), "misses", list), Identity.from_obj, "misses")
        results = await state.write(lambda txn: state.reg.report_misses(misses, txn=txn))
        return reply(request, {"results": results})

    async def lease(request: Request) -> Response:
        state.writer(request)
        body = await state.body(request)
        worker = field(body, "worker", str)
        max_jobs = field(body, "max_jobs", int, 1)
        lease_secs = float(field(body, "lease_secs", (int, float), 300.0))
        fingerprint = field(body, "fingerprint", str, "") or None
        kind = field(body, "kind", str, "") or None
        if not 1 <= max_jobs <= 100 or not 0 < lease_secs <= 86400:
            raise InvalidRecord("max_jobs must be 1..100 and lease_secs 0..86400")
        leases = await state.write(lambda txn: state.reg.lease(worker, max_jobs, lease_secs, fingerprint=fingerprint, kind=kind, txn=txn))
        return reply(request, {"leases": [{"key": l.key, "lease_id": l.lease_id, "expires": l.expires, "job": l.job} for l in leases]})

    async def queue_action(request: Request) -> Response:
        key = path_key(request)
        state.writer(request)
        action = request.path_params["action"]
        body = await state.body(request) if action != "requeue" else {}
        if action == "requeue":
            await state.write(lambda txn: state.reg.requeue(key, txn=txn))
            return reply(request, {"key": key, "state": "pending"})
        lease_id = field(body, "lease_id", str)
        if action == "renew":
            secs = float(field(body, "lease_secs", (int, float), 300.0))
            expires = await state.write(lambda txn: state.reg.renew(key, lease_id, secs, txn=txn))
            return reply(request, {"key": key, "expires": expires})
        if action == "ack":
            await state.write(lambda txn: state.reg.ack(key, lease_id, txn=txn))
            return reply(request, {"key": key, "state": "done"})
        if action == "fail":
            error = field(body, "error", str, "")
            new_state = await state.write(lambda txn: state.reg.fail(key, lease_id, error, txn=txn))
            return reply(request, {"key": key, "state": new_state})
        raise NotFound(f"unknown queue action {action!r}: use renew, ack, fail or requeue")

    async def list_queue(request: Request) -> Response:
        state_filter = request.query_params.get("state") or None
        return reply(request, {"jobs": state.reg.jobs(state_filter, 1000)})

    async def stats(request: Request) -> Response:
        committer = state.committer
        return reply(request, {
            **state.reg.stats(),
            "since_start": dict(state.counters),
            "uptime_secs": time.time() - state.started,
            "commits": {"batches": committer.batches, "writes": committer.writes} if committer else None,
            "read_only": state.read_only or committer is None,
        })  # fmt: skip

    async def health(request: Request) -> Response:
        return reply(request, {"ok": True})

    async def openapi(request: Request) -> Response:
        return reply(request, OPENAPI)

    async def dashboard(request: Request) -> Response:
        s = state.reg.stats()
        recent = state.reg.summaries(since=max(0, s["cursor"] - 50))[::-1]
        rows = "".join(
            f"<tr><td><code>{html.escape(r.key[:16])}…</code></td><td>{html.escape(r.op)}</td><td>{html.escape(r.kind)}</td>"
            f"<td>{r.count}</td><td>{r.best_secs * 1e6:.1f}</td></tr>"
            for r in recent
        )
        queue = ", ".join(f"{k}: {v}" for k, v in s["queue"].items())
        return HTMLResponse(
            f"<!doctype html><title>schedhub</title><h1>schedhub registry</h1>"
            f"<p>{s['keys']} keys, {s['measurements']} measurements, {s['quarantined']} quarantined; queue {queue}</p>"
            f"<table border=1 cellpadding=4><tr><th>key</th><th>op</th><th>target</th><th>records</th><th>best µs</th></tr>{rows}</table>"
            f"<p>API: <a href='/openapi.json'>/openapi.json</a></p>"
        )

    async def on_error(request: Request, exc: Exception) -> Response:
        status = exc.status if isinstance(exc, RegistryError) else 500
        message = str(exc) if isinstance(exc, RegistryError) else f"internal error: {exc.__class__.__name__}"
        return reply(request, {"error": exc.__class__.__name__, "message": message, "status": status}, status)

    routes = [
        Route("/", dashboard),
        Route("/healthz", health),
        Route("/openapi.json", openapi),
        Route("/v1/stats", stats),
        Route("/v1/records", list_records, methods=["GET"]),
        Route("/v1/records", post_records, methods=["POST"]),
        Route("/v1/records/{key}", get_record, methods=["GET", "HEAD"]),
        Route("/v1/records/{key}", put_record, methods=["PUT"]),
        Route("/v1/records/{key}/quarantine", quarantine, methods=["POST"]),
        Route("/v1/lookup", lookup, methods=["POST"]),
        Route("/v1/misses", report_misses, methods=["POST"]),
        Route("/v1/queue", list_queue, methods=["GET"]),
        Route("/v1/queue/lease", lease, methods=["POST"]),
        Route("/v1/queue/{key}/{action}", queue_action, methods=["POST"]),
    ]
    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        return reply(request, {"error": "HTTPError", "message": str(exc.detail), "status": exc.status_code}, exc.status_code)

    handlers = {Exception: on_error, RegistryError: on_error, HTTPException: on_http_error}
    app = Starlette(routes=routes, lifespan=state.lifespan, exception_handlers=handlers)
    app.state.registry_app = state
    return app
