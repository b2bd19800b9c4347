"""The registry's HTTP protocol: uvicorn's httptools protocol with every request's arrival bounded.

uvicorn times out idle keep-alive connections, but not a request that has begun, does not bound a request's head (the
httptools parser grows a header by concatenation: 32 MiB of one header took 39 s of event-loop time), queues any number
of pipelined requests, and lets one address hold every connection the server takes. Here:

- **Deadlines, per request.** A request's head must arrive within ``header_timeout`` of its first byte (else the
  connection is closed) and its body within ``body_timeout`` of its head (else 408 and close). Each request arms its
  own deadline when it begins and disarms it when it has arrived, whatever came before it on the connection: a response
  completing never disarms the deadline of the request pipelined behind it. The body's deadline is kept here, one timer
  per request, rather than in the app around each read, where it cost the 20-key lookup ~5% of its requests/s.
- **A bounded head.** ``max_head_bytes`` of a request line and headers without their end is refused (431 and close)
  before the parser sees more (it may have seen one read's bytes, at most 256 KiB, beyond what was counted).
- **Bounded pipelining.** At most ``max_pipelined`` requests wait behind the one being answered; the next closes the
  connection, and the parser reads no further.
- **Connections per address.** At most ``max_connections_per_client`` open connections from one client address; more are
  closed as they open, so one client cannot take the server's ``limit_concurrency`` from everyone else.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._server import DEFAULT_BODY_TIMEOUT
from ._wire import ERROR_HEADER

HEADER_TIMEOUT = 10.0  # seconds for a request's head to arrive once it has begun
MAX_HEAD_BYTES = 64 << 10  # a request line and its headers
MAX_PIPELINED = 16  # requests queued on one connection behind the one being answered
MAX_CONNECTIONS_PER_CLIENT = 256  # open connections from one client address (limit_concurrency is 2048 in all)
_HEAD_END = b"\r\n\r\n"


class _Refused(Exception):
    """Raised from a parser callback to stop the parser once the connection has been refused."""


def error_response(status: int, reason: str, error: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, with the registry's JSON error body."""
    body = json.dumps({"error": error, "message": message, "status": status}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"{ERROR_HEADER}: {error}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with each request's arrival bounded in time and size (see the module docstring)."""

    header_timeout: ClassVar[float] = HEADER_TIMEOUT
    body_timeout: ClassVar[float] = DEFAULT_BODY_TIMEOUT
    max_head_bytes: ClassVar[int] = MAX_HEAD_BYTES
    max_pipelined: ClassVar[int] = MAX_PIPELINED
    max_connections_per_client: ClassVar[int] = MAX_CONNECTIONS_PER_CLIENT
    open_by_client: ClassVar[collections.Counter[str]] = collections.Counter()  # one per server: :func:`protocol_class`

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._refused = False
        self._in_head = True  # the bytes arriving are a request's line and headers (or the wait for them)
        self._head_bytes = 0
        self._tail = b""  # the last bytes counted, for a head's end split across reads
        self._address = self.client[0] if self.client else ""
        self._counted = self.open_by_client[self._address] < self.max_connections_per_client
        if not self._counted:
            transport.close()
            return
        self.open_by_client[self._address] += 1
        self._arm(self.header_timeout, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            self.open_by_client[self._address] -= 1
            if self.open_by_client[self._address] <= 0:
                del self.open_by_client[self._address]
        super().connection_lost(exc)

    # -- reading ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head and not self._head_within_bound(data):
            self._refuse(error_response(431, "Request Header Fields Too Large", "HeadersTooLarge",
                                        f"the request line and headers are over {self.max_head_bytes} bytes"))  # fmt: skip
            return
        super().data_received(data)

    def _head_within_bound(self, data: bytes) -> bool:
        """Count ``data`` as head bytes up to the head's end (or all of it, the end not yet seen)."""
        seen = self._tail + data
        end = seen.find(_HEAD_END)
        counted = len(data) if end < 0 else max(0, end + len(_HEAD_END) - len(self._tail))
        self._head_bytes += counted
        self._tail = seen[-(len(_HEAD_END) - 1) :] if end < 0 else b""
        return self._head_bytes <= self.max_head_bytes

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # a refusal has answered already (its callback error reaches uvicorn as a parser error)
            super().send_400_response(msg)

    def _refuse(self, response: bytes = b"") -> None:
        self._refused = True
        self._disarm()
        if not self.transport.is_closing():
            if response and not self._answering():
                self.transport.write(response)
            self.transport.close()

    def _answering(self) -> bool:
        """Whether a response is under way or queued on this connection (an error written now would cut into it)."""
        return bool(self.pipeline) or (self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete)

    # -- parser callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._refused:
            raise _Refused
        super().on_message_begin()
        self._arm(self.header_timeout, self._head_too_slow)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head, self._head_bytes, self._tail = False, 0, b""
        super().on_headers_complete()
        if len(self.pipeline) > self.max_pipelined:
            self._refuse()
            raise _Refused
        if any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers):  # a GET has no body to wait for
            self._arm(self.body_timeout, self._body_too_slow)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        super().on_message_complete()

    # on_response_complete is uvicorn's: a response completing leaves the next request's deadline armed.

    # -- deadlines ------------------------------------------------------------------------------

    def _arm(self, seconds: float, expire: Callable[[], None]) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(seconds, expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_too_slow(self) -> None:
        self._deadline = None
        self._refuse()

    def _body_too_slow(self) -> None:
        self._deadline = None
        message = f"the request body did not arrive within {self.body_timeout:g} s"
        self._refuse(error_response(408, "Request Timeout", "RequestTimeout", message))


def protocol_class(header_timeout: float, body_timeout: float, **bounds: int) -> type[DeadlineProtocol]:
    """A :class:`DeadlineProtocol` for one server: its deadlines and bounds, and its own count of connections by address."""
    settings: dict[str, Any] = {"header_timeout": header_timeout, "body_timeout": body_timeout, "open_by_client": collections.Counter()}
    for name, value in bounds.items():
        if not hasattr(DeadlineProtocol, name):
            raise TypeError(f"DeadlineProtocol has no bound {name!r}")
        settings[name] = value
    return type("SchedhubHttpProtocol", (DeadlineProtocol,), settings)
