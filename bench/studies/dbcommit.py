"""What a commit to RegistryDatabase costs MetaSchedule's search, beside MetaSchedule's own JSONDatabase.

    python -m bench.studies.dbcommit [--commits 5000]

Commits ``--commits`` distinct traces of one workload (as a search does) to a RegistryDatabase over a local store
(sync off unless ``--sync``, the default of a local store: the registry's own write is timed apart and taken out) and to a JSONDatabase; per commit: the median of
the first 100 and of the last 100, in ms. "overhead" is the database's own work: the commit less the registry's put.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from schedhub.hooks import HookSession, RegistryDatabase
from schedhub.registry import LocalRegistry

from ..report import REPO, environment

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})


def workload() -> tvm.IRModule:
    a, b = te.placeholder((64, 256), name="A"), te.placeholder((256, 256), name="B")
    k = te.reduce_axis((0, 256), name="k")
    c = te.compute((64, 256), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def records(mod: tvm.IRModule, count: int) -> list[ms.database.TuningRecord]:
    """``count`` distinct traces (splits of the two spatial loops) of ``mod``, each with its own time."""
    out, args = [], ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    factors = [(i, j) for i in (1, 2, 4, 8, 16, 32, 64) for j in range(1, 257) if 256 % j == 0 or j < 200]
    for n, (i, j) in enumerate(factors[:count]):
        sch = tvm.s_tir.Schedule(mod)
        li, lj, _ = sch.get_loops(sch.get_sblock("matmul"))
        sch.split(li, [None, i])
        sch.split(lj, [None, j])
        out.append(ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), [1e-3 + n * 1e-7], TARGET, args))
    return out


class TimedPuts:
    """The registry's put, timed, so the database's own share can be taken apart."""

    def __init__(self, registry: LocalRegistry) -> None:
        self.registry, self.secs = registry, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, name)

    def put(self, record: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.registry.put(record)
        finally:
            self.secs += time.perf_counter() - start


def per_commit(db: Any, recs: list[ms.database.TuningRecord], puts: TimedPuts | None = None) -> list[dict[str, float]]:
    samples = []
    for rec in recs:
        before = puts.secs if puts else 0.0
        start = time.perf_counter()
        db.commit_tuning_record(rec)
        total = time.perf_counter() - start
        samples.append({"commit_ms": total * 1e3, "overhead_ms": (total - ((puts.secs - before) if puts else 0.0)) * 1e3})
    return samples


def medians(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {part: {f: statistics.median(s[f] for s in part_samples) for f in part_samples[0]}
            for part, part_samples in (("first_100", samples[:100]), ("last_100", samples[-100:]))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.dbcommit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--sync", action="store_true", help="a local store as LocalRegistry opens it by default: each commit durable (one fsync)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dbcommit.json")
    args = parser.parse_args()
    mod = workload()
    recs = records(mod, args.commits)
    with tempfile.TemporaryDirectory() as tmp:
        with LocalRegistry(Path(tmp) / "store", sync=args.sync) as reg:
            puts = TimedPuts(reg)
            db = RegistryDatabase(HookSession(puts, report_misses=False))  # type: ignore[arg-type]
            with TARGET:
                ours = per_commit(db, recs, puts)
        (Path(tmp) / "json").mkdir()
        json_db = ms.database.JSONDatabase(work_dir=str(Path(tmp) / "json"))
        own = json_db.commit_workload(mod)  # a JSONDatabase takes records of workloads committed to it
        theirs = per_commit(json_db, [ms.database.TuningRecord(r.trace, own, r.run_secs, r.target, r.args_info) for r in recs])
    result = {"command": f"python -m bench.studies.dbcommit --commits {len(recs)}" + (" --sync" if args.sync else ""), "commits": len(recs), "sync": args.sync,
              "registry_database": medians(ours), "json_database": medians(theirs), "environment": environment()}  # fmt: skip
    print(json.dumps({k: result[k] for k in ("commits", "registry_database", "json_database")}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
