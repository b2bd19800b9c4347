"""Named errors of the registry.

    RegistryError
    ├── InvalidRecord          a record or request body that fails validation (HTTP 400/422)
    │   └── KeyMismatch        the key does not hash from the record's own fields (422)
    ├── PayloadTooLarge        a body or field over its size limit (413)
    ├── NotFound               no record / no queue job under that key (404)
    ├── Unauthorized           a call without a valid bearer token (401)
    │   └── Forbidden          a valid token whose role does not allow the call (403)
    ├── TooManyRequests        over a rate limit, e.g. complaints (429)
    ├── RequestTimeout         a body that did not arrive in time (408)
    ├── LeaseLost              ack/fail/renew with a lease that expired, was re-leased, or whose job is gone (409)
    ├── RegistryUnavailable    the registry could not be reached, answered 5xx, or too slowly
    │   └── StoreFull          the store's LMDB map is full: no write succeeds until its operator gives it room (507)
    └── MalformedAnswer        a client got an answer that is not the registry's (a hostile or wrong server)
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base of every error the registry raises on purpose."""

    status = 500


class InvalidRecord(RegistryError):
    status = 400


class KeyMismatch(InvalidRecord):
    status = 422


class PayloadTooLarge(RegistryError):
    status = 413


class NotFound(RegistryError):
    status = 404


class Unauthorized(RegistryError):
    status = 401


class Forbidden(Unauthorized):
    status = 403


class TooManyRequests(RegistryError):
    status = 429

    def __init__(self, message: str = "", stored: int = 0) -> None:
        super().__init__(message)
        self.stored = stored  # records of a push in batches that were stored before a batch was refused


class RequestTimeout(RegistryError):
    status = 408


class LeaseLost(RegistryError):
    status = 409


class RegistryUnavailable(RegistryError):
    status = 503


class StoreFull(RegistryUnavailable):
    status = 507


class MalformedAnswer(RegistryError):
    status = 502


BY_STATUS: dict[int, type[RegistryError]] = {
    400: InvalidRecord,
    401: Unauthorized,
    403: Forbidden,
    408: RequestTimeout,
    404: NotFound,
    409: LeaseLost,
    413: PayloadTooLarge,
    422: KeyMismatch,
    429: TooManyRequests,
}


def error_for_status(status: int, message: str) -> RegistryError:
    """The named error a client raises for an HTTP error answer."""
    if status >= 500:
        return RegistryUnavailable(f"registry error {status}: {message}")
    return BY_STATUS.get(status, RegistryError)(message)


#: What reading a stored record, trial or status raises when this version's checks refuse it (it was stored before a
#: check existed, or a hostile server sent it): the reader leaves that one value out and goes on
REFUSED_ON_READ: tuple[type[RegistryError], ...] = (InvalidRecord, PayloadTooLarge)
