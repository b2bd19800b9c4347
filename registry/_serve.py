"""Running the registry app under uvicorn: in the foreground (the CLI) or in a thread (tests, demos)."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from ._auth import TOKEN_ENV, Principal, TokenFile
from ._errors import RegistryError
from ._protocol import HEADER_TIMEOUT, protocol_class
from ._server import DEFAULT_BODY_TIMEOUT, create_app

def server_config(app: Any, header_timeout: float = HEADER_TIMEOUT, body_timeout: float = DEFAULT_BODY_TIMEOUT, *,
                  wire_bounds: dict[str, int] | None = None, **options: Any) -> uvicorn.Config:  # fmt: skip
    """uvicorn settings every schedhub server uses: per-request deadlines, bounded heads, pipelining and connections
    (:mod:`._protocol`; ``wire_bounds`` overrides its bounds by name). The app should be made with ``body_timeout=None``:
    the protocol keeps that deadline."""
    protocol = protocol_class(header_timeout, body_timeout, **(wire_bounds or {}))
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
                 wire_bounds: dict[str, int] | None = None, **app_options: Any) -> None:  # fmt: skip
        self.host = host
        self._socket = listen(host, port)
        self.port = self._socket.getsockname()[1]
        body_timeout = app_options.pop("body_timeout", DEFAULT_BODY_TIMEOUT)
        config = server_config(create_app(root, body_timeout=None, **app_options), header_timeout, body_timeout, wire_bounds=wire_bounds,
                               log_level="warning")  # fmt: skip
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
