"""What a machine's measurement tasks remember between rounds: a reference kernel's outputs and the default's brief timing.

Every tuning round of a kernel times its candidates beside the same default schedule and checks them against the
same reference (on a CPU the unscheduled kernel is both; on a GPU the reference is the unscheduled kernel run on the
host). Their builds are byte for byte the same each round, and so are the inputs (:func:`.kernels.random_arguments`,
seed 0), so a round after the first has the reference's outputs already. BERT's unscheduled matmuls run 0.3-1 s a
call: three calls a round (the reference, and the default's brief timing) were a third of its round.

An entry is one ``.npz`` file (arrays only, read without pickle) under the machine's kernel cache
(``hooks.kernels.cache.default_dir()``, ``references/``), named by the SHA-256 of the build's bytes, its arguments and the
device; it holds only the arguments the call changed (a weight it reads is made again from the seed). It is on disk,
not in the worker, because Ray ends idle workers: in memory, half of a BERT run's later rounds found nothing. The
folder is bounded with the rest of the cache (``hooks.kernels.cache.prune``). A file that cannot be read, or does not fit
the arguments, is a miss: the kernel is simply called.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: A default's brief timing is reused this long: it is read only against candidates 10x faster than it.
BRIEF_KEPT_SECS = 3600.0
FOLDER = "references"


@dataclass
class Remembered:
    """A kernel's call on the measurement's inputs (``key``: :func:`kernel_key`): the arguments it changed (None: left
    as given), that call's seconds, and its brief timing (:func:`.kernels._brief`'s ``run_secs`` and, where taken,
    ``flushed_secs``) with the time it was made."""

    key: str
    changed: list[np.ndarray | None]
    call_secs: float
    brief: dict[str, list[float]] | None = None
    brief_at: float = 0.0

    def outputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Every argument after the call, ``arrays`` being the inputs it was called on."""
        return [given if changed is None else changed for given, changed in zip(arrays, self.changed, strict=True)]

    def brief_timing(self, flushed: bool, now: float | None = None) -> dict[str, list[float]] | None:
        """The brief timing, where it was made within :data:`BRIEF_KEPT_SECS` and with flushed calls iff ``flushed``."""
        fresh = self.brief is not None and (now or time.time()) - self.brief_at < BRIEF_KEPT_SECS
        return self.brief if fresh and ("flushed_secs" in self.brief) == flushed else None


def kernel_key(artifact: bytes, args_info: list[Any], device: str) -> str:
    """The content address of one build called on the arguments ``args_info`` describes, on ``device`` of this host (a
    cache folder shared by several machines never gives one a timing taken on another)."""
    digest = hashlib.sha256(artifact)
    digest.update(json.dumps([args_info, device, socket.gethostname()], sort_keys=True).encode())
    return digest.hexdigest()


class KernelMemory:
    """Remembered calls by :func:`kernel_key`, one file each under ``root`` (None: nothing is remembered)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def _path(self, key: str) -> Path | None:
        return None if self.root is None else self.root / FOLDER / f"{key}.npz"

    def recall(self, key: str, arrays: list[np.ndarray]) -> Remembered | None:
        """The call ``key`` names on ``arrays``, or None: never kept, unreadable, or not of these arguments."""
        path = self._path(key)
        try:
            if path is None:
                return None
            with np.load(path, allow_pickle=False) as held:
                changed: list[np.ndarray | None] = [None] * len(arrays)
                for i in (int(i) for i in held["changed"]):
                    got = held[f"arg{i}"]
                    if not 0 <= i < len(arrays) or got.shape != arrays[i].shape or got.dtype != arrays[i].dtype:
                        return None
                    changed[i] = got
                brief = {name: [float(s) for s in held[f"brief_{name}"]] for name in ("run_secs", "flushed_secs") if f"brief_{name}" in held}
                entry = Remembered(key, changed, float(held["call_secs"]), brief or None, float(held["brief_at"]) if brief else 0.0)
        except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError, zipfile.BadZipFile):  # a file we did not write whole, or not ours
            return None
        from schedhub.hooks.kernels.cache import mark_used

        mark_used(path)
        return entry

    def recall_or_call(self, key: str, arrays: list[np.ndarray], call: Callable[[], tuple[list[np.ndarray], float]]) -> tuple[Remembered, bool]:
        """The call ``key`` names on ``arrays`` as remembered (True), or made now (``call``: every argument after it, and
        its seconds) and remembered (False)."""
        if (known := self.recall(key, arrays)) is not None:
            return known, True
        return self.remember(key, arrays, *call()), False

    def remember(self, key: str, arrays: list[np.ndarray], outputs: list[np.ndarray], call_secs: float) -> Remembered:
        """Keep a call's ``outputs`` (``arrays``: what it was called on); returns the entry."""
        entry = Remembered(key, [None if np.array_equal(out, given) else out for given, out in zip(arrays, outputs, strict=True)], call_secs)
        self._write(entry)
        return entry

    def remember_brief(self, entry: Remembered, brief: dict[str, Any]) -> None:
        """Keep ``brief`` (a brief timing's result) as ``entry``'s, made now."""
        entry.brief, entry.brief_at = {k: list(brief[k]) for k in ("run_secs", "flushed_secs") if k in brief}, time.time()
        self._write(entry)

    def _write(self, entry: Remembered) -> None:
        """Write ``entry`` whole or not at all; a full or read-only disk only loses it. The cache is kept within its bound."""
        from schedhub.hooks.kernels.cache import atomic_file, max_bytes, prune

        path = self._path(entry.key)
        if path is None:
            return
        arrays: dict[str, np.ndarray] = {f"arg{i}": a for i, a in enumerate(entry.changed) if a is not None}
        arrays.update(changed=np.array([i for i, a in enumerate(entry.changed) if a is not None], dtype="int64"), call_secs=np.float64(entry.call_secs))
        if entry.brief:
            arrays.update({f"brief_{k}": np.array(v, dtype="float64") for k, v in entry.brief.items()}, brief_at=np.float64(entry.brief_at))
        try:
            with atomic_file(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, **arrays)
        except OSError:
            return
        assert self.root is not None
        prune(self.root, max_bytes())


def forget_all() -> None:
    """Forget every call this machine remembers (:func:`memory`'s folder): a benchmark's arms each start as a machine
    that never tuned these kernels."""
    import shutil

    from schedhub.hooks.kernels.cache import default_dir

    shutil.rmtree(default_dir() / FOLDER, ignore_errors=True)


def memory() -> KernelMemory:
    """This machine's memory: under the kernel cache's folder (``SCHEDHUB_CACHE_DIR``)."""
    from schedhub.hooks.kernels.cache import default_dir

    return KernelMemory(default_dir())
