"""Studies that compile held-out networks through the hook with different ``hooks.use`` options and time the
executables side by side (``bench.studies.relocation``, ``bench.studies.postprocessing``): one registry, several runs, a summary of
medians per network and shape."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import cluster, tvm_env
from schedhub.tuner.networks import models
from schedhub.tuner.workloads.search import TuneOptions

from ..models import check_agreement, network_input, time_side_by_side
from ..stats import medians_by_cell, timings_and_compiles
from ..transfer import MODES, compile_and_load, quick_registry, tune_kernels

Derived = Callable[[dict[str, Any]], dict[str, float]]  # a row's own figures (a ratio between two options, a count)


def study(source_store: Path, runs: int, rounds: int, held_out: list[tuple[str, dict[str, int]]], configs: dict[str, dict[str, Any]],
          derived: Derived, prefix: str, tuned: bool = False) -> dict[str, Any]:  # fmt: skip
    """Each of ``held_out`` (network, shape) compiled once with each of ``configs`` (label: ``hooks.use`` options) and
    timed side by side, ``runs`` times, on a copy of the registry in ``source_store`` (:func:`.transfer.quick_registry`);
    every row carries ``derived(row)``, and the summary their medians per network and shape with the milliseconds and
    compile seconds. With ``tuned``, each network's kernels are first tuned at its shape into a registry of its own
    (another copy; the quick mode's budget, warm-started from the registry as a worker starts) and a "tuned" executable
    (every kernel a hit) is timed beside the others: each row also carries every label's time over the tuned one's."""
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"target": tvm_env.host_target(), "rounds": rounds, "configs": configs, "runs": []}
    figures = (lambda row: derived(row) | over_tuned(row)) if tuned else derived
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, contextlib.ExitStack() as stack:
        registry = stack.enter_context(quick_registry(source_store, Path(tmp), target, out))
        own = {i: stack.enter_context(tuned_copy(source_store, Path(tmp) / f"tuned-{i}", name, shape, target, out)) for i, (name, shape) in enumerate(held_out) if tuned}
        cluster.stop()  # nothing of Ray beside the timings
        for r in range(runs):
            rows = []
            for i, (name, shape) in enumerate(held_out):
                row = side_by_side(registry, target, name, shape, Path(tmp) / f"run{r}-{name}-{i}", rounds,
                                   configs | ({"tuned": {}} if tuned else {}), {"tuned": own[i]} if tuned else {})  # fmt: skip
                own_figures = figures(row)
                rows.append(row | own_figures)
                print({"network": name, "shape": shape, **own_figures, "compile_secs": row["compile_secs"]}, flush=True)
            out["runs"].append(rows)
    out["summary"] = summary(out["runs"], figures)
    return out


def over_tuned(row: dict[str, Any]) -> dict[str, float]:
    """Each label's median time over the tuned executable's."""
    return {f"{label}_over_tuned": t["median"] / row["timing"]["tuned"]["median"] for label, t in row["timing"].items() if label != "tuned"}


@contextlib.contextmanager
def tuned_copy(source_store: Path, root: Path, name: str, shape: dict[str, int], target: Any, out: dict[str, Any],
               options: TuneOptions = MODES["quick"]["options"], label: str = "") -> Iterator[LocalRegistry]:  # fmt: skip
    """A copy of ``source_store`` at ``root`` with every kernel of ``name`` at ``shape`` tuned into it with ``options``
    (the quick mode's budget; warm-started from the copy's records, as a worker starts), open. The tuning's seconds go
    to ``out["tuning_secs"]`` and the candidates its jobs measured before any search to ``out["warm_measured"]``, under
    ``label`` and the network."""
    shutil.copytree(source_store, root)
    cluster.start()
    with LocalRegistry(root) as registry:
        started = time.time()
        mod, _, _ = models.export(name, **shape)  # type: ignore[arg-type]
        results = tune_kernels(registry, models.kernels(mod, target, NO_REWRITES), options, retune=True)
        cell = f"{label} {name} {shape}".strip()
        out.setdefault("tuning_secs", {})[cell] = time.time() - started
        out.setdefault("warm_measured", {})[cell] = sum(r.warm_started for r in results.values())
        yield registry


def side_by_side(registry: LocalRegistry, target: Any, name: str, shape: dict[str, int], workdir: Path, rounds: int,
                 configs: dict[str, dict[str, Any]], registries: dict[str, LocalRegistry] | None = None) -> dict[str, Any]:  # fmt: skip
    """``name`` at ``shape`` compiled through the hook once with each of ``configs`` (each compile with an empty kernel
    cache, misses not reported; on ``registries[label]`` where it names one), the executables timed side by side in
    interleaved rounds and their outputs compared: a row (timing, compile seconds, transfers and each compile's kernels)."""
    import tvm

    from schedhub import hooks

    mod, _, input_shape = models.export_with_weights(name, **shape)  # type: ignore[arg-type]
    executables, compile_secs, transfers, kernels = {}, {}, {}, {}
    for label, options in configs.items():
        with hooks.use((registries or {}).get(label, registry), target, report_misses=False, cache=workdir / label, **options) as session:
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
