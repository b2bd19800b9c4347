"""A network's latency against tuning minutes, beside each alternative's: one PNG per tuned network.

    python -m bench.studies.tuning_plot --log TUNE.log --study FIRST_COMPILE.json --out PLOT.png

``--log``: what ``schedhub tune --until`` printed while it tuned the network (each round's line with the network's
estimate, Σ calls × each kernel's best time alone, and each check of the compiled network). ``--study``: what
:mod:`.first_compile` measured afterwards with that store (``--starter-store``): the engines, the untuned compile (the
CPU rules) and the tuned one, side by side in alternating rounds. The estimate is drawn as a line against minutes;
the untuned and tuned compiles as points at the start and at the end of the tuning; each engine as a level line.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

ROUND = re.compile(r"^round\s+\d+\s+(\d+) trials\s+([\d.]+) min\s.*\snetwork ([\d.]+) ms \(")
CHECK = re.compile(r"^check at (\d+) trials: the compiled network ([\d.]+) ms")
ENGINES = {"pytorch": ("PyTorch eager", "C3"), "inductor": ("torch.compile (Inductor)", "C4"), "onnxruntime": ("ONNX Runtime", "C1"),
           "openvino": ("OpenVINO", "C5")}  # fmt: skip


def tuning_rounds(log: str) -> tuple[list[tuple[int, float, float]], list[tuple[int, float]]]:
    """(trials, minutes, estimate ms) of each round once every kernel had one, and (trials, compiled ms) of each check."""
    rounds = [(int(m[1]), float(m[2]), float(m[3])) for m in map(ROUND.match, log.splitlines()) if m]
    checks = [(int(m[1]), float(m[2])) for m in map(CHECK.match, log.splitlines()) if m]
    return rounds, checks


def plot(log: str, study: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds, checks = tuning_rounds(log)
    if not rounds:
        raise ValueError("the log holds no round with the network's estimate (was it `schedhub tune --until`?)")
    timing = study["timing"]
    end = rounds[-1][1]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([r[1] for r in rounds], [r[2] for r in rounds], "-", color="C0", label="estimate while tuning (Σ calls × best alone)")
    minutes_at = {trials: minutes for trials, minutes, _ in rounds}
    for trials, ms in checks:
        ax.plot([minutes_at.get(trials, end)], [ms], "x", color="C0", label="the compiled network, checked by the tuner")
    ax.plot([0], [timing["ruled"]["median"]], "o", color="C2", label="schedhub untuned (CPU rules)")
    ax.plot([end], [timing["starter"]["median"]], "s", color="C2", label=f"schedhub tuned ({study.get('starter_label', '')})")
    for engine, (label, color) in ENGINES.items():
        if engine in timing:
            ax.axhline(timing[engine]["median"], color=color, linestyle="--", linewidth=1, label=label)
    ax.set_xlabel("tuning minutes (2 cores)")
    ax.set_ylabel("ms per forward pass (median of rounds)")
    ax.set_title(f"{study['network'].rpartition(':')[2]} on {study.get('cpu', '?')}, batch 1", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7)
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.tuning_plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, required=True, help="what `schedhub tune --until` printed")
    parser.add_argument("--study", type=Path, required=True, help="bench.studies.first_compile's JSON for the tuned store")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    fig = plot(args.log.read_text(), json.loads(args.study.read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110, bbox_inches="tight")
    print(args.out)


if __name__ == "__main__":
    main()
