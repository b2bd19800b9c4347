"""TVM's tensor intrinsics, imported cheaply.

Importing ``tvm.s_tir.tensor_intrin`` parses ~250 TVMScript functions, each calling
``inspect.stack()``, which on CPython 3.11 resolves a module per frame: 35–120 s. MetaSchedule's
``TuneContext`` (its design spaces, its feature extractor) and its stock build function import it.
:func:`load_tensor_intrinsics` imports it once with a frame walk that skips that lookup (about
2 s), so later imports are free.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import sys
from collections.abc import Iterator


def _frames_without_module_lookup(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` with the current line as context but no per-frame module search."""
    out = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno)
        out.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return out


@contextlib.contextmanager
def _cheap_stack() -> Iterator[None]:
    original = inspect.stack
    inspect.stack = _frames_without_module_lookup  # type: ignore[assignment]
    try:
        yield
    finally:
        inspect.stack = original  # type: ignore[assignment]


@functools.lru_cache(maxsize=1)
def load_tensor_intrinsics() -> None:
    """Register TVM's tensor intrinsics (once a process, the fast way)."""
    with _cheap_stack():
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers intrinsics; slow without the patch)
