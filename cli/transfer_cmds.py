"""Commands that move records: push, pull (and export/import, their local spellings)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar
from pathlib import Path

import click

from schedhub.registry import LocalRegistry, Record, Registry

from .common import open_registry, progress, registry_option, reports_errors
from .recordfiles import is_records_file, read_records, write_records

FORMATS = ("lmdb", "metaschedule", "records")
T = TypeVar("T")


def _needs_tvm(what: str) -> None:
    try:
        import tvm  # noqa: F401
    except ImportError:
        raise click.ClickException(f"{what} needs TVM: pip install 'schedhub[tvm]'") from None


def records_of(source: Path) -> Iterator[Record]:
    """Records from a records file, a schedhub store directory or a MetaSchedule JSONDatabase."""
    if source.is_file() and is_records_file(source):
        yield from read_records(source)
    elif (source / "data.mdb").is_file():
        with LocalRegistry(source, readonly=True) as local:
            for _, raws in local.iter_raw():
                yield from (Record.from_bytes(raw) for raw in raws)
    elif (source / "database_tuning_record.json").is_file():
        _needs_tvm("reading a MetaSchedule database")
        from schedhub.hooks.msdb import read_json_database

        yield from read_json_database(source)
    elif not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    else:
        raise click.ClickException(
            f"{source}: not a records file (.msgpack/.jsonl), a schedhub store (data.mdb) or a MetaSchedule JSONDatabase"
        )


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def push_records(reg: Registry, sources: list[Path], batch: int = 500) -> tuple[int, int, int]:
    """Push every source's records in batches, then the measurement log of each source that is a store;
    returns (records sent, records kept in a top-k, log entries sent)."""
    sent = kept = logged = 0
    with progress("push") as bar:
        task = bar.add_task("push", total=None)
        for chunk in chunks((r for source in sources for r in records_of(source)), batch):
            kept += sum(r.kept for r in reg.put_many(chunk))
            sent += len(chunk)
            bar.update(task, advance=len(chunk))
        for source in sources:
            if (source / "data.mdb").is_file():
                with LocalRegistry(source, readonly=True) as local:
                    for entry in local.iter_trial_logs():
                        reg.push_trials(entry)  # the registry names the pusher (a server: by the token) and decides what is verified
                        logged += 1
    return sent, kept, logged


def copy_log(source: Registry, local: LocalRegistry, keys: set[str] | None) -> int:
    """Copy ``source``'s measurement log (of ``keys`` only, unless None) into a local store as it was: each
    entry under its pusher, verified or not. Returns the entries copied."""
    count = 0
    for entry in source.iter_trial_logs():
        if keys is None or entry.identity.key in keys:
            local.push_trials(entry, entry.pushed_by, verified=entry.verified)
            count += 1
    return count


@click.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@registry_option
@reports_errors
def push(sources: tuple[Path, ...], registry: str, token: str | None) -> None:
    """Push records to a registry from files (.msgpack/.jsonl), schedhub stores (their measurement log too) or MetaSchedule JSONDatabase directories."""
    sent, kept, logged = push_records(open_registry(registry, token), list(sources))
    log_note = f"; {logged} measurement-log entries" if logged else ""
    click.echo(f"pushed {sent} records to {registry}; {kept} are now among their key's best{log_note}")


def pull_into(reg: Registry, out: Path, fmt: str, op: str | None, target: str | None, since: int) -> int:
    """Records into ``out`` (a store also gets the measurement log of the keys pulled); returns the records written."""
    keys: set[str] = set()

    def raws() -> Iterator[bytes]:
        with progress("pull") as bar:
            task = bar.add_task("pull", total=None)
            for summary, key_raws in reg.iter_raw(op, target, since):
                keys.add(summary.key)
                bar.update(task, advance=len(key_raws))
                yield from key_raws

    if fmt == "records":
        return write_records(out, raws())
    if fmt == "metaschedule":
        _needs_tvm("writing a MetaSchedule database")
        from schedhub.hooks.msdb import write_json_database

        return write_json_database(out, (Record.from_bytes(b) for b in raws()))
    with LocalRegistry(out) as local:
        count = sum(len(local.put_many(chunk)) for chunk in chunks((Record.from_bytes(b) for b in raws()), 500))
        copy_log(reg, local, None if op is None and target is None and since == 0 else keys)
        return count


@click.command()
@registry_option
@click.option("--out", "-o", "out", required=True, type=click.Path(path_type=Path), help="Store directory, JSONDatabase directory or records file.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="lmdb", show_default=True,
              help="lmdb: a schedhub store; metaschedule: a JSONDatabase directory; records: a .msgpack/.jsonl file.")  # fmt: skip
@click.option("--op", default=None, help="Only this op.")
@click.option("--target", default=None, help="Only this target kind or canonical target text.")
@click.option("--since", default=0, show_default=True, help="Only keys changed after this change-feed cursor.")
@reports_errors
def pull(registry: str, token: str | None, out: Path, fmt: str, op: str | None, target: str | None, since: int) -> None:
    """Pull records from a registry into a local store (with their measurement log), a MetaSchedule database or a file."""
    if fmt == "records" and not is_records_file(out):
        raise click.BadParameter("a records file ends in .msgpack or .jsonl", param_hint="--out")
    count = pull_into(open_registry(registry, token, readonly=True), out, fmt, op, target, since)
    click.echo(f"pulled {count} records into {out} ({fmt})")


@click.command("export")
@registry_option
@click.option("--out", "-o", "out", required=True, type=click.Path(path_type=Path), help="A .msgpack or .jsonl file.")
@click.option("--op", default=None)
@click.option("--target", default=None)
@reports_errors
def export_cmd(registry: str, token: str | None, out: Path, op: str | None, target: str | None) -> None:
    """Write a registry's records to a file (pull --format records)."""
    if not is_records_file(out):
        raise click.BadParameter("the file must end in .msgpack or .jsonl", param_hint="--out")
    count = pull_into(open_registry(registry, token, readonly=True), out, "records", op, target, 0)
    click.echo(f"exported {count} records to {out}")
