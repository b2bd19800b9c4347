"""Work on scheduled kernels in the background while the hook goes on with the next ones.

TVM's passes and LLVM run without Python's GIL, so a kernel's build or lowering started the moment its schedule
is known overlaps the lookups and replays of the kernels after it. TVM's pass configuration is thread-local: each
piece of work runs in the configuration (and target) current when it was started.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Generic, TypeVar

import tvm

from .threads import usable_cpus


def pass_settings() -> dict[str, Any]:
    """The current pass configuration as ``tvm.transform.PassContext``'s arguments."""
    ctx = tvm.transform.PassContext.current()
    return {"opt_level": ctx.opt_level, "config": dict(ctx.config), "required_pass": list(ctx.required_pass), "disabled_pass": list(ctx.disabled_pass)}


Key = TypeVar("Key", bound=Hashable)
_STOP = object()


class _DaemonPool:
    """Worker threads that never hold the process up: a piece given up on (:meth:`KernelWork.give_up`) may run on in its
    thread, inside LLVM where no Python can stop it, while the compile goes on, and the process exits without it."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._name, self._threads = name, 0
        for _ in range(workers):
            self.add_worker()

    def add_worker(self) -> None:
        self._threads += 1
        threading.Thread(target=self._work, name=f"{self._name}_{self._threads}", daemon=True).start()

    def submit(self, work: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, work))
        return future

    def stop(self) -> None:
        """Each worker ends once it is free (one given up on, when its piece ends)."""
        for _ in range(self._threads):
            self._queue.put(_STOP)

    def _work(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            future, work = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as exc:  # noqa: BLE001 (handed to whoever waits, as an executor does)
                    future.set_exception(exc)


class KernelWork(Generic[Key]):
    """Pieces of work by key, ``workers`` at a time (default: one per CPU), each started once until it is forgotten;
    a piece's result is None when it succeeded, else the exception it ended with."""

    def __init__(self, workers: int | None, thread_name: str) -> None:
        self.workers = workers or usable_cpus()
        self._thread_name = thread_name
        self._pool: _DaemonPool | None = None
        self._started: dict[Key, Future[Exception | None]] = {}
        self._began: dict[Key, float] = {}  # when each piece began to run (monotonic seconds)
        self._took: dict[Key, float] = {}  # how long each piece that ended ran
        self._given_up: set[Key] = set()

    def _submit(self, key: Key, work: Callable[[], Exception | None], target: tvm.target.Target) -> Future[Exception | None]:
        """``work`` started under the current pass configuration and ``target``, or the piece already started under ``key``."""
        if key in self._started:
            return self._started[key]
        settings = pass_settings()

        def run() -> Exception | None:
            self._began[key] = began = time.monotonic()
            try:
                with tvm.transform.PassContext(**settings), target:
                    return work()
            finally:
                self._took[key] = time.monotonic() - began

        if self._pool is None:
            self._pool = _DaemonPool(self.workers, self._thread_name)
        self._started[key] = future = self._pool.submit(run)
        return future

    def outcome(self, key: Key, future: Future[Exception | None], budget: float | None = None) -> Exception | None:
        """The piece's result; :class:`TooSlow` where it ran over ``budget`` seconds, ended or not (one still running is
        given up on: it runs on in the background, and another worker takes its place)."""
        while True:
            try:
                result = future.result(timeout=_POLL_SECS if budget is not None else None)
            except FutureTimeout:
                began = self._began.get(key)
                if budget is not None and began is not None and time.monotonic() - began > budget:
                    self.give_up(key)
                    return TooSlow(f"ran over {budget:g} s without ending")
                continue
            took = self._took.get(key, 0.0)
            return TooSlow(f"ran {took:.3g} s, over {budget:g} s") if result is None and budget is not None and took > budget else result

    def give_up(self, key: Key) -> None:
        """Stop waiting for ``key``'s piece: it is forgotten, and a new worker takes its place."""
        if key in self._started and key not in self._given_up:
            self._given_up.add(key)
            del self._started[key]
            if self._pool is not None:
                self._pool.add_worker()

    def settle(self) -> None:
        """Wait for every piece started: a kernel timed here must not share the CPUs with them."""
        for future in list(self._started.values()):
            future.result()

    def close(self) -> None:
        """Finish the pieces started (a build that failed after starting them: their results serve the next build); a
        piece given up on is not waited for."""
        self.settle()
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        self._started.clear()


class TooSlow(RuntimeError):  # a RuntimeError: what the hook treats as a kernel TVM could not build
    """A piece of work given up on after its budget of seconds."""


_POLL_SECS = 0.1  # how often a budgeted wait looks at the clock (a piece that ends is answered at once)
