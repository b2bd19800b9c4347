"""A network's compile through the hook side by side with another revision's: the first compile on a machine (an empty
kernel cache) and the next one, with the rewrites named.

    python -m bench.compile_cost --store DIR --against REV [--network resnet18] [--layout NHWC] [--prepack] [--rounds 3]

``--network`` is one of the full mode's networks at batch 1 (``resnet18`` and ``mobilenetv2`` at 224 px through
``torch.export``, ``bert_layer`` at seq 128, ``mlp``); DIR a registry holding its records under the rewrites named (a
``bench.models --keep-store``), copied for each process and not changed. Each round starts one fresh process per
revision, in turn (this tree's first, then REV's, then the other way round), that compiles twice into a kernel cache of
its own. Prints each revision's medians and their ratios (``before / this``: above 1, this tree compiles faster);
writes nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .report import REPO
from .revisions import PACKAGES, alternating, checked_shims, child_env
from .stats import summary

_CHILD = """
import json, shutil, sys, tempfile, time
from pathlib import Path
import tvm
from schedhub import hooks
from schedhub.registry import LocalRegistry
from schedhub.tuner import tvm_env
from bench.models import build_network, networks_of
store, network, rewrites = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tvm_env.prepare()
with tempfile.TemporaryDirectory(prefix="schedhub-compile-cost-") as tmp:
    mod, _, _, _ = build_network(networks_of("full", [network], 1)[0], Path(tmp))
    shutil.copytree(store, Path(tmp) / "store")
    target = tvm.target.Target(tvm_env.host_target())
    secs, summaries = [], []
    with LocalRegistry(Path(tmp) / "store") as reg:
        for _ in range(2):
            start = time.perf_counter()
            with hooks.use(reg, target, report_misses=False, cache=Path(tmp) / "cache", **rewrites) as session:
                tvm.compile(mod, target)
            secs.append(time.perf_counter() - start)
            summaries.append(session.report.summary())
print(json.dumps({"first": secs[0], "next": secs[1], "summary": summaries[-1]}))
"""


def compile_secs(shim: Path, store: Path, network: str, rewrites: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(store), network, json.dumps(rewrites)], cwd=REPO, env=child_env(shim),
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def against_revision(rev: str, store: Path, network: str, rewrites: dict[str, Any], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="schedhub-compile-cost-") as scratch:
        shims = checked_shims(("worktree", rev), Path(scratch), PACKAGES)
        runs = alternating(shims, rounds, lambda _, shim: compile_secs(shim, store, network, rewrites))
    this, before = runs["worktree"], runs[rev]
    return {"against": rev, "network": network, "rewrites": rewrites, "rounds": rounds,
            "summaries": {"this": this[-1]["summary"], "before": before[-1]["summary"]},
            **{f"{which}_{phase}_secs": summary([r[phase] for r in each]) for which, each in (("this", this), ("before", before)) for phase in ("first", "next")},
            **{f"{phase}_before_over_this": summary([b[phase] / t[phase] for b, t in zip(before, this)]) for phase in ("first", "next")}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a registry holding the network's records (copied, not changed)")
    parser.add_argument("--against", metavar="REV", required=True, help="the git revision to compare with")
    parser.add_argument("--network", default="resnet18", choices=["resnet18", "mobilenetv2", "bert_layer", "mlp"])
    parser.add_argument("--layout", default="given", choices=["given", "NHWC"])
    parser.add_argument("--prepack", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rewrites = {"layout": args.layout, "prepack": args.prepack}
    print(json.dumps(against_revision(args.against, args.store, args.network, rewrites, args.rounds), indent=1))


if __name__ == "__main__":
    main()
