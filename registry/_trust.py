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
Accepts = Callable[[bool, str], bool]  # (verified, pushed by) -> served


def trusted(trust: Trust) -> Accepts:
    """Whether a reader with ``trust`` accepts what a pusher pushed (verified or not, pushed by that name)."""
    if trust == "any":
        return lambda verified, pushed_by: True
    if trust == "verified":
        return lambda verified, pushed_by: verified
    if isinstance(trust, str):
        raise ValueError(f"trust must be 'verified', 'any' or a collection of pusher names, got {trust!r}")
    names = frozenset(trust)
    return lambda verified, pushed_by: verified or pushed_by in names


def accepts_entry(accepts: Accepts, entry: dict[str, object]) -> bool:
    """Whether ``accepts`` takes a stored entry or its public status (both name the verifier ``vby``, the pusher ``by``)."""
    return accepts(bool(entry.get("vby")), str(entry.get("by", "")))


def trust_filter(trust: Trust) -> Callable[[Record], bool]:
    """Which records a reader accepts (a record without a registry status is the reader's own)."""
    accepts = trusted(trust)
    return lambda r: r.served is None or accepts(r.served.verified, r.served.pushed_by)


def trust_wire(trust: Trust) -> str | list[str]:
    """``trust`` as a lookup request carries it."""
    return trust if isinstance(trust, str) else sorted(trust)


def trust_of_request(value: object) -> Trust:
    """The trust a lookup request states (absent: ``any``, what a client older than the field was answered); raises
    ValueError for anything but 'verified', 'any' or up to 64 pusher names."""
    if value is None:
        return "any"
    if value in ("verified", "any"):
        return value  # type: ignore[return-value]
    if isinstance(value, list) and len(value) <= 64 and all(isinstance(n, str) and 0 < len(n) <= 128 for n in value):
        return frozenset(value)
    raise ValueError("'trust' must be 'verified', 'any' or a list of up to 64 pusher names")


def parse_trust(text: str) -> Trust:
    """A command line's trust: ``verified``, ``any`` or pusher names separated by commas."""
    text = text.strip()
    if text in ("verified", "any"):
        return text
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("trust must be 'verified', 'any' or pusher names separated by commas")
    return names
