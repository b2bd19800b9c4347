"""What every command shares: the registry option, error reporting, tables and progress."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from schedhub.registry import InvalidRecord, Registry, RegistryError, RegistryUnavailable, check_kind, connect

DEFAULT_HOME = Path(os.environ.get("SCHEDHUB_HOME", Path.home() / ".local" / "share" / "schedhub"))
DEFAULT_REGISTRY = os.environ.get("SCHEDHUB_REGISTRY", str(DEFAULT_HOME / "registry"))
EXIT_ERROR, EXIT_UNAVAILABLE = 1, 3


def _console(stderr: bool = False) -> Console:
    """A terminal's own width; piped output is never wrapped (80 columns cut keys and summaries). No markup: what is
    printed comes from records, registries and servers, and a provenance value such as ``[/]`` would otherwise raise
    (or style the terminal as its pusher chose); styles are given as :func:`labelled`'s."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() or os.environ.get("COLUMNS") else 100_000, markup=False)


def labelled(label: str, message: object, style: str = "red") -> Text:
    """``label`` styled, then ``message`` as plain text (never read as markup)."""
    return Text.assemble((label, style), f" {message}")


console = _console(stderr=True)
out = _console()
F = TypeVar("F", bound=Callable[..., Any])


def registry_option(f: F) -> F:
    f = click.option("--token", envvar="SCHEDHUB_TOKEN", default=None, help="Bearer token for writes [env SCHEDHUB_TOKEN].")(f)
    f = click.option(
        "--registry", "-r", "registry", default=DEFAULT_REGISTRY, show_default=True, envvar="SCHEDHUB_REGISTRY",
        help="Registry URL (http://…) or local store directory [env SCHEDHUB_REGISTRY].",
    )(f)  # fmt: skip
    return f


def _target_filter(ctx: click.Context, param: click.Parameter, spec: str | None) -> str | None:
    """A listing's ``--target``: a kind (llvm, cuda) as it is; ``host`` or a target JSON object (or a TVM
    tag) as the canonical text TVM completes it to, so it matches the keys tuned for it (needs TVM)."""
    if spec is None or (spec != "host" and _is_kind(spec)):
        return spec
    if spec == "host" and (known := _known_host_target()) is not None:
        return known
    try:
        from schedhub.hooks.kernels.identity import target_text
        from schedhub.tuner.networks.plan import resolve_target
    except ImportError:
        raise click.BadParameter("a target other than a kind (llvm, cuda) needs TVM: pip install 'schedhub[tvm]'") from None
    try:
        text = target_text(resolve_target(spec))
        if spec == "host":
            _remember_host_target(text)
        return text
    except Exception as exc:  # TVM's parse errors, bad JSON
        raise click.BadParameter(f"{spec!r} is not a target: {str(exc).splitlines()[-1][:200] if str(exc) else type(exc).__name__}") from None


def _host_target_file() -> Path:
    """Where this machine's canonical host target is kept, under what decides it: the TVM release, the CPU (its
    model and flags) and the cores this process may use. Resolving ``host`` otherwise imports TVM (about 3 s)."""
    try:
        tvm_version = metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        tvm_version = ""
    try:
        cpu = next(block for block in Path("/proc/cpuinfo").read_text().split("\n\n") if block.strip())
    except (OSError, StopIteration):
        cpu = ""
    cpu = "\n".join(line for line in cpu.splitlines() if line.split(":")[0].strip() in ("model name", "flags", "vendor_id", "cpu family", "model"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    digest = hashlib.sha256(f"{tvm_version}\0{cpu}\0{cores}".encode()).hexdigest()[:24]
    root = Path(os.environ.get("SCHEDHUB_CACHE_DIR") or Path.home() / ".cache" / "schedhub")
    return root / f"host-target-{digest}.json"


def _known_host_target() -> str | None:
    try:
        text = _host_target_file().read_text()
        json.loads(text)
        return text
    except (OSError, ValueError):
        return None


def _remember_host_target(text: str) -> None:
    path = _host_target_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        pass  # the next listing resolves it again


def _is_kind(spec: str) -> bool:
    try:
        check_kind(spec)
        return True
    except InvalidRecord:
        return False


def target_filter_option(f: F) -> F:
    """``--target``: only keys of this kind, or of this target (``host``, a JSON object)."""
    return click.option("--target", default=None, callback=_target_filter,
                        help="Only this target kind (llvm, cuda), or this target: 'host' or a target JSON object.")(f)  # fmt: skip


def open_registry(spec: str, token: str | None = None, readonly: bool = False) -> Registry:
    if spec.startswith(("http://", "https://")):
        return connect(spec, token=token)
    return connect(spec, readonly=readonly)


def reports_errors(f: F) -> F:
    """Named errors become one line on stderr and an exit code, not a traceback."""

    @wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except RegistryUnavailable as exc:
            console.print(labelled("error:", exc))
            raise SystemExit(EXIT_UNAVAILABLE) from None
        except (RegistryError, OSError, ValueError) as exc:
            console.print(labelled("error:", exc))
            raise SystemExit(EXIT_ERROR) from None
        except RuntimeError as exc:
            if not _cluster_error(exc):
                raise
            console.print(labelled("error:", exc))
            raise SystemExit(EXIT_ERROR) from None

    return wrapper  # type: ignore[return-value]


def _cluster_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the tuner's :class:`ClusterError` (Ray could not start, join, or lacks what tuning needs),
    told without importing the tuner: a command that never imported it cannot have raised one."""
    cluster = sys.modules.get("schedhub.tuner.execution.cluster")
    return cluster is not None and isinstance(exc, cluster.ClusterError)


def progress(description: str, total: int | None = None) -> Progress:
    return Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False, disable=not console.is_terminal)  # fmt: skip
