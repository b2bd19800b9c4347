"""RegistryDatabase as MetaSchedule uses it: best first, its own commits included, one target rule, a trace's best time."""

from __future__ import annotations

from pathlib import Path

import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from schedhub.hooks import HookSession, RegistryDatabase
from schedhub.registry import LocalRegistry

X86 = tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})
ARM = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72", "num-cores": 2})


def matmul(n: int = 16) -> tvm.IRModule:
    a, b = te.placeholder((n, 16), name="A"), te.placeholder((16, 16), name="B")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((n, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def commit(db: RegistryDatabase, mod: tvm.IRModule, tile: int, run_secs: list[float], target: tvm.target.Target = X86) -> None:
    """Commit ``mod`` split by ``tile`` (one trace per tile) at ``run_secs``, as MetaSchedule's search does."""
    sch = tvm.s_tir.Schedule(mod)
    sch.split(sch.get_loops(sch.get_sblock("matmul"))[1], [None, tile])
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), run_secs, target,
                                                     ms.arg_info.ArgInfo.from_prim_func(mod["main"])))  # fmt: skip


def secs(records: list[ms.database.TuningRecord]) -> list[list[float]]:
    return [[float(s) for s in r.run_secs] for r in records]


@pytest.fixture
def reg(tmp_path: Path):
    with LocalRegistry(tmp_path / "store", sync=False) as r:
        yield r


def test_its_own_commits_are_answered_best_first_among_better_stored_records(reg: LocalRegistry) -> None:
    mod = matmul()
    commit(RegistryDatabase(HookSession(reg)), mod, 8, [4e-5])  # another tuning run stored the better one
    db = RegistryDatabase(HookSession(reg))
    with X86:
        assert secs(db.get_top_k(db.commit_workload(mod), 4)) == [[4e-5]]  # looked up: now cached
    commit(db, mod, 4, [9e-4])
    commit(db, mod, 2, [1e-4])
    with X86:
        assert secs(db.get_top_k(db.commit_workload(mod), 4)) == [[4e-5], [1e-4], [9e-4]]
        assert secs(db.get_top_k(db.commit_workload(mod), 1)) == [[4e-5]]
    assert [float(s) for s in db.query_tuning_record(mod, X86, "main").run_secs] == [4e-5]
    assert db.query_schedule(mod, X86, "main") is not None


def test_a_trace_committed_again_keeps_its_best_time(reg: LocalRegistry) -> None:
    mod = matmul()
    db = RegistryDatabase(HookSession(reg))
    commit(db, mod, 8, [1.0, 2.0, 3.0])
    commit(db, mod, 8, [4.0, 9.0, 8.0])
    with X86:
        assert secs(db.get_top_k(db.commit_workload(mod), 4)) == [[1.0, 2.0, 3.0]]
    commit(db, mod, 8, [0.5])
    with X86:
        assert secs(db.get_top_k(db.commit_workload(mod), 4)) == [[0.5]]
    assert secs(RegistryDatabase(HookSession(reg)).get_all_tuning_records()) == []  # a fresh one has looked nothing up
    fresh = RegistryDatabase(HookSession(reg))
    with X86:
        assert secs(fresh.get_top_k(fresh.commit_workload(mod), 4)) == [[0.5]]  # the registry kept the best too


def test_every_committed_record_is_listed(reg: LocalRegistry) -> None:
    db = RegistryDatabase(HookSession(reg))
    commit(db, matmul(16), 8, [2e-4])
    commit(db, matmul(16), 4, [1e-4])
    commit(db, matmul(32), 8, [3e-4])
    assert sorted(map(tuple, secs(db.get_all_tuning_records()))) == [(1e-4,), (2e-4,), (3e-4,)]


def test_one_target_rule_in_every_method(reg: LocalRegistry) -> None:
    mod = matmul()
    commit(RegistryDatabase(HookSession(reg)), mod, 8, [1e-4], target=X86)
    db = RegistryDatabase(HookSession(reg))
    assert db.query_tuning_record(mod, ARM, "main") is None  # an x86 record is no answer for aarch64
    assert db.query_ir_module(mod, ARM, "main") is None
    with ARM:
        assert not db.has_workload(mod) and db.get_top_k(ms.database.Workload(mod), 4) == []
    with X86:
        assert db.has_workload(mod) and len(db.get_top_k(ms.database.Workload(mod), 4)) == 1
    assert db.query_tuning_record(mod, X86, "main") is not None
    assert db.get_top_k(ms.database.Workload(mod), 4) == []  # no target in scope: no key


def test_a_committed_workload_is_known_and_run_secs_that_are_no_measurement_are_not_kept(reg: LocalRegistry) -> None:
    mod = matmul()
    db = RegistryDatabase(HookSession(reg))
    assert not db.has_workload(mod)
    workload = db.commit_workload(mod)
    assert db.has_workload(mod) and db.commit_workload(mod).same_as(workload)
    for run_secs in ([0.0, 2.0], [], [1e10], [3.0, 1e10]):
        commit(db, mod, 8, run_secs)
    with X86:
        assert db.get_top_k(workload, 4) == []
    assert reg.stats()["keys"] == 0


def test_a_long_op_name_is_kept_under_a_name_every_process_reads_over_http_too(tmp_path: Path) -> None:
    """A workload whose generated op name ran to 545 characters was kept where no other process could read it (a raw
    LMDB error), and over HTTP the first commit raised: the name is now cut to the registry's 200, alike everywhere."""
    from schedhub.registry import MAX_OP, RegistryClient, ServerThread

    long_name = "fused_" + "_".join(f"matmul{i}_add{i}" for i in range(40))
    assert len(long_name) > 500
    mod = matmul()
    mod = tvm.IRModule({"main": mod["main"]})
    with ServerThread(tmp_path / "served", tokens={"t": "tuner"}, sync=False) as srv, RegistryClient(srv.url, token="t") as client:
        for registry in (client, LocalRegistry(tmp_path / "local", sync=False)):
            session = HookSession(registry)
            identity = session.identity(mod, X86, long_name)
            assert len(identity.op) == MAX_OP and identity.op.startswith("fused_matmul0_add0")
            db = RegistryDatabase(session)
            commit(db, mod, 4, [1e-4])
            (stored,) = registry.get(identity.key)  # read back whole, as another process reads it
            assert stored.identity.op == identity.op
            if isinstance(registry, LocalRegistry):
                registry.close()


def test_a_trace_no_compile_would_replay_is_refused_at_commit(reg: LocalRegistry) -> None:
    """A trace over 1,024 instructions was committed and then never answered: it is refused at the commit, saying why."""
    mod = matmul()
    sch = tvm.s_tir.Schedule(mod)
    for _ in range(600):
        sch.get_loops(sch.get_sblock("matmul"))
    db = RegistryDatabase(HookSession(reg))
    record = ms.database.TuningRecord(sch.trace, db.commit_workload(mod), [1e-4], X86, ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
    with pytest.raises(RuntimeError, match="not committed: trace has 1200 instructions, over the limit of 1024"):
        db.commit_tuning_record(record)
    assert not reg.summaries()
