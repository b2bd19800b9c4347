"""Whose records a reader accepts: verified ones by default, claims of named pushers or of anyone on request.

A record is *verified* when a trusted worker (or a local store's owner) replayed, checked and
measured it; otherwise it is its pusher's *claim*. The hook serves, and pull and push copy into
formats that carry no status, only what the reader's trust accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Union

from ._records import Record

Trust = Union[str, Collection[str]]


def trusted(trust: Trust) -> Callable[[bool, str], bool]:
    """Whether a reader with ``trust`` accepts what a pusher pushed (verified or not, pushed by that name)."""
    if trust == "any":
        return lambda verified, pushed_by: True
    if trust == "verified":
        return lambda verified, pushed_by: verified
    if isinstance(trust, str):
        raise ValueError(f"trust must be 'verified', 'any' or a collection of pusher names, got {trust!r}")
    names = frozenset(trust)
    return lambda verified, pushed_by: verified or pushed_by in names


def trust_filter(trust: Trust) -> Callable[[Record], bool]:
    """Which records a reader accepts (a record without a registry status is the reader's own)."""
    accepts = trusted(trust)
    return lambda r: r.served is None or accepts(r.served.verified, r.served.pushed_by)


def parse_trust(text: str) -> Trust:
    """A command line's trust: ``verified``, ``any`` or pusher names separated by commas."""
    text = text.strip()
    if text in ("verified", "any"):
        return text
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("trust must be 'verified', 'any' or pusher names separated by commas")
    return names
