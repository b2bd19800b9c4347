"""A registry's read path side by side with another revision's: every key of a store looked up in one batch (what a
compile's prefetch asks a local registry), records parsed and checked as a reader does.

    python -m bench.lookup --store DIR --against REV [--rounds 5] [--reps 5]

Each round starts one fresh process per revision, in turn (this tree's, then REV's, then the other way round), that
opens the store read-only and times ``lookup`` of all its keys ``--reps`` times; a process's figures are its first
lookup (what a compile in a fresh process sees) and its median. Prints the medians of each revision and their ratios
(``before / this``: above 1, this tree reads faster); writes nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .revisions import alternating, checked_shims, child_env
from .stats import summary

_CHILD = """
import json, statistics, sys, time
from schedhub.registry import LocalRegistry
with LocalRegistry(sys.argv[1], readonly=True) as reg:
    with reg.store.read() as txn:
        keys = [k.decode() for k, _ in txn.cursor(db=reg.store.dbs["records"])]
    times, found = [], 0
    for _ in range(int(sys.argv[2])):
        start = time.perf_counter()
        found = sum(len(records) for records in reg.lookup(keys).values())
        times.append(time.perf_counter() - start)
print(json.dumps({"ms": statistics.median(times) * 1e3, "first_ms": times[0] * 1e3, "keys": len(keys), "records": found}))
"""


def lookup_ms(shim: Path, store: Path, reps: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(store), str(reps)], env=child_env(shim), check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def against_revision(rev: str, store: Path, rounds: int, reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="schedhub-lookup-") as scratch:
        runs = alternating(checked_shims(("worktree", rev), Path(scratch)), rounds, lambda _, shim: lookup_ms(shim, store, reps))
    answered = {(r["keys"], r["records"]) for each in runs.values() for r in each}
    out: dict[str, Any] = {"against": rev, "store": str(store), "rounds": rounds, "reps": reps, "keys_records": sorted(answered)}
    for figure, name in (("ms", ""), ("first_ms", "first_")):
        this, before = ([r[figure] for r in runs[which]] for which in ("worktree", rev))
        out |= {f"this_{name}ms": summary(this), f"before_{name}ms": summary(before), f"{name}before_over_this": summary([b / t for b, t in zip(before, this)])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lookup", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a registry folder (opened read-only)")
    parser.add_argument("--against", metavar="REV", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(against_revision(args.against, args.store, args.rounds, args.reps), indent=1))


if __name__ == "__main__":
    main()
