"""The HTTP API on a real uvicorn server: behaviour, auth, limits and hostile input."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from schedhub.registry import (
    KeyMismatch, LocalRegistry, canonical_target, NotFound, PayloadTooLarge, RegistryClient, RegistryUnavailable, ServerThread, Unauthorized, packb,
)  # fmt: skip
from schedhub.registry import _server

from .conftest import TOKEN, make_record

MSGPACK = {"content-type": "application/msgpack", "authorization": f"Bearer {TOKEN}"}


def test_put_get_head_lookup_over_http(client: RegistryClient) -> None:
    recs = [make_record(w, (w + 1) * 1e-4) for w in range(5)]
    assert client.put(recs[0]).kept
    client.put_many(recs[1:])
    assert client.get_raw(recs[0].key) == [recs[0].to_bytes()]
    assert client.exists(recs[1].key) and not client.exists("f" * 64)
    found = client.lookup([r.key for r in recs] + ["e" * 64])
    assert set(found) == {r.key for r in recs}
    assert client.get("a" * 64) == []


def test_json_for_people_and_msgpack_for_programs(server: ServerThread, client: RegistryClient) -> None:
    rec = make_record(1, 1e-3)
    client.put(rec)
    as_json = httpx.get(f"{server.url}/v1/records/{rec.key}")
    assert as_json.headers["content-type"] == "application/json"
    assert as_json.json()["records"][0]["op"] == rec.identity.op
    # a JSON body is accepted as well
    other = make_record(2, 1e-3)
    r = httpx.put(f"{server.url}/v1/records/{other.key}", json=other.to_dict(), headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 201 and client.exists(other.key)
    assert httpx.get(f"{server.url}/openapi.json").json()["openapi"].startswith("3.")
    assert "schedhub registry" in httpx.get(server.url + "/").text
    assert httpx.get(f"{server.url}/v1/stats").json()["keys"] == 2


def test_writes_need_the_token(server: ServerThread) -> None:
    rec = make_record(1, 1e-3)
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic abc"}):
        with RegistryClient(server.url, token="", timeout=5) as anon:
            anon._http.headers.update(headers)
            with pytest.raises(Unauthorized):
                anon.put(rec)
            with pytest.raises(Unauthorized):
                anon.report_misses([rec.identity])
            assert anon.get(rec.key) == []  # reads stay open


def test_a_wrong_key_is_422_and_nothing_is_stored(server: ServerThread, client: RegistryClient) -> None:
    rec, other = make_record(1, 1e-3), make_record(2, 1e-3)
    r = httpx.put(f"{server.url}/v1/records/{other.key}", content=rec.to_bytes(), headers=MSGPACK)
    assert r.status_code == 422 and "URL names key" in r.json()["message"]
    tampered = rec.to_dict() | {"workload": rec.identity.workload + "# changed\n"}
    with pytest.raises(KeyMismatch, match="does not match its content"):
        client._call("PUT", f"/v1/records/{rec.key}", tampered)
    assert client.stats()["keys"] == 0


def test_oversized_bodies_are_413(tmp_path: Path) -> None:
    with ServerThread(tmp_path, max_body=64 << 10, sync=False) as srv, RegistryClient(srv.url) as c:
        big = [make_record(w, 1e-3).to_dict() for w in range(400)]
        with pytest.raises(PayloadTooLarge):
            c._call("POST", "/v1/records", {"records": big})
        # without a Content-Length (chunked upload) the limit holds as well
        r = httpx.post(f"{srv.url}/v1/records", content=iter([b"\x00" * (40 << 10)] * 3), headers={"content-type": "application/msgpack"})
        assert r.status_code == 413
        assert c.health()


def test_fuzzed_and_truncated_bodies_are_4xx_and_the_server_keeps_serving(server: ServerThread, client: RegistryClient) -> None:
    rng = random.Random(1234)
    rec = make_record(1, 1e-3)
    valid = rec.to_bytes()
    bodies = [valid[:n] for n in range(0, len(valid), max(1, len(valid) // 60))]
    for _ in range(120):
        flipped = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        bodies.append(bytes(flipped))
    bodies += [rng.randbytes(rng.randint(1, 2000)) for _ in range(60)]
    bodies += [packb(x) for x in (None, 1, "x", [rec.to_dict()], {"records": "nope"}, {"records": [1, 2]})]
    statuses = []
    with httpx.Client(base_url=server.url, headers=MSGPACK, timeout=5) as http:
        for body in bodies:
            for method, path in (("PUT", f"/v1/records/{rec.key}"), ("POST", "/v1/records"), ("POST", "/v1/misses"), ("POST", "/v1/lookup")):
                r = http.request(method, path, content=body)
                statuses.append(r.status_code)
                if r.status_code >= 400:
                    assert r.json()["message"], (method, path, body[:40])
        for body in (b"{", b'{"keys": 5}', b'{"keys": ["zz"]}', b"[]", "{\"records\": [\"\u00e9\"]}".encode()):
            r = http.post("/v1/lookup", content=body, headers={"content-type": "application/json"})
            statuses.append(r.status_code)
            assert 400 <= r.status_code < 500
    assert all(s < 500 for s in statuses), sorted(set(statuses))
    assert statuses.count(400) > 100
    assert client.health() and client.put(rec).kept  # still serving, still writable


@pytest.mark.parametrize("path", ["/v1/records/xyz", "/v1/records/" + "A" * 64, "/v1/queue/xyz/ack"])
def test_malformed_keys_in_paths_are_400(server: ServerThread, path: str) -> None:
    r = httpx.request("POST" if "queue" in path else "GET", server.url + path, headers=MSGPACK, content=packb({"lease_id": "x"}))
    assert r.status_code == 400 and "not a key" in r.json()["message"]


@pytest.mark.parametrize("query", [{"prefix": "abc"}, {"prefix": "ABCDEF0123"}, {"prefix": "a" * 65}, {"newest": "yes"}])
def test_malformed_listing_queries_are_400(server: ServerThread, query: dict[str, str]) -> None:
    r = httpx.get(server.url + "/v1/records", params=query)
    assert r.status_code == 400 and next(iter(query)) in r.json()["message"]


def test_the_stats_do_not_say_where_the_store_lives(server: ServerThread, tmp_path: Path) -> None:
    """A public answer: the store's path (a home folder, a user name) is the server's business."""
    answer = httpx.get(f"{server.url}/v1/stats").json()
    assert "root" not in answer and "keys" in answer
    with LocalRegistry(tmp_path / "local") as reg:
        assert reg.stats()["root"] == str(tmp_path / "local")  # the operator's own view keeps it


def test_queue_over_http(client: RegistryClient) -> None:
    miss = make_record(1, 1e-3).identity
    assert [r["demand"] for r in client.report_misses([miss, miss])] == [1, 2]
    lease = client.lease("w1", lease_secs=30)[0]
    assert lease.job["workload"] == miss.workload  # enough to tune it without the model
    client.renew(lease.key, lease.lease_id, 30)
    client.ack(lease.key, lease.lease_id)
    with pytest.raises(Exception, match="not held"):
        client.ack(lease.key, lease.lease_id)
    with pytest.raises(NotFound):
        client.requeue("b" * 64)
    assert client.jobs("done")[0]["demand"] == 2


def test_concurrent_pushes_are_group_committed(tmp_path: Path) -> None:
    with ServerThread(tmp_path, sync=True) as srv:
        recs = [make_record(w % 20, (w + 1) * 1e-5, variant=w) for w in range(200)]

        def push(chunk: list) -> None:
            with RegistryClient(srv.url) as c:
                for r in chunk:
                    c.put(r)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(push, [recs[i::8] for i in range(8)]))
        with RegistryClient(srv.url) as c:
            stats = c.stats()
            assert stats["measurements"] == 200 and stats["keys"] == 20
            assert stats["commits"]["batches"] < stats["commits"]["writes"]  # writes shared commits
            for key in {r.key for r in recs}:
                mine = sorted((r for r in recs if r.key == key), key=lambda r: r.mean_secs)[:8]
                assert [r.trace_id for r in c.get(key)] == [r.trace_id for r in mine]


def test_a_dead_registry_costs_the_retries_and_says_so() -> None:
    with RegistryClient("http://127.0.0.1:9", retries=2, backoff=0.01, timeout=1) as c:
        with pytest.raises(RegistryUnavailable, match="unreachable after 3 tries"):
            c.get("a" * 64)


def test_a_pull_of_one_op_pages_through_every_key_of_it(server: ServerThread, client: RegistryClient, tmp_path: Path) -> None:
    """An op-filtered listing pages like the whole feed: before, it answered one page and said no more,
    so a pull of an op with more keys than a page silently left the rest behind (local stores too)."""
    many = [make_record(5000 + i, 1e-3, op="fused_popular") for i in range(300)]
    client.put_many(many + [make_record(9000 + i, 1e-3, op="fused_other") for i in range(5)])
    wanted = {r.key for r in many}
    assert {s.key for s, _ in client.iter_served(op="fused_popular", page=128)} == wanted
    with LocalRegistry(tmp_path / "local", sync=False) as local:
        local.put_many(many)
        assert {s.key for s, _ in local.iter_served(op="fused_popular", page=128)} == wanted


def test_a_page_with_records_stops_at_the_answer_bound_and_paging_goes_on(server: ServerThread, client: RegistryClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of keys with their records is bounded in bytes, not only in keys (1000 keys × 8 records × 1 MiB
    each was an 8 GB answer for any reader); the next page starts where it stopped."""
    records = [make_record(7000 + i, 1e-3) for i in range(40)]
    client.put_many(records)
    size = len(records[0].to_bytes())
    monkeypatch.setattr(_server, "MAX_ANSWER_BYTES", 5 * size)
    pages = []
    since = 0
    while True:
        answer = httpx.get(f"{server.url}/v1/records", params={"since": since, "limit": 1000, "include": "records"}).json()
        pages.append(len(answer["items"]))
        if not answer["more"]:
            break
        since = answer["next"]
    assert max(pages) <= 6 and sum(pages) == 40, pages  # each page stops once past the bound
    assert {s.key for s, _ in client.iter_served()} == {r.key for r in records}


def test_a_filter_that_matches_little_pages_in_bounded_reads_and_paging_finds_every_match(server: ServerThread, client: RegistryClient, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = canonical_target({"kind": "cuda", "arch": "sm_90", "keys": ["cuda", "gpu"]})
    records = [make_record(8000 + i, 1e-3, **({"target": gpu} if i % 10 == 3 else {})) for i in range(50)]
    client.put_many(records)
    monkeypatch.setattr(_server, "MAX_SCAN", 4)
    cuda_op0 = {r.key for r in records if r.identity.target == gpu and r.identity.op == "fused_op0"}
    answer = httpx.get(f"{server.url}/v1/records", params={"target": "cuda", "op": "fused_op0"}).json()
    assert {s["key"] for s in answer["items"]} == cuda_op0 and not answer["more"]  # the op's rows of the kind: only matches read
    assert {s.key for s, _ in client.iter_served(target="cuda", op="fused_op0")} == cuda_op0 and cuda_op0
    answer = httpx.get(f"{server.url}/v1/records", params={"target": gpu, "limit": 3}).json()  # the target's own feed: only matches read
    assert [s["key"] for s in answer["items"]] == [r.key for r in records if r.identity.target == gpu][:3] and answer["more"]
    assert {s.key for s, _ in client.iter_served(target="cuda")} == {r.key for r in records if r.identity.target == gpu}
    assert [s.key for s, _ in client.iter_served(target="rocm")] == []
