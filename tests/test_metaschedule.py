"""TVM side of identity and the MetaSchedule bridge, with real Relax models and real traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tvm  # the test extra installs it: a missing TVM must fail, not skip  # noqa: E402

from click.testing import CliRunner  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend import nn  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from schedhub.cli.main import cli  # noqa: E402
from schedhub.hooks.kernels.identity import target_from_text, workload_identity, workload_module  # noqa: E402
from schedhub.hooks.metaschedule.msdb import record_from_tuning_record, tuning_record  # noqa: E402
from schedhub.registry import LocalRegistry, Record, ServerThread  # noqa: E402

from .conftest import TOKEN  # noqa: E402

CPU = tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})


class Small(nn.Module):
    def __init__(self) -> None:
        self.l1 = nn.Linear(64, 128)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.relu(self.l1(x))


class Bigger(nn.Module):
    def __init__(self) -> None:
        self.first = nn.Linear(64, 128)
        self.head = nn.Linear(128, 10)

    def forward(self, inputs: nn.Tensor) -> nn.Tensor:
        return self.head(nn.relu(self.first(inputs)))


def kernels(model: nn.Module, arg: str, batch: int = 4, target: tvm.target.Target = CPU) -> dict:
    mod, _ = model.export_tvm({"forward": {arg: nn.spec.Tensor((batch, 64), "float32")}})
    with target:
        fused = relax.get_pipeline("zero")(mod)
    return {t.task_name: t.dispatched[0] for t in ms.relax_integration.extract_tasks(fused, target)}


def scheduled_record(mod: tvm.IRModule, run_secs: float, tile: int) -> ms.database.TuningRecord:
    sch = tvm.s_tir.Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("matmul"))
    jo, ji = sch.split(j, factors=[None, tile])
    sch.reorder(i, jo, k, ji)
    sch.vectorize(ji)
    return sch.trace, run_secs


def test_one_layer_in_two_models_has_one_key_and_targets_never_share() -> None:
    a, b = kernels(Small(), "x"), kernels(Bigger(), "inputs")
    ia = workload_identity(a["fused_matmul_add_relu"], CPU, "fused_matmul_add_relu")
    ib = workload_identity(b["fused_matmul_add_relu"], CPU, "fused_matmul_add_relu")
    assert ia.key == ib.key and "arg0" in ia.workload and "inputs" not in ib.workload
    other_cpu = tvm.target.Target({"kind": "llvm", "mcpu": "skylake", "num-cores": 2})
    assert workload_identity(a["fused_matmul_add_relu"], other_cpu).key != ia.key
    assert workload_identity(kernels(Small(), "x", batch=8)["fused_matmul_add_relu"], CPU).key != ia.key
    assert tvm_ffi.structural_equal(workload_module(ia.workload), tvm.IRModule({"main": a["fused_matmul_add_relu"]["main"]}))
    assert target_from_text(ia.target).export()["mcpu"] == "znver1"


def test_metaschedule_database_push_pull_round_trip(tmp_path: Path) -> None:
    mod = kernels(Small(), "x")["fused_matmul_add_relu"]
    source = tmp_path / "tuned"
    source.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(source))
    workload = db.commit_workload(mod)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    for tile, secs in ((4, 3e-4), (16, 1e-4), (8, 2e-4)):
        trace, run_secs = scheduled_record(mod, secs, tile)
        db.commit_tuning_record(ms.database.TuningRecord(trace, workload, [run_secs], CPU, args))

    with ServerThread(tmp_path / "served", tokens={TOKEN: "t"}, sync=False) as srv:
        pushed = CliRunner().invoke(cli, ["push", str(source), "-r", srv.url, "--token", TOKEN], catch_exceptions=False)
        assert "pushed 3 records" in pushed.output
        out = tmp_path / "pulled"
        pulled = CliRunner().invoke(cli, ["pull", "-r", srv.url, "-o", str(out), "--format", "metaschedule"], catch_exceptions=False)
        assert "pulled 3 records" in pulled.output

        first = stored(tmp_path / "served")
    with ServerThread(tmp_path / "again", tokens={TOKEN: "t"}, sync=False) as srv:  # and back: op names and provenance survive
        CliRunner().invoke(cli, ["push", str(out), "-r", srv.url, "--token", TOKEN], catch_exceptions=False)
        again = stored(tmp_path / "again")
    assert again.keys() == first.keys()
    assert all(again[t].identity.op == first[t].identity.op and again[t].provenance == first[t].provenance for t in first)
    (out / "schedhub_records.jsonl").write_text('{"workload_id": 1}\nnot json\n' + json.dumps(
        {"workload_id": next(iter(first.values())).identity.workload_id, "trace_id": next(iter(first)), "op": "x" * 10_000, "provenance": {}}) + "\n")
    from schedhub.hooks.metaschedule.msdb import read_json_database

    hostile = {r.trace_id: r for r in read_json_database(out)}  # a damaged or hostile sidecar: records as MetaSchedule has them
    assert hostile.keys() == first.keys() and all(r.identity.op != "x" * 10_000 for r in hostile.values())

    loaded = ms.database.JSONDatabase(work_dir=str(out), allow_missing=False)
    assert len(loaded.get_all_tuning_records()) == 3
    # the user's own module (with its own parameter names) finds the best record in the pulled database
    best = loaded.query_tuning_record(mod, CPU, "main")
    assert best is not None and float(best.run_secs[0]) == pytest.approx(1e-4)
    sch = loaded.query_schedule(mod, CPU, "main")
    assert "T.vectorized" in sch.mod.script()


def stored(root: Path) -> dict[str, Record]:
    with LocalRegistry(root) as reg:
        return {r.trace_id: r for s in reg.summaries() for r in reg.get(s.key)}


def test_a_trace_that_does_not_fit_the_module_fails_loudly() -> None:
    kern = kernels(Small(), "x")
    trace, secs = scheduled_record(kern["fused_matmul_add_relu"], 1e-4, 8)
    db_record = ms.database.TuningRecord(trace, ms.database.Workload(kern["fused_matmul_add_relu"]), [secs], CPU, ms.arg_info.ArgInfo.from_prim_func(kern["fused_matmul_add_relu"]["main"]))

    record = record_from_tuning_record(db_record, "fused_matmul_add_relu")
    assert Record.from_bytes(record.to_bytes()) == record
    tuning_record(record)  # replays on its own workload
    with pytest.raises(tvm.s_tir.schedule.ScheduleError):
        tuning_record(record, kern["transpose"])  # no matmul block there
    assert json.loads(record.trace)[0][0][0] == "GetSBlock"


def test_a_pulled_metaschedule_database_loads_whole_and_leaves_out_what_it_cannot_hold(tmp_path: Path) -> None:
    """MetaSchedule loads a JSONDatabase whole or not at all and replays each record on the workload it
    stored for the structure, matching workloads with block names ignored (which traces address blocks
    by: why ``TuningRecord.from_json`` raised ScheduleError in GetSBlock on one CUDA record that replayed
    on its own workload). A pull writes what loads and says what it left out."""
    kern = kernels(Small(), "x")
    mod = kern["fused_matmul_add_relu"]
    trace, secs = scheduled_record(mod, 1e-4, 8)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    good = record_from_tuning_record(ms.database.TuningRecord(trace, ms.database.Workload(mod), [secs], CPU, args), "fused_matmul_add_relu")
    renamed_text = good.identity.workload.replace('T.sblock("matmul")', 'T.sblock("NT_matmul")')
    renamed = Record(workload_identity(workload_module(renamed_text), CPU, "fused_matmul_add_relu"), good.trace.replace('"matmul"', '"NT_matmul"'), [2e-4], {})
    misfit = Record(workload_identity(kern["transpose"], CPU, "transpose"), good.trace, [1e-5], {})
    assert renamed.key != good.key and tuning_record(renamed) is not None  # a record that replays on its own workload
    memory = ms.database.MemoryDatabase()
    memory.commit_workload(mod)
    assert memory.has_workload(workload_module(renamed_text))  # ...which MetaSchedule takes for the first one's
    with pytest.raises(tvm.s_tir.schedule.ScheduleError, match="NT_matmul"):  # the block named, not "(not rendered)"
        tuning_record(renamed, mod)

    with LocalRegistry(tmp_path / "store") as reg:
        for record in (good, renamed, misfit):  # in this order: the change feed pulls the first one first
            reg.put(record)
    out = tmp_path / "db"
    pulled = CliRunner().invoke(cli, ["pull", "-r", str(tmp_path / "store"), "-o", str(out), "--format", "metaschedule"], catch_exceptions=False)
    assert pulled.exit_code == 0, pulled.output
    assert "pulled 1 records" in pulled.output and "left out 2 records MetaSchedule could not load" in pulled.output
    assert f"{renamed.trace_id}: ValueError: MetaSchedule takes its workload for another one" in pulled.output
    assert f"{misfit.trace_id}: ScheduleError" in pulled.output
    loaded = ms.database.JSONDatabase(work_dir=str(out), allow_missing=False)  # loads: nothing in it fails to replay
    assert [float(r.run_secs[0]) for r in loaded.get_all_tuning_records()] == [pytest.approx(1e-4)]
    assert "T.vectorized" in loaded.query_schedule(workload_module(renamed_text), CPU, "main").mod.script()  # serves the renamed kernel too
