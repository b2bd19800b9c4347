"""A pushing client process for the durability tests: logs each acknowledged record to a file.

Usage: python -m tests.pusher URL WORKER COUNT KEYS OUT
"""

from __future__ import annotations

import random
import sys

from schedhub.registry import RegistryClient, RegistryError

from .conftest import TOKEN, make_record


def main(url: str, worker: int, count: int, keys: int, out: str) -> None:
    rng = random.Random(worker)
    with RegistryClient(url, token=TOKEN, retries=0, timeout=5) as client, open(out, "w") as log:
        for i in range(count):
            rec = make_record(i % keys, rng.uniform(1e-5, 1e-2), variant=worker * 100_000 + i)
            try:
                client.put(rec)
            except RegistryError as exc:
                print(f"worker {worker} stopped after {i} records: {exc}", file=sys.stderr)
                return
            log.write(f"{rec.key} {rec.trace_id} {rec.mean_secs!r}\n")
            log.flush()


if __name__ == "__main__":
    url, worker, count, keys, out = sys.argv[1:]
    main(url, int(worker), int(count), int(keys), out)
