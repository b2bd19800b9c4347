"""Commands that move records: push, pull (and export/import, their local spellings)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from pathlib import Path

import click

from schedhub.registry import LocalRegistry, Record, RefusedRecord, Registry, TooManyRequests, Trust, parse_trust, trust_filter, trusted

from .common import open_registry, progress, registry_option, reports_errors, target_filter_option
from .recordfiles import is_records_file, read_records, write_records

FORMATS = ("lmdb", "metaschedule", "records")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _needs_tvm(what: str) -> None:
    try:
        import tvm  # noqa: F401
    except ImportError:
        raise click.ClickException(f"{what} needs TVM: pip install 'schedhub[tvm]'") from None


def trust_option(f: F) -> F:
    """``--trust``: which records go into a copy that carries no status (see :func:`schedhub.registry.parse_trust`)."""
    return click.option("--trust", "trust", default="verified", show_default=True, callback=_parse_trust,
                        help="Which records to copy: 'verified' (replayed, checked and measured by a trusted worker or a store's owner), "
                             "'any' (claims too), or pusher names separated by commas (their claims too).")(f)  # fmt: skip


def _parse_trust(_ctx: click.Context, _param: click.Parameter, value: str) -> Trust:
    try:
        return parse_trust(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def accepted(records: Iterable[Record], trust: Trust, left_out: Counter[str]) -> Iterator[Record]:
    """The records ``trust`` accepts; the others are counted in ``left_out["records"]``."""
    accepts = trust_filter(trust)
    for record in records:
        if accepts(record):
            yield record
        else:
            left_out["records"] += 1


def records_of(source: Path, trust: Trust = "verified", left_out: Counter[str] | None = None) -> Iterator[Record]:
    """Records from a records file, a schedhub store directory (those of its records ``trust`` accepts: see
    :func:`accepted`; those this version's checks refuse counted in ``left_out["refused"]``) or a MetaSchedule
    JSONDatabase."""
    if source.is_file() and is_records_file(source):
        yield from read_records(source)
    elif (source / "data.mdb").is_file():
        left_out = left_out if left_out is not None else Counter()
        refused: list[RefusedRecord] = []
        with LocalRegistry(source, readonly=True) as local:
            for _, records in local.iter_served(refused=refused):
                yield from accepted(records, trust, left_out)
        left_out["refused"] += len(refused)
    elif (source / "database_tuning_record.json").is_file():
        _needs_tvm("reading a MetaSchedule database")
        from schedhub.hooks.metaschedule.msdb import read_json_database

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


def push_records(reg: Registry, sources: list[Path], batch: int = 500, trust: Trust = "verified",
                 left_out: Counter[str] | None = None, claims: Counter[str] | None = None) -> tuple[int, int, int]:  # fmt: skip
    """Push every source's records in batches, then the measurement log of each source that is a store;
    of a store, only what ``trust`` accepts (a claim it holds is not the pusher's to vouch for: pushed with
    a worker's token it would come out verified), the rest counted in ``left_out`` ("records", "log").
    Returns (records sent, records kept in a top-k, log entries sent); ``claims["kept"]`` counts the kept records that
    are claims awaiting a worker's verification (a push token's, whoever verified them where they came from). Into a
    local store, what a store held keeps who pushed it and who verified it (as a pull keeps it), where a server names
    the pusher by the token."""
    left_out = left_out if left_out is not None else Counter()
    claims = claims if claims is not None else Counter()
    accepts = trusted(trust)
    sent = kept = logged = 0
    with progress("push") as bar:
        task = bar.add_task("push", total=None)
        for chunk in chunks((r for source in sources for r in records_of(source, trust, left_out)), batch):
            try:
                results = _put(reg, chunk)
                kept += sum(r.kept for r in results)
                claims["kept"] += sum(r.kept and not r.verified for r in results)
            except TooManyRequests as exc:  # the registry's bound on claims awaiting verification: say what got there
                raise TooManyRequests(f"{sent + exc.stored} records were pushed, then the registry refused the rest: {exc}") from None
            sent += len(chunk)
            bar.update(task, advance=len(chunk))
        for source in sources:
            if (source / "data.mdb").is_file():
                with LocalRegistry(source, readonly=True) as local:
                    for entry in local.iter_trial_logs():
                        if not accepts(entry.verified, entry.pushed_by):
                            left_out["log"] += 1
                            continue
                        if isinstance(reg, LocalRegistry):  # a copy between stores keeps whose each entry is
                            reg.push_trials(entry, entry.pushed_by, verified=entry.verified)
                        else:
                            reg.push_trials(entry)  # the registry names the pusher (a server: by the token) and decides what is verified
                        logged += 1
    return sent, kept, logged


def _put(reg: Registry, records: list[Record]) -> list[Any]:
    """``records`` into ``reg``: into a local store, a record read from a store with its status (pusher, verifier)
    mirrored as it was; every other record pushed as the caller's."""
    if not isinstance(reg, LocalRegistry):
        return reg.put_many(records)
    held = [r for r in records if r.served is not None]
    plain = [r for r in records if r.served is None]
    return (reg.mirror(held) if held else []) + (reg.put_many(plain) if plain else [])


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
@trust_option
@reports_errors
def push(sources: tuple[Path, ...], registry: str, token: str | None, trust: Trust) -> None:
    """Push records to a registry from files (.msgpack/.jsonl), schedhub stores (their measurement log too) or MetaSchedule JSONDatabase directories."""
    left_out: Counter[str] = Counter()
    claims: Counter[str] = Counter()
    sent, kept, logged = push_records(open_registry(registry, token), list(sources), trust=trust, left_out=left_out, claims=claims)
    log_note = f"; {logged} measurement-log entries" if logged else ""
    claim_note = (f" ({claims['kept']} of them claims: served once a worker has verified them, as this token's pushes are)"
                  if claims["kept"] else "")  # fmt: skip
    click.echo(f"pushed {sent} records to {registry}; {kept} are now among their key's best{claim_note}{log_note}")
    if left_out["records"] or left_out["log"]:
        click.echo(f"left out {left_out['records']} unverified claims and {left_out['log']} unverified measurement-log entries "
                   "of the stores (--trust any, or the pushers' names, takes them)")  # fmt: skip
    if left_out["refused"]:
        click.echo(f"left out {left_out['refused']} records of the stores that this schedhub's checks refuse (kept before a check existed)")


@dataclass
class Pulled:
    """What a pull wrote, and what it left out: records the trust did not accept, and records a
    MetaSchedule database cannot hold (``unusable``: why, by trace id)."""

    written: int = 0
    untrusted: int = 0
    unusable: dict[str, str] = field(default_factory=dict)
    refused: list[RefusedRecord] = field(default_factory=list)  # records this version's checks refuse

    def summary(self, out: Path, fmt: str) -> str:
        lines = [f"pulled {self.written} records into {out} ({fmt})"]
        if self.untrusted:
            lines.append(f"left out {self.untrusted} unverified claims (--trust any, or the pushers' names, takes them)")
        if self.unusable:
            lines.append(f"left out {len(self.unusable)} records MetaSchedule could not load:")
            lines += [f"  {tid}: {why}" for tid, why in list(self.unusable.items())[:10]]
        if self.refused:
            lines.append(f"left out {len(self.refused)} records this schedhub's checks refuse (kept before a check existed):")
            lines += [f"  {r.trace_id or '(unnamed)'} of {r.key[:16] or '(unnamed)'}: {r.reason}" for r in self.refused[:10]]
        return "\n".join(lines)


def pull_into(reg: Registry, out: Path, fmt: str, op: str | None, target: str | None, since: int, trust: Trust = "verified") -> Pulled:
    """Records into ``out``. A store keeps every record as the registry holds it (verified, or its
    pusher's claim) and gets the measurement log of the keys pulled; a file or a MetaSchedule database
    carries no status, so it gets the records ``trust`` accepts."""
    keys: set[str] = set()
    left_out: Counter[str] = Counter()
    pulled = Pulled()

    def served() -> Iterator[Record]:
        with progress("pull") as bar:
            task = bar.add_task("pull", total=None)
            for summary, records in reg.iter_served(op, target, since, refused=pulled.refused):
                keys.add(summary.key)
                bar.update(task, advance=len(records))
                yield from records

    if fmt == "records":
        pulled.written = write_records(out, (r.to_bytes() for r in accepted(served(), trust, left_out)))
    elif fmt == "metaschedule":
        _needs_tvm("writing a MetaSchedule database")
        from schedhub.hooks.metaschedule.msdb import write_json_database

        pulled.written, pulled.unusable = write_json_database(out, accepted(served(), trust, left_out))
    else:
        with LocalRegistry(out) as local:
            pulled.written = sum(len(local.mirror(chunk)) for chunk in chunks(served(), 500))
            copy_log(reg, local, None if op is None and target is None and since == 0 else keys)
    pulled.untrusted = left_out["records"]
    return pulled


@click.command()
@registry_option
@click.option("--out", "-o", "out", required=True, type=click.Path(path_type=Path), help="Store directory, JSONDatabase directory or records file.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="lmdb", show_default=True,
              help="lmdb: a schedhub store; metaschedule: a JSONDatabase directory; records: a .msgpack/.jsonl file.")  # fmt: skip
@click.option("--op", default=None, help="Only this op.")
@target_filter_option
@click.option("--since", default=0, show_default=True, help="Only keys changed after this change-feed cursor.")
@trust_option
@reports_errors
def pull(registry: str, token: str | None, out: Path, fmt: str, op: str | None, target: str | None, since: int, trust: Trust) -> None:
    """Pull records from a registry into a local store (every record with who vouched for it, and the
    measurement log), a MetaSchedule database or a file (those two: the records --trust accepts)."""
    if fmt == "records" and not is_records_file(out):
        raise click.BadParameter("a records file ends in .msgpack or .jsonl", param_hint="--out")
    pulled = pull_into(open_registry(registry, token, readonly=True), out, fmt, op, target, since, trust)
    click.echo(pulled.summary(out, fmt))


@click.command("export")
@registry_option
@click.option("--out", "-o", "out", required=True, type=click.Path(path_type=Path), help="A .msgpack or .jsonl file.")
@click.option("--op", default=None)
@target_filter_option
@trust_option
@reports_errors
def export_cmd(registry: str, token: str | None, out: Path, op: str | None, target: str | None, trust: Trust) -> None:
    """Write a registry's records to a file (pull --format records): the records --trust accepts."""
    if not is_records_file(out):
        raise click.BadParameter("the file must end in .msgpack or .jsonl", param_hint="--out")
    pulled = pull_into(open_registry(registry, token, readonly=True), out, "records", op, target, 0, trust)
    click.echo(pulled.summary(out, "records").replace("pulled", "exported", 1))
