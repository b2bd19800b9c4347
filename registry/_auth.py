"""Who may do what: bearer tokens carry a name and a role; complaints are rate-limited.

Roles, each including the ones before it:

- ``read``: report misses and complaints (reads themselves are open)
- ``push``: push records; they are *claims* until a worker verifies them
- ``worker``: lease, renew, ack, fail and release queue jobs; its pushes count as verified
- ``admin``: quarantine records and requeue jobs
"""

from __future__ import annotations

import hmac
import logging
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


def authenticate(tokens: dict[str, Principal], header: str, *, open_registry: bool | None = None) -> Principal:
    """The principal behind an ``Authorization: Bearer …`` header (timing-safe comparison). An open registry
    (``open_registry``; by default: one without tokens) lets anyone in as :data:`ANONYMOUS`."""
    if open_registry if open_registry is not None else not tokens:
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


class TokenFile:
    """The tokens of a token file and ``$SCHEDHUB_TOKEN`` (:func:`load_tokens`), read again when the file changes (its
    size, time or inode; looked at most every ``check_secs``): revoking a token is deleting its line, no restart. An
    edit that does not parse, or a file gone, leaves the tokens in force and is logged once; a file left without
    tokens accepts none (a server given a token file is never open to anyone)."""

    def __init__(self, path: str | os.PathLike[str], env: dict[str, str] | None = None, check_secs: float = 1.0) -> None:
        self.path, self.env, self.check_secs = Path(path), env, check_secs
        self._stamp = self._stat()
        self._tokens = load_tokens(self.path, env)
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            found = self.path.stat()
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size, found.st_ino

    @property
    def tokens(self) -> dict[str, Principal]:
        """The tokens in force now."""
        if time.monotonic() - self._checked >= self.check_secs:
            self._checked = time.monotonic()
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp  # a bad edit is reported once, and read again when it changes
                try:
                    self._tokens = load_tokens(self.path, self.env)
                    logging.getLogger("schedhub.registry").warning("%s changed: %d token(s) in force", self.path, len(self._tokens))
                except (OSError, UnicodeError, RegistryError) as exc:
                    logging.getLogger("schedhub.registry").error("%s changed and was not taken, the %d token(s) before stay in force: %s",
                                                                 self.path, len(self._tokens), exc)  # fmt: skip
        return self._tokens


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
