"""How a recorded row (a network, a kernel) is named in the report and its plots."""

from __future__ import annotations

from typing import Any

from schedhub.hooks.rewrites import Rewrites


def rewrites_of(row: dict[str, Any]) -> list[str]:
    """What a row's compile rewrote (``hooks.rewrites``: its ``layout``, ``math``, ``prepack``, ``conv``), in words: none for the defaults."""
    return Rewrites.of_row(row).parts()


def named(row: dict[str, Any]) -> str:
    """A row's network, with what its compile rewrote: "resnet18 (weights prepacked)"."""
    rewrites = rewrites_of(row)
    return f"{row['network']} ({', '.join(rewrites)})" if rewrites else str(row["network"])
