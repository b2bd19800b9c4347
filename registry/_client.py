"""RegistryClient: the registry's operations over HTTP, with the method names of LocalRegistry.

One persistent httpx connection per client, msgpack both ways, and retries where they are safe:
always when the connection could not be made (nothing was sent), and on a dropped connection for
idempotent calls. Every call is bounded: ``timeout`` for any one step (connect, send, a read),
``deadline`` for the whole answer (a server that trickles it is given up on), ``max_answer_bytes``
for its size; and every answer is parsed as hostile input (``_answers``): a wrong URL, a proxy's
page or a broken server raises a RegistryError, never a KeyError. ``transport=`` lets tests run
the real ASGI app in process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from ._answers import decode, listing, mapping, number, reading, text, typed
from ._errors import MalformedAnswer, RegistryError, RegistryUnavailable, TooManyRequests, error_for_status
from ._forget import FORGOTTEN
from ._neighbours import RELATIONS, Candidate, Probe, served_candidates
from ._queue import Lease
from ._records import Identity, Record, RefusedRecord, packb, served_records
from ._listing import KeySummary
from ._store import PutResult
from ._models import CostModelEntry
from ._trials import MAX_CURSOR_CHARS, TrialLog, iter_pages, stored_logs
from ._trust import Trust, trust_wire
from ._usage import USAGE
from ._wire import ERROR_HEADER, MSGPACK

LOOKUP_CHUNK = 4096
MAX_ANSWER_BYTES = 256 << 20  # the server's largest answer, a 32 MiB lookup page plus its last key, with room
PUSH_CHUNK_BYTES = 8 << 20
_SAFE_TO_RESEND = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)


class RegistryClient:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        deadline: float | None = None,
        retries: int = 3,
        backoff: float = 0.2,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``deadline``: the longest one attempt of a call may take, answer included (default 6 × ``timeout``,
        at least 60 s); a trickling server is given up on after it plus at most one ``timeout``."""
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline if deadline is not None else max(60.0, 6 * timeout)
        self.max_answer_bytes = max_answer_bytes
        token = token if token is not None else os.environ.get("SCHEDHUB_TOKEN")
        headers = {"accept": MSGPACK, "accept-encoding": "identity", "user-agent": "schedhub"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            parsed = httpx.URL(self.url)
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise httpx.InvalidURL("expected http://HOST:PORT or https://HOST:PORT")
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        except httpx.InvalidURL as exc:
            raise RegistryError(f"{url!r} is not a registry URL ({exc}); write it as http://HOST:PORT, e.g. http://127.0.0.1:8470") from None

    @property
    def location(self) -> str:
        return self.url

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, *, params: dict[str, Any] | None = None,
              idempotent: bool = True, allow_404: bool = False) -> Any:  # fmt: skip
        content = packb(body) if body is not None else None
        headers = {"content-type": MSGPACK} if content is not None else None
        for attempt in range(self.retries + 1):
            try:
                response, answer = self._exchange(method, path, content, headers, params)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure: Exception = exc
            except _SAFE_TO_RESEND as exc:
                if not idempotent:
                    raise RegistryUnavailable(f"{method} {self.url}{path}: connection lost ({exc}); the request may or may not have applied") from None
                failure = exc
            except httpx.TimeoutException as exc:
                raise RegistryUnavailable(f"{method} {self.url}{path} timed out ({exc.__class__.__name__})") from None
            if attempt < self.retries:
                time.sleep(self.backoff * 2**attempt)
        else:
            raise RegistryUnavailable(f"registry at {self.url} is unreachable after {self.retries + 1} tries: {failure}")
        if response.status_code == 404 and not _is_registry_answer(response):
            raise RegistryError(f"{method} {self.url}{path}: no such endpoint (404): is {self.url} the registry's root URL (http://HOST:PORT, no path)?")
        if response.status_code == 404 and allow_404:
            return None
        if response.status_code >= 400:
            raise error_for_status(response.status_code, _error_message(response, answer))
        if method == "HEAD":
            return True
        if not answer:
            return None
        return decode(answer, response.headers.get("content-type", ""), f"{method} {self.url}{path}")

    def _exchange(self, method: str, path: str, content: bytes | None, headers: dict[str, str] | None,
                  params: dict[str, Any] | None) -> tuple[httpx.Response, bytes]:  # fmt: skip
        """One request and its whole answer, within ``deadline`` and ``max_answer_bytes``."""
        started = time.monotonic()
        with self._http.stream(method, path, content=content, headers=headers, params=params) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_answer_bytes:
                raise MalformedAnswer(f"{method} {self.url}{path} answered {declared} bytes, over the client's limit of {self.max_answer_bytes}")
            answer = bytearray()
            for chunk in response.iter_bytes():
                answer += chunk
                if len(answer) > self.max_answer_bytes:
                    raise MalformedAnswer(f"{method} {self.url}{path} answered over the client's limit of {self.max_answer_bytes} bytes")
                if time.monotonic() - started > self.deadline:
                    raise RegistryUnavailable(f"{method} {self.url}{path} answered too slowly: {len(answer)} bytes in {self.deadline:g} s")
        return response, bytes(answer)

    # -- records ---------------------------------------------------------------------------

    def get_raw(self, key: str) -> list[bytes]:
        answer = self._call("GET", f"/v1/records/{key}", allow_404=True)
        with reading(f"GET /v1/records/{key}"):
            return [_record_bytes(b) for b in listing(mapping(answer, "answer")["records"], "records")] if answer else []

    def get(self, key: str, refused: list[RefusedRecord] | None = None) -> list[Record]:
        return self.lookup([key], refused=refused).get(key, [])

    def exists(self, key: str) -> bool:
        return self._call("HEAD", f"/v1/records/{key}", allow_404=True) is not None

    def lookup_entries(self, keys: list[str], top: int | None = None) -> dict[str, list[tuple[bytes, dict[str, Any]]]]:
        """(record bytes, status) of many keys; chunked, and keys the server left out of a large answer are asked again."""
        return self._lookup(list(dict.fromkeys(keys)), top, {}, 0)[0]

    def lookup_with_candidates(self, identities: list[Identity], top: int | None = None, per_key: int = 4,
                               refused: list[RefusedRecord] | None = None, trust: Trust = "any",
                               exact_only: Sequence[Identity] = ()) -> tuple[dict[str, list[Record]], dict[str, list[Candidate]]]:  # fmt: skip
        """Records of every key that has some and, for each key that has none ``trust`` accepts, candidates to
        transfer that it accepts, chosen by the server (a record this version refuses is left out and appended to
        ``refused``); ``exact_only``: keys whose records are asked in the same request, without candidates (the
        server names neighbours only for the keys it is sent probes of)."""
        probes = {i.key: Probe.of(i) for i in identities}
        weighing = {i.key for i in exact_only} - set(probes)
        found, near = self._lookup(list(dict.fromkeys([*probes, *(i.key for i in exact_only)])), top, probes, per_key, trust, weighing)
        with reading("POST /v1/lookup"):
            return _records_by_key(found, refused), served_candidates(near, refused)

    def _lookup(self, keys: list[str], top: int | None, probes: dict[str, Probe], per_key: int, trust: Trust = "any", weighing: Collection[str] = ()) -> tuple[
            dict[str, list[tuple[bytes, dict[str, Any]]]], dict[str, list[tuple[bytes, dict[str, Any], str, float]]]]:  # fmt: skip
        found: dict[str, list[tuple[bytes, dict[str, Any]]]] = {}
        near: dict[str, list[tuple[bytes, dict[str, Any], str, float]]] = {}
        pending = keys
        while pending:
            chunk, pending = pending[:LOOKUP_CHUNK], pending[LOOKUP_CHUNK:]
            body: dict[str, Any] = {"keys": chunk, "top": top or 8}
            probed = [probes[k].to_dict() for k in chunk if k in probes] if per_key > 0 else []
            if probed:
                body.update(probes=probed, candidates=per_key, trust=trust_wire(trust))
            if weighed := [k for k in chunk if k in weighing]:
                body["weighing"] = weighed
            answer = self._call("POST", "/v1/lookup", body)
            asked = set(chunk)
            with reading("POST /v1/lookup"):
                answer = mapping(answer, "answer")
                records, entries = mapping(answer["records"], "records"), mapping(answer["entries"], "entries")
                for key, raws in records.items():
                    if key in asked:  # a key nobody asked for is not taken from a server
                        found[key] = _entries(listing(raws, key), listing(entries[key], key))
                for key, items in mapping(answer.get("candidates") or {}, "candidates").items():
                    if key in asked:  # a key whose records this trust does not serve has candidates too
                        near[key] = [_candidate(item) for item in listing(items, key)]
                truncated = [k for k in listing(answer.get("truncated", []), "truncated") if text(k, "truncated") in asked and k not in found]
                if truncated and not any(k in found for k in chunk):
                    raise ValueError("every key of the request answered as truncated: no progress")  # asked again forever otherwise
            pending = list(dict.fromkeys(truncated)) + pending
        return found, near

    def lookup_raw(self, keys: list[str]) -> dict[str, list[bytes]]:
        return {k: [b for b, _ in v] for k, v in self.lookup_entries(keys).items()}

    def lookup(self, keys: list[str], top: int | None = None, refused: list[RefusedRecord] | None = None, weighing: Collection[str] = ()) -> dict[str, list[Record]]:
        """Records of many keys, best first, each with its ``served`` status (owner, verifier); a record this
        version refuses is left out and appended to ``refused``. ``weighing``: those of ``keys`` asked only to weigh a
        rewrite the compile may not take (the server counts them apart from a compile's hits and misses)."""
        found = self._lookup(list(dict.fromkeys(keys)), top, {}, 0, weighing=set(weighing))[0]
        with reading("POST /v1/lookup"):
            return _records_by_key(found, refused)

    def put_many(self, records: Iterable[Record], pushed_by: str = "") -> list[PutResult]:
        """Push records in batches of about PUSH_CHUNK_BYTES; each batch is one transaction.

        ``pushed_by`` is decided by the server from the bearer token; the argument is ignored.
        """
        results: list[PutResult] = []
        batch: list[dict[str, Any]] = []
        size = 0
        try:
            for record in records:
                data = record.to_dict()
                batch.append(data)
                size += len(record.to_bytes())
                if size >= PUSH_CHUNK_BYTES:
                    results += self._push(batch)
                    batch, size = [], 0
            if batch:
                results += self._push(batch)
        except TooManyRequests as exc:  # a bound on the pusher's claims: the batches before it were stored
            raise TooManyRequests(str(exc), stored=len(results)) from None
        return results

    def _push(self, batch: list[dict[str, Any]]) -> list[PutResult]:
        answer = self._call("POST", "/v1/records", {"records": batch})
        with reading("POST /v1/records"):
            results = [typed(PutResult, r) for r in listing(mapping(answer, "answer")["results"], "results")]
            if [r.key for r in results] != [r["key"] for r in batch]:
                raise ValueError(f"{len(results)} results that do not match the {len(batch)} records pushed")
            return results

    def put(self, record: Record, pushed_by: str = "") -> PutResult:
        answer = self._call("PUT", f"/v1/records/{record.key}", record.to_dict())
        with reading(f"PUT /v1/records/{record.key}"):
            return typed(PutResult, answer)

    def complain(self, key: str, trace_id: str, reason: str) -> dict[str, Any] | None:
        """Report a record that failed here; the registry queues its verification (None: no such record)."""
        answer = self._call("POST", f"/v1/records/{key}/complaints", {"trace_id": trace_id, "reason": reason[:4000]}, allow_404=True, idempotent=False)
        with reading(f"POST /v1/records/{key}/complaints"):
            return None if answer is None else mapping(answer, "answer")

    def quarantine(self, key: str, trace_id: str, reason: str) -> bool:
        """Take a record out of service (needs an admin token)."""
        return self._call("POST", f"/v1/records/{key}/quarantine", {"trace_id": trace_id, "reason": reason}, allow_404=True) is not None

    def callers(self, after: str = "", limit: int = 100) -> tuple[list[dict[str, Any]], bool]:
        """One page of callers and what each holds: see ``LocalRegistry.callers``."""
        answer = mapping(self._call("GET", "/v1/callers", params={"after": after, "limit": limit}), "answer")
        with reading("GET /v1/callers"):
            items = [mapping(item, "item") for item in listing(answer["items"], "items")]
            return [{"name": text(item["name"], "name"), **{count: int(number(item[count], count)) for count in USAGE}} for item in items], answer["more"] is True

    def forget(self, name: str, *, verified: bool = False) -> dict[str, int]:
        """Take out what caller ``name`` left behind (needs an admin token): see ``LocalRegistry.forget``."""
        answer = self._call("POST", f"/v1/callers/{quote(name, safe='')}/forget", {"verified": verified})
        with reading("POST /v1/callers/…/forget"):
            return {kind: int(number(mapping(answer, "answer").get(kind, 0), kind)) for kind in FORGOTTEN}  # a kind an older server does not count: 0

    def quarantined(self, limit: int = 100) -> list[dict[str, Any]]:
        answer = self._call("GET", "/v1/quarantine", params={"limit": limit})
        with reading("GET /v1/quarantine"):
            return [mapping(item, "item") for item in listing(mapping(answer, "answer")["items"], "items")]

    def summaries(self, op: str | None = None, target: str | None = None, since: int = 0, limit: int | None = None,
                  *, newest: bool = False, prefix: str = "") -> list[KeySummary]:
        """One page of the server's listing (at most its 1000-key limit): see ``LocalRegistry.summaries``."""
        params = _params(op=op, target=target, since=since, limit=limit, newest="1" if newest else None, prefix=prefix or None)
        answer = self._call("GET", "/v1/records", params=params)
        with reading("GET /v1/records"):
            return [typed(KeySummary, item) for item in listing(mapping(answer, "answer")["items"], "items")]

    def iter_served(self, op: str | None = None, target: str | None = None, since: int = 0, page: int = 256,
                    refused: list[RefusedRecord] | None = None) -> Iterator[tuple[KeySummary, list[Record]]]:  # fmt: skip
        """Every matching key with its records, best first, each with its ``served`` status; one page per request
        (a record this version refuses is left out and appended to ``refused``)."""
        while True:
            answer = self._call("GET", "/v1/records", params=_params(op=op, target=target, since=since, limit=page, include="records"))
            with reading("GET /v1/records?include=records"):
                answer = mapping(answer, "answer")
                items = []
                for item in listing(answer["items"], "items"):
                    summary = typed(KeySummary, item)
                    items.append((summary, _records_of(summary.key, _entries(listing(item["records"], "records"), listing(item.get("entries") or [], "entries")), refused)))
                more, following = answer["more"], answer["next"]
                if not isinstance(more, bool) or (more and (not isinstance(following, int) or isinstance(following, bool) or following <= since)):
                    raise ValueError(f"a page that says more={more!r} and next={following!r:.40} after {since} would page forever")
            yield from items
            if not more:
                return
            since = following

    # -- measurement log -------------------------------------------------------------------

    def push_trials(self, log: TrialLog, pushed_by: str = "") -> dict[str, Any]:
        """Merge a tuning run's trials into your entry of the log (the server names you by your token)."""
        body = {"identity": log.identity.to_dict(), "trials": [t.to_dict() for t in log.trials]}
        answer = self._call("POST", "/v1/trials", body)  # a merge by trace: sending it twice is the same
        with reading("POST /v1/trials"):
            return mapping(answer, "answer")

    def trial_logs(self, after: str = "", limit: int = 100, *, verified_only: bool = False, target: str = "",
                   structure: str = "") -> tuple[list[TrialLog], str, bool]:  # fmt: skip
        params = _params(cursor=after, limit=limit, verified="1" if verified_only else None, target=target or None, structure=structure or None)
        answer = self._call("GET", "/v1/trials", params=params)
        with reading("GET /v1/trials"):
            items, cursor, more = (answer.get(k) for k in ("items", "next", "more")) if isinstance(answer, dict) else (None, None, None)
            if not isinstance(items, list) or not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS or not isinstance(more, bool):
                raise ValueError("a trial page needs 'items', 'next' and 'more'")
            logs = stored_logs(items)
            if target and any(log.identity.target != target for log in logs):
                raise ValueError("a log of another target than asked for")
            if structure and any(log.identity.structure != structure for log in logs):
                raise ValueError("a log of another structure than asked for")
        return logs, cursor, more

    def iter_trial_logs(self, *, verified_only: bool = False, page: int = 100, target: str = "", structure: str = "") -> Iterator[TrialLog]:
        yield from iter_pages(self.trial_logs, verified_only=verified_only, page=page, target=target, structure=structure)

    # -- served cost models ----------------------------------------------------------------

    def push_cost_model(self, entry: CostModelEntry, pushed_by: str = "") -> dict[str, Any]:
        """Serve ``entry`` as its target's model (a worker or admin token; the server names you by it)."""
        answer = self._call("PUT", "/v1/models", entry.push_dict())  # a replacement: sending it twice is the same
        with reading("PUT /v1/models"):
            return mapping(answer, "answer")

    def cost_model(self, target: str, compiler: str, features: str) -> CostModelEntry | None:
        """The model served for canonical ``target``, ``compiler`` and ``features`` (None: none), validated."""
        answer = self._call("GET", "/v1/models", params={"target": target, "compiler": compiler, "features": features}, allow_404=True)
        if answer is None:
            return None
        with reading("GET /v1/models"):
            entry = CostModelEntry.from_stored(answer)
            if (entry.target, entry.compiler, entry.features) != (target, compiler, features):
                raise ValueError("a model of another target, compiler or feature set than asked for")
        return entry

    # -- queue -----------------------------------------------------------------------------

    def report_misses(self, misses: Iterable[Identity]) -> list[dict[str, Any]]:
        body = {"misses": [m.to_dict() for m in misses]}
        answer = self._call("POST", "/v1/misses", body, idempotent=False)
        with reading("POST /v1/misses"):
            return [mapping(r, "result") for r in listing(mapping(answer, "answer")["results"], "results")]

    def report_network(self, kernels: list[tuple[str, int]], *, name: str | None = None, goal: dict[str, Any] | None = None) -> dict[str, Any]:
        """Tell the registry which kernels one compile built and their calls per forward pass, and optionally the
        network's name and the latency it aims at ({"label", "secs"}) (``_networks``)."""
        body: dict[str, Any] = {"kernels": [{"key": k, "calls": c} for k, c in kernels]}
        body.update({k: v for k, v in (("name", name), ("goal", goal)) if v is not None})
        answer = self._call("POST", "/v1/networks", body, idempotent=True)
        with reading("POST /v1/networks"):
            out = mapping(answer, "answer")
            return {"network": text(out["network"], "network"), "kernels": int(number(out["kernels"], "kernels")), "reports": int(number(out["reports"], "reports"))}

    def recent_networks(self) -> list[dict[str, Any]]:
        """The networks reported last and where each stands (``_networks.NetworkBook.recent``)."""
        answer = self._call("GET", "/v1/networks")
        with reading("GET /v1/networks"):
            return [mapping(n, "network") for n in listing(mapping(answer, "answer")["networks"], "networks")]

    def refine_bottleneck(self, fingerprint: str, kind: str, device: str = "") -> dict[str, Any] | None:
        """Requeue the reported networks' bottleneck kernel this worker can tune (worker role); what was requeued, or None."""
        answer = self._call("POST", "/v1/queue/refine", {"fingerprint": fingerprint, "kind": kind, "device": device}, idempotent=False)
        with reading("POST /v1/queue/refine"):
            pick = mapping(answer, "answer").get("requeued")
            if pick is None:
                return None
            pick = mapping(pick, "requeued")
            return {"key": text(pick["key"], "key"), "op": text(pick["op"], "op"), "network": text(pick["network"], "network"),
                    **{name: number(pick[name], name) for name in ("calls", "best_secs", "searches", "share")}}  # fmt: skip

    def lease(self, worker: str, max_jobs: int = 1, lease_secs: float = 300.0, *, fingerprint: str | None = None, kind: str | None = None,
              device: str | None = None, tasks: tuple[str, ...] = ("tune",)) -> list[Lease]:  # fmt: skip
        body = {"worker": worker, "max_jobs": max_jobs, "lease_secs": lease_secs, "fingerprint": fingerprint or "", "kind": kind or "",
                "device": device or "", "tasks": list(tasks)}  # fmt: skip
        answer = self._call("POST", "/v1/queue/lease", body, idempotent=False)
        with reading("POST /v1/queue/lease"):
            return [typed(Lease, item) for item in listing(mapping(answer, "answer")["leases"], "leases")]

    def renew(self, key: str, lease_id: str, lease_secs: float = 300.0) -> float:
        answer = self._call("POST", f"/v1/queue/{key}/renew", {"lease_id": lease_id, "lease_secs": lease_secs})
        with reading(f"POST /v1/queue/{key}/renew"):
            return number(mapping(answer, "answer")["expires"], "expires")

    def ack(self, key: str, lease_id: str, verdict: dict[str, Any] | None = None, *, refine: bool = False) -> str:
        body: dict[str, Any] = {"lease_id": lease_id}
        if verdict is not None:
            body["verdict"] = verdict
        if refine:
            body["refine"] = True
        answer = self._call("POST", f"/v1/queue/{key}/ack", body)
        with reading(f"POST /v1/queue/{key}/ack"):
            return text(mapping(answer, "answer")["outcome"], "outcome")

    def fail(self, key: str, lease_id: str, error: str) -> str:
        answer = self._call("POST", f"/v1/queue/{key}/fail", {"lease_id": lease_id, "error": error[:4000]}, idempotent=False)
        with reading(f"POST /v1/queue/{key}/fail"):
            return text(mapping(answer, "answer")["state"], "state")

    def release(self, key: str, lease_id: str, reason: str) -> None:
        self._call("POST", f"/v1/queue/{key}/release", {"lease_id": lease_id, "error": reason[:4000]})

    def requeue(self, key: str) -> None:
        self._call("POST", f"/v1/queue/{key}/requeue", {})

    def job(self, key: str) -> dict[str, Any]:
        answer = self._call("GET", f"/v1/queue/{key}")
        with reading(f"GET /v1/queue/{key}"):
            return mapping(answer, "answer")

    def jobs_in_lease_order(self, limit: int = 1000) -> list[dict[str, Any]]:
        """The first ``limit`` pending jobs in the order the queue hands them out, paged through the server's limit."""
        return self._queue_pages(limit, "", lambda following, after: following != after, order="lease")

    def jobs(self, state: str | None = None, limit: int = 1000, after: str = "") -> list[dict[str, Any]]:
        """Job summaries, paged through the server's 500-a-request limit."""
        return self._queue_pages(limit, after, lambda following, after: following > after, state=state)

    def _queue_pages(self, limit: int, after: str, moves_on: Callable[[str, str], bool], **params: Any) -> list[dict[str, Any]]:
        """Pages of ``GET /v1/queue`` with ``params`` until ``limit`` jobs or the last page; a 'next' that does not move on
        from the cursor before it (``moves_on``: a job id must grow, a lease-order cursor must change) is refused."""
        out: list[dict[str, Any]] = []
        while len(out) < limit:
            answer = self._call("GET", "/v1/queue", params=_params(**params, limit=min(500, limit - len(out)), after=after))
            with reading("GET /v1/queue"):
                answer = mapping(answer, "answer")
                page = [mapping(job, "job") for job in listing(answer["jobs"], "jobs")]
                following = answer.get("next")
                if following is not None and (not moves_on(text(following, "next"), after) or not page):
                    raise ValueError(f"a page whose 'next' {following!r:.80} does not follow {after!r:.80} would page forever")
            out += page
            if not following:
                break
            after = following
        return out

    def stats(self) -> dict[str, Any]:
        answer = self._call("GET", "/v1/stats")
        with reading("GET /v1/stats"):
            return mapping(answer, "answer")

    def health(self) -> bool:
        answer = self._call("GET", "/healthz")
        with reading("GET /healthz"):
            return mapping(answer, "answer")["ok"] is True


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None and v != ""}


def _is_registry_answer(response: httpx.Response) -> bool:
    """A 404 from the registry itself (an unknown key or job), not from a path it does not serve."""
    return response.headers.get(ERROR_HEADER) == "NotFound"


def _error_message(response: httpx.Response, answer: bytes) -> str:
    try:
        body = decode(answer, response.headers.get("content-type", ""), "an error")
        return str(body.get("message", body))[:2000]
    except Exception:  # an error page that is not ours (a proxy, say): show its start
        return answer[:300].decode("utf-8", "replace")


def _record_bytes(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"a record must travel as msgpack bin, got {type(value).__name__}")
    return value


def _entries(raws: list[Any], statuses: list[Any]) -> list[tuple[bytes, dict[str, Any]]]:
    """(record bytes, status) pairs of one key's answer: as many statuses as records."""
    if len(raws) != len(statuses):
        raise ValueError(f"{len(raws)} records with {len(statuses)} statuses")
    return [(_record_bytes(b), mapping(s, "status")) for b, s in zip(raws, statuses)]


def _records_of(key: str, entries: list[tuple[bytes, dict[str, Any]]], refused: list[RefusedRecord] | None) -> list[Record]:
    """One key's records that pass this version's checks (see :func:`served_records`), checked to be that
    key's: a server answers for the key it was asked."""
    records = served_records(entries, refused)
    if any(r.key != key for r in records):
        raise ValueError(f"a record of another key answered for {key}")
    return records


def _records_by_key(found: dict[str, list[tuple[bytes, dict[str, Any]]]], refused: list[RefusedRecord] | None) -> dict[str, list[Record]]:
    """Each key's records (:func:`_records_of`); a key whose every record was refused has none, as a miss has none."""
    return {k: records for k, v in found.items() if (records := _records_of(k, v, refused))}


def _candidate(item: Any) -> tuple[bytes, dict[str, Any], str, float]:
    """One candidate of a lookup answer, checked: a hostile server gets an error, not a crash."""
    item = mapping(item, "candidate")
    relation, distance = item.get("relation"), item.get("distance")
    if relation not in RELATIONS:
        raise ValueError(f"a candidate's relation must be one of {sorted(RELATIONS)}")
    return _record_bytes(item.get("record")), mapping(item.get("entry"), "entry"), relation, number(distance, "distance")
