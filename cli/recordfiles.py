"""Files of records: a msgpack stream (``.msgpack``) or JSON lines (``.jsonl``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgpack

from schedhub.registry import InvalidRecord, Record, unpackb
from schedhub.registry._records import MAX_RECORD_BYTES

MSGPACK_SUFFIXES = (".msgpack", ".mpk")
JSONL_SUFFIXES = (".jsonl", ".ndjson")


def is_records_file(path: Path) -> bool:
    return path.suffix in MSGPACK_SUFFIXES + JSONL_SUFFIXES


def read_records(path: Path) -> Iterator[Record]:
    """Validated records of a file; a malformed one stops with its position."""
    if path.suffix in JSONL_SUFFIXES:
        with path.open() as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield Record.from_obj(json.loads(line))
                    except (ValueError, InvalidRecord) as exc:
                        raise InvalidRecord(f"{path}:{n}: {exc}") from None
        return
    with path.open("rb") as f:
        unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=True, max_buffer_size=MAX_RECORD_BYTES * 2, use_list=True)
        n = 0
        try:
            for obj in unpacker:
                n += 1
                yield Record.from_obj(obj)
        except (ValueError, msgpack.UnpackException, InvalidRecord) as exc:
            raise InvalidRecord(f"{path}: record {n}: {exc}") from None


def write_records(path: Path, raws: Iterable[bytes]) -> int:
    """Write canonical record bytes as they are (msgpack) or as JSON lines."""
    count = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    as_jsonl = path.suffix in JSONL_SUFFIXES
    with path.open("w" if as_jsonl else "wb") as f:
        for raw in raws:
            f.write(json.dumps(unpackb(raw), separators=(",", ":")) + "\n" if as_jsonl else raw)  # type: ignore[arg-type]
            count += 1
    return count
