"""Commands that inspect a registry: ls, show, stats, queue, quarantined (and requeue, quarantine)."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from schedhub.registry import LocalRegistry, NotFound, Record, RefusedRecord, Registry, by_bytes_held, every_caller, size_text, task_label

from .common import DEFAULT_REGISTRY, labelled, open_registry, out, registry_option, reports_errors, target_filter_option


def _dump(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@click.command("ls")
@registry_option
@click.option("--op", default=None, help="Only this op (fused function name).")
@target_filter_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000),
              help="The newest this many keys (newest change last).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
def ls(registry: str, token: str | None, op: str | None, target: str | None, limit: int, as_json: bool) -> None:
    """List keys with their op, target and best time."""
    reg = open_registry(registry, token, readonly=True)
    rows = reg.summaries(op, target, limit=limit, newest=True)
    if as_json:
        return _dump([r.to_dict() for r in rows])
    if not rows:
        asked = " and ".join([*([f"op {op!r} (an op is matched whole, e.g. fused_matmul_add_relu)"] if op else []), *([f"target {target!r}"] if target else [])])
        out.print(f"no keys{' of ' + asked if asked else ''} in {registry}", highlight=False, soft_wrap=True)
        return
    table = Table("key", "op", "target", "records", "verified", "best µs")
    for r in rows:
        table.add_row(r.key[:16], r.op, target_summary(r.target), str(r.count), str(r.verified), f"{r.best_secs * 1e6:.2f}")
    out.print(table)


def _short(name: str, value: Any) -> str:
    """A provenance value for a table: the tuning curve as its length and end point, not 64 pairs."""
    if name == "curve" and isinstance(value, str):
        try:
            points = json.loads(value)
            return f"<{len(points)} points, best {points[-1][1] * 1e6:.2f} µs after {points[-1][0]}>"
        except (ValueError, IndexError, TypeError):
            return value[:40]
    return str(value)


def target_summary(target: str) -> str:
    """The parts of a canonical target that tell targets apart in a listing: kind, CPU or arch, cores."""
    try:
        parsed = json.loads(target)
    except ValueError:
        return target[:40]
    parts = [str(parsed.get(k)) for k in ("kind", "mcpu", "arch", "device") if parsed.get(k)]
    if parsed.get("num-cores"):
        parts.append(f"x{parsed['num-cores']}")
    return " ".join(parts)


def resolve_key(reg: Registry, key: str) -> str:
    """A full key of records from a unique prefix of at least 8 hex characters."""
    return _unique(key, lambda prefix: [s.key for s in reg.summaries(prefix=prefix, limit=2)])


def resolve_job_key(reg: Registry, key: str) -> str:
    """A full queue job key (records or not) from a unique prefix of at least 8 hex characters."""
    return _unique(key, lambda prefix: [j["key"] for j in reg.jobs(None, 2, just_before(prefix)) if j["key"].startswith(prefix)])


def just_before(prefix: str) -> str:
    """The job id (64 hex characters) just before the first one ``prefix`` begins, as a listing's ``after`` cursor ("" for
    none before it): a registry takes only a whole job id there."""
    first = int(prefix.ljust(64, "0"), 16)
    return f"{first - 1:064x}" if first else ""


def _unique(key: str, starting_with: Callable[[str], list[str]]) -> str:
    if len(key) == 64:
        return key
    if len(key) < 8:
        raise NotFound("give at least 8 characters of the key")
    if not all(c in "0123456789abcdef" for c in key.lower()):
        raise NotFound(f"{key!r} is not a key: keys are hex")
    matches = starting_with(key.lower())
    if len(matches) != 1:
        raise NotFound(f"no key starts with {key!r}" if not matches else f"more than one key starts with {key!r}: give more characters")
    return matches[0]


@click.command()
@click.argument("key")
@registry_option
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
@click.option("--workload", is_flag=True, help="Also print the canonical workload text.")
@reports_errors
def show(key: str, registry: str, token: str | None, as_json: bool, workload: bool) -> None:
    """Show the records of one key, best first. KEY is the full key or a unique prefix of at least 8 characters."""
    reg = open_registry(registry, token, readonly=True)
    full = resolve_key(reg, key)
    refused: list[RefusedRecord] = []
    records: list[Record] = reg.get(full, refused)
    if not records and not refused:
        raise NotFound(f"no records for key {full}")
    if as_json:
        return _dump([r.to_dict() for r in records])
    for item in refused:  # stored before one of this version's checks existed: what an admin may quarantine
        out.print(f"left out {item.trace_id}: {item.reason}", markup=False, highlight=False)
    if not records:
        return
    ident = records[0].identity
    out.print(full, style="bold")
    out.print(f"op {ident.op}\ntarget {ident.target}\ncompiler {ident.fingerprint}")
    out.print("args " + ", ".join(f"{a[1]}{a[2]}" for a in ident.args_info))
    out.print("ranked as served: verified records first, then claims; within each, by the time on flushed caches where every "
              "record of the group has one, else the warm time (a verified record's as its verifier timed it, a claim's as "
              "claimed)", highlight=False, soft_wrap=True)  # fmt: skip
    table = Table("rank", "trace", "claimed µs", "pushed by", "verified by (µs warm, flushed)", "complaints")
    table.columns[1].no_wrap, table.columns[1].min_width = True, 16  # a trace id is what quarantine takes: never cut
    for i, r in enumerate(records):
        s = r.served
        flushed = f", {s.verified_flushed_secs * 1e6:.2f}" if s and s.verified_flushed_secs else ""
        verified = f"{s.verified_by} ({s.verified_secs * 1e6:.2f}{flushed})" if s and s.verified else "unverified claim"
        table.add_row(str(i), r.trace_id, f"{r.mean_secs * 1e6:.2f}", s.pushed_by if s else "", verified, str(s.complaints if s else 0))
    out.print(table)
    for i, r in enumerate(records):  # below the table, where a terminal's width wraps it whole
        out.print(labelled(f"{i} {r.trace_id}", ", ".join(f"{k}={_short(k, v)}" for k, v in sorted(r.provenance.items())) or "no provenance", "bold"),
                  highlight=False)  # fmt: skip
    if workload:
        out.print(ident.workload, markup=False, highlight=False)


@click.command()
@registry_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
def stats(registry: str, token: str | None, as_json: bool) -> None:
    """Store size, queue states and (for a server) request counters."""
    found = open_registry(registry, token, readonly=True).stats()
    if as_json:
        return _dump(found)
    table = Table("", "", show_header=False, box=None)
    for label, value in stats_rows(found):
        table.add_row(label, value)
    out.print(table)


def stats_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """``stats`` as labelled lines for people (a field an older server lacks is left out)."""
    cov, queue = stats.get("coverage") or {}, stats.get("queue") or {}
    rows = [("keys", f"{stats.get('keys', 0):,} ({cov.get('ops', 0):,} ops, {cov.get('targets', 0):,} targets, {cov.get('fingerprints', 0):,} compiler builds)"),
            ("measurements", f"{stats.get('measurements', 0):,} pushes and verdicts; {stats.get('trial_logs', 0):,} trial logs; "
                             f"{stats.get('cost_models', 0):,} cost models served"),
            ("quarantined", f"{stats.get('quarantined', 0):,}"),
            ("queue", ", ".join(f"{queue.get(s, 0):,} {s}" for s in ("pending", "leased", "done", "dead"))),
            ("store", f"{stats.get('bytes_used', 0) / 1e6:,.1f} MB of {stats.get('map_size', 0) / 2**30:,.0f} GiB mapped" + (f" at {stats['root']}" if "root" in stats else "")),
            ("change feed", f"cursor {stats.get('cursor', 0):,}")]  # fmt: skip
    if "uptime_secs" in stats:
        since = stats.get("since_start") or {}
        rows.append(("server", f"up {stats['uptime_secs'] / 3600:,.1f} h" + ("; read-only" if stats.get("read_only") else "")
                     + ("; since start: " + ", ".join(f"{v:,} {k}" for k, v in sorted(since.items())) if since else "")))  # fmt: skip
    return rows


@click.command()
@registry_option
@click.option("--state", type=click.Choice(["pending", "leased", "done", "dead"]), default=None)
@click.option("--next", "upcoming", type=click.IntRange(1, 100_000), default=None, metavar="N",
              help="The next N pending jobs in the order they are handed out (the callers' turns, then most callers, then most demand).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (whole keys).")
@reports_errors
def queue(registry: str, token: str | None, state: str | None, upcoming: int | None, as_json: bool) -> None:
    """Jobs in the miss queue (by job id; --next: in the order workers get them). Keys are shown by their first 16
    characters, as ``ls`` shows them: every command takes such a prefix."""
    reg = open_registry(registry, token, readonly=True)
    if as_json:
        return _dump(reg.jobs_in_lease_order(upcoming) if upcoming is not None else reg.jobs(state))
    if upcoming is not None:
        table = Table("#", "key", "task", "op", "target", "requester", "callers", "demand")
        for place, job in enumerate(reg.jobs_in_lease_order(upcoming), 1):
            table.add_row(str(place), job["key"][:16], task_label(job), job["op"], target_summary(job.get("target", "")), job.get("requester") or "(local)",
                          str(job.get("callers", "")), str(job["demand"]))  # fmt: skip
        out.print(table)
        return
    table = Table("key", "task", "op", "target", "state", "callers", "demand", "attempts", "last error")  # a worker times one CPU model: say whose
    for job in reg.jobs(state):
        table.add_row(job["key"][:16], task_label(job), job["op"], target_summary(job.get("target", "")), job["state"], str(job.get("callers", "")),
                      str(job["demand"]), str(job["attempts"]), job["last_error"][:60])  # fmt: skip
    out.print(table)


@click.command()
@click.argument("key")
@registry_option
@reports_errors
def requeue(key: str, registry: str, token: str | None) -> None:
    """Put a dead (or done) queue job back to pending. KEY is the full key or a unique prefix of at least 8 characters."""
    reg = open_registry(registry, token)
    full = resolve_job_key(reg, key)
    reg.requeue(full)
    click.echo(f"requeued {full}")


@click.command()
@click.argument("key")
@click.argument("trace_id")
@registry_option
@click.option("--reason", default="", help="Why it goes out of service (kept with it).")
@reports_errors
def quarantine(key: str, trace_id: str, registry: str, token: str | None, reason: str) -> None:
    """Take one record out of service (an admin's decision; clients' failures only queue a verification)."""
    reg = open_registry(registry, token)
    full = resolve_key(reg, key)
    if not reg.quarantine(full, trace_id, reason):
        raise NotFound(f"key {full} has no record {trace_id}")
    click.echo(f"quarantined {trace_id} of {full}")


@click.command()
@click.argument("name")
@registry_option
@click.option("--verified", is_flag=True, help="Its verified records too (a worker measured them; others may be served them now).")
@reports_errors
def forget(name: str, registry: str, token: str | None, verified: bool) -> None:
    """Take out what caller NAME left behind, once its token is revoked (admin): its claims and complaints, the queue
    jobs it asked for, its measurement log and its ended work."""
    gone = open_registry(registry, token).forget(name, verified=verified)
    click.echo(f"forgot {name}: " + ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in gone.items()))


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--root", default=DEFAULT_REGISTRY, show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="The store to back up (a running server's --root: it goes on serving meanwhile).")
@reports_errors
def backup(folder: Path, root: Path) -> None:
    """Copy the whole store (records, queue, logs, models) into FOLDER (new or empty), compacted: a consistent snapshot
    taken while the registry goes on writing. To restore, serve or open FOLDER as the store's root."""
    with LocalRegistry(root, readonly=True) as reg:
        size, stats = reg.backup(folder), reg.stats()
    click.echo(f"backed up {stats['keys']:,} keys, {stats['measurements']:,} measurements and {stats['trial_logs']:,} trial logs "
               f"to {folder}: {size / 2**20:,.1f} MiB (the store's file: {stats['bytes_used'] / 2**20:,.1f} MiB in use)")


@click.command()
@registry_option
@reports_errors
def callers(registry: str, token: str | None) -> None:
    """Who holds what here: each caller's records in service, claims and misses awaiting work, unverified
    measurement log and kept history (what its bounds are checked against), who holds the most bytes first."""
    held, _ = every_caller(open_registry(registry, token, readonly=True).callers)
    if not held:
        out.print("no caller holds anything here")
        return
    table = Table("caller", "records", "claims awaiting", "misses awaiting", "unverified log", "kept history")
    for item in sorted(held, key=by_bytes_held):
        table.add_row(item["name"] or "(local)", size_text(item["records_bytes"]), str(item["claims_awaiting"]), str(item["misses_awaiting"]),
                      size_text(item["claimed_log_bytes"]), size_text(item["kept_bytes"]))  # fmt: skip
    out.print(table)


@click.command("quarantined")
@registry_option
@reports_errors
def quarantined_cmd(registry: str, token: str | None) -> None:
    """Records out of service: quarantined by an admin, refused or failed by a verifying worker, and whose they were."""
    items = open_registry(registry, token, readonly=True).quarantined()
    if not items:
        out.print("nothing is quarantined: every record is in service")
        return
    table = Table("key", "trace", "pushed by", "reason")
    for item in items:
        table.add_row(item["key"][:16], item["trace_id"], item["by"], item["reason"][:100])
    out.print(table)
