"""Who may do what: bearer tokens carry a name and a role; complaints are rate-limited.

Roles, each including the ones before it:

- ``read``: report misses and complaints (reads themselves are open)
- ``push``: push records; they are *claims* until a worker verifies them
- ``worker``: lease, renew, ack, fail and release queue jobs; its pushes count as verified
- ``admin``: quarantine records and requeue jobs
"""

from __future__ import annotations

import hmac
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path

from ._errors import RegistryError, Unauthorized

ROLES = ("read", "push", "worker", "admin")
TOKEN_ENV = "SCHEDHUB_TOKEN"
MAX_NAME = 128  # a principal's name is part of index keys (a trial log's: key, NUL, name) and of every page that shows who pushed


@dataclass(frozen=True)
class Principal:
    name: str
    role: str = "push"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise RegistryError(f"unknown role {self.role!r}: use one of {', '.join(ROLES)}")
        if not 0 < len(self.name) <= MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in self.name):
            raise RegistryError(f"a token's name must be 1 to {MAX_NAME} characters without control characters; got {self.name[:40]!r}")

    def can(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)

    @property
    def trusted(self) -> bool:
        """Its measurements count as verified (workers measure side by side against the reference)."""
        return self.can("worker")


ANONYMOUS = Principal("anonymous", "admin")  # an open registry (no tokens): loopback only, see serve()


def as_principals(tokens: dict[str, str | Principal] | None) -> dict[str, Principal]:
    """Token → Principal; a plain name (the older form) is an admin of that name."""
    return {tok: p if isinstance(p, Principal) else Principal(p, "admin") for tok, p in (tokens or {}).items()}


def authenticate(tokens: dict[str, Principal], header: str) -> Principal:
    """The principal behind an ``Authorization: Bearer …`` header (timing-safe comparison)."""
    if not tokens:
        return ANONYMOUS
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("this call needs 'Authorization: Bearer <token>' (schedhub --token or SCHEDHUB_TOKEN)")
    presented = token.strip().encode()
    found = None
    for known, principal in tokens.items():
        if hmac.compare_digest(known.encode(), presented):
            found = principal
    if found is None:
        raise Unauthorized("the bearer token is not accepted by this registry")
    return found


def load_tokens(token_file: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> dict[str, Principal]:
    """Tokens from ``$SCHEDHUB_TOKEN`` (an admin named 'default') and a file of ``name token [role]``
    lines (role defaults to ``push``; a bare ``token`` line is a pusher named tokenN); '#' comments."""
    env = os.environ if env is None else env
    tokens: dict[str, Principal] = {}
    if env.get(TOKEN_ENV):
        tokens[env[TOKEN_ENV].strip()] = Principal("default", "admin")
    if token_file:
        for n, line in enumerate(Path(token_file).read_text().splitlines(), 1):
            parts = line.split("#", 1)[0].split()
            if not parts:
                continue
            if len(parts) > 3:
                raise RegistryError(f"{token_file}:{n}: expected 'name token [role]' or 'token'")
            try:
                if len(parts) == 1:
                    tokens[parts[0]] = Principal(f"token{n}")
                else:
                    tokens[parts[1]] = Principal(parts[0], parts[2] if len(parts) == 3 else "push")
            except RegistryError as exc:
                raise RegistryError(f"{token_file}:{n}: {exc}") from None
    return tokens


class RateLimiter:
    """At most ``count`` events per ``window`` seconds per caller; remembers ``callers`` callers."""

    def __init__(self, count: int, window: float, callers: int = 10_000) -> None:
        self.count, self.window, self.callers = count, window, callers
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def allow(self, caller: str, events: int = 1) -> bool:
        """Whether ``caller`` may have ``events`` more now (and if so, they are counted)."""
        now = time.monotonic()
        times = self._seen.pop(caller, None) or deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        self._seen[caller] = times
        while len(self._seen) > self.callers:
            self._seen.popitem(last=False)
        if len(times) + events > self.count:
            return False
        times.extend([now] * events)
        return True
