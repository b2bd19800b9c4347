"""The ``schedhub`` command."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from schedhub.registry import CallerBounds, TokenFile, load_tokens, serve as serve_registry

from .argfiles import ArgFileError, expand
from .common import DEFAULT_REGISTRY, EXIT_ERROR, console, labelled, reports_errors
from .profile_cmd import profile
from .retime_cmd import retime
from .inspect_cmds import backup, callers, forget, ls, quarantine, quarantined_cmd, queue, requeue, show, stats
from .transfer_cmds import export_cmd, pull, push
from .tune_cmds import demo, jobs_group, submit, tune, worker


def caller_bound_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One option per :class:`CallerBounds` field (``--claims-awaiting`` …), its default and help the field's."""
    for bound in reversed(dataclasses.fields(CallerBounds)):
        command = click.option(f"--{bound.name.replace('_', '-')}", bound.name, default=bound.default, show_default=True,
                               type=click.IntRange(min=0), help=bound.metadata["help"])(command)  # fmt: skip
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="schedhub")
def cli() -> None:
    """schedhub: a content-addressed registry of tuned TVM schedules.

    Any argument of the form @FILE.yaml expands into the options its mapping names.
    """


@cli.command()
@click.option("--root", default=DEFAULT_REGISTRY, show_default=True, type=click.Path(path_type=Path), help="LMDB store directory.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8470, show_default=True, type=int)
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="File of 'name token [role]' lines; role read|push|worker|admin, default push ($SCHEDHUB_TOKEN is an admin).")  # fmt: skip
@click.option("--read-only", is_flag=True, help="Refuse every write.")
@click.option("--no-sync", is_flag=True, help="Skip fsync on commit (faster; a power loss may drop recent writes).")
@click.option("--max-body", default=16 << 20, show_default=True, help="Largest request body in bytes.")
@caller_bound_options
@reports_errors
def serve(root: Path, host: str, port: int, token_file: str | None, read_only: bool, no_sync: bool, max_body: int, **bounds: int) -> None:
    """Serve a registry over HTTP (msgpack for programs, JSON for people, / for a dashboard)."""
    tokens = TokenFile(token_file) if token_file else load_tokens()  # a token file is read again when it changes
    count = len(tokens.tokens if isinstance(tokens, TokenFile) else tokens)
    mode = "read-only" if read_only else f"{count} token(s)" + (f", {token_file} read again when it changes" if token_file else "") if count or token_file else "open writes: loopback only"
    serve_registry(root, host, port, tokens=tokens, read_only=read_only, sync=not no_sync, max_body=max_body, bounds=CallerBounds(**bounds),
                   announce=lambda url: console.print(f"schedhub registry at {root} on {url} ({mode})", highlight=False, soft_wrap=True))  # fmt: skip


for command in (push, pull, export_cmd, ls, show, stats, queue, requeue, quarantine, quarantined_cmd, callers, forget, backup, tune, submit, jobs_group, worker, demo, profile, retime):
    cli.add_command(command)
cli.add_command(push, name="import")  # the local spelling of push: `schedhub import FILE -r DIR`


def main(argv: list[str] | None = None) -> None:
    try:
        args = expand(sys.argv[1:] if argv is None else argv)
    except ArgFileError as exc:
        console.print(labelled("error:", exc))
        raise SystemExit(EXIT_ERROR) from None
    cli.main(args=args, prog_name="schedhub")


if __name__ == "__main__":
    main()
