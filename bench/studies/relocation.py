"""What moving a transfer's recomputing compute locations buys a static network (``hooks.metaschedule.recompute``).

A record can compute a reduction again for every element of its consumer (the BERT layer's softmax tuned at
sequence 32 computes each row's maximum inside the loop over the row): cheap where it was tuned, a factor of the
row's length further away. Each held-out network is compiled through the hook twice, with the compute locations
moved where the kernel stores over twice what the unscheduled one does (the default) and as recorded
(``relocate=False``), each compile with an empty kernel cache, and the two executables timed side by side in
interleaved rounds (outputs compared).

The registry: ``--source-store DIR`` (filled there as ``bench.transfer --quick`` fills it when empty: the BERT
layer tuned at sequence 32). Not part of ``bench all``.

    python -m bench.studies.relocation --source-store DIR [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .side_by_side import study
from ..stats import store_study_main

#: held-out (network, shape): the quick fill tuned the BERT layer at batch 1, sequence 32 and the MLP at batch 1
HELD_OUT: list[tuple[str, dict[str, int]]] = [
    ("bert_layer", {"batch": 2, "seq": 64}),  # bench.transfer --quick's held-out shape
    ("bert_layer", {"batch": 1, "seq": 128}),
    ("bert_layer", {"batch": 1, "seq": 256}),
    ("mlp", {"batch": 16}),  # nothing recomputes: the control
]
CONFIGS = {"relocated": {}, "recorded": {"relocate": False}}


def derived(row: dict[str, Any]) -> dict[str, float]:
    """The relocated network's latency over the recorded one's."""
    return {"relocated_over_recorded": row["timing"]["relocated"]["median"] / row["timing"]["recorded"]["median"]}


def run(source_store: Path, runs: int, rounds: int) -> dict[str, Any]:
    return study(source_store, runs, rounds, HELD_OUT, CONFIGS, derived, "schedhub-relocation-")


def main() -> None:
    store_study_main(__doc__, run)


if __name__ == "__main__":
    main()
