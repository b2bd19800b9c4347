"""PNG plots for RESULTS.md: speedup bars and tuning curves (best GFLOPS vs trials)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .labels import named


def all_plots(data: dict[str, Any], directory: Path) -> dict[str, str]:
    """Draw what the data allows; returns plot name → path relative to ``bench/``."""
    import matplotlib

    matplotlib.use("Agg")
    drawn = {}
    if data.get("models", {}).get("rows"):
        drawn["speedup"] = _save(speedups(data["models"]), directory / "speedup.png")
    if data.get("models") or data.get("tuner"):
        drawn["curves"] = _save(curves(data.get("models"), data.get("tuner")), directory / "curves.png")
    if any(row.get("tuning") for row in data.get("models", {}).get("rows", [])):
        drawn["network_tuning"] = _save(network_tuning(data["models"]), directory / "network-tuning.png")
    if data.get("transfer", {}).get("rows"):
        drawn["transfer"] = _save(transfers(data["transfer"]), directory / "transfer.png")
    return drawn


def _save(fig: Any, path: Path) -> str:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(path.relative_to(path.parents[2]))


def speedups(models: dict[str, Any]) -> Any:
    """Grouped log-scale bars: schedhub-tuned vs PyTorch and vs untuned TVM, per network and batch (whiskers: per-round min–max)."""
    import matplotlib.pyplot as plt

    rows = models["rows"]
    labels = [f"{named(r)}\nb{r['batch']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 3.6))
    width = 0.4
    xs = range(len(rows))
    for offset, key, label in ((-width / 2, "speedup_vs_pytorch", "vs PyTorch"), (width / 2, "speedup_vs_untuned", "vs untuned TVM")):
        values = [r[key]["median"] for r in rows]
        noise = [[v - r[key]["min"] for v, r in zip(values, rows)], [r[key]["max"] - v for v, r in zip(values, rows)]]
        bars = ax.bar([x + offset for x in xs], values, width, yerr=noise, capsize=2, label=label)
        ax.bar_label(bars, labels=[f"{v:.2g}×" if v < 100 else f"{v:.0f}×" for v in values], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("speedup of schedhub-tuned (×)")
    ax.set_title(f"End-to-end speedup ({models['mode']} run, {models['options']['trials']} trials per kernel)")
    ax.legend(fontsize=8)
    return fig


def curves(models: dict[str, Any] | None, tuner: dict[str, Any] | None) -> Any:
    """Best GFLOPS so far vs measured candidates: the tuner bench's kernels (ray and plain), and each network's heaviest kernel."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    left, right = axes
    for name, entry in (tuner or {}).get("workloads", {}).items():
        for run in entry["runs"]:
            for label, style in (("ray", "-"), ("plain", "--")):
                _curve(left, run[label]["curve_ms"], entry["flops"], f"{name} {label} (seed {run['seed']})", style)
    left.set_title("Tuner bench: Ray tuner vs plain MetaSchedule")
    heaviest: dict[tuple[str, int], dict[str, Any]] = {}
    for k in (models or {}).get("kernels", []):
        if k["flops"] and k["curve_ms"]:
            heaviest.setdefault((k["network"], k["batch"]), k)  # rows come heaviest first
    for (network, batch), k in heaviest.items():
        _curve(right, k["curve_ms"], k["flops"], f"{network} b{batch}: {k['op']}", "-" if batch == 1 else ":")
    right.set_title("Heaviest matmul/conv kernel of each network")
    for ax in axes:
        ax.set_xlabel("measured candidates")
        ax.set_ylabel("best GFLOPS so far")
        if ax.lines:
            ax.legend(fontsize=6)
    return fig


def _curve(ax: Any, curve_ms: list[list[float]], flops: float, label: str, style: str) -> None:
    if not curve_ms:
        return
    xs = [p[0] for p in curve_ms]
    ys = [flops / (p[1] * 1e-3) / 1e9 for p in curve_ms]
    ax.step(xs, ys, style, where="post", label=label)


def network_tuning(models: dict[str, Any]) -> Any:
    """Per network tuned in rounds (``bench.models --policy``): its estimated latency (Σ calls × each kernel's best)
    against tuning minutes, with PyTorch's latency and the tuned network's measured one as lines."""
    import matplotlib.pyplot as plt

    rows = [r for r in models["rows"] if r.get("tuning")]
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.4), squeeze=False)
    for ax, row in zip(axes[0], rows):
        timed = [r for r in row["tuning"]["rounds"] if r["estimate_ms"] > 0]
        ax.plot([r["minutes"] for r in timed], [r["estimate_ms"] for r in timed], "-", color="C0", label="estimate (Σ calls × best)")
        ax.axhline(row["timing"]["pytorch"]["median"], color="C3", linestyle="--", label="PyTorch")
        ax.axhline(row["timing"]["tuned"]["median"], color="C2", linestyle=":", label="tuned, measured")
        ax.set_yscale("log")
        ax.set_xlabel("tuning minutes")
        ax.set_ylabel("ms per forward pass")
        ax.set_title(f"{named(row)} b{row['batch']} ({row['tuning']['policy']}, {row['trials']} trials)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def transfers(transfer: dict[str, Any]) -> Any:
    """Per held-out network, log-scale latency of TVM's default schedules, the transferred schedules,
    the tuned ones and PyTorch (whiskers: per-round min–max)."""
    import matplotlib.pyplot as plt

    rows = transfer["rows"]
    configs = (("default", "TVM default"), ("transferred", "transfer, ranked"), ("measured", "transfer, measured"), ("tuned", "tuned for the shape"),
               ("pytorch", "PyTorch"))  # fmt: skip
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(rows)), 3.8))
    width = 0.16
    for i, (key, label) in enumerate(configs):
        values = [r["timing"][key]["median"] for r in rows]
        noise = [[v - r["timing"][key]["min"] for v, r in zip(values, rows)], [r["timing"][key]["max"] - v for v, r in zip(values, rows)]]
        bars = ax.bar([x + (i - 2) * width for x in range(len(rows))], values, width, yerr=noise, capsize=2, label=label)
        ax.bar_label(bars, labels=[f"{v:.2g}" for v in values], fontsize=6)
    ax.set_yscale("log")
    ax.set_xticks(list(range(len(rows))), [r["label"].replace(" (", "\n(") for r in rows], fontsize=7)
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"Held-out networks, never tuned: what a compile gets ({transfer['mode']} run)")
    ax.legend(fontsize=7)
    return fig
