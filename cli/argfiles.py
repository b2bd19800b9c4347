"""``@file.yaml`` arguments: a YAML mapping expanded into command-line options.

``schedhub pull @pull.yaml`` with ``{registry: http://…, op: fused_dense, out: ./cache}`` reads as
``--registry http://… --op fused_dense --out ./cache``. Lists repeat the option, ``true`` is a bare
flag, ``false``/null drop it, a mapping becomes its JSON text (``target: {kind: llvm}`` →
``--target '{"kind": "llvm"}'``; ``model: [{name: mlp, batch: 8}]``). Only plain YAML (safe_load):
no tags, no Python objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


class ArgFileError(ValueError):
    pass


def expand(argv: list[str]) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if arg.startswith("@") and arg.endswith((".yaml", ".yml")):
            out += options_from_file(Path(arg[1:]))
        else:
            out.append(arg)
    return out


def options_from_file(path: Path) -> list[str]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ArgFileError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ArgFileError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ArgFileError(f"{path} must hold a mapping of option names to values")
    args: list[str] = []
    for name, value in data.items():
        args += _option(str(name), value, path)
    return args


def _option(name: str, value: Any, path: Path) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    if isinstance(value, list):
        return [part for item in value for part in _option(name, item, path)]
    if isinstance(value, (str, int, float)):
        return [flag, str(value)]
    if isinstance(value, dict):
        try:
            return [flag, json.dumps(value, sort_keys=True)]
        except TypeError:  # dates and other non-JSON YAML scalars
            raise ArgFileError(f"{path}: option {name!r} holds a value that is not plain JSON data") from None
    raise ArgFileError(f"{path}: option {name!r} must be a scalar, a mapping or a list of them")
