"""Running the registry app under uvicorn: in the foreground (the CLI) or in a thread (tests, demos)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._auth import TOKEN_ENV, Principal, TokenFile
from ._errors import RegistryError
from ._server import DEFAULT_BODY_TIMEOUT, create_app
from ._wire import ERROR_HEADER

HEADER_TIMEOUT = 10.0  # seconds for a request's headers to arrive once it has begun


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with deadlines on a request's arrival: its headers within ``header_timeout`` of its start
    (else the connection is closed), its body within ``body_timeout`` of its headers (else it is answered 408 and
    closed).

    uvicorn times out idle keep-alive connections but not a request that has begun: a client sending its headers or
    its body a byte at a time (slowloris) would hold its connection forever. The body's deadline is kept here, one
    timer per request, rather than in the app around each read, where it cost the 20-key lookup ~5% of its
    requests/s (bench.serverload).
    """

    header_timeout = HEADER_TIMEOUT
    body_timeout = DEFAULT_BODY_TIMEOUT

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm(self.header_timeout, self._headers_too_slow)

    def _arm(self, seconds: float, expire: Callable[[], None]) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(seconds, expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _body_too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            message = f"the request body did not arrive within {self.body_timeout:g} s"
            body = json.dumps({"error": "RequestTimeout", "message": message, "status": 408}).encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 + f"{ERROR_HEADER}: RequestTimeout\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout, self._headers_too_slow)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers):  # a GET has no body to wait for
            self._arm(self.body_timeout, self._body_too_slow)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle from here on: uvicorn's keep-alive timeout takes over

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def server_config(app: Any, header_timeout: float = HEADER_TIMEOUT, body_timeout: float = DEFAULT_BODY_TIMEOUT, **options: Any) -> uvicorn.Config:
    """uvicorn settings every schedhub server uses: header and body deadlines, bounded headers and connections. The app
    should be made with ``body_timeout=None``: the protocol keeps that deadline."""
    protocol = type("SchedhubHttpProtocol", (DeadlineProtocol,), {"header_timeout": header_timeout, "body_timeout": body_timeout})
    return uvicorn.Config(app, http=protocol, access_log=False, timeout_keep_alive=5,
                          limit_concurrency=2048, h11_max_incomplete_event_size=64 << 10, **options)  # fmt: skip


class InsecureServerError(RegistryError):
    """A writable server on a non-loopback address without any token."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, tokens: dict[str, str | Principal] | TokenFile, read_only: bool) -> None:
    if not tokens and not read_only and not is_loopback(host):
        raise InsecureServerError(
            f"refusing to serve writable on {host} without a token: set {TOKEN_ENV}, pass --token-file, or --read-only"
        )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: an ephemeral port), or a RegistryError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RegistryError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server on that port? try --port 0)") from None
    return sock


def serve(root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8470, *, tokens: dict[str, str | Principal] | TokenFile | None = None,
          read_only: bool = False, log_level: str = "info", announce: Callable[[str], None] | None = None, **app_options: Any) -> None:  # fmt: skip
    """Serve the store at ``root`` until interrupted; ``announce`` gets the real URL once the port is bound."""
    tokens = tokens or {}
    check_exposure(host, tokens, read_only)
    sock = listen(host, port)
    body_timeout = app_options.pop("body_timeout", DEFAULT_BODY_TIMEOUT)
    app = create_app(root, tokens=tokens, read_only=read_only, body_timeout=None, **app_options)
    if announce is not None:
        shown = f"[{host}]" if ":" in host else host
        announce(f"http://{shown}:{sock.getsockname()[1]}")
    uvicorn.Server(server_config(app, body_timeout=body_timeout, log_level=log_level)).run(sockets=[sock])


class ServerThread:
    """A real uvicorn server on 127.0.0.1 (an ephemeral port) in a background thread."""

    def __init__(self, root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, *, header_timeout: float = HEADER_TIMEOUT,
                 **app_options: Any) -> None:  # fmt: skip
        self.host = host
        self._socket = listen(host, port)
        self.port = self._socket.getsockname()[1]
        body_timeout = app_options.pop("body_timeout", DEFAULT_BODY_TIMEOUT)
        config = server_config(create_app(root, body_timeout=None, **app_options), header_timeout, body_timeout, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RegistryError("the registry server failed to start (see its log)")
            self._thread.join(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()
