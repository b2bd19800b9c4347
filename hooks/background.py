"""Work on scheduled kernels in the background while the hook goes on with the next ones.

TVM's passes and LLVM run without Python's GIL, so a kernel's build or lowering started the moment its schedule
is known overlaps the lookups and replays of the kernels after it. TVM's pass configuration is thread-local: each
piece of work runs in the configuration (and target) current when it was started.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import tvm

from .threads import usable_cpus


def pass_settings() -> dict[str, Any]:
    """The current pass configuration as ``tvm.transform.PassContext``'s arguments."""
    ctx = tvm.transform.PassContext.current()
    return {"opt_level": ctx.opt_level, "config": dict(ctx.config), "required_pass": list(ctx.required_pass), "disabled_pass": list(ctx.disabled_pass)}


Key = TypeVar("Key", bound=Hashable)


class KernelWork(Generic[Key]):
    """Pieces of work by key, ``workers`` at a time (default: one per CPU), each started once until it is forgotten;
    a piece's result is None when it succeeded, else the exception it ended with."""

    def __init__(self, workers: int | None, thread_name: str) -> None:
        self.workers = workers or usable_cpus()
        self._thread_name = thread_name
        self._pool: ThreadPoolExecutor | None = None
        self._started: dict[Key, Future[Exception | None]] = {}

    def _submit(self, key: Key, work: Callable[[], Exception | None], target: tvm.target.Target) -> Future[Exception | None]:
        """``work`` started under the current pass configuration and ``target``, or the piece already started under ``key``."""
        if key in self._started:
            return self._started[key]
        settings = pass_settings()

        def run() -> Exception | None:
            with tvm.transform.PassContext(**settings), target:
                return work()

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self._thread_name)
        self._started[key] = future = self._pool.submit(run)
        return future

    def settle(self) -> None:
        """Wait for every piece started: a kernel timed here must not share the CPUs with them."""
        for future in list(self._started.values()):
            future.result()

    def close(self) -> None:
        """Finish the pieces started (a build that failed after starting them: their results serve the next build)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._started.clear()
