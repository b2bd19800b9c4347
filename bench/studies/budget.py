"""What a small measurement budget buys a compile, by the order it is spent in.

``use(..., measure=SECONDS)`` builds, checks and times each missed kernel's transfer candidates until the
compile's budget runs out. A compile that measures serves its misses costliest first
(``HookSession.measure_priority``: call sites × the kernel's work at its nearest candidate's home speed);
before, it served them in the module's order, so a budget that ran out had been spent on whichever
kernels came first. This compares both orders in one run (the module's order is what the pass did before:
every priority equal, a stable sort):

1. each held-out convolution network of the quick transfer bench is compiled through the hook on a registry
   filled as ``bench.transfer --quick`` fills it (``--source-store``): ranked (no measuring), with each
   budget of ``--budgets`` in both orders, and with every candidate measured (600 s), each compile with an
   empty kernel cache (nothing measured before);
2. every executable is timed side by side in interleaved rounds.

``--synthesize N`` measures synthesized candidates too (``use(..., synthesize=N)``), with the cost model
trained beforehand (a compile of another network), so the budgets pay for drawing, building and timing.

Per network and run: latency by configuration, the share of the gain of measuring everything that each
budget got, compile seconds and kernels measured. ``--runs`` repeats the whole (fresh caches).
Not part of ``bench all``.

    python -m bench.studies.budget --source-store DIR [--budgets 5,10] [--synthesize 64] [--runs 3] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


from schedhub.registry import LocalRegistry
from schedhub.tuner.networks import models
from schedhub.tuner.execution import tvm_env

from ..models import check_agreement, network_input, time_side_by_side
from ..stats import study_arguments, write_study
from ..transfer import MODEL_WARM_UP, QUICK_CONVNETS, compile_and_load

ALL = 600.0  # seconds: every candidate of every kernel measured
ORDERS = ("costliest", "module")


@contextlib.contextmanager
def module_order() -> Iterator[None]:
    """The pass as it was: every kernel's priority equal, so the stable sort keeps the module's order."""
    from schedhub.hooks.serving.session import HookSession

    real = HookSession.measure_priority
    HookSession.measure_priority = lambda self, identity: 0.0  # type: ignore[method-assign]
    try:
        yield
    finally:
        HookSession.measure_priority = real  # type: ignore[method-assign]


def run(source_store: Path, budgets: list[float], runs: int, rounds: int, synthesize: int = 0) -> dict[str, Any]:
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    out: dict[str, Any] = {"target": tvm_env.host_target(), "budgets": budgets, "all_secs": ALL, "synthesize": synthesize, "rounds": rounds, "runs": []}
    configs = {"ranked": (0.0, "costliest"), **{f"{order} {b:g} s": (b, order) for b in budgets for order in ORDERS}, "all measured": (ALL, "costliest")}
    with tempfile.TemporaryDirectory(prefix="schedhub-budget-") as tmp:
        shutil.copytree(source_store, Path(tmp) / "store")  # a refused record is complained about: a write
        with LocalRegistry(Path(tmp) / "store") as registry:
            trained = _train_model(registry, target, Path(tmp) / "model") if synthesize else None
            for r in range(runs):
                rows = []
                for name, shape in QUICK_CONVNETS:
                    caches = {label: Path(tmp) / f"cache-{r}-{name}-{label.replace(' ', '-')}" for label in configs}
                    rows.append(_network(registry, target, name, shape, configs, caches, trained, synthesize, rounds))
                    print(json.dumps({"run": r, "network": name, **{k: rows[-1][k] for k in ("gain_share", "compile_secs", "kernels_measured")}}), flush=True)
                out["runs"].append(rows)
    out["summary"] = _summary(out["runs"])
    return out


def _train_model(registry: LocalRegistry, target: Any, cache: Path) -> Path:
    """A kernel cache holding the cost model synthesis uses (trained on the registry's log by a compile of
    another network), so that no configuration's budget pays for training: every compile's cache starts as it."""
    import tvm

    from schedhub import hooks

    mod = models.export(MODEL_WARM_UP[0], **MODEL_WARM_UP[1])[0]
    with hooks.use(registry, target, report_misses=False, cache=cache, measure=ALL, synthesize=1) as session:
        tvm.compile(mod, target)
    if not session.log_model.trained_on or session.log_model.partial:
        raise RuntimeError("no cost model trained in full: the registry's log is too small, or training ran out of time")
    return cache


def _network(registry: LocalRegistry, target: Any, name: str, shape: dict[str, int], configs: dict[str, tuple[float, str]],
             caches: dict[str, Path], trained: Path | None, synthesize: int, rounds: int) -> dict[str, Any]:  # fmt: skip
    """One network compiled in every configuration (each with its own kernel cache, the trained model's when
    synthesizing), its executables timed side by side."""
    import tvm

    from schedhub import hooks

    mod, _, input_shape = models.export_with_weights(name, **shape)
    executables, compile_secs, measured = {}, {}, {}
    for label, (budget, order) in configs.items():
        if trained is not None:
            shutil.copytree(trained, caches[label])
        with module_order() if order == "module" else contextlib.nullcontext():
            with hooks.use(registry, target, report_misses=False, cache=caches[label], measure=budget, synthesize=synthesize if budget else 0) as session:
                executables[label], compile_secs[label] = compile_and_load(lambda: tvm.compile(mod, target))
        measured[label] = sum(bool(k.measured) for k in session.report.kernels)
    timing, errors = time_side_by_side(executables, network_input(input_shape), rounds)
    check_agreement(name, errors)
    ms = {label: t["median"] for label, t in timing.items()}
    gain = ms["ranked"] - ms["all measured"]
    return {"network": name, "shape": shape, "timing": timing, "compile_secs": compile_secs, "kernels_measured": measured,
            "gain_share": {label: (ms["ranked"] - v) / gain if gain > 0 else None for label, v in ms.items()}, "max_rel_error": errors}  # fmt: skip


def _summary(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per network and configuration: the median over runs of the gain share, the latency and the compile seconds."""
    found: dict[str, Any] = {}
    for row in (row for rows in runs for row in rows):
        net = found.setdefault(row["network"], {})
        for label, share in row["gain_share"].items():
            c = net.setdefault(label, {"gain_share": [], "ms": [], "compile_s": [], "measured": []})
            c["gain_share"].append(share)
            c["ms"].append(row["timing"][label]["median"])
            c["compile_s"].append(row["compile_secs"][label])
            c["measured"].append(row["kernels_measured"][label])
    return {net: {label: {k: statistics.median(v) if None not in v else None for k, v in c.items()} | {"gain_share_runs": c["gain_share"]}
                  for label, c in configs.items()} for net, configs in found.items()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-store", type=Path, required=True, help="a registry filled as bench.transfer --quick fills it")
    parser.add_argument("--budgets", default="5,10", help="measurement budgets in seconds, comma-separated")
    parser.add_argument("--synthesize", type=int, default=0, help="with synthesis too: design-space samples per missed kernel (the cost model trained beforehand)")
    study_arguments(parser)
    args = parser.parse_args()
    write_study(run(args.source_store, [float(b) for b in args.budgets.split(",")], args.runs, args.rounds, args.synthesize), args.out)


if __name__ == "__main__":
    main()
