"""The registry's HTTP protocol under hostile callers (registry/_protocol.py): every request, pipelined or not, has its
own head and body deadlines; heads, pipelining and connections per address are bounded; /healthz keeps answering."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from schedhub.registry import ServerThread

from .test_trust import _raw

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerThread]:
    bounds = {"max_connections_per_client": 40, "max_pipelined": 4}
    with ServerThread(tmp_path / "store", sync=False, header_timeout=1.0, body_timeout=1.0, wire_bounds=bounds) as s:
        yield s


def _read_until_closed(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within ``seconds``, what it sent)."""
    sock.settimeout(seconds)
    got, end = b"", time.monotonic() + seconds
    try:
        while time.monotonic() < end and (chunk := sock.recv(65536)):
            got += chunk
        return time.monotonic() < end, got
    except (TimeoutError, socket.timeout):
        return False, got
    except ConnectionResetError:
        return True, got


def _healthz_secs(srv: ServerThread) -> float:
    start = time.monotonic()
    assert httpx.get(f"{srv.url}/healthz", timeout=30).json()["ok"]
    return time.monotonic() - start


def test_a_request_pipelined_behind_an_answered_one_keeps_its_head_deadline(srv: ServerThread) -> None:
    sock = _raw(srv, HEALTHZ + b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    start, closed = time.monotonic(), False
    while not closed and time.monotonic() - start < 6:
        try:
            sock.sendall(b"a")  # one byte at a time, as a slowloris does
        except OSError:
            closed = True
        else:
            closed, _ = _read_until_closed(sock, 0.3)
    sock.close()
    assert closed and time.monotonic() - start < 4, f"still open after {time.monotonic() - start:.1f} s"


def test_a_body_dribbled_behind_a_pipelined_request_gets_its_408(srv: ServerThread) -> None:
    head = b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    sock = _raw(srv, HEALTHZ + head + b'{"keys": [')
    start = time.monotonic()
    closed, got = _read_until_closed(sock, 6)
    sock.close()
    assert closed and time.monotonic() - start < 4
    assert got.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 408 " in got, got[:400]


def test_a_huge_head_is_refused_before_the_parser_reads_it_and_healthz_keeps_answering(srv: ServerThread) -> None:
    sock = socket.create_connection((srv.host, srv.port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sent, refused, slowest = 0, b"", 0.0
    stop = threading.Event()

    def probe() -> None:
        nonlocal slowest
        while not stop.is_set():
            slowest = max(slowest, _healthz_secs(srv))

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        while sent < 24 << 20:
            sock.sendall(b"a" * (64 << 10))
            sent += 64 << 10
    except OSError:  # closed by the server
        pass
    finally:
        stop.set()
        prober.join()
    with pytest.raises(OSError):  # the server has stopped reading
        for _ in range(64):
            sock.sendall(b"a" * (64 << 10))
    closed, refused = _read_until_closed(sock, 3)
    sock.close()
    assert sent < 4 << 20, f"{sent} bytes of one header taken"
    assert b" 431 " in refused.split(b"\r\n")[0] or closed, refused[:200]
    assert slowest < 0.5, f"/healthz took {slowest:.2f} s"


def test_pipelined_requests_per_connection_are_bounded(srv: ServerThread) -> None:
    sock = _raw(srv, HEALTHZ * 3000)
    closed, got = _read_until_closed(sock, 5)
    sock.close()
    assert closed and got.count(b"HTTP/1.1 200 ") <= 1 + srv_bound(srv, "max_pipelined"), got.count(b"HTTP/1.1 200 ")
    assert _healthz_secs(srv) < 0.5


def srv_bound(srv: ServerThread, name: str) -> int:
    return int(getattr(srv._server.config.http, name))


def test_connections_from_one_address_are_bounded_and_others_are_served(srv: ServerThread) -> None:
    socks = [socket.create_connection((srv.host, srv.port), timeout=10) for _ in range(60)]
    try:
        time.sleep(0.3)  # within the head deadline (1 s): only the bound closes any
        readable, _, _ = select.select(socks, [], [], 0)
        shut = sum(1 for s in readable if s.recv(1) == b"")
        assert shut == 60 - srv_bound(srv, "max_connections_per_client"), shut
    finally:
        for s in socks:
            s.close()
    time.sleep(0.3)
    assert _healthz_secs(srv) < 0.5  # their places are given back once they close


def test_idle_and_slow_heads_are_closed_within_the_head_deadline(srv: ServerThread) -> None:
    idle = socket.create_connection((srv.host, srv.port), timeout=10)
    slow = _raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    start = time.monotonic()
    assert _read_until_closed(idle, 4)[0] and _read_until_closed(slow, 4)[0]
    assert time.monotonic() - start < 3
    idle.close()
    slow.close()
