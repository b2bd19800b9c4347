"""The GPU table's registry, carried from one GPU lease to the next in the repository.

A GPU machine is lent for minutes at a time and comes back bare, and the machine that lends it is new each session:
a registry tuned there is lost unless it is committed. ``save`` writes a store's compacted copy (records, measurement
log, queue: ``LocalRegistry.backup``) as one xz file (a store tuned for 9 minutes is megabytes of LMDB pages and tens
of kilobytes once compressed); ``load`` unpacks such a file into a new store folder for ``bench.models --seed-store``,
so the next lease's rounds resume from the last one's records and its cost model starts from their log.

    python -m bench.gpu_store save STORE FILE.mdb.xz     # after a lease: $OUT/gpu-store -> bench/results/gpu/store.mdb.xz
    python -m bench.gpu_store load FILE.mdb.xz FOLDER    # before the next: a seed store
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import sys
import tempfile
from pathlib import Path

from schedhub.registry import LocalRegistry, RegistryError

#: Where the GPU lease's registry is kept between sessions (``bench/gpu_session.sh`` reads and writes it).
KEPT = Path(__file__).resolve().parent / "results" / "gpu" / "store.mdb.xz"
#: The largest store ``load`` unpacks: a file it would inflate past this is refused, not written on.
MAX_STORE_BYTES = 4 << 30
_CHUNK = 1 << 20


def save(store: Path, archive: Path) -> dict[str, int]:
    """``store`` compacted into ``archive`` (xz); its counts and the two sizes in bytes."""
    with tempfile.TemporaryDirectory(prefix="schedhub-gpu-store-") as tmp:
        copy = Path(tmp) / "store"
        with LocalRegistry(store, readonly=True) as reg:
            size, stats = reg.backup(copy), reg.stats()
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(archive.name + ".partial")
        with (copy / "data.mdb").open("rb") as src, lzma.open(partial, "wb", preset=9) as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
        partial.replace(archive)  # a file that is there is whole
    return {"keys": stats["keys"], "trial_logs": stats["trial_logs"], "store_bytes": size, "archive_bytes": archive.stat().st_size}


def load(archive: Path, folder: Path) -> dict[str, int]:
    """``archive`` (:func:`save`'s) unpacked into ``folder`` (new or empty) as a store; its counts. A file that is not
    a whole xz stream, inflates past :data:`MAX_STORE_BYTES` or holds no store this schedhub opens raises
    ``RegistryError``, and ``folder`` is left as it was."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "data.mdb").exists():
        raise RegistryError(f"{folder} already holds a store: load into a new or empty folder (nothing was written)")
    partial = folder / "data.mdb.partial"
    try:
        _inflate(archive, partial)
        partial.replace(folder / "data.mdb")
        with LocalRegistry(folder, readonly=True) as reg:
            stats = reg.stats()
    except (OSError, lzma.LZMAError, EOFError, RegistryError) as exc:
        for name in ("data.mdb", "data.mdb.partial", "lock.mdb"):
            (folder / name).unlink(missing_ok=True)
        raise RegistryError(f"{archive}: not a kept store ({type(exc).__name__}: {exc})") from None
    return {"keys": stats["keys"], "trial_logs": stats["trial_logs"]}


def _inflate(archive: Path, out: Path) -> None:
    written = 0
    with lzma.open(archive, "rb") as src, out.open("wb") as dst:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            if written > MAX_STORE_BYTES:
                raise RegistryError(f"it inflates past {MAX_STORE_BYTES >> 20} MiB")
            dst.write(chunk)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_store", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    saving = sub.add_parser("save", help="a store compacted into one xz file")
    saving.add_argument("store", type=Path)
    saving.add_argument("archive", type=Path, nargs="?", default=KEPT)
    loading = sub.add_parser("load", help="such a file unpacked into a new store folder")
    loading.add_argument("archive", type=Path)
    loading.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "save":
            got = save(args.store, args.archive)
            print(f"saved {got['keys']} keys and {got['trial_logs']} trial logs to {args.archive}: "
                  f"{got['archive_bytes'] / 2**10:,.0f} KiB ({got['store_bytes'] / 2**20:,.1f} MiB of store)")
        else:
            got = load(args.archive, args.folder)
            print(f"loaded {got['keys']} keys and {got['trial_logs']} trial logs into {args.folder}")
    except (RegistryError, OSError) as exc:
        print(f"bench.gpu_store: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
