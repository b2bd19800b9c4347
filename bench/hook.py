"""Compile-hook benchmark: what looking schedules up in the registry costs a Relax build.

    python -m bench.hook [--reps 7]

A 6-layer MLP (12 fused kernels) is compiled once inside ``use()`` against an empty registry
server (all misses queued), its kernels are tuned by the stand-in tuner process
(``tests.hand_tuner``: real builds and timings of a few candidates), then, side by side:

- plain ``tvm.compile`` (no database: TVM's default schedules)
- the same records in a MetaSchedule MemoryDatabase (``with target, db`` + zero + default pipelines)
- ``use(URL)`` cold: a new block per compile (one batch lookup each)
- ``use(URL)`` warm: repeated compiles in one block (read-through cache, no request)
- ``use(DIR)``: the embedded default, the same records in a local LMDB store

Each figure is a median over ``--reps`` compiles (after one warm-up) with min–max.

    python -m bench.hook --against REV [--rounds 5]

compares the compile of the embedded default (``use(DIR)``, all hits) side by side with revision ``REV``'s schedhub
(``git archive``, :mod:`.revisions`): each round runs a process of each revision in turn, alternating which goes
first, that compiles ``--reps`` times on the same records; the figure is each revision's per-round medians and their
paired ratio. A change that makes the compile slower shows here before it lands.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.s_tir import meta_schedule as ms

from schedhub.hooks import use
from schedhub.hooks.metaschedule.msdb import tuning_record
from schedhub.registry import LocalRegistry, RegistryClient, ServerThread

from . import revisions
from .stats import ratio, summary_ms

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})


class DeepMLP(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (256, 512, 512, 256, 128, 64, 10)) -> None:
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(widths, widths[1:])])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = nn.relu(x)
        return x


def interleaved(configs: dict[str, Callable[[], Any]], reps: int) -> dict[str, dict[str, float]]:
    """Time each configuration once per round, rounds in turn, so drift hits all alike."""
    for fn in configs.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(reps):
        for name, fn in configs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: summary_ms(t) for name, t in times.items()}


#: A child process's compiles: the DeepMLP in a fresh ``use(STORE)`` block each time (cache CACHE), after one warm-up.
_COMPILES = """
import json, sys, time
import tvm
from tvm.relax.frontend import nn
from schedhub.hooks import use
from bench.hook import TARGET, DeepMLP
store, cache, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
mod, _ = DeepMLP().export_tvm({"forward": {"x": nn.spec.Tensor((8, 256), "float32")}})
times = []
for _ in range(reps + 1):
    start = time.perf_counter()
    with use(store, TARGET, cache=cache) as session:
        tvm.compile(mod, TARGET)
    times.append(time.perf_counter() - start)
    assert not session.report.misses, session.report.summary()
print(json.dumps(times[1:]))
"""


def against_revision(rev: str, store: Path, scratch: Path, rounds: int, reps: int) -> dict[str, Any]:
    """The all-hit compile from ``store`` at ``rev`` and in the working tree, side by side (:data:`_COMPILES`)."""
    def median_secs(name: str, shim: Path) -> float:
        out = subprocess.run([sys.executable, "-c", _COMPILES, str(store), str(scratch / name / "cache"), str(reps)], cwd=REPO,
                             env=revisions.child_env(shim), check=True, capture_output=True, text=True).stdout  # fmt: skip
        return statistics.median(json.loads(out.strip().splitlines()[-1]))

    medians = revisions.alternating(revisions.checked_shims((rev, "worktree"), scratch, revisions.PACKAGES), rounds, median_secs)
    return {"against": rev, "rounds": rounds, "reps": reps, **{f"{'this' if n == 'worktree' else 'before'}_ms": summary_ms(t) for n, t in medians.items()},
            "this_vs_before": ratio(summary_ms(medians[rev]), summary_ms(medians["worktree"]), paired=True)}  # fmt: skip  (> 1: this tree compiles faster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 rounds instead of 7")
    parser.add_argument("--reps", type=int)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--against", metavar="REV", help="compare the all-hit compile with this git revision's (prints, writes nothing)")
    parser.add_argument("--rounds", type=int, default=5, help="with --against: processes of each revision, alternating")
    args = parser.parse_args()
    args.reps = args.reps or (5 if args.quick else 7)
    args.out = args.out or Path(__file__).parent / "results" / ("quick" if args.quick else "full") / "hook.json"
    mod, _ = DeepMLP().export_tvm({"forward": {"x": nn.spec.Tensor((8, 256), "float32")}})
    work = Path(tempfile.mkdtemp(prefix="schedhub-hook-"))
    results: dict[str, Any] = {"command": "python -m bench.hook" + (" --quick" if args.quick else ""), "reps": args.reps}
    with ServerThread(work / "served", tokens={TOKEN: "bench"}, sync=False) as srv, RegistryClient(srv.url, token=TOKEN) as client:
        with use(client, TARGET) as first:
            tvm.compile(mod, TARGET)
        results["kernels"] = len(first.report.kernels)
        tuner = subprocess.run([sys.executable, "-m", "tests.hand_tuner", srv.url, TOKEN], cwd=REPO, capture_output=True, text=True)
        assert tuner.returncode == 0, tuner.stderr
        records = [client.get(s.key)[0] for s in client.summaries()]
        with LocalRegistry(work / "local") as local:
            local.put_many(records)
        if args.against:
            print(json.dumps(against_revision(args.against, work / "local", work / "revisions", args.rounds, args.reps), indent=1))
            return
        memory = ms.database.MemoryDatabase()
        for rec in records:
            workload = memory.commit_workload(tuning_record(rec).workload.mod)
            memory.commit_tuning_record(tuning_record(rec, workload.mod))
        zero_then_default = tvm.transform.Sequential([relax.get_pipeline("zero"), relax.get_pipeline("default")])

        def with_memory_db() -> None:
            with TARGET, memory:
                tvm.compile(mod, TARGET, relax_pipeline=zero_then_default)

        def hook_cold() -> None:
            with use(srv.url, TARGET) as session:
                tvm.compile(mod, TARGET)
            assert session.report.hits == results["kernels"], session.report.summary()

        def hook_local() -> None:
            with use(work / "local", TARGET) as session:
                tvm.compile(mod, TARGET)
            assert session.report.hits == results["kernels"], session.report.summary()

        with use(client, TARGET) as warm:
            tvm.compile(mod, TARGET)  # fills the session's cache

        def hook_warm() -> None:
            with use(warm, TARGET):
                tvm.compile(mod, TARGET)

        results.update(interleaved({
            "plain_tvm_ms": lambda: tvm.compile(mod, TARGET),
            "memory_database_ms": with_memory_db,
            "hook_http_cold_ms": hook_cold,
            "hook_http_warm_ms": hook_warm,
            "hook_local_lmdb_ms": hook_local,
        }, args.reps))  # fmt: skip
        assert all(r.hits == results["kernels"] and r.lookups == 0 for r in warm.reports[1:]), warm.reports[-1].summary()
        with use(srv.url, TARGET) as probe:
            tvm.compile(mod, TARGET)
        results["lookup_round_trip_ms"] = probe.report.lookup_secs * 1e3
        results["lookup_per_kernel_ms"] = probe.report.lookup_secs * 1e3 / results["kernels"]
    for name in ("hook_http_cold_ms", "hook_http_warm_ms", "hook_local_lmdb_ms", "plain_tvm_ms"):
        results[name]["vs_memory_database"] = ratio(results[name], results["memory_database_ms"], paired=True)
    print(json.dumps(results, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
