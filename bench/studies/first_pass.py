"""What timing each transfer's twin postprocessed here buys a worker's first pass.

A worker's first pass (``TuneOptions.first_pass``) measures a missed kernel's transfers and the log model's
synthesized schedules and publishes the fastest. A transfer replays its record's postprocessing, decided for the
record's own loop extents; with ``TuneOptions.repostprocess`` (the default) each transfer's sketch is also measured
with the target's postprocessors applied again on the kernel (``hooks.metaschedule.msdb.postprocessed_here``), as a compile that
measures does. Each held-out network (``bench.studies.postprocessing``'s) gets its first passes with the twins and without,
each into a copy of the registry of its own, and compiles from each copy (every kernel a hit); the two executables are
timed side by side in interleaved rounds (outputs compared).

The registry: ``--source-store DIR`` (filled there as ``bench.transfer --quick`` fills it when empty: the convnets
tuned at batch 1, 64 px). The synthesized seeds are drawn again in each first pass, so they differ between the two
copies as between two workers. Not part of ``bench all``.

    python -m bench.studies.first_pass --source-store DIR [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from schedhub.tuner.execution import cluster, tvm_env

from .postprocessing import HELD_OUT
from .side_by_side import side_by_side, summary, tuned_copy
from ..stats import store_study_main
from ..transfer import MODES, quick_registry

CONFIGS = {"twins": True, "plain": False}  # label: TuneOptions.repostprocess of the first passes


def run(source_store: Path, runs: int, rounds: int) -> dict[str, Any]:
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    first_pass = MODES["quick"]["options"].first_pass()
    out: dict[str, Any] = {"target": tvm_env.host_target(), "rounds": rounds, "options": dataclasses.asdict(first_pass), "runs": []}
    with tempfile.TemporaryDirectory(prefix="schedhub-first-pass-") as tmp, quick_registry(source_store, Path(tmp), target, out) as registry:
        filled = Path(tmp) / "store"
        for r in range(runs):
            rows = []
            for name, shape in HELD_OUT:
                with contextlib.ExitStack() as stack:
                    copies = {label: stack.enter_context(tuned_copy(filled, Path(tmp) / f"run{r}-{name}-{label}", name, shape, target, out,
                                                                    dataclasses.replace(first_pass, repostprocess=twins), f"run{r} {label}"))
                              for label, twins in CONFIGS.items()}  # fmt: skip
                    cluster.stop()  # nothing of Ray beside the timings
                    row = side_by_side(registry, target, name, shape, Path(tmp) / f"run{r}-{name}", rounds, {label: {} for label in CONFIGS}, copies)
                row |= {"first_pass_secs": {label: out["tuning_secs"][f"run{r} {label} {name} {shape}"] for label in CONFIGS},
                        "warm_measured": {label: out["warm_measured"][f"run{r} {label} {name} {shape}"] for label in CONFIGS}}  # fmt: skip
                figures = derived(row)
                rows.append(row | figures)
                print({"network": name, "shape": shape, **figures}, flush=True)
            out["runs"].append(rows)
    out["summary"] = summary(out["runs"], derived)
    return out


def derived(row: dict[str, Any]) -> dict[str, float]:
    """The network's latency after first passes with twins over without, and what each first pass cost and measured."""
    timing = row["timing"]
    return {"twins_over_plain": timing["twins"]["median"] / timing["plain"]["median"],
            **{f"first_pass_s {label}": secs for label, secs in row["first_pass_secs"].items()},
            **{f"measured {label}": float(n) for label, n in row["warm_measured"].items()}}  # fmt: skip


def main() -> None:
    store_study_main(__doc__, run)


if __name__ == "__main__":
    main()
