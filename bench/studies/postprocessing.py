"""What timing each transfer's sketch postprocessed again at the new shape buys a measured compile.

A record's trace ends with its postprocessing: which outer loops are fused into the parallel one, which are
vectorized, how far loops are unrolled, all decided for the record's own loop extents. A transfer replays them at
another shape. With ``use(..., measure=SECONDS)`` the hook also times each transfer's sketch with the target's
postprocessors applied again on the kernel (``hooks.metaschedule.msdb.repostprocessed``), served where it runs faster
(``repostprocess=True``, the default). Each held-out network is compiled with every candidate measured, with the
re-postprocessed candidates and without them (``repostprocess=False``), each compile with an empty kernel cache,
and the two executables are timed side by side in interleaved rounds (outputs compared).

The registry: ``--source-store DIR`` (filled there as ``bench.transfer --quick`` fills it when empty: the convnets
tuned at batch 1, 64 px). Not part of ``bench all``.

With ``--tuned`` each network is also tuned at its shape and compiled with no measuring (ranked), so every compile's
time is also a ratio to the tuned network's: how far from tuned each compile lands.

    python -m bench.studies.postprocessing --source-store DIR [--tuned] [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schedhub.hooks.metaschedule.ranking import REPOSTPROCESSED

from .side_by_side import study
from ..stats import store_study_main

#: held-out (network, shape): bench.transfer --quick's convnets (its fill tuned them at batch 1, 64 px)
HELD_OUT: list[tuple[str, dict[str, int]]] = [
    ("resnet18", {"batch": 2, "image": 96}),
    ("mobilenetv2", {"batch": 2, "image": 96}),
]
MEASURE_SECS = 600.0  # every candidate of these networks measured (a compile takes 30-50 s on 2 cores)
CONFIGS = {"repostprocessed": {"measure": MEASURE_SECS}, "recorded": {"measure": MEASURE_SECS, "repostprocess": False}}


def derived(row: dict[str, Any]) -> dict[str, float]:
    """The network's latency with candidates postprocessed here over its latency without, and how many of its kernels
    were served one."""
    served = sum(k["detail"].startswith(f"{REPOSTPROCESSED}:") for k in row["kernels"]["repostprocessed"])
    return {"repostprocessed_over_recorded": row["timing"]["repostprocessed"]["median"] / row["timing"]["recorded"]["median"],
            "served_postprocessed_here": served}  # fmt: skip


def run(source_store: Path, runs: int, rounds: int, tuned: bool = False) -> dict[str, Any]:
    return study(source_store, runs, rounds, HELD_OUT, CONFIGS | ({"ranked": {}} if tuned else {}), derived, "schedhub-postprocessing-", tuned)


def main() -> None:
    store_study_main(__doc__, run, {"tuned": "also tune each network at its shape (the quick budget, warm-started) and time it beside, with "
                                              "the ranked compile (no measuring): every figure over the tuned network's too (~5 min a network)"})


if __name__ == "__main__":
    main()
