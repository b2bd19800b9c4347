"""schedhub.tuner: tune workloads with MetaSchedule on a Ray cluster and push them to a registry.

- :func:`cluster.start` joins a Ray cluster or starts a local one (the embedded default);
- :func:`tune_workload` searches one workload (builds as parallel CPU tasks, measurements under
  an exclusive per-device resource), then verifies and re-measures what it publishes;
- :class:`Worker` drains the registry's miss queue with leases; :func:`tune_many` tunes a list;
- :mod:`.networks.plan` turns models (shipped, ONNX, PyTorch) and shape sweeps into kernels.

Importing this package imports neither TVM nor Ray; its submodules do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers; at run time __getattr__ imports them (ruff cannot read a computed __all__)
    from .workloads.dispatch import BulkSummary, tune_many  # noqa: F401
    from .workloads.search import ToolchainMismatch, TuneOptions, TuneResult, tune_workload  # noqa: F401
    from .worker import Worker  # noqa: F401

_EXPORTS = {
    "TuneOptions": "workloads.search", "TuneResult": "workloads.search", "tune_workload": "workloads.search", "ToolchainMismatch": "workloads.search",
    "Worker": "worker", "tune_many": "workloads.dispatch", "BulkSummary": "workloads.dispatch",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(name)


__all__ = sorted(_EXPORTS)
