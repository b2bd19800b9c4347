"""The registry's HTTP API: a Starlette app whose LMDB store opens in its lifespan.

msgpack in and out by Content-Type / Accept, JSON otherwise. Writes need a bearer token when
tokens are configured; the server re-derives every key from the record's fields; bodies are
size-limited; malformed input is a 4xx with a message, never a 500.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field as bound
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from . import _dashboard
from ._auth import MAX_NAME, RateLimiter, Principal, TokenFile, as_principals, authenticate
from ._commit import GroupCommitter
from ._errors import Forbidden, InvalidRecord, NotFound, PayloadTooLarge, RegistryError, RequestTimeout, TooManyRequests, Unauthorized
from ._forget import FORGOTTEN
from ._history import DEFAULT_KEPT_BYTES
from ._keys import is_key
from ._neighbours import Probe
from ._limits import MAX_CURSOR, MAX_SECS, MAX_TARGET_QUERY, check_number, check_op, check_text, parse_each, query_int, query_target
from ._models import MAX_FEATURES_CHARS, CostModelEntry
from ._networks import parse_goal, parse_kernels, parse_name
from ._openapi import OPENAPI
from ._queue import DONE, PENDING, REFINE, STATES, TASKS, TUNE
from ._records import Identity, Record, run_secs_field
from ._service import LocalRegistry
from ._store import PutResult
from ._trials import TrialLog
from ._trust import accepts_entry, trust_of_request, trusted
from ._wire import ERROR_HEADER, RawRecord, check_length, decode_body, encode_body, field, wants_msgpack

DEFAULT_MAX_BODY = 16 << 20
DEFAULT_BODY_TIMEOUT = 30.0  # seconds for a whole request body to arrive
MAX_LOOKUP_KEYS = 4096
MAX_CANDIDATES = 8  # neighbours offered per missed key
MAX_ANSWER_BYTES = 32 << 20  # a lookup answer past this lists the rest under 'truncated'; a page of records ends
MAX_PAGE = 1000
MAX_SCAN = 10_000  # feed rows one listing reads: a filter that matches little answers a short page with more=true
MAX_QUEUE_PAGE = 500
MAX_TRIAL_PAGE = 200  # trial logs per page (each up to 64 traces)


@dataclass(frozen=True)
class CallerBounds:
    """What one caller (a token; without tokens, a name and address) may ask of a registry: 429 past any bound."""

    complaints_per_minute: int = bound(default=30, metadata={"help": "Complaints a minute per caller (each queues a verification)."})
    misses_per_minute: int = bound(default=1200, metadata={"help": "Reported misses a minute per caller (each adds demand; a new one, a job)."})
    claims_awaiting: int = bound(default=256, metadata={
        "help": "Verifications a caller may have waiting (claims it pushed, records it complained about): each costs a worker a replay, builds, timings."})
    misses_awaiting: int = bound(default=4096, metadata={
        "help": "Tune jobs a caller's miss reports may have queued and not yet tuned: each holds its workload and costs a worker a search."})
    claimed_log_bytes: int = bound(default=256 << 20, metadata={
        "help": "Bytes of unverified measurement log a pusher may store, over all keys (an entry holds up to 2 MiB)."})
    records_bytes: int = bound(default=1 << 30, metadata={
        "help": "Bytes of records in service a pusher may own (its claims and its verified records; a worker's and an admin's are not bounded)."})
    unverified_percent: int = bound(default=75, metadata={
        "help": "Percent of the store's map (its file's size) past which callers that are not workers or admins may add nothing: their "
                "misses, claims, complaints and unverified logs answer 429, and the rest of the map is kept for verified records "
                "(every caller's own bounds times enough callers would fill any map)."})
    kept_bytes: int = bound(default=DEFAULT_KEPT_BYTES, metadata={
        "help": "Bytes of a caller's ended work kept for the record (finished and dead jobs it asked for, its records taken out "
                "of service): past it, its oldest go."})
_OFF_LOOP_BYTES = 64 << 10  # bodies larger than this are decoded in a worker thread
#: Reads answered on the event loop: up to this many keys whose stored values hold up to this many bytes in all. A hop
#: to the thread pool costs a small read more than the read itself (2.4-3.9x fewer requests/s, bench.serverload); a
#: large read done on the loop holds every other request back (a /healthz waited seconds behind a few lookups).
ON_LOOP_KEYS = 64
ON_LOOP_BYTES = 256 << 10
#: JSON answers over this many bytes of records are encoded in a worker thread (decoding each record to render it
#: as JSON costs ~1 ms per 10 KB); msgpack answers carry records as they are stored, encoded on the loop up to
#: :data:`MAX_ANSWER_BYTES`' share below.
JSON_ON_LOOP_BYTES = 64 << 10
MSGPACK_ON_LOOP_BYTES = 4 << 20
_TRACE_ID = re.compile(r"[0-9a-f]{16}")
T = TypeVar("T")


def public_stats(reg: LocalRegistry) -> dict[str, Any]:
    """The store's figures as anyone may read them: not where the store lives on the server (a home folder names its user)."""
    return {k: v for k, v in reg.stats().items() if k != "root"}


class RegistryApp:
    """Holds the open registry, the committer and counters for one serving process."""

    def __init__(self, root: str | os.PathLike[str], tokens: dict[str, str | Principal] | TokenFile | None, max_body: int, sync: bool,
                 read_only: bool, body_timeout: float | None, bounds: CallerBounds) -> None:  # fmt: skip
        self.root = root
        self._token_file = tokens if isinstance(tokens, TokenFile) else None
        self._tokens = {} if isinstance(tokens, TokenFile) else as_principals(tokens)
        self.open = self._token_file is None and not self._tokens  # anyone may write (loopback only: see serve())
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.sync = sync
        self.read_only = read_only
        self.registry: LocalRegistry | None = None
        self.committer: GroupCommitter | None = None
        self.counters: Counter[str] = Counter()
        self.activity = _dashboard.Activity()
        self.bounds = bounds
        self.complaints = RateLimiter(bounds.complaints_per_minute, 60.0)
        self.misses = RateLimiter(bounds.misses_per_minute, 60.0)
        self.started = time.time()

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.registry = LocalRegistry(self.root, sync=self.sync, readonly=self.read_only, kept_bytes=self.bounds.kept_bytes)
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

    @property
    def tokens(self) -> dict[str, Principal]:
        """The tokens in force (a token file's as it is now)."""
        return self._token_file.tokens if self._token_file is not None else self._tokens

    def require(self, request: Request, role: str) -> Principal:
        """The caller behind the bearer token, if its role allows ``role``; every such call writes."""
        if self.read_only or self.committer is None:
            raise Unauthorized("this registry is read-only")
        principal = authenticate(self.tokens, request.headers.get("authorization", ""), open_registry=self.open)
        if not principal.can(role):
            raise Forbidden(f"token {principal.name!r} has role {principal.role!r}; this call needs {role!r} or above")
        return principal

    def caller(self, request: Request, who: Principal) -> str:
        """Whom a rate limit counts: the token's name, or without tokens (a loopback registry) the name and client address."""
        return f"{who.name}@{request.client.host if request.client else '?'}" if self.open else who.name

    async def body(self, request: Request) -> Any:
        """The decoded body: size-limited, time-limited, nesting-limited, large ones decoded off the loop."""
        check_length(request.headers.get("content-length"), self.max_body)
        if self.body_timeout is None:  # the HTTP protocol keeps the deadline (_protocol.DeadlineProtocol)
            data = await self._read(request)
        else:
            data = await within(self.body_timeout, self._read(request), f"the request body did not arrive within {self.body_timeout:g} s")
        content_type = request.headers.get("content-type", "")
        request.state.body_bytes = len(data)
        if len(data) > _OFF_LOOP_BYTES:
            return await run_in_threadpool(decode_body, data, content_type)
        return decode_body(data, content_type)

    async def _read(self, request: Request) -> bytes:
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise PayloadTooLarge(f"body is over the limit of {self.max_body} bytes")
                chunks.append(chunk)
        except ClientDisconnect:  # gone before its body came (the protocol's deadline closes such a connection)
            raise RequestTimeout("the client went away before its request body arrived") from None
        return b"".join(chunks)

    async def write(self, fn: Callable[..., Any]) -> Any:
        assert self.committer is not None
        return await asyncio.wrap_future(self.committer.submit(fn))

    def check_share(self, who: Principal, txn: Any = None, adding: int = 0) -> None:
        """Refuse what an untrusted caller would add once the store's data (as ``txn`` sees it, with ``adding`` bytes
        more: :meth:`.Store.held`, which deleting data lowers) is past its share of the map."""
        if who.trusted:
            return
        held = self.reg.store.held(txn) + adding / self.reg.store.env.info()["map_size"]
        if held * 100 > self.bounds.unverified_percent:
            raise TooManyRequests(f"the registry's store is {held:.0%} full: past {self.bounds.unverified_percent}% it keeps the rest "
                                  "for verified records, and takes no more misses, claims, complaints or unverified logs (its "
                                  "operator can give it a larger map: SCHEDHUB_MAP_SIZE)")  # fmt: skip

    async def write_within_share(self, who: Principal, request: Request, fn: Callable[[Any], T]) -> T:
        """:meth:`write` of an untrusted caller's data checked against the store's share inside the write transaction, its
        own bytes counted (twice the body's: LMDB's pages hold a value of some KB in about twice its size), so that
        concurrent writers cannot pass the share together; a trusted caller's as it is."""
        if who.trusted:
            return await self.write(fn)
        self.check_share(who)  # at once, before the request waits for the writer
        adding = 2 * getattr(request.state, "body_bytes", 0)

        def within(txn: Any) -> T:
            self.check_share(who, txn, adding)
            return fn(txn)

        return await self.write(within)

    async def push(self, records: list[Record], who: Principal, request: Request) -> list[PutResult]:
        """Store ``records`` as ``who``'s push, within its bounds: claims awaiting verification, bytes of records in
        service (a trusted pusher's are not bounded), the store's share for unverified data."""
        bytes_limit = None if who.trusted else self.bounds.records_bytes
        return await self.write_within_share(who, request, lambda txn: self.reg.put_many(records, who.name, verified=who.trusted, claim_limit=self.bounds.claims_awaiting,
                                                                                          bytes_limit=bytes_limit, txn=txn))  # fmt: skip


async def within(seconds: float, awaitable: Awaitable[T], message: str) -> T:
    """``await awaitable``, raising :class:`RequestTimeout` with ``message`` past ``seconds``. One timer handle that
    cancels this task: every request with a body pays it (asyncio.wait_for makes a task, asyncio.timeout costs 1.5x)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    handle = loop.call_at(loop.time() + seconds, expire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if expired and task.uncancel() == 0:
            raise RequestTimeout(message) from None
        raise
    finally:
        handle.cancel()


def reply(request: Request, obj: Any, status: int = 200) -> Response:
    as_msgpack = wants_msgpack(request.headers.get("accept", ""))
    return _response(encode_body(obj, as_msgpack), as_msgpack, obj, status)


async def reply_records(request: Request, obj: Any, record_bytes: int) -> Response:
    """:func:`reply` for an answer holding ``record_bytes`` of stored records: encoded in a worker thread where that is
    large for its format (JSON renders every record; msgpack copies them), so one answer stalls no other request."""
    as_msgpack = wants_msgpack(request.headers.get("accept", ""))
    if record_bytes > (MSGPACK_ON_LOOP_BYTES if as_msgpack else JSON_ON_LOOP_BYTES):
        return _response(await run_in_threadpool(encode_body, obj, as_msgpack), as_msgpack, obj, 200)
    return _response(encode_body(obj, as_msgpack), as_msgpack, obj, 200)


def _response(body: bytes, as_msgpack: bool, obj: Any, status: int) -> Response:
    media = "application/msgpack" if as_msgpack else "application/json"
    headers = {ERROR_HEADER: obj["error"]} if status >= 400 and isinstance(obj, dict) and "error" in obj else None
    return Response(body, status_code=status, media_type=media, headers=headers)


def entries_bytes(entries: list[tuple[bytes, dict[str, Any]]]) -> int:
    return sum(len(b) for b, _ in entries)


def path_key(request: Request) -> str:
    key = request.path_params["key"]
    if not is_key(key):
        raise InvalidRecord(f"{key!r:.80} is not a key: expected 64 lowercase hex characters (sha256)")
    return key


def _records_body(raws: list[bytes]) -> list[RawRecord]:
    return [RawRecord(b) for b in raws]


def trace_id_field(body: Any) -> str:
    trace_id = field(body, "trace_id", str)
    if not _TRACE_ID.fullmatch(trace_id):
        raise InvalidRecord("'trace_id' must be 16 lowercase hex characters")
    return trace_id


def bounded_text(body: Any, name: str, limit: int = 4000) -> str:
    return check_text(field(body, name, str, "")[:limit], name)


def lease_secs_field(body: Any, name: str = "lease_secs") -> float:
    return float(check_number(field(body, name, (int, float), 300.0), name, low=0.001, high=MAX_SECS))


def stored_as(request: Request) -> Callable[[bytes], Any]:
    """How an answer holds a stored record: its bytes as they are in msgpack (packed as ``bin`` without a callback per
    record), a :class:`RawRecord` that JSON renders."""
    return _as_is if wants_msgpack(request.headers.get("accept", "")) else RawRecord


def _as_is(data: bytes) -> bytes:
    return data


def served_body(entries: list[tuple[bytes, dict[str, Any]]], wrap: Callable[[bytes], Any] = RawRecord) -> dict[str, Any]:
    return {"records": [wrap(b) for b, _ in entries], "entries": [s for _, s in entries]}


def lookup_answer(found: dict[str, list[tuple[bytes, dict[str, Any]]]], missing: list[str],
                  near: dict[str, list[tuple[bytes, dict[str, Any], str, float]]], wrap: Callable[[bytes], Any] = RawRecord) -> tuple[dict[str, Any], int]:  # fmt: skip
    """A lookup's answer (each record as ``wrap`` makes it: :func:`stored_as`) and the bytes of records it holds: keys
    past :data:`MAX_ANSWER_BYTES` are listed under 'truncated' (the first key always fits); candidates are a best
    effort, left out past it."""
    records: dict[str, list[tuple[bytes, dict[str, Any]]]] = {}
    truncated: list[str] = []
    size = 0
    for key, entries in found.items():
        size += entries_bytes(entries)
        if size > MAX_ANSWER_BYTES and records:
            truncated.append(key)
        else:
            records[key] = entries
    candidates: dict[str, list[dict[str, Any]]] = {}
    for key, items in near.items():
        size += sum(len(b) for b, *_ in items)
        if size > MAX_ANSWER_BYTES:
            break
        candidates[key] = [{"record": wrap(b), "entry": st, "relation": rel, "distance": d} for b, st, rel, d in items]
    return {
        "records": {k: [wrap(b) for b, _ in v] for k, v in records.items()},
        "entries": {k: [s for _, s in v] for k, v in records.items()},
        "missing": missing, "truncated": truncated, "candidates": candidates,
    }, size  # fmt: skip


def create_app(
    root: str | os.PathLike[str],
    *,
    tokens: dict[str, str | Principal] | TokenFile | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    sync: bool = True,
    read_only: bool = False,
    body_timeout: float | None = DEFAULT_BODY_TIMEOUT,
    bounds: CallerBounds | None = None,
) -> Starlette:
    """The registry as an ASGI app over the store at ``root`` (opened when the app starts).

    ``tokens`` maps bearer token → :class:`Principal` (name and role; a plain name is an admin), or is a
    :class:`TokenFile`, read again when it changes. None or empty lets anyone write, which the CLI only allows on a
    loopback address.
    ``bounds``: each caller's rates and what it may have waiting (default: :class:`CallerBounds`' defaults).
    ``body_timeout``: seconds for a request body to arrive (408 past it); None where the HTTP server keeps that deadline
    (:func:`.server_config`'s protocol, as ``serve`` and ``ServerThread`` run the app).
    """
    state = RegistryApp(root, tokens, max_body, sync, read_only, body_timeout, bounds or CallerBounds())

    async def read_entries(keys: list[str], top: int | None = None) -> dict[str, list[tuple[bytes, dict[str, Any]]]]:
        """The keys' entries: read on the loop when they are few and small, else in a worker thread."""
        if len(keys) <= ON_LOOP_KEYS and (found := state.reg.lookup_entries_within(keys, top, ON_LOOP_BYTES)) is not None:
            return found
        return await run_in_threadpool(state.reg.lookup_entries, keys, top)

    async def get_record(request: Request) -> Response:
        key = path_key(request)
        entries = (await read_entries([key])).get(key, [])
        state.counters["hits" if entries else "misses"] += 1
        if request.method == "HEAD":
            return Response(status_code=200) if entries else Response(status_code=404, headers={ERROR_HEADER: "NotFound"})
        if not entries:
            raise NotFound(f"no records for key {key}")
        return await reply_records(request, {"key": key, **served_body(entries, stored_as(request))}, entries_bytes(entries))

    async def put_record(request: Request) -> Response:
        key = path_key(request)
        who = state.require(request, "push")
        record = Record.from_obj(await state.body(request), expected_key=key)
        result = (await state.push([record], who, request))[0]
        state.counters["puts"] += 1
        return reply(request, result.__dict__, 201 if result.kept else 200)

    async def post_records(request: Request) -> Response:
        who = state.require(request, "push")
        body = await state.body(request)
        records = await run_in_threadpool(parse_each, field(body, "records", list), Record.from_obj, "records")
        results = await state.push(records, who, request)
        state.counters["puts"] += len(records)
        return reply(request, {"results": [r.__dict__ for r in results]})

    async def list_records(request: Request) -> Response:
        q = request.query_params
        since = query_int(q.get("since"), "since", 0, 0, MAX_CURSOR)
        limit = query_int(q.get("limit"), "limit", MAX_PAGE, 1, MAX_PAGE)
        op = check_op(q["op"]) if q.get("op") else None
        target = query_target(q) or None
        newest = q.get("newest", "0")
        if newest not in ("0", "1"):
            raise InvalidRecord("query parameter 'newest' must be 0 or 1")
        prefix = q.get("prefix", "")
        if prefix and not re.fullmatch(r"[0-9a-f]{8,64}", prefix):
            raise InvalidRecord("query parameter 'prefix' must be 8 to 64 lowercase hex characters")

        def page_of() -> tuple[dict[str, Any], int]:
            found = state.reg.page(op, target, since, limit, newest=newest == "1", prefix=prefix, scan=MAX_SCAN)
            page, more = found.items, found.more
            bodies: dict[str, dict[str, Any]] = {}
            size = 0
            if q.get("include") == "records":  # key by key, and no further than MAX_ANSWER_BYTES past the first
                for i, summary in enumerate(page):
                    entries = state.reg.lookup_entries([summary.key]).get(summary.key, [])
                    size += entries_bytes(entries)
                    if size > MAX_ANSWER_BYTES and i > 0:
                        page, more = page[:i], True
                        break
                    bodies[summary.key] = served_body(entries)
            items = [s.to_dict() | bodies.get(s.key, {}) for s in page]
            cut = len(page) < len(found.items)
            return {"items": items, "next": page[-1].seq if cut else found.next, "more": more}, size

        return await reply_records(request, *await run_in_threadpool(page_of))

    async def lookup(request: Request) -> Response:
        body = await state.body(request)
        keys = field(body, "keys", list)
        top = int(check_number(field(body, "top", int, 8), "top", low=1, high=64, integer=True))
        per_key = int(check_number(field(body, "candidates", int, 0), "candidates", low=0, high=MAX_CANDIDATES, integer=True))
        if len(keys) > MAX_LOOKUP_KEYS or not all(isinstance(k, str) and is_key(k) for k in keys):
            raise InvalidRecord(f"'keys' must be at most {MAX_LOOKUP_KEYS} sha256 hex keys")
        raw_weighing = field(body, "weighing", list, [])
        if len(raw_weighing) > MAX_LOOKUP_KEYS or not all(isinstance(k, str) for k in raw_weighing) or not set(raw_weighing) <= set(keys):
            raise InvalidRecord("'weighing' names keys of 'keys' only: those asked to weigh a rewrite, not to compile")
        weighing = set(raw_weighing)
        raw_probes = field(body, "probes", list, [])
        if len(raw_probes) > MAX_LOOKUP_KEYS:
            raise InvalidRecord(f"'probes' must be at most {MAX_LOOKUP_KEYS} probes")
        parsing = (lambda: parse_each(raw_probes, Probe.from_obj, "probes"))
        probes = {p.key: p for p in (await run_in_threadpool(parsing) if len(raw_probes) > ON_LOOP_KEYS else parsing())}
        try:
            trust = trust_of_request(body.get("trust"))  # a map: field() checked it
        except ValueError as exc:
            raise InvalidRecord(str(exc)) from None
        unique = list(dict.fromkeys(keys))
        found = await read_entries(unique, top)
        missing = [k for k in unique if k not in found]
        near: dict[str, list[tuple[bytes, dict[str, Any], str, float]]] = {}
        if probes and per_key:  # keys with nothing this caller serves get candidates it would serve
            accepts = trusted(trust)
            wanted = [probes[k] for k in unique if k in probes and not any(accepts_entry(accepts, st) for _, st in found.get(k, []))]
            near = await run_in_threadpool(state.reg.neighbours, wanted, per_key, accepts) if wanted else {}
        result, size = lookup_answer(found, missing, near, stored_as(request))
        taken = [k for k in unique if k not in weighing]  # the keys a compile takes; the rest only weigh rewrites it may not take
        counts = {"hits": sum(k in found for k in taken), "misses": sum(k not in found for k in taken),
                  "transfers": sum(k in result["candidates"] for k in taken), "weighed": len(unique) - len(taken)}  # fmt: skip
        state.counters.update(counts)
        state.activity.add(**counts)
        return await reply_records(request, result, size)

    async def complain(request: Request) -> Response:
        key = path_key(request)
        who = state.require(request, "read")
        body = await state.body(request)
        trace_id, reason = trace_id_field(body), bounded_text(body, "reason")
        caller = state.caller(request, who)
        if not state.complaints.allow(caller):
            raise TooManyRequests(f"{caller!r} is over {state.complaints.count} complaints a minute; try again later")
        status = await state.write_within_share(who, request, lambda txn: state.reg.complain(key, trace_id, reason, caller, limit=state.bounds.claims_awaiting, txn=txn))
        if status is None:
            raise NotFound(f"key {key} has no record with trace_id {trace_id}")
        state.counters["complaints"] += 1
        return reply(request, {"key": key, "trace_id": trace_id, **status})

    async def quarantine(request: Request) -> Response:
        key = path_key(request)
        who = state.require(request, "admin")
        body = await state.body(request)
        trace_id, reason = trace_id_field(body), bounded_text(body, "reason")
        moved = await state.write(lambda txn: state.reg.quarantine(key, trace_id, f"by {who.name}: {reason}", txn=txn))
        if not moved:
            raise NotFound(f"key {key} has no record with trace_id {trace_id}")
        return reply(request, {"key": key, "trace_id": trace_id, "quarantined": True})

    async def forget_caller(request: Request) -> Response:
        who = state.require(request, "admin")
        name = check_text(request.path_params["name"], "name")
        if not 0 < len(name) <= MAX_NAME:
            raise InvalidRecord(f"a caller's name is 1 to {MAX_NAME} characters")
        verified = field(await state.body(request), "verified", bool, False)
        steps = await run_in_threadpool(lambda: list(state.reg.forget_steps(name, verified=verified)))  # the reads: off the loop
        counts = dict.fromkeys(FORGOTTEN, 0)
        for step in steps:  # a commit each, so other writes go on between them
            await state.write(lambda txn, step=step: step(txn, counts))
        logging.getLogger("schedhub.registry").warning("%s forgot %s: %s", who.name, name, counts)
        return reply(request, {"name": name, "verified": verified, **counts})

    async def list_callers(request: Request) -> Response:
        q = request.query_params
        after = check_text(q.get("after", ""), "after")
        if len(after) > MAX_NAME:
            raise InvalidRecord(f"query parameter 'after' is a caller's name: at most {MAX_NAME} characters")
        limit = query_int(q.get("limit"), "limit", 100, 1, MAX_QUEUE_PAGE)
        items, more = await run_in_threadpool(state.reg.callers, after, limit)
        return reply(request, {"items": items, "more": more, "next": items[-1]["name"] if items else after, "bounds": dataclasses.asdict(state.bounds)})

    async def list_quarantine(request: Request) -> Response:
        limit = query_int(request.query_params.get("limit"), "limit", 100, 1, MAX_QUEUE_PAGE)
        return reply(request, {"items": await run_in_threadpool(state.reg.quarantined, limit)})

    async def report_misses(request: Request) -> Response:
        who = state.require(request, "read")
        body = await state.body(request)
        misses = await run_in_threadpool(parse_each, field(body, "misses", list), Identity.from_obj, "misses")
        caller = state.caller(request, who)
        if not state.misses.allow(caller, len(misses)):
            raise TooManyRequests(f"{caller!r} is over {state.misses.count} reported misses a minute; try again later")
        results = await state.write_within_share(who, request, lambda txn: state.reg.report_misses(misses, by=caller, limit=state.bounds.misses_awaiting, txn=txn))
        state.counters["reported"] += len(misses)
        return reply(request, {"results": results})

    async def report_network(request: Request) -> Response:
        who = state.require(request, "read")
        body = await state.body(request)
        kernels = parse_kernels(field(body, "kernels", list))
        name, goal = parse_name(body.get("name")), parse_goal(body.get("goal"))
        caller = state.caller(request, who)
        if not state.misses.allow(caller, 1):
            raise TooManyRequests(f"{caller!r} is over {state.misses.count} reports a minute; try again later")
        return reply(request, await state.write_within_share(who, request, lambda txn: state.reg.report_network(kernels, by=caller, txn=txn, name=name, goal=goal)))

    async def recent_networks(request: Request) -> Response:
        state.require(request, "read")
        return reply(request, {"networks": await run_in_threadpool(state.reg.recent_networks)})

    async def refine_bottleneck(request: Request) -> Response:
        who = state.require(request, "worker")
        body = await state.body(request)
        fingerprint = check_text(field(body, "fingerprint", str)[:4096], "fingerprint")
        kind = check_text(field(body, "kind", str)[:64], "kind")
        device = check_text(field(body, "device", str, "")[:64], "device")
        if not fingerprint or not kind:
            raise InvalidRecord("'fingerprint' and 'kind' name what the worker can tune")
        return reply(request, {"requeued": await state.write(lambda txn: state.reg.refine_bottleneck(fingerprint, kind, device, by=who.name, txn=txn))})

    async def push_trials(request: Request) -> Response:
        who = state.require(request, "push")
        log = await run_in_threadpool(TrialLog.from_obj, await state.body(request))
        result = await state.write_within_share(who, request, lambda txn: state.reg.push_trials(log, who.name, verified=who.trusted,
                                                                                                 claimed_bytes=state.bounds.claimed_log_bytes, txn=txn))  # fmt: skip
        state.counters["trials"] += len(log.trials)
        return reply(request, result)

    async def list_trials(request: Request) -> Response:
        q = request.query_params
        limit = query_int(q.get("limit"), "limit", MAX_TRIAL_PAGE, 1, MAX_TRIAL_PAGE)
        verified = q.get("verified", "0")
        if verified not in ("0", "1"):
            raise InvalidRecord("query parameter 'verified' must be 0 or 1")
        target = query_target(q)
        if target and not target.startswith("{"):
            raise InvalidRecord("query parameter 'target' must be a canonical target (its JSON text)")
        structure = check_text(q.get("structure") or "", "structure")
        def page() -> tuple[bytes, bool]:  # read and encoded in a worker thread: a page of 8 MB stalls no other request
            logs, cursor, more = state.reg.trial_logs(q.get("cursor", ""), limit, verified_only=verified == "1", target=target, structure=structure)
            as_msgpack = wants_msgpack(request.headers.get("accept", ""))
            return encode_body({"items": [log.to_dict() for log in logs], "next": cursor, "more": more}, as_msgpack), as_msgpack

        body, as_msgpack = await run_in_threadpool(page)
        return _response(body, as_msgpack, {}, 200)

    async def push_cost_model(request: Request) -> Response:
        who = state.require(request, "worker")  # a model decides every compile's transfers: no one could check a claim's
        entry = await run_in_threadpool(CostModelEntry.from_obj, await state.body(request))
        result = await state.write(lambda txn: state.reg.push_cost_model(entry, who.name, verified=who.trusted, txn=txn))
        state.counters["cost_models"] += 1
        return reply(request, result)

    async def get_cost_model(request: Request) -> Response:
        q = request.query_params
        target = query_target(q)
        compiler, features = (check_text(q.get(name) or "", name) for name in ("compiler", "features"))
        if not target.startswith("{") or not compiler or not features:
            raise InvalidRecord("query parameters 'target' (a canonical target), 'compiler' and 'features' are required")
        if len(compiler) > MAX_TARGET_QUERY or len(features) > MAX_FEATURES_CHARS:
            raise InvalidRecord(f"query parameter 'compiler' or 'features' is over {MAX_TARGET_QUERY} or {MAX_FEATURES_CHARS} characters")
        entry = await run_in_threadpool(state.reg.cost_model, target, compiler, features)
        if entry is None:
            raise NotFound("no cost model is served for this target, compiler and feature set")
        return reply(request, entry.to_dict())

    async def lease(request: Request) -> Response:
        who = state.require(request, "worker")
        body = await state.body(request)
        worker = check_text(field(body, "worker", str)[:200], "worker")
        max_jobs = int(check_number(field(body, "max_jobs", int, 1), "max_jobs", low=1, high=100, integer=True))
        lease_secs = lease_secs_field(body)
        fingerprint = check_text(field(body, "fingerprint", str, "")[:4096], "fingerprint") or None
        kind = check_text(field(body, "kind", str, "")[:64], "kind") or None
        device = check_text(field(body, "device", str, "")[:64], "device") or None
        tasks = field(body, "tasks", list, [TUNE])
        if not tasks or not all(t in TASKS for t in tasks):
            raise InvalidRecord(f"'tasks' must be a non-empty list of {', '.join(TASKS)}")
        leases = await state.write(lambda txn: state.reg.lease(f"{who.name}/{worker}", max_jobs, lease_secs, fingerprint=fingerprint,
                                                               kind=kind, device=device, tasks=tuple(tasks), holder=who.name, txn=txn))  # fmt: skip
        return reply(request, {"leases": [{"key": l.key, "lease_id": l.lease_id, "expires": l.expires, "job": l.job} for l in leases]})

    async def queue_action(request: Request) -> Response:
        key = path_key(request)
        action = request.path_params["action"]
        if action not in ("renew", "ack", "fail", "release", "requeue"):
            raise NotFound(f"unknown queue action {action!r}: use renew, ack, fail, release or requeue")
        who = state.require(request, "admin" if action == "requeue" else "worker")
        body = await state.body(request)
        if action == "requeue":
            await state.write(lambda txn: state.reg.requeue(key, txn=txn))
            return reply(request, {"key": key, "state": "pending"})
        lease_id = field(body, "lease_id", str)[:64]
        if action == "renew":
            secs = lease_secs_field(body)
            expires = await state.write(lambda txn: state.reg.renew(key, lease_id, secs, holder=who.name, txn=txn))
            return reply(request, {"key": key, "expires": expires})
        if action == "ack":
            verdict = field(body, "verdict", dict, None)
            if verdict is not None:
                for name in ("run_secs", "flushed_secs"):
                    if verdict.get(name) is not None:
                        verdict[name] = run_secs_field(verdict[name], name)
                verdict["reason"] = bounded_text(verdict, "reason")
            refine = field(body, "refine", bool, False)
            outcome = await state.write(lambda txn: state.reg.ack(key, lease_id, verdict, refine=refine, holder=who.name, txn=txn))
            return reply(request, {"key": key, "state": PENDING if outcome == REFINE else DONE, "outcome": outcome})
        error = bounded_text(body, "error")
        if action == "release":
            await state.write(lambda txn: state.reg.release(key, lease_id, error, holder=who.name, txn=txn))
            return reply(request, {"key": key, "state": "pending"})
        new_state = await state.write(lambda txn: state.reg.fail(key, lease_id, error, holder=who.name, txn=txn))
        return reply(request, {"key": key, "state": new_state})

    async def list_queue(request: Request) -> Response:
        q = request.query_params
        state_filter = q.get("state") or None
        if state_filter is not None and state_filter not in STATES:
            raise InvalidRecord(f"'state' must be one of {', '.join(STATES)}")
        limit = query_int(q.get("limit"), "limit", 100, 1, MAX_QUEUE_PAGE)
        after = q.get("after") or ""
        if q.get("order", "id") not in ("id", "lease"):
            raise InvalidRecord("'order' is 'id' (every state, by job id) or 'lease' (pending jobs in the order they are handed out)")
        if q.get("order") == "lease":
            if state_filter not in (None, "pending"):
                raise InvalidRecord("order=lease lists pending jobs only")
            page, following = await run_in_threadpool(state.reg.lease_order_page, limit, after)
            return reply(request, {"jobs": page, "next": following})
        if after and not is_key(after):
            raise InvalidRecord("'after' must be a job id (64 hex characters)")
        jobs = await run_in_threadpool(state.reg.jobs, state_filter, limit, after)
        return reply(request, {"jobs": jobs, "next": jobs[-1]["key"] if len(jobs) == limit else None})

    async def get_job(request: Request) -> Response:
        return reply(request, await run_in_threadpool(state.reg.job, path_key(request)))

    async def stats(request: Request) -> Response:
        committer = state.committer
        return reply(request, {
            **(await run_in_threadpool(public_stats, state.reg)),
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
        def render() -> str:
            return _dashboard.render(public_stats(state.reg), state.reg.dashboard_data(top=_dashboard.TOP), state.activity.series(), dict(state.counters))

        return HTMLResponse(await run_in_threadpool(render))

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
        Route("/v1/records/{key}/complaints", complain, methods=["POST"]),
        Route("/v1/records/{key}/quarantine", quarantine, methods=["POST"]),
        Route("/v1/quarantine", list_quarantine, methods=["GET"]),
        Route("/v1/callers", list_callers, methods=["GET"]),
        Route("/v1/callers/{name}/forget", forget_caller, methods=["POST"]),
        Route("/v1/lookup", lookup, methods=["POST"]),
        Route("/v1/misses", report_misses, methods=["POST"]),
        Route("/v1/networks", report_network, methods=["POST"]),
        Route("/v1/networks", recent_networks, methods=["GET"]),
        Route("/v1/queue/refine", refine_bottleneck, methods=["POST"]),
        Route("/v1/trials", list_trials, methods=["GET"]),
        Route("/v1/trials", push_trials, methods=["POST"]),
        Route("/v1/models", get_cost_model, methods=["GET"]),
        Route("/v1/models", push_cost_model, methods=["PUT"]),
        Route("/v1/queue", list_queue, methods=["GET"]),
        Route("/v1/queue/lease", lease, methods=["POST"]),
        Route("/v1/queue/{key}", get_job, methods=["GET"]),
        Route("/v1/queue/{key}/{action}", queue_action, methods=["POST"]),
    ]

    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        return reply(request, {"error": "HTTPError", "message": str(exc.detail), "status": exc.status_code}, exc.status_code)

    handlers = {Exception: on_error, RegistryError: on_error, HTTPException: on_http_error}
    app = Starlette(routes=routes, lifespan=state.lifespan, exception_handlers=handlers)
    app.state.registry_app = state
    return app
