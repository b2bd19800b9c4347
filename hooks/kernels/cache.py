"""A per-machine cache of what the hook derives from kernels and records, so a model compiled again
skips the work: never a record itself (the registry decides what is served), only

- a kernel's identity (canonical workload text and ArgInfo), keyed by the sha256 of its TVMScript:
  renaming the parameters costs 10–30 ms a kernel, printing and hashing about 1 ms;
- a record's trace replayed on a kernel and checked within the bounds, keyed by the kernel's key,
  the trace id and the bounds, as TVM's JSON of the scheduled kernel: loading it costs a fraction
  of a replay, and the check is not repeated;
- features of logged schedules: the served and synthesis cost models' (``features``) and, for the tuner's
  searches, MetaSchedule's per-store features (``logfeatures``, ``schedhub.tuner.workloads.logmodel``).

One JSON file per entry under ``~/.cache/schedhub/kernels`` (``SCHEDHUB_CACHE_DIR``), named by the
sha256 of what it was derived from (the compiler fingerprint included), written atomically; the
folder is private to its user. An entry that cannot be read or parsed is a miss, never an error.

The folder is bounded (``SCHEDHUB_CACHE_MAX_BYTES``, default 2 GiB, kernel objects included): a
hit marks its file used, and when a session that wrote something ends over the bound, the files
used longest ago go first, down to 80% of it. A file used in the last ten minutes is never removed
(another compile may be about to read it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path.home() / ".cache" / "schedhub" / "kernels"
CACHE_ENV = "SCHEDHUB_CACHE_DIR"
MAX_ENTRY_BYTES = 64 << 20  # a scheduled kernel's JSON is KBs to a few MBs: anything bigger is not ours
MAX_BYTES_ENV = "SCHEDHUB_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 << 30
KEEP_RECENT_SECS = 600.0  # never remove a file used this recently


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[str]:
    """The name of a new file beside ``path`` (same suffix: writers that go by it still work) to write in the
    block; it replaces ``path`` when the block succeeds and is removed when it fails, so a reader sees the
    whole file or none. The folder is made private to its user."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def digest_path(path: Path) -> Path:
    """Where the SHA-256 of a kept file's bytes is kept, beside it."""
    return path.with_name(path.name + ".sha256")


def keep_digest(path: Path) -> None:
    """Write the SHA-256 of ``path``'s bytes beside it (atomically), for :func:`read_if_intact`."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with atomic_file(digest_path(path)) as tmp:
        Path(tmp).write_text(digest)


def read_if_intact(path: Path) -> bytes | None:
    """``path``'s bytes where they match the digest kept beside them (:func:`keep_digest`), else None: a file
    overwritten, cut short or missing, or its digest gone."""
    try:
        data = path.read_bytes()
        return data if digest_path(path).read_text().strip() == hashlib.sha256(data).hexdigest() else None
    except OSError:
        return None


def default_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_DIR)


def max_bytes() -> int:
    """The cache's bound in bytes: ``$SCHEDHUB_CACHE_MAX_BYTES`` when it is a whole number ≥ 0, else 2 GiB."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    return int(text) if text.isdigit() else DEFAULT_MAX_BYTES


def mark_used(path: Path) -> None:
    """Note that ``path`` was used now (its mtime), so pruning keeps it longer; a read-only folder is no error."""
    try:
        os.utime(path)
    except OSError:
        pass


def prune(root: Path, limit: int, keep_recent_secs: float = KEEP_RECENT_SECS) -> int:
    """Remove the files under ``root`` used longest ago while it holds more than ``limit`` bytes, down to 80% of
    ``limit``; files used within ``keep_recent_secs`` stay. Returns the bytes removed."""
    files: list[tuple[float, int, Path]] = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in files)
    if total <= limit:
        return 0
    removed, newest_allowed = 0, time.time() - keep_recent_secs
    for mtime, size, path in sorted(files, key=lambda f: f[0]):
        if total - removed <= limit * 0.8 or mtime > newest_allowed:
            break
        try:
            path.unlink()
        except OSError:
            continue
        removed += size
    return removed


class Untold:
    """The first failure of something a compile should hear about once (a cache it cannot write)."""

    def __init__(self) -> None:
        self._what: str | None = None
        self._told = False

    def note(self, exc: BaseException) -> None:
        if self._what is None:
            self._what = f"{type(exc).__name__}: {str(exc)[:300]}"

    def tell(self) -> str | None:
        """The first failure noted, the first time this is asked after it; None otherwise."""
        if self._what is None or self._told:
            return None
        self._told = True
        return self._what


class KernelCache:
    """Entries by kind and the strings they were derived from; ``root=None`` keeps nothing."""

    def __init__(self, root: str | os.PathLike[str] | None) -> None:
        self.root = Path(root) if root is not None else None
        self.hits = self.misses = self.writes = 0
        self.unwritable = Untold()

    @staticmethod
    def name(kind: str, *parts: str) -> str:
        digest = hashlib.sha256(kind.encode())
        for part in parts:
            digest.update(b"\0" + part.encode())
        return f"{kind}-{digest.hexdigest()}"

    def _path(self, kind: str, parts: tuple[str, ...]) -> Path | None:
        return None if self.root is None else self.root / kind / f"{self.name(kind, *parts)}.json"

    def get(self, kind: str, *parts: str) -> dict[str, Any] | None:
        path = self._path(kind, parts)
        try:
            if path is None or path.stat().st_size > MAX_ENTRY_BYTES:
                raise FileNotFoundError
            value = json.loads(path.read_bytes())
            if not isinstance(value, dict):
                raise ValueError("not an object")
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        mark_used(path)
        return value

    def put(self, kind: str, parts: tuple[str, ...], value: dict[str, Any]) -> None:
        """Store an entry; a full or read-only disk only loses the entry."""
        path = self._path(kind, parts)
        if path is None:
            return
        try:
            with atomic_file(path) as tmp, open(tmp, "w") as f:
                json.dump(value, f, separators=(",", ":"))
            self.writes += 1
        except OSError as exc:
            self.unwritable.note(exc)
