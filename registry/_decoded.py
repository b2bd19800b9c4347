"""Decoded key values kept beside their stored bytes, so a read that finds the same bytes skips decoding them.

A key's value (its entries, best first, with their bookkeeping) is msgpack; decoding one of ~2.5 KB costs ~1.7 µs and
building its entries' public status about as much again, where copying its bytes out of LMDB and comparing them with
the bytes decoded last time costs ~0.2 µs. The comparison is the check: equal bytes decode equally, whoever wrote
them, so a value another process rewrote is decoded again. Bounded in values and in bytes; a value over
:data:`MAX_VALUE_BYTES` is never kept (those reads are rare and large anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

MAX_VALUE_BYTES = 64 << 10
T = TypeVar("T")


class DecodedValues(Generic[T]):
    """Per-key ``decode(stored bytes)`` results, reused while the stored bytes are the same; oldest out first."""

    def __init__(self, decode: Callable[[bytes], T], max_values: int = 16384, max_bytes: int = 64 << 20) -> None:
        self._decode = decode
        self._kept: dict[str, tuple[bytes, T]] = {}
        self._bytes = 0
        self.max_values = max_values
        self.max_bytes = max_bytes

    def get(self, key: str, stored: Any) -> T:
        """``decode(stored)``, from what was kept for ``key`` when its bytes are equal (``stored``: bytes or a buffer)."""
        data = bytes(stored)
        kept = self._kept.get(key)
        if kept is not None and kept[0] == data:
            return kept[1]
        decoded = self._decode(data)
        if len(data) <= MAX_VALUE_BYTES:
            self._keep(key, data, decoded)
        return decoded

    def _keep(self, key: str, data: bytes, decoded: T) -> None:
        # Threads share one instance (the server reads on its loop and in worker threads): every step is one dict
        # operation, and a count off by a racing step only moves when the next eviction comes.
        old = self._kept.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        while self._kept and (len(self._kept) >= self.max_values or self._bytes + len(data) > self.max_bytes):
            try:
                oldest = self._kept.pop(next(iter(self._kept)), None)
            except (StopIteration, RuntimeError):  # emptied or changed by another thread meanwhile
                break
            if oldest is not None:
                self._bytes -= len(oldest[0])
        self._kept[key] = (data, decoded)
        self._bytes += len(data)
