"""A real HTTP server on 127.0.0.1 that answers every request as it is told: a wrong URL, a broken
proxy or a hostile registry, for the clients' tests."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    content_type: str = "application/msgpack"
    body: bytes = b""
    byte_every: float = 0.0  # > 0: send the body one byte at a time, this many seconds apart (forever if it is long)


class ScriptedServer:
    """``with ScriptedServer(Reply(...)) as srv``: every request gets ``srv.reply`` (set it between calls)."""

    def __init__(self, reply: Reply | None = None) -> None:
        self.reply = reply or Reply()
        self.requests = 0
        self._stop = threading.Event()
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                scripted.requests += 1
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                reply = scripted.reply
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                try:
                    if reply.byte_every <= 0:
                        self.wfile.write(reply.body)
                        return
                    for i in range(len(reply.body)):
                        if scripted._stop.is_set():
                            return
                        self.wfile.write(reply.body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(reply.byte_every)
                except OSError:  # the client gave up
                    pass

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> ScriptedServer:
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._http.shutdown()
        self._http.server_close()
