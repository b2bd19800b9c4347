"""Shared fixtures: records built from real canonical fields, real stores, a real server."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedhub.registry import SCHEMA_VERSION, Identity, LocalRegistry, Principal, Record, RegistryClient, ServerThread, canonical_target, record_key

TOKEN = "s3cret-token"
TARGET = canonical_target({"kind": "llvm", "mcpu": "znver5", "num-cores": 2, "keys": ["cpu"]})
FINGERPRINT = "tvm=0.27.0.post1;test"
#: What a tiny tuning budget needs of ``schedhub tune | worker | submit``: a small evolutionary population and brief
#: timings of the schedules to publish (MetaSchedule's 512 and 100 ms repeats cost a 4-trial job ~5 s of its ~7)
QUICK_SEARCH = {"population": 64, "final_repeat_ms": 10}
QUICK_FLAGS = [arg for name, value in QUICK_SEARCH.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


@pytest.fixture(scope="session", autouse=True)
def _tensor_intrinsics_imported_cheaply() -> None:
    """Where the collected tests import TVM: its tensor intrinsics imported once the cheap way, before any test makes a
    MetaSchedule ``TuneContext`` (which imports them the slow way: about 100 s on the first, in this process)."""
    import sys

    if "tvm" in sys.modules:
        from schedhub.hooks.kernels.intrinsics import load_tensor_intrinsics

        load_tensor_intrinsics()


def make_record(workload: int, secs: float, variant: int = 0, *, op: str | None = None, target: str = TARGET, provenance: dict | None = None) -> Record:
    """A valid record: workload ``workload`` (its text decides the key), schedule ``variant``."""
    text = f"# workload {workload}\n@T.prim_func\ndef main(arg0: T.Buffer(({workload}, 64), 'float32')): pass\n"
    trace = [[["GetSBlock", [], ["matmul", "main"], ["b0"]], ["Split", ["l1", "None", 4 + variant], [], ["l2", "l3"]]], []]
    return Record.from_obj({
        "key": record_key(FINGERPRINT, target, text), "schema": SCHEMA_VERSION, "fingerprint": FINGERPRINT,
        "target": target, "workload": text, "op": op or f"fused_op{workload % 3}",
        "args_info": [["TENSOR", "float32", [workload, 64]]], "trace": json.dumps(trace),
        "run_secs": [secs, secs * 1.01], "provenance": provenance or {"host_cpu": "test"},
    })  # fmt: skip


def of_structure(workload: int, rank: int, target: str = TARGET) -> Identity:
    """make_record(workload)'s identity with a buffer of ``rank`` dimensions: workloads of one rank share a structure."""
    identity = make_record(workload, 1e-3, target=target).identity
    text = identity.workload.replace(f"({workload}, 64)", "(" + ", ".join([str(workload)] + ["64"] * (rank - 1)) + ")")
    args_info = [["TENSOR", "float32", [workload] + [64] * (rank - 1)]]
    return Identity.from_obj({**identity.to_dict(), "workload": text, "key": record_key(identity.fingerprint, target, text), "args_info": args_info})


#: A trace today's checks refuse and a registry without the object-graph check kept: a string holding an object graph
#: of a type TVM would load unchecked (see ``registry.check_object_graphs``)
UNCHECKED_TRACE = json.dumps([[["GetSBlock", [], ["matmul", "main"], ["b0"]],
                               ["TransformLayout", ["b0"], [0, 0, json.dumps({"root_index": 0, "nodes": [{"type": "ir.GlobalVar", "data": {}}]}),
                                                            "None", True], []]], []])  # fmt: skip


def store_unchecked(root: str | os.PathLike[str], record: Record, trace: str = UNCHECKED_TRACE) -> None:
    """Give a stored record (key and trace id unchanged) another trace, as a registry without one of today's checks
    would have kept it: the store under ``root`` is written directly (a server on it shares the environment)."""
    from schedhub.registry import packb, unpackb

    with LocalRegistry(root, sync=False) as reg, reg.store.write() as txn:
        value = unpackb(txn.get(record.key.encode(), db=reg.store.dbs["records"]))
        entry = next(e for e in value["entries"] if e["tid"] == record.trace_id)
        entry["rec"] = packb({**record.to_dict(), "trace": trace})
        txn.put(record.key.encode(), packb(value), db=reg.store.dbs["records"])


@pytest.fixture(autouse=True, scope="session")
def kernel_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The hook's per-machine kernel cache in a folder of the test run (subprocesses inherit it), never the user's."""
    path = tmp_path_factory.mktemp("kernel-cache")
    previous = os.environ.get("SCHEDHUB_CACHE_DIR")
    os.environ["SCHEDHUB_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("SCHEDHUB_CACHE_DIR", None)
    else:
        os.environ["SCHEDHUB_CACHE_DIR"] = previous


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        yield reg


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    """A real uvicorn server on 127.0.0.1 with one write token."""
    with ServerThread(tmp_path / "served", tokens={TOKEN: "tester"}, sync=False) as srv:
        yield srv


@contextlib.contextmanager
def clients_by_name(url: str, tokens: dict[str, Principal]) -> Iterator[dict[str, RegistryClient]]:
    """One client per principal of ``tokens`` (token → Principal), by the principal's name."""
    clients = {p.name: RegistryClient(url, token=tok, timeout=10) for tok, p in tokens.items()}
    try:
        yield clients
    finally:
        for c in clients.values():
            c.close()


@pytest.fixture
def client(server: ServerThread) -> Iterator[RegistryClient]:
    with RegistryClient(server.url, token=TOKEN, timeout=5) as c:
        yield c
