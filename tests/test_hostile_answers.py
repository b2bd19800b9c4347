"""The client side of trust: a RegistryClient facing a wrong URL, a broken proxy or a hostile server.

Every call's real answer is captured from a real server, then served back by a scripted server
(tests/scripted_server.py) with each of its fields taken away or replaced by a value of another
type, and whole, as other kinds of bodies. Whatever comes back, a call either returns or raises a
RegistryError (which the hook answers by falling back and the worker by retrying), and it ends:
no KeyError out of a compile, no page followed forever, no answer read without a bound.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from schedhub.registry import (
    CostModelEntry,
    KeySummary,
    Lease,
    MalformedAnswer,
    Principal,
    PutResult,
    Record,
    RefusedRecord,
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    ServerThread,
    Trial,
    TrialLog,
    packb,
)

from .conftest import make_record, of_structure
from .scripted_server import Reply, ScriptedServer

TOKENS = {"admin-tok": Principal("root", "admin"), "w-tok": Principal("w", "worker")}
WORKER_CALLS = {"lease", "renew", "fail"}  # the lease's holder's calls
WRONG_TYPES: list[Any] = [None, "x", -1, 1.5, True, [], {}, b"\x00", float("inf")]
LEFT_OUT: list[RefusedRecord] = []  # records the calls that read records left out of what they returned


class Recorder(httpx.HTTPTransport):
    """A real HTTP transport that keeps the last answer it carried."""

    def __init__(self) -> None:
        super().__init__()
        self.last: tuple[int, str, bytes] | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = response.read()
        self.last = (response.status_code, response.headers.get("content-type", ""), body)
        return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)


Call = Callable[[RegistryClient], Any]


def calls(records: list[Record], missed: Record, lease: Lease) -> dict[str, Call]:
    """Every client call whose answer carries something, with the arguments it is captured and replayed with."""
    keys = [r.key for r in records]
    trials = TrialLog(records[0].identity, [Trial(records[0].trace, 1e-3)])
    tree = {"left": [1, -1, -1], "right": [2, -1, -1], "feature": [1, 0, 0], "value": [0.5, -1.0, 1.0], "default_left": [1, 0, 0]}
    model = CostModelEntry.from_obj({"target": records[0].identity.target, "compiler": records[0].identity.fingerprint, "features": "f/1",
                                     "trials": 9, "model": {"width": 2, "base": 0.0, "trees": [tree]}})  # fmt: skip
    return {
        "get_raw": lambda c: c.get_raw(keys[0]),
        "lookup": lambda c: c.lookup([*keys, missed.key], refused=LEFT_OUT),
        "lookup_with_candidates": lambda c: c.lookup_with_candidates([records[0].identity, missed.identity], refused=LEFT_OUT),
        "put": lambda c: c.put(records[0]),
        "put_many": lambda c: c.put_many(records),
        "complain": lambda c: c.complain(keys[0], records[0].trace_id, "does not replay"),
        "quarantined": lambda c: c.quarantined(),
        "summaries": lambda c: c.summaries(),
        "iter_served": lambda c: list(c.iter_served(refused=LEFT_OUT)),
        "push_trials": lambda c: c.push_trials(trials),
        "iter_trial_logs": lambda c: list(c.iter_trial_logs()),
        "trial_logs_of_target": lambda c: c.trial_logs(target=records[0].identity.target),
        "trial_logs_of_structure": lambda c: c.trial_logs(target=records[0].identity.target, structure=records[0].identity.structure),
        "push_cost_model": lambda c: c.push_cost_model(model),
        "cost_model": lambda c: c.cost_model(model.target, model.compiler, model.features),
        "report_misses": lambda c: c.report_misses([missed.identity]),
        "job": lambda c: c.job(lease.key),
        "jobs": lambda c: c.jobs(),
        "jobs_in_lease_order": lambda c: c.jobs_in_lease_order(),
        "lease": lambda c: c.lease("w"),
        "renew": lambda c: c.renew(lease.key, lease.lease_id),
        "fail": lambda c: c.fail(lease.key, lease.lease_id, "a test"),
        "stats": lambda c: c.stats(),
        "health": lambda c: c.health(),
    }  # fmt: skip


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Call, tuple[int, str, bytes]]]]:
    """Each call and the answer a real server gave it."""
    root = tmp_path_factory.mktemp("hostile-answers")
    records = [make_record(1, 1e-3), make_record(1, 2e-3, variant=1), make_record(2, 1e-3)]
    missed = make_record(3, 1e-3)
    with ServerThread(root / "store", tokens=TOKENS, sync=False) as srv:
        recorder = Recorder()
        with RegistryClient(srv.url, token="admin-tok", transport=recorder) as admin, \
                RegistryClient(srv.url, token="w-tok", transport=recorder) as worker:  # fmt: skip
            admin.put_many(records)
            admin.quarantine(records[1].key, records[1].trace_id, "a test")
            admin.report_misses([missed.identity, make_record(4, 1e-3).identity])  # one to lease, one left pending
            lease = next(lease for lease in worker.lease("w", max_jobs=8) if lease.key == missed.key)
            answers = {}
            for name, call in calls(records, missed, lease).items():
                call(worker if name in WORKER_CALLS else admin)
                assert recorder.last is not None and recorder.last[0] in (200, 201), name
                answers[name] = (call, recorder.last)
    yield answers


def mutations(value: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``value`` with one field removed or replaced by a value of another type, at every place up to 4 levels down."""
    if depth > 4:
        return
    if isinstance(value, dict):
        children = list(value.items())[:4]
    elif isinstance(value, list):
        children = list(enumerate(value))[:2]
    else:
        return
    for name, child in children:
        if isinstance(value, dict):
            yield f"{name}: removed", {k: v for k, v in value.items() if k != name}
        for wrong in WRONG_TYPES:
            if type(wrong) is not type(child):
                yield f"{name}: {wrong!r}", _with(value, name, wrong)
        for label, inner in mutations(child, depth + 1):
            yield f"{name}.{label}", _with(value, name, inner)


def _with(value: Any, name: Any, new: Any) -> Any:
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[name] = new
    return copy


def whole_bodies(answer: bytes) -> list[tuple[str, Reply]]:
    deep = b"[" * 100_000 + b"]" * 100_000
    return [
        ("a web page", Reply(200, "text/html", b"<html><body>It works!</body></html>")),
        ("no content type", Reply(200, "", answer)),
        ("cut short", Reply(200, "application/msgpack", answer[: len(answer) // 2])),
        ("not msgpack", Reply(200, "application/msgpack", b"\xc1" * 10)),
        ("an extension type", Reply(200, "application/msgpack", msgpack.packb(msgpack.ExtType(5, b"x")))),
        ("deep JSON", Reply(200, "application/json", deep)),
        ("deep msgpack", Reply(200, "application/msgpack", b"\x91" * 10_000 + b"\xc0")),
        ("JSON of another shape", Reply(200, "application/json", json.dumps({"hello": ["world"]}).encode())),
        ("a proxy's 502 page", Reply(502, "text/html", b"<html>Bad Gateway</html>")),
        ("a 400 with a body that is not ours", Reply(400, "application/msgpack", b"\xc1")),
    ]


def finishes(call: Callable[[], Any], secs: float = 20.0) -> tuple[str, Any]:
    """("returned", value) or ("raised", exception), or ("hung", None) if it did not end in ``secs``."""
    outcome: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            outcome.append(("returned", call()))
        except BaseException as exc:  # noqa: BLE001 - what it raised is what the test checks
            outcome.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(secs)
    return outcome[0] if outcome else ("hung", None)


def test_every_malformed_answer_is_a_registry_error_and_every_call_ends(captured: dict) -> None:
    failures, tried, refused = [], 0, 0
    with ScriptedServer() as scripted, RegistryClient(scripted.url, token="admin-tok", timeout=2, deadline=5, retries=0) as client:
        for name, (call, (status, ctype, answer)) in captured.items():
            value = msgpack.unpackb(answer, raw=False)
            replies = [(label, Reply(status, ctype, packb(v))) for label, v in mutations(value)] + whole_bodies(answer)
            for label, reply in replies:
                scripted.reply = reply
                left_out = len(LEFT_OUT)
                kind, result = finishes(lambda: call(client))
                tried += 1
                refused += kind == "raised" or len(LEFT_OUT) > left_out
                if kind == "hung" or (kind == "raised" and not isinstance(result, RegistryError)):
                    failures.append(f"{name} given {label}: {kind} {result!r:.200}")
                elif kind == "returned":
                    failures += [f"{name} given {label}: returned {bad}" for bad in _ill_typed(result)]
    assert not failures, f"{len(failures)} of {tried} answers:\n" + "\n".join(failures[:30])
    assert tried > 400 and refused > tried // 2  # most of these answers cannot be used (refused, or their records left out), and none crashed


def _ill_typed(result: Any) -> list[str]:
    """What a call returned that its caller could not use: a summary, put result or lease field of the wrong type."""
    items = result if isinstance(result, list) else [result]
    bad = []
    for item in items:
        if isinstance(item, (KeySummary, PutResult, Lease)):
            for field, value in vars(item).items():
                if isinstance(value, float) and not math.isfinite(value):
                    bad.append(f"{type(item).__name__}.{field} = {value!r}")
                expected = type(item).__annotations__[field]
                if "str" == expected and not isinstance(value, str):
                    bad.append(f"{type(item).__name__}.{field} = {value!r:.40}")
    return bad


def test_the_real_answers_parse_as_they_did(captured: dict) -> None:
    """The scripted server replays each real answer unchanged: every call returns what the real server meant."""
    with ScriptedServer() as scripted, RegistryClient(scripted.url, token="admin-tok", timeout=2, retries=0) as client:
        for name, (call, (status, ctype, answer)) in captured.items():
            scripted.reply = Reply(status, ctype, answer)
            assert finishes(lambda: call(client))[0] == "returned", name
        scripted.reply = Reply(*captured["lookup_with_candidates"][1])
        found, near = captured["lookup_with_candidates"][0](client)
        assert len(found) == 1 and len(near) == 1 and all(c.record.served is not None for cs in near.values() for c in cs)


def test_a_record_answered_for_another_key_is_refused(captured: dict) -> None:
    """A server that answers key A with key B's record (a broken cache, a hostile server) is not believed."""
    status, ctype, answer = captured["lookup"][1]
    value = msgpack.unpackb(answer, raw=False)
    keys = list(value["records"])
    assert len(keys) >= 2
    value["records"][keys[0]], value["entries"][keys[0]] = value["records"][keys[1]], value["entries"][keys[1]]
    with ScriptedServer(Reply(status, ctype, packb(value))) as scripted, RegistryClient(scripted.url, retries=0) as client:
        with pytest.raises(MalformedAnswer, match="another key"):
            captured["lookup"][0](client)


def test_a_log_answered_for_another_target_is_refused(captured: dict) -> None:
    """Asked for one target's measurement log, a server that answers another's (it would train the cost model) is not believed."""
    status, ctype, answer = captured["trial_logs_of_target"][1]
    value = msgpack.unpackb(answer, raw=False)
    other = make_record(1, 1e-3, target=value["items"][0]["identity"]["target"].replace("znver5", "znver4"))
    value["items"][0]["identity"] = other.identity.to_dict()
    with ScriptedServer(Reply(status, ctype, packb(value))) as scripted, RegistryClient(scripted.url, retries=0) as client:
        with pytest.raises(MalformedAnswer, match="another target"):
            captured["trial_logs_of_target"][0](client)


def test_a_log_answered_for_another_structure_is_refused(captured: dict) -> None:
    """Asked for one structure's log (a search's cost model starts from it), an answer of another structure is not believed."""
    status, ctype, answer = captured["trial_logs_of_structure"][1]
    value = msgpack.unpackb(answer, raw=False)
    value["items"][0]["identity"] = of_structure(1, 3).to_dict()
    with ScriptedServer(Reply(status, ctype, packb(value))) as scripted, RegistryClient(scripted.url, retries=0) as client:
        with pytest.raises(MalformedAnswer, match="another structure"):
            captured["trial_logs_of_structure"][0](client)


def test_an_answer_past_the_bounds_is_given_up_on(captured: dict) -> None:
    """Too large (declared or sent) is refused at once; a trickle ends at the deadline, not at every byte's timeout."""
    status, ctype, answer = captured["health"][1]
    with ScriptedServer(Reply(status, ctype, answer)) as scripted:
        with RegistryClient(scripted.url, retries=0, max_answer_bytes=len(answer) - 1) as small:
            with pytest.raises(MalformedAnswer, match="over the client's limit"):
                small.health()
        scripted.reply = Reply(200, "application/json", b" " * 10_000 + b"{}", byte_every=0.05)
        with RegistryClient(scripted.url, retries=0, timeout=1, deadline=2) as client:
            kind, result = finishes(client.health, secs=30)
        assert kind == "raised" and isinstance(result, RegistryUnavailable) and "too slowly" in str(result)


def test_a_wrong_url_names_the_problem(tmp_path: Path) -> None:
    with ScriptedServer(Reply(200, "text/html", b"<html>Welcome to nginx!</html>")) as scripted, RegistryClient(scripted.url, retries=0) as client:
        with pytest.raises(MalformedAnswer, match="not a registry's answer"):
            client.lookup([make_record(1, 1e-3).key])
