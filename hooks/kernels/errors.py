"""What TVM raises when a build, a schedule or a sample fails.

apache-tvm 0.27 reports its C++ errors through tvm-ffi as Python's own exception types: ``LOG(FATAL)`` and
``ICHECK`` as ``tvm.error.InternalError`` and a schedule primitive's as ``ScheduleError`` (both
``RuntimeError``), argument checks as ``ValueError`` or ``TypeError``. There is no ``tvm.TVMError`` (nor
``tvm.error.TVMError``) any more: an ``except`` clause that names one raises ``AttributeError`` the moment
an error reaches it.
"""

from __future__ import annotations

TVM_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError, TypeError)


def error_line(exc: BaseException) -> str:
    """An error in one line for a message: its type and its last line (TVM's C++ errors end with their message, after a
    traceback), at most 200 characters of it."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1][:200] if lines else ''}"
