"""What TVM raises when a build, a schedule or a sample fails.

apache-tvm 0.27 reports its C++ errors through tvm-ffi as Python's own exception types: ``LOG(FATAL)`` and
``ICHECK`` as ``tvm.error.InternalError`` and a schedule primitive's as ``ScheduleError`` (both
``RuntimeError``), argument checks as ``ValueError`` or ``TypeError``. There is no ``tvm.TVMError`` (nor
``tvm.error.TVMError``) any more: an ``except`` clause that names one raises ``AttributeError`` the moment
an error reaches it.
"""

from __future__ import annotations

TVM_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError, TypeError)
