"""What moving a transfer's recomputing compute locations buys a static network (``hooks.recompute``).

A record can compute a reduction again for every element of its consumer (the BERT layer's softmax tuned at
sequence 32 computes each row's maximum inside the loop over the row): cheap where it was tuned, a factor of the
row's length further away. Each held-out network is compiled through the hook twice, with the compute locations
moved where the kernel stores over twice what the unscheduled one does (the default) and as recorded
(``relocate=False``), each compile with an empty kernel cache, and the two executables timed side by side in
interleaved rounds (outputs compared).

The registry: ``--source-store DIR`` (filled there as ``bench.transfer --quick`` fills it when empty: the BERT
layer tuned at sequence 32). Not part of ``bench all``.

    python -m bench.relocation --source-store DIR [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner import models, tvm_env

from .models import check_agreement, network_input, time_side_by_side
from .stats import medians_by_cell, store_study_main, timings_and_compiles
from .transfer import compile_and_load, quick_registry

#: held-out (network, shape): the quick fill tuned the BERT layer at batch 1, sequence 32 and the MLP at batch 1
HELD_OUT: list[tuple[str, dict[str, int]]] = [
    ("bert_layer", {"batch": 2, "seq": 64}),  # bench.transfer --quick's held-out shape
    ("bert_layer", {"batch": 1, "seq": 128}),
    ("bert_layer", {"batch": 1, "seq": 256}),
    ("mlp", {"batch": 16}),  # nothing recomputes: the control
]
CONFIGS = {"relocated": {}, "recorded": {"relocate": False}}


def run(source_store: Path, runs: int, rounds: int) -> dict[str, Any]:
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"target": tvm_env.host_target(), "rounds": rounds, "runs": []}
    with tempfile.TemporaryDirectory(prefix="schedhub-relocation-") as tmp:
        with quick_registry(source_store, Path(tmp), target, out) as registry:
            for r in range(runs):
                rows = [_network(registry, target, name, shape, Path(tmp) / f"run{r}-{name}-{i}", rounds) for i, (name, shape) in enumerate(HELD_OUT)]
                for row in rows:
                    print({k: row[k] for k in ("network", "shape", "relocated_over_recorded")}, flush=True)
                out["runs"].append(rows)
    out["summary"] = _summary(out["runs"])
    return out


def _network(registry: LocalRegistry, target: Any, name: str, shape: dict[str, int], workdir: Path, rounds: int) -> dict[str, Any]:
    """``name`` at ``shape`` compiled through the hook in each of :data:`CONFIGS`, timed side by side."""
    import tvm

    from schedhub import hooks

    mod, _, input_shape = models.export_with_weights(name, **shape)  # type: ignore[arg-type]
    executables, compile_secs, transfers = {}, {}, {}
    for label, options in CONFIGS.items():
        with hooks.use(registry, target, report_misses=False, cache=workdir / label, **options) as session:
            executables[label], compile_secs[label] = compile_and_load(lambda: tvm.compile(mod, target))
        transfers[label] = session.report.transfers
    timing, errors = time_side_by_side(executables, network_input(input_shape), rounds)
    check_agreement(f"{name} {shape}", errors)
    ms = {label: t["median"] for label, t in timing.items()}
    return {"network": name, "shape": shape, "timing": timing, "max_rel_error": errors, "compile_secs": compile_secs,
            "transfers": transfers, "relocated_over_recorded": ms["relocated"] / ms["recorded"]}  # fmt: skip


def _summary(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per network and shape: medians over runs of the latency ratio, the milliseconds and the compiles' seconds."""
    return medians_by_cell((row for rows in runs for row in rows), lambda row: f"{row['network']} {row['shape']}",
                           lambda row: {"relocated_over_recorded": row["relocated_over_recorded"]} | timings_and_compiles(row))  # fmt: skip


def main() -> None:
    store_study_main(__doc__, run)


if __name__ == "__main__":
    main()
