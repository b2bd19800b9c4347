"""``schedhub profile``: a model's kernels timed with TVM's default schedule and the registry's, across threads."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .common import console, open_registry, out, registry_option, reports_errors
from .tune_cmds import rewrite_options


def _thread_counts(text: str | None) -> list[int]:
    if text is None:
        return list(range(1, (os.cpu_count() or 1) + 1))
    try:
        counts = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise click.BadParameter(f"{text!r}: a comma-separated list of thread counts, e.g. 1,2,4", param_hint="--threads") from None
    if not counts or counts[0] < 1 or counts[-1] > 1024:
        raise click.BadParameter("thread counts must be between 1 and 1024", param_hint="--threads")
    return counts


@click.command()
@registry_option
@click.option("--model", "-m", "model_spec", required=True, help="A model as `schedhub tune -m` takes it ('resnet18:image=112', onnx:FILE, JSON).")
@click.option("--target", default="host", show_default=True, help="'host', a target JSON object, or a TVM target string.")
@click.option("--threads", default=None, help="Thread counts, e.g. 1,2,4 (default: 1 … this machine's cores).")
@click.option("--out", "-o", "out_path", type=click.Path(path_type=Path), default=Path("profile.csv"), show_default=True,
              help="CSV of one row per (kernel, schedule, threads); a .parquet beside it when pyarrow is installed.")  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None, help="PNG of latency against threads per op (needs matplotlib).")
@click.option("--defaults-only", is_flag=True, help="Time TVM's default schedules only (no registry).")
@rewrite_options
@reports_errors
def profile(registry: str, token: str | None, model_spec: str, target: str, threads: str | None, out_path: Path, plot_path: Path | None,
            defaults_only: bool, layout: str, math: str, prepack: bool | None, conv: str) -> None:  # fmt: skip
    """Time every kernel of a model with TVM's default schedule and the registry's (a hit, a transfer, or the rules' schedule
    a miss gets) across thread counts; its kernels planned with the rewrites `schedhub tune` takes."""
    import tvm

    from schedhub.tuner.networks import plan, profile as profiling

    counts = _thread_counts(threads)
    os.environ["TVM_NUM_THREADS"] = str(max(counts))  # before TVM's thread pool starts: it can shrink and regrow, never grow past it
    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.BadParameter("plots need matplotlib: pip install matplotlib", param_hint="--plot") from None
    ref = plan.parse_model(model_spec)
    spec = plan.resolve_target(target)
    tgt = tvm.target.Target(spec)
    if tgt.kind.name != "llvm":
        raise click.BadParameter(f"profiles run on this machine's CPU; {tgt.kind.name} targets are not profiled yet", param_hint="--target")
    reg = None if defaults_only else open_registry(registry, token, readonly=True)
    mod = plan.load(ref)
    rewrites = plan.tuning_rewrites(spec, layout, math, prepack, conv, [mod])  # the kernels `schedhub tune` tunes
    console.print(f"kernels planned with {rewrites.describe() or 'no rewrites'}", highlight=False)
    rows = profiling.profile(mod, tgt, reg, counts, say=lambda line: console.print(line, highlight=False, soft_wrap=True), rewrites=rewrites)
    profiling.write_csv(rows, out_path)
    written = [str(out_path)]
    if profiling.write_parquet(rows, out_path.with_suffix(".parquet")):
        written.append(str(out_path.with_suffix(".parquet")))
    if plot_path is not None:
        profiling.plot(rows, plot_path)
        written.append(str(plot_path))
    for line in profiling.summary(rows):
        out.print(line, highlight=False, soft_wrap=True)
    console.print(f"{len(rows)} rows for {len({r.op for r in rows})} ops: {', '.join(written)}", highlight=False, soft_wrap=True)
