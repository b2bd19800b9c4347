"""What a measurement worker remembers between its tasks: a reference kernel's outputs and the default's brief timing.

Every tuning round of a kernel times its candidates beside the same default schedule and checks them against the
same reference (on a CPU the unscheduled kernel is both; on a GPU the reference is the unscheduled kernel run on the
host). Their builds are byte for byte the same each round, and the inputs are the same (:func:`.kernels.random_arguments`,
seed 0), so a worker that ran one in an earlier round already has its outputs. BERT's unscheduled matmuls run
0.3-1 s a call: three calls a round (the reference, and the default's brief timing) were a third of its round.

Entries are keyed by the SHA-256 of the build's bytes, its arguments and the device, and hold only the arguments the
kernel changed (a weight it reads is made again from the seed). A worker keeps at most :data:`MEMORY_BYTES`, the
least recently used going first; a worker that never ran a kernel, or forgot it, simply runs it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

#: What one measurement worker keeps of the kernels it ran.
MEMORY_BYTES = 256 << 20


@dataclass
class Remembered:
    """A kernel's call on the measurement's inputs: the arguments it changed (None: left as given), that call's
    seconds, and, once made, its brief timing (:func:`.kernels._brief`'s result, ``flushed_secs`` included where taken)."""

    changed: list[np.ndarray | None]
    call_secs: float
    at: float
    brief: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.changed if a is not None)

    def outputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Every argument after the call, ``arrays`` being the inputs it was called on."""
        return [given if changed is None else changed for given, changed in zip(arrays, self.changed, strict=True)]


def kernel_key(artifact: bytes, args_info: list[Any], device: str) -> str:
    """The content address of one build called on the arguments ``args_info`` describes, on ``device``."""
    digest = hashlib.sha256(artifact)
    digest.update(json.dumps([args_info, device], sort_keys=True).encode())
    return digest.hexdigest()


class KernelMemory:
    """Remembered calls by :func:`kernel_key`, at most ``limit`` bytes of arrays, least recently used out first."""

    def __init__(self, limit: int = MEMORY_BYTES) -> None:
        self.limit = limit
        self._entries: OrderedDict[str, Remembered] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> Remembered | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def remember(self, key: str, arrays: list[np.ndarray], outputs: list[np.ndarray], call_secs: float) -> Remembered:
        """Keep a call's ``outputs`` (``arrays``: what it was called on); returns the entry (kept only where it fits)."""
        entry = Remembered([None if np.array_equal(out, given) else out for given, out in zip(arrays, outputs, strict=True)], call_secs, time.time())
        self.forget(key)
        if entry.nbytes <= self.limit:
            self._entries[key] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.limit:
                self._bytes -= self._entries.popitem(last=False)[1].nbytes
        return entry

    def forget(self, key: str) -> None:
        if (gone := self._entries.pop(key, None)) is not None:
            self._bytes -= gone.nbytes

    def __len__(self) -> int:
        return len(self._entries)


#: This process's memory (a Ray worker's lives as long as the worker).
MEMORY = KernelMemory()
