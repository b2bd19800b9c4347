"""Running the registry app under uvicorn: in the foreground (the CLI) or in a thread (tests, demos)."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from pathlib import Path
from typing import Any

import uvicorn

from ._errors import RegistryError
from ._server import create_app

TOKEN_ENV = "SCHEDHUB_TOKEN"


class InsecureServerError(RegistryError):
    """A writable server on a non-loopback address without any token."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_tokens(token_file: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """Bearer tokens → writer names: ``$SCHEDHUB_TOKEN`` (named 'default') and a file of
    ``name token`` (or bare ``token``) lines; '#' starts a comment."""
    env = os.environ if env is None else env
    tokens: dict[str, str] = {}
    if env.get(TOKEN_ENV):
        tokens[env[TOKEN_ENV].strip()] = "default"
    if token_file:
        for n, line in enumerate(Path(token_file).read_text().splitlines(), 1):
            parts = line.split("#", 1)[0].split()
            if not parts:
                continue
            if len(parts) > 2:
                raise RegistryError(f"{token_file}:{n}: expected 'name token' or 'token'")
            name, token = (parts[0], parts[1]) if len(parts) == 2 else (f"token{n}", parts[0])
            tokens[token] = name
    return tokens


def check_exposure(host: str, tokens: dict[str, str], read_only: bool) -> None:
    if not tokens and not read_only and not is_loopback(host):
        raise InsecureServerError(
            f"refusing to serve writable on {host} without a token: set {TOKEN_ENV}, pass --token-file, or --read-only"
        )


def serve(root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8470, *, tokens: dict[str, str] | None = None,
          read_only: bool = False, log_level: str = "info", **app_options: Any) -> None:  # fmt: skip
    """Serve the store at ``root`` until interrupted."""
    tokens = tokens or {}
    check_exposure(host, tokens, read_only)
    app = create_app(root, tokens=tokens, read_only=read_only, **app_options)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


class ServerThread:
    """A real uvicorn server on 127.0.0.1 (an ephemeral port) in a background thread."""

    def __init__(self, root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0, **app_options: Any) -> None:
        self.host = host
        self._socket = socket.socket()
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(create_app(root, **app_options), log_level="warning", access_log=False)
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
