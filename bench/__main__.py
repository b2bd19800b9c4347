"""Every schedhub benchmark from one entry point, written up in ``bench/RESULTS.md`` with plots.

    python -m bench all [--quick] [--model-trials N]   # registry, hook, tuner, models, transfer; then the report
    python -m bench models|tuner|isolation|hook|registry|transfer [--quick]
    python -m bench report [--quick]         # rewrite RESULTS.md from the recorded results
    python -m bench gpu [--model-trials N]   # on a machine with an NVIDIA GPU: models, tuner and transfer on CUDA → results/gpu/
    python -m bench loadaware [--device cuda] [--jobs 4]   # N tuning jobs sharing a device against one at a time (not in 'all')

Each benchmark runs in its own process (a crash loses only its section; no Ray or TVM state
leaks between timings) and writes ``bench/results/<mode>/<name>.json``. Before ``all`` starts,
the previous results of the same mode move to ``bench/results/<mode>.prev/``; the report
compares the two runs figure by figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import report, stats

SECTIONS = ["registry", "hook", "tuner", "isolation", "models", "transfer"]
STANDALONE = ["loadaware"]  # run on their own (``python -m bench NAME``), not by 'all'; on a GPU too


def run_section(name: str, options: list[str], results: Path) -> dict[str, object]:
    """Run ``python -m bench.<name> OPTIONS`` into ``results``; returns its command, exit code, wall seconds
    and the machine probe timed just before (how fast the shared machine was)."""
    command = " ".join([f"python -m bench.{name}", *options])
    probe = stats.machine_probe()
    print(f"== {command} (machine probe {probe['median']:.1f} ms)", flush=True)
    started = time.time()
    rc = subprocess.run([sys.executable, "-u", "-m", f"bench.{name}", *options, "--out", str(results / f"{name}.json")], cwd=report.REPO).returncode
    wall = time.time() - started
    print(f"== bench.{name}: exit {rc} after {wall:.0f} s", flush=True)
    return {"command": command, "rc": rc, "wall_secs": wall, "probe_ms": probe}


def section_options(name: str, quick: bool, model_trials: int | None, source_store: Path | None = None) -> list[str]:
    return ((["--quick"] if quick else []) + (["--trials", str(model_trials)] if name == "models" and model_trials else [])
            + (["--source-store", str(source_store)] if name == "transfer" and source_store else []))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["all", "report", "gpu", *SECTIONS, *STANDALONE])
    parser.add_argument("--quick", action="store_true", help="small shapes and budgets: about 55 minutes on 2 cores, the transfer bench about half of it")
    parser.add_argument("--model-trials", type=int, help="tuning trials per kernel in the model table (default: the mode's)")
    parser.add_argument("--without", action="append", default=[], choices=SECTIONS, help="leave a section out of 'all' (repeatable)")
    parser.add_argument("--transfer-source-store", type=Path, help="keep the transfer bench's filled registry here and reuse it (skips its tuning)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="loadaware: the device the jobs share")
    parser.add_argument("--jobs", type=int, default=4, help="loadaware: jobs at once in the shared mode")
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    results = report.RESULTS / mode
    if args.what in STANDALONE:
        results = report.RESULTS / ("gpu" if args.device == "cuda" else mode)
        results.mkdir(parents=True, exist_ok=True)
        sys.exit(run_section(args.what, ["--device", args.device, "--jobs", str(args.jobs)], results)["rc"])
    if args.what == "gpu":  # the GPU table (DLight vs schedhub-tuned vs PyTorch), the tuner's throughput and transfers on the GPU
        results = report.RESULTS / "gpu"
        results.mkdir(parents=True, exist_ok=True)
        trials = ["--trials", str(args.model_trials)] if args.model_trials else []
        codes = [run_section(name, ["--device", "cuda", *(trials if name == "models" else [])], results)["rc"] for name in ("models", "tuner")]
        codes.append(run_section("gpu_transfer", trials, results)["rc"])
        sys.exit(1 if any(codes) else 0)
    if args.what == "all":
        if results.exists():
            shutil.rmtree(report.RESULTS / f"{mode}.prev", ignore_errors=True)
            results.rename(report.RESULTS / f"{mode}.prev")
        results.mkdir(parents=True)
        started = time.time()
        command = ("python -m bench all" + (" --quick" if args.quick else "") + (f" --model-trials {args.model_trials}" if args.model_trials else "")
                   + (f" --transfer-source-store {args.transfer_source_store}" if args.transfer_source_store else "")
                   + "".join(f" --without {n}" for n in args.without))  # fmt: skip
        manifest = {"mode": mode, "command": command,
                    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), **report.environment(), "sections": {}}  # fmt: skip
        for name in (n for n in SECTIONS if n not in args.without):
            manifest["sections"][name] = run_section(name, section_options(name, args.quick, args.model_trials, args.transfer_source_store), results)
            manifest["wall_secs"] = time.time() - started
            (results / "manifest.json").write_text(json.dumps(manifest, indent=1))
    elif args.what != "report":
        results.mkdir(parents=True, exist_ok=True)
        run_section(args.what, section_options(args.what, args.quick, args.model_trials, args.transfer_source_store), results)
        return
    if not (results / "manifest.json").exists():  # a page without its run's header and commit would pass for a record
        sys.exit(f"no {mode} run is recorded in {results}: `python -m bench all{' --quick' if args.quick else ''}` records one"
                 + ("" if args.quick else "; `python -m bench report --quick` rewrites RESULTS.md from the quick run"))
    path = report.write(mode)
    print(f"wrote {path}")
    failed = [n for n, s in json.loads((results / "manifest.json").read_text())["sections"].items() if s["rc"] != 0]
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
