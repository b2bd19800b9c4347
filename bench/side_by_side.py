"""Studies that compile held-out networks through the hook with different ``hooks.use`` options and time the
executables side by side (``bench.relocation``, ``bench.postprocessing``): one registry, several runs, a summary of
medians per network and shape."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner import models, tvm_env

from .models import check_agreement, network_input, time_side_by_side
from .stats import medians_by_cell, timings_and_compiles
from .transfer import compile_and_load, quick_registry

Derived = Callable[[dict[str, Any]], dict[str, float]]  # a row's own figures (a ratio between two options, a count)


def study(source_store: Path, runs: int, rounds: int, held_out: list[tuple[str, dict[str, int]]], configs: dict[str, dict[str, Any]],
          derived: Derived, prefix: str) -> dict[str, Any]:  # fmt: skip
    """Each of ``held_out`` (network, shape) compiled once with each of ``configs`` (label: ``hooks.use`` options) and
    timed side by side, ``runs`` times, on a copy of the registry in ``source_store`` (:func:`.transfer.quick_registry`);
    every row carries ``derived(row)``, and the summary their medians per network and shape with the milliseconds and
    compile seconds."""
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"target": tvm_env.host_target(), "rounds": rounds, "configs": configs, "runs": []}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        with quick_registry(source_store, Path(tmp), target, out) as registry:
            for r in range(runs):
                rows = []
                for i, (name, shape) in enumerate(held_out):
                    row = side_by_side(registry, target, name, shape, Path(tmp) / f"run{r}-{name}-{i}", rounds, configs)
                    rows.append(row | derived(row))
                    print({"network": name, "shape": shape, **derived(row), "compile_secs": row["compile_secs"]}, flush=True)
                out["runs"].append(rows)
    out["summary"] = summary(out["runs"], derived)
    return out


def side_by_side(registry: LocalRegistry, target: Any, name: str, shape: dict[str, int], workdir: Path, rounds: int,
                 configs: dict[str, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """``name`` at ``shape`` compiled through the hook once with each of ``configs`` (each compile with an empty kernel
    cache, misses not reported), the executables timed side by side in interleaved rounds and their outputs compared:
    a row (timing, compile seconds, transfers and each compile's kernels)."""
    import tvm

    from schedhub import hooks

    mod, _, input_shape = models.export_with_weights(name, **shape)  # type: ignore[arg-type]
    executables, compile_secs, transfers, kernels = {}, {}, {}, {}
    for label, options in configs.items():
        with hooks.use(registry, target, report_misses=False, cache=workdir / label, **options) as session:
            executables[label], compile_secs[label] = compile_and_load(lambda: tvm.compile(mod, target))
        transfers[label] = session.report.transfers
        kernels[label] = [asdict(k) for k in session.report.kernels]
    timing, errors = time_side_by_side(executables, network_input(input_shape), rounds)
    check_agreement(f"{name} {shape}", errors)
    return {"network": name, "shape": shape, "timing": timing, "max_rel_error": errors, "compile_secs": compile_secs,
            "transfers": transfers, "kernels": kernels}  # fmt: skip


def summary(runs: list[list[dict[str, Any]]], derived: Derived) -> dict[str, Any]:
    """Per network and shape: medians over runs of ``derived``'s figures, the milliseconds and the compiles' seconds."""
    return medians_by_cell((row for rows in runs for row in rows), lambda row: f"{row['network']} {row['shape']}",
                           lambda row: derived(row) | timings_and_compiles(row))  # fmt: skip
