"""Models exported with a dynamic dimension: what the hook serves a kernel whose size is symbolic.

MetaSchedule tunes static shapes only, so a model exported with a symbolic batch or sequence length
(``nn.spec.Tensor(("n", 256))``) has no exact record anywhere. Its kernels find the same ops at static shapes
as neighbours (``registry._keys.skeleton``), and the hook serves the nearest in the static dimensions, its
symbolic loops padded to the recorded tiles, chosen at run time by the size, or as TVM replays them (one untiled
loop) for sizes under half a tile (``hooks.metaschedule.padding``; ``--no-padding``: TVM's replay alone), and a reduction the
record computes again for every element of its consumer (the softmax's row maximum) computed once where that stores
less (``hooks.metaschedule.recompute``; ``--no-relocation``: the recorded compute locations). Ranked, never measured: a symbolic
kernel has no inputs to time it on.
This compares, at several sizes the model is then run at:

- ``default``: the dynamic model compiled plainly (TVM's default schedules);
- ``dynamic``: the dynamic model compiled once through the hook;
- ``static``: the model exported at that size, compiled through the hook (transfers too: the reference a
  static export would get from the same registry).

The registry: ``--source-store DIR`` (filled there as ``bench.transfer --quick`` fills it when empty). Each
compile has an empty kernel cache; the executables are timed side by side in interleaved rounds. Not part
of ``bench all``.

    python -m bench.studies.dynamic --source-store DIR [--no-padding] [--no-relocation] [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from schedhub.registry import LocalRegistry
from schedhub.tuner.networks import models
from schedhub.tuner.execution import tvm_env

from ..models import check_agreement, network_input, time_side_by_side
from ..stats import medians_by_cell, store_study_main, timings_and_compiles
from ..transfer import compile_and_load, quick_registry

#: (network, its symbolic dimension, the sizes it is run at)
CASES = [("mlp", "batch", [1, 7, 16, 64]), ("bert_layer", "seq", [8, 17, 64, 100])]


def run(source_store: Path, runs: int, rounds: int, no_padding: bool = False, no_relocation: bool = False) -> dict[str, Any]:
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"target": tvm_env.host_target(), "rounds": rounds, "padding": not no_padding, "relocation": not no_relocation, "runs": []}
    repairs = {"pad": not no_padding, "relocate": not no_relocation}
    with tempfile.TemporaryDirectory(prefix="schedhub-dynamic-") as tmp:
        with quick_registry(source_store, Path(tmp), target, out) as registry:
            out["records"] = len(registry.summaries())
            for r in range(runs):
                rows = [row for name, dim, sizes in CASES for row in _network(registry, target, name, dim, sizes, Path(tmp) / f"run{r}-{name}", rounds, repairs)]
                for row in rows:
                    print({k: row[k] for k in ("network", "size", "dynamic_over_static", "default_over_dynamic")}, flush=True)
                out["runs"].append(rows)
    out["summary"] = _summary(out["runs"])
    return out


def _network(registry: LocalRegistry, target: Any, name: str, dim: str, sizes: list[int], workdir: Path, rounds: int,
             repairs: dict[str, bool]) -> list[dict[str, Any]]:  # fmt: skip
    """``name`` exported with ``dim`` symbolic, compiled plainly and through the hook, and at each size statically
    through the hook (``repairs``: the hook's ``pad`` and ``relocate``); one row per size, each timed side by side."""
    import tvm

    from schedhub import hooks

    dynamic_mod, _, _ = models.export_with_weights(name, **{dim: "n"})  # type: ignore[arg-type]
    default, default_secs = compile_and_load(lambda: tvm.compile(dynamic_mod, target))
    with hooks.use(registry, target, report_misses=False, cache=workdir / "dynamic", **repairs) as session:
        dynamic, dynamic_secs = compile_and_load(lambda: tvm.compile(dynamic_mod, target))
    report = session.report
    rows = []
    for size in sizes:
        static_mod, _, input_shape = models.export_with_weights(name, **{dim: size})
        with hooks.use(registry, target, report_misses=False, cache=workdir / f"static-{size}", **repairs) as static_session:
            static, static_secs = compile_and_load(lambda: tvm.compile(static_mod, target))
        timing, errors = time_side_by_side({"static": static, "dynamic": dynamic, "default": default}, network_input(input_shape), rounds)
        check_agreement(f"{name} {dim}={size}", errors)
        ms = {label: t["median"] for label, t in timing.items()}
        rows.append({
            "network": name, "size": {dim: size}, "timing": timing, "max_rel_error": errors,
            "compile_secs": {"default": default_secs, "dynamic": dynamic_secs, "static": static_secs},
            "dynamic_report": {"transfers": report.transfers, "hits": report.hits, "misses": report.misses},
            "static_report": {"transfers": static_session.report.transfers, "hits": static_session.report.hits, "misses": static_session.report.misses},
            "dynamic_over_static": ms["dynamic"] / ms["static"], "default_over_dynamic": ms["default"] / ms["dynamic"],
        })  # fmt: skip
    return rows


def _summary(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per network and size: medians over runs of the latency ratios, of the milliseconds, and of the compiles' seconds."""

    def values(row: dict[str, Any]) -> dict[str, float]:
        outcomes = {f"dynamic {outcome}": row["dynamic_report"][outcome] for outcome in ("transfers", "misses")}
        return {k: row[k] for k in ("dynamic_over_static", "default_over_dynamic")} | timings_and_compiles(row) | outcomes

    return medians_by_cell((row for rows in runs for row in rows), lambda row: "{} {}={}".format(row["network"], *next(iter(row["size"].items()))), values)


def main() -> None:
    store_study_main(__doc__, run, {"no-padding": "TVM's re-derivation of every recorded tiling that does not fit (hooks.use(pad=False))",
                                    "no-relocation": "transfers served with their recorded compute locations (hooks.use(relocate=False))"})


if __name__ == "__main__":
    main()
