"""Another revision's schedhub beside the working tree's, for side-by-side benchmarks of a hot path (a GET, a lookup,
a compile): a folder to put first on a child process's ``PYTHONPATH`` whose ``schedhub`` packages are that revision's.

    shim = revision_source("bf44029", scratch, ("registry", "hooks"))
    subprocess.run([sys.executable, "-c", CODE], env=child_env(shim))

The child must never import the working tree's code instead (the editable install's finder would take it when the
shim lacks a package): :func:`check_imports_from` fails loudly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("registry", "hooks", "tuner", "cli")  # the repo folders that are schedhub's subpackages (pyproject's package-dir)


def revision_source(rev: str, scratch: Path, packages: tuple[str, ...] = ("registry",)) -> Path:
    """A folder whose ``schedhub/<package>`` are ``rev``'s ``packages`` (the working tree's for ``rev == 'worktree'``)."""
    shim = scratch / rev / "shim"
    (shim / "schedhub").mkdir(parents=True)
    if rev == "worktree":
        for package in packages:
            (shim / "schedhub" / package).symlink_to(REPO / package)
        return shim
    archive = subprocess.run(["git", "archive", rev, *packages], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(shim / "schedhub")], input=archive, check=True)
    return shim


def child_env(shim: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(shim)
    return env


def check_imports_from(shim: Path, packages: tuple[str, ...] = ("registry",)) -> None:
    """Fail loudly when the child would import another revision's ``packages`` than the ones ``shim`` holds."""
    code = "import importlib, sys; print('\\n'.join(importlib.import_module('schedhub.' + p).__file__ for p in sys.argv[1:]))"
    found = subprocess.run([sys.executable, "-c", code, *packages], env=child_env(shim), check=True, capture_output=True, text=True).stdout.split()
    for package, where in zip(packages, found):
        if not Path(where).resolve().is_relative_to((shim / "schedhub" / package).resolve()):
            raise SystemExit(f"bench: the child imported {where}, not {shim / 'schedhub' / package}")


def checked_shims(revs: Sequence[str], scratch: Path, packages: tuple[str, ...] = ("registry",)) -> dict[str, Path]:
    """A shim of ``packages`` for each of ``revs`` (``"worktree"``: this tree's), each checked to import what it holds."""
    shims = {rev: revision_source(rev, scratch, packages) for rev in revs}
    for shim in shims.values():
        check_imports_from(shim, packages)
    return shims


def alternating(shims: dict[str, Path], rounds: int, measure: Callable[[str, Path], T]) -> dict[str, list[T]]:
    """``measure(rev, shim)`` for each shim, ``rounds`` times, in the shims' order and then the other way round, so that
    neither revision always runs first on a machine that warms or cools."""
    runs: dict[str, list[T]] = {rev: [] for rev in shims}
    for round_ in range(rounds):
        for rev in list(shims)[:: 1 if round_ % 2 == 0 else -1]:
            runs[rev].append(measure(rev, shims[rev]))
    return runs
