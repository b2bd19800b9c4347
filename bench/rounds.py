"""Tuning throughput: where a network's rounds spend their seconds, and this tree against another revision.

    python -m bench.rounds [--network resnet18] [--layout NHWC] [--prepack] [--kernels 3] [--rounds 6] [--runs 2]
                           [--against REV] [--out FILE]

A round is what ``schedhub tune --until`` and ``bench.models`` run: one tuning job of 16 trials (the full table's
search: population 128 × 2 genetic rounds), warm-started from the registry, then the search's best built, checked and
timed again beside the default schedule and published. A run tunes the network's ``--kernels`` heaviest kernels in
turn (the "even" policy: the kernel with the fewest trials next, so every revision tunes the same kernels in the same
order, and after the first pass a kernel's round resumes from its own records) into a fresh registry, in a process
of its own with its own Ray cluster. With ``--against`` each run is made at both revisions, the order alternating.

Per round, from the job's own timeline: wall seconds, and of them the warm start (its traces built and timed), the
search (MetaSchedule's phases: search, build, measure, cost model) and publishing (built and timed beside the
default); "other" is the rest (the driver between rounds, Ray, the job's start and its warm cost model). A round whose
publishing measurement recalled its reference's outputs from an earlier round (``tuner.execution.remembered``) says
``reference_recalled``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import revisions
from .report import REPO, environment
from .stats import ratio, summary

ROUND_TRIALS = 16
STAGES = ("warm start", "search", "publish", "other")
#: The search's own phases (``tuner.workloads.search.PHASES``), each a part of its "search" stage.
PHASES = ("search", "build", "measure", "cost model")
#: The tasks of the warm start and of publishing: each stage is the span of its builds, then of its measurement.
TASK_KINDS = ("build", "measure")


def round_row(number: int, op: str, wall: float, result: Any) -> dict[str, Any]:
    """One round's seconds by stage: warm start and publish are the spans of their build and measurement tasks
    (``result.events``), the search MetaSchedule's own total, "other" what is left of the round's ``wall``."""
    spans: dict[str, float] = {}
    tasks: dict[str, dict[str, float]] = {}
    for stage in ("warm start", "publish"):
        events = [e for e in result.events if e["stage"] == stage]
        tasks[stage] = {kind: _span(e for e in events if e["kind"] == kind) for kind in TASK_KINDS}
        spans[stage] = sum(tasks[stage].values())
    spans["search"] = result.search_secs
    spans["other"] = max(0.0, wall - sum(spans.values()))
    return {"round": number, "op": op, "wall_secs": wall, "trials": result.trials, "warm_measured": result.warm_started,
            "best_secs": min((r.mean_secs for r in result.records), default=None),
            "stages": spans, "phases": {p: result.phases.get(p, 0.0) for p in PHASES}, "publishing": tasks["publish"],
            "reference_recalled": any(e.get("recalled") for e in result.events if e["stage"] == "publish" and e["kind"] == "measure")}  # fmt: skip


def _span(events: Any) -> float:
    """Wall seconds from the first event's start to the last one's end (0 for none): a stage's tasks overlap each other."""
    found = list(events)
    return max(e["end"] for e in found) - min(e["start"] for e in found) if found else 0.0


def run_here(network: str, layout: str, prepack: bool, kernels: int, rounds: int, seed_store: Path | None = None) -> dict[str, Any]:
    """The rounds in this process (a fresh cluster, and a fresh registry or a copy of ``seed_store``): the network's
    heaviest ``kernels`` tuned in turn."""
    from schedhub.hooks.rewrites import Rewrites
    from schedhub.registry import LocalRegistry
    from schedhub.tuner.execution import cluster, tvm_env
    from schedhub.tuner.networks import models
    from schedhub.tuner.networks.allocation import POLICIES, Goal
    from schedhub.tuner.networks.network import heaviest_first, tune_network

    from .models import MODES, build_network

    tvm_env.prepare()
    spec = next(n for n in MODES["full"]["networks"] if n.name == network)
    target = tvm_env.device_target("cpu")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="schedhub-rounds-") as tmp:
        mod = build_network(spec, Path(tmp))[0]
        chosen = heaviest_first(models.kernels(mod, target, Rewrites(layout, "exact", prepack)))[:kernels]
        cluster.start()
        try:
            imported = _imported_in_a_task()
            last = [time.monotonic()]

            def on_round(r: Any) -> None:
                now = time.monotonic()
                rows.append(round_row(r.number, r.kernel.op, now - last[0], r.result))
                last[0] = now
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

            if seed_store is not None:
                shutil.copytree(seed_store, Path(tmp) / "store")
            with LocalRegistry(Path(tmp) / "store", sync=False) as registry:
                tune_network(registry, [(k.identity, k.calls) for k in chosen], MODES["full"]["options"], POLICIES["even"],
                             Goal(max_trials=ROUND_TRIALS * rounds), round_trials=ROUND_TRIALS, pushed_by="bench.rounds", on_round=on_round)  # fmt: skip
        finally:
            cluster.stop()
    return {"label": spec.label(), "kernels": [k.identity.op for k in chosen], "host_cpu": tvm_env.host_target()["mcpu"], "rounds": rows,
            "tasks_import": imported}


def _imported_in_a_task() -> str:
    """Where a task on this cluster imports the tuner from: a revision's run must not time another's tasks."""
    import ray

    return ray.get(ray.remote(num_cpus=1)(_tuner_file).remote())


def _tuner_file() -> str:
    import schedhub.tuner

    return str(Path(schedhub.tuner.__file__).resolve().parent)


def arm_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One revision's runs: trials/s of each run (search trials over the rounds' wall), and each stage's seconds a round
    (medians: of the stages, of the search's phases, and of publishing's builds and measurement)."""
    rows = [row for run in runs for row in run["rounds"]]
    return {"trials_per_sec": summary([sum(r["trials"] for r in run["rounds"]) / sum(r["wall_secs"] for r in run["rounds"]) for run in runs]),
            "round_secs": summary([r["wall_secs"] for r in rows]),
            "stage_secs": {s: statistics.median(r["stages"][s] for r in rows) for s in STAGES},
            "phase_secs": {p: statistics.median(r["phases"][p] for r in rows) for p in PHASES},
            "publishing_secs": {k: statistics.median(r["publishing"][k] for r in rows) for k in TASK_KINDS},
            "reference_recalled": {"rounds": sum(bool(r.get("reference_recalled")) for r in rows), "of": len(rows)}}  # fmt: skip


def _store_size(store: Path) -> dict[str, int]:
    """What a seed store holds: keys with records, and logged trials."""
    from schedhub.registry import LocalRegistry

    with LocalRegistry(store, sync=False) as registry:
        return {"keys": len(registry.summaries()), "logged_trials": sum(len(e.trials) for e in registry.iter_trial_logs())}


def _child(rev: str, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run at ``rev`` (``"worktree"``: this tree) in a process of its own whose schedhub is that revision's."""
    run_dir = scratch / f"{rev}-{time.monotonic_ns()}"
    shim = revisions.revision_source(rev, run_dir, revisions.PACKAGES)
    revisions.check_imports_from(shim, revisions.PACKAGES)
    command = [sys.executable, "-m", "bench.rounds", "--here", "--network", args.network, "--layout", args.layout,
               "--kernels", str(args.kernels), "--rounds", str(args.rounds), *(["--prepack"] if args.prepack else []),
               *(["--seed-store", str(args.seed_store)] if args.seed_store else [])]  # fmt: skip
    env = {**revisions.child_env(shim), "SCHEDHUB_CACHE_DIR": str(run_dir / "cache")}  # each run starts with this machine's cache empty
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench.rounds: the run at {rev} failed:\n{done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(run["tasks_import"]).is_relative_to((shim / "schedhub" / "tuner").resolve()):
        raise SystemExit(f"bench.rounds: the run at {rev} ran its tasks with the tuner of {run['tasks_import']}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet18", choices=["resnet18", "mobilenetv2", "bert_layer", "mlp"], help="at the full table's shape")
    parser.add_argument("--layout", default="NHWC", choices=["given", "NHWC", "NCHW"])
    parser.add_argument("--prepack", action="store_true")
    parser.add_argument("--kernels", type=int, default=3, help="the network's heaviest kernels, tuned in turn")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of 16 trials in each run")
    parser.add_argument("--runs", type=int, default=2, help="runs of each revision")
    parser.add_argument("--against", metavar="REV", help="also run at this git revision, alternating with this tree's runs")
    parser.add_argument("--seed-store", type=Path, help="each run starts from a copy of this registry (its records and log), as a resumed run does")
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # one run in this process (a child's)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.here:
        print(json.dumps(run_here(args.network, args.layout, args.prepack, args.kernels, args.rounds, args.seed_store)))
        return
    command = " ".join(["python -m bench.rounds", *sys.argv[1:]]).replace(f" --out {args.out}", "").replace(f" --seed-store {args.seed_store}", " --seed-store DIR")
    revs = ["worktree", *([args.against] if args.against else [])]
    runs: dict[str, list[dict[str, Any]]] = {rev: [] for rev in revs}
    with tempfile.TemporaryDirectory(prefix="schedhub-rounds-") as scratch:
        for i in range(args.runs):
            for rev in revs if i % 2 == 0 else revs[::-1]:
                runs[rev].append(run := _child(rev, Path(scratch), args))
                print(f"{rev}: {sum(r['trials'] for r in run['rounds'])} trials in {sum(r['wall_secs'] for r in run['rounds']):.0f} s", flush=True)
    arms = {rev: arm_summary(r) for rev, r in runs.items()}
    out: dict[str, Any] = {"command": command, "environment": environment(), "host_cpu": runs["worktree"][0]["host_cpu"], "network": runs["worktree"][0]["label"],
                           "seed_store": _store_size(args.seed_store) if args.seed_store else None,
                           "layout": args.layout, "prepack": args.prepack, "kernels": runs["worktree"][0]["kernels"], "runs": runs, "arms": arms}  # fmt: skip
    if args.against:
        out["this_vs_before"] = ratio(arms["worktree"]["trials_per_sec"], arms[args.against]["trials_per_sec"], paired=True)
    for rev, arm in arms.items():
        print(f"{rev}: {arm['trials_per_sec']['median']:.2f} trials/s; a round {arm['round_secs']['median']:.1f} s: "
              + ", ".join(f"{s} {v:.1f} s" for s, v in arm["stage_secs"].items()))  # fmt: skip
    if "this_vs_before" in out:
        print(f"this tree vs {args.against}: {out['this_vs_before']['median']:.2f}× the trials/s")
    path = args.out or Path(__file__).parent / "results" / "full" / f"rounds-{args.network}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
