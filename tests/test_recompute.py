"""A transfer that recomputes a reduction for every element of its consumer gets its compute locations moved out
(``hooks.metaschedule.recompute``); an exact hit keeps what was measured. Real TVM builds and runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks.kernels.identity import plain_json, workload_module
from schedhub.hooks.metaschedule.recompute import stores
from schedhub.registry import LocalRegistry, Record, record_key
from schedhub.tuner.networks.models import kernels

from .networks import use_transfers as use
from .test_hooks import CPU, run


class Softmax(nn.Module):
    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.softmax(x, axis=-1)


def export(cols: int | str) -> tvm.IRModule:
    mod, _ = Softmax().export_tvm({"forward": {"x": nn.spec.Tensor((8, cols), "float32")}})
    return mod


def recomputing_record(cols: int) -> Record:
    """A record of the softmax at ``cols`` columns that computes each row's maximum under the loop over the row's
    elements (MetaSchedule's ``SampleComputeLocation``, decided 1): the maximum again for every element."""
    kernel = next(k for k in kernels(export(cols), CPU, NO_REWRITES) if k.identity.op == "softmax")
    sch = tvm.s_tir.Schedule(workload_module(kernel.identity.workload))
    maximum = sch.get_sblock("T_softmax_maxelem")
    sch.compute_at(maximum, sch.sample_compute_location(maximum, decision=1))
    return Record(kernel.identity, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), [1e-5], {"tuner": "test"})


def softmax_kernel(registry: LocalRegistry, cols: int | str, **options: object) -> tvm.tirx.PrimFunc:
    with use(registry, CPU, link=False, **options):  # type: ignore[arg-type]
        lowered = relax.get_pipeline("schedhub")(export(cols))
    return next(f for gv, f in lowered.functions_items() if gv.name_hint == "softmax")


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("cols", [64, "n"])
def test_a_transfer_that_recomputes_a_reduction_per_element_has_it_moved_out(tmp_path: Path, cols: int | str) -> None:
    """Tuned at 16 columns, the record stores 4.75x what the unscheduled softmax does; replayed at 64 it would store
    17x (at a symbolic width, as many at 128). Served, the maximum is computed once a row: no more stores than twice
    the unscheduled kernel's, and right at every width. ``relocate=False`` serves it as recorded."""
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(recomputing_record(16))
        served = stores(softmax_kernel(reg, cols))
        as_recorded = stores(softmax_kernel(reg, cols, relocate=False))
        unscheduled = stores(softmax_kernel(reg, cols, transfer=False, layout="given", prepack=False))  # no transfer: as if nothing were near
        with use(reg, CPU) as session:
            ex = tvm.compile(export(cols), CPU)
    assert served is not None and as_recorded is not None and unscheduled is not None
    assert served <= 2 * unscheduled < as_recorded
    assert {k.op: k.outcome for k in session.report.kernels}["softmax"] == "transfer"
    for width in [64] if cols == 64 else [1, 7, 64, 100]:
        x = np.random.default_rng(width).standard_normal((8, width)).astype("float32")
        np.testing.assert_allclose(run(ex, x, []), softmax(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fingerprint", [None, "tvm=0.26.0;tvm-ffi=0.1.9;libtvm=0123456789abcdef"])
def test_a_record_of_the_kernels_own_shape_keeps_its_compute_locations(tmp_path: Path, fingerprint: str | None) -> None:
    """The record at its own width is what was measured there: served as it is, recomputing, as an exact hit and as
    the transfer of another compiler build's record of the same workload."""
    recorded = recomputing_record(16)
    if fingerprint is not None:
        ident = recorded.identity
        recorded = Record.from_obj(recorded.to_dict() | {"fingerprint": fingerprint, "key": record_key(fingerprint, ident.target, ident.workload)})
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(recorded)
        served = stores(softmax_kernel(reg, 16))
        with use(reg, CPU) as session:
            tvm.compile(export(16), CPU)
    assert {k.op: k.outcome for k in session.report.kernels}["softmax"] == ("hit" if fingerprint is None else "transfer")
    kernel = next(k for k in kernels(export(16), CPU, NO_REWRITES) if k.identity.op == "softmax")
    unscheduled = stores(workload_module(kernel.identity.workload)["main"])
    assert served is not None and unscheduled is not None and served > 2 * unscheduled
