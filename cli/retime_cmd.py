"""``schedhub retime``: a registry's verified records timed again on flushed caches, so its keys rank by them."""

from __future__ import annotations

import click

from .common import labelled, open_registry, out, registry_option, reports_errors
from .tune_cmds import ray_option


@click.command()
@registry_option
@click.option("--op", default=None, help="Only the keys of this op.")
@click.option("--target", default=None, help="Only the keys of this target (a kind such as llvm, or a canonical target).")
@ray_option
@reports_errors
def retime(registry: str, token: str | None, op: str | None, target: str | None, ray_address: str | None, num_cpus: int | None,
           num_gpus: int | None) -> None:  # fmt: skip
    """Time a key's verified records again, warm and on flushed caches, where some lack a flushed time, and push them
    again with it (a worker's or an admin's token, or a local store): a key ranks by flushed time once all its verified
    records have one, as a network meets its kernels' weights."""
    from schedhub.tuner.execution import cluster
    from schedhub.tuner.workloads.retime import retime as retime_keys

    reg = open_registry(registry, token)
    cluster.start(ray_address, num_cpus, num_gpus)
    try:
        done = retime_keys(reg, op, target, on_key=lambda d: out.print(
            f"{d.key[:12]}  {d.op:<40} " + ", ".join(f"{tid[:8]} {w * 1e3:.3f}/{f * 1e3:.3f} ms" for tid, (w, f) in d.times.items()), highlight=False))
    finally:
        cluster.stop()
    for d in done:
        for error in d.errors:
            out.print(labelled("not re-timed", f"{d.key[:12]} {error}"), highlight=False)
    out.print(f"re-timed {sum(len(d.times) for d in done)} records of {len(done)} keys (warm/flushed means)", highlight=False)
