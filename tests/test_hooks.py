"""The compile hook with real TVM builds and a real registry server."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import numpy as np
import pytest

import tvm  # the test extra installs it: a missing TVM must fail, not skip  # noqa: E402

from tvm import relax  # noqa: E402
from tvm.relax.frontend import nn  # noqa: E402

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.hooks import ANSWER_DEADLINE, IdleCoresWarning, RegistryFallbackWarning, target_text, use, workload_identity  # noqa: E402
from schedhub.hooks.kernels.measure import host_cpu  # noqa: E402
from schedhub.hooks.kernels.identity import workload_module  # noqa: E402
from schedhub.tuner.networks.models import kernels  # noqa: E402
from schedhub.registry import InvalidRecord, Record, RegistryClient, ServerThread, packb, record_key  # noqa: E402

from .conftest import TOKEN  # noqa: E402
from .scripted_server import Reply, ScriptedServer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CPU = tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})
OTHER_CPU = tvm.target.Target({"kind": "llvm", "mcpu": "skylake", "num-cores": 2})
#: What the hand-tuned records here were tuned with; named where a compile meets a network the registry knows nothing of,
#: which on CPU (AVX2) would otherwise be compiled, and queued, as the CPU is best tuned (NHWC prepacked: test_rewrite_choice).
GIVEN: dict[str, Any] = {"layout": "given", "prepack": False}


class MLP(nn.Module):
    def __init__(self) -> None:
        self.l1 = nn.Linear(64, 128)
        self.l2 = nn.Linear(128, 10)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.l2(nn.relu(self.l1(x)))


class SharesFirstLayer(nn.Module):
    """Another model whose first layer has the same shapes as MLP.l1 (other names)."""

    def __init__(self) -> None:
        self.encoder = nn.Linear(64, 128)
        self.head = nn.Linear(128, 32)

    def forward(self, features: nn.Tensor) -> nn.Tensor:
        return nn.sigmoid(self.head(nn.relu(self.encoder(features))))


def export(model: nn.Module, arg: str) -> tuple[tvm.IRModule, list[np.ndarray]]:
    mod, spec = model.export_tvm({"forward": {arg: nn.spec.Tensor((4, 64), "float32")}})
    rng = np.random.default_rng(0)
    params = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for _, p in spec]
    return mod, params


def run(ex: relax.VMExecutable, x: np.ndarray, params: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["forward"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()


def mlp_reference(x: np.ndarray, p: list[np.ndarray]) -> np.ndarray:
    return np.maximum(x @ p[0].T + p[1], 0) @ p[2].T + p[3]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RegistryClient]]:
    with ServerThread(tmp_path_factory.mktemp("hooked"), tokens={TOKEN: "t"}, sync=False) as srv, RegistryClient(srv.url, token=TOKEN) as client:
        yield srv.url, client


@pytest.fixture(scope="module")
def tuned(registry: tuple[str, RegistryClient]) -> dict:
    """Compile MLP against an empty registry, then tune its misses in another process."""
    url, client = registry
    mod, params = export(MLP(), "x")
    with use(client, CPU, **GIVEN) as session:
        untuned = tvm.compile(mod, CPU)
    first = session.report
    queued = [client.job(j["key"]) for j in client.jobs("pending")]  # listings are summaries: fetch each whole
    tuner = subprocess.run([sys.executable, "-m", "tests.hand_tuner", url, TOKEN], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert tuner.returncode == 0, tuner.stderr
    return {"first": first, "queued": queued, "untuned": untuned, "mod": mod, "params": params}


def test_an_empty_registry_misses_every_kernel_and_queues_them(tuned: dict) -> None:
    first = tuned["first"]
    assert len(first.kernels) == 4 and first.hits == 0 and first.misses == 4
    assert first.lookups == 1  # one batch request for the whole model
    assert sorted(j["op"] for j in tuned["queued"]) == sorted(k.op for k in first.kernels)
    assert all(j["workload"].startswith("@I.ir_module") for j in tuned["queued"])  # tunable without the model
    x = np.random.default_rng(1).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(run(tuned["untuned"], x, tuned["params"]), mlp_reference(x, tuned["params"]), rtol=1e-4, atol=1e-4)


def test_recompiling_hits_applies_the_schedules_and_stays_correct(registry: tuple[str, RegistryClient], tuned: dict) -> None:
    url, client = registry
    assert client.jobs("pending") == [] and len(client.jobs("done")) == 4
    with use(client, CPU) as session:
        ex = tvm.compile(tuned["mod"], CPU)  # the user's unchanged call
        lowered = relax.get_pipeline("schedhub")(tuned["mod"])  # the explicit spelling
    assert session.reports[0].hits == 4 and session.reports[0].misses == 0
    # each scheduled kernel's machine code comes from this machine's object cache, linked into the build
    assert not [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert [m.kind for m in lowered.attrs["external_mods"]] == ["static_library"] * 4
    with use(client, CPU, link=False):
        unlinked = relax.get_pipeline("schedhub")(tuned["mod"])
    kernels = {gv.name_hint: f for gv, f in unlinked.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert len(kernels) == 4 and all(f.attrs.get("tirx.is_scheduled") for f in kernels.values())
    x = np.random.default_rng(2).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(run(ex, x, tuned["params"]), mlp_reference(x, tuned["params"]), rtol=1e-4, atol=1e-4)


def test_a_second_model_sharing_a_layer_hits_on_that_layer(registry: tuple[str, RegistryClient], tuned: dict) -> None:
    _, client = registry
    mod, _ = export(SharesFirstLayer(), "features")
    with use(client, CPU) as session:
        tvm.compile(mod, CPU)
    outcomes = {k.op: k.outcome for k in session.report.kernels}
    assert outcomes["fused_matmul_add_relu"] == "hit" and outcomes["transpose"] == "hit"
    # its own head layer is new: never a hit, and it is queued; untimed on a CPU it runs the rules' schedule, ahead of
    # the MLP's layers of the same loop structure (rules=False: they transfer to it)
    assert outcomes["fused_matmul1_add1_tir_sigmoid"] == "miss" and session.report.misses_reported == 2
    with use(client, CPU, rules=False, report_misses=False) as session:
        tvm.compile(mod, CPU)
    assert {k.op: k.outcome for k in session.report.kernels}["fused_matmul1_add1_tir_sigmoid"] == "transfer"


def test_outside_use_tvm_is_untouched(registry: tuple[str, RegistryClient], tuned: dict) -> None:
    _, client = registry
    before = client.stats()["since_start"].get("hits", 0)
    tvm.compile(tuned["mod"], CPU)
    assert client.stats()["since_start"].get("hits", 0) == before


def test_a_target_as_a_dict_or_a_target_object_gets_the_same_keys(tuned: dict) -> None:
    as_dict = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
    assert target_text(as_dict) == target_text(tvm.target.Target(as_dict)) and '"keys":["cpu"]' in target_text(as_dict)
    identity = kernels(tuned["mod"], as_dict, NO_REWRITES)[0].identity
    kernel = workload_module(identity.workload)
    assert workload_identity(kernel, as_dict).key == workload_identity(kernel, tvm.target.Target(as_dict)).key == identity.key


def test_a_record_of_a_kernel_the_hook_identified_is_read_without_its_workload_checked_again(tuned: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook prints its kernels itself, so it vouches for their identities: a registry's record carrying one exactly
    is read without parsing the workload (2.5 ms a kernel, once a process); a record of any other text is checked."""
    from schedhub.registry import _records

    monkeypatch.setattr(_records, "_CHECKED_IDENTITIES", {})
    identity = workload_identity(workload_module(kernels(tuned["mod"], CPU, NO_REWRITES)[0].identity.workload), CPU)
    record = Record(identity, json.dumps([[], []]), [1e-3], {})
    monkeypatch.setattr(_records, "check_workload_source", lambda text: pytest.fail("checked again"))
    assert Record.from_bytes(record.to_bytes()).identity == identity
    other = identity.workload.replace("def main(", "def main( ", 1)
    with pytest.raises(BaseException, match="checked again"):
        Record.from_bytes(packb({**record.to_dict(), "workload": other, "key": record_key(identity.fingerprint, identity.target, other)}))


def test_a_workload_text_is_parsed_once_a_process_and_each_caller_gets_a_module_of_its_own(tuned: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuning worker parsed every workload of its cost model's log again each round (0.1-0.2 s a convolution)."""
    text = kernels(tuned["mod"], CPU, NO_REWRITES)[0].identity.workload
    first = workload_module(text)
    monkeypatch.setattr(tvm.script, "from_source", lambda *a, **k: pytest.fail("parsed again"))
    second = workload_module(text)
    assert second is not first
    tvm.ir.assert_structural_equal(first, second)
    second["main"] = second["main"].with_attr("global_symbol", "changed")  # one caller's module changed: not the other's
    assert workload_module(text)["main"].attrs["global_symbol"] == first["main"].attrs["global_symbol"] == "main"
    for _ in range(2):  # a refused text is refused every time, never parsed
        with pytest.raises(InvalidRecord, match="Import is not allowed"):
            workload_module("import os\n" + text)


def test_a_record_for_another_target_never_hits_and_serves_only_as_a_transfer(tmp_path: Path, tuned: dict, registry: tuple[str, RegistryClient]) -> None:
    _, source = registry
    other = target_text(OTHER_CPU)
    with ServerThread(tmp_path, tokens={TOKEN: "t"}, sync=False) as srv, RegistryClient(srv.url, token=TOKEN) as client:
        for summary in source.summaries():
            for rec in source.get(summary.key):
                moved = rec.to_dict() | {"target": other, "key": record_key(rec.identity.fingerprint, other, rec.identity.workload)}
                client.put(Record.from_obj(moved))
        with use(client, CPU, transfer=False) as session:
            tvm.compile(tuned["mod"], CPU)
        assert session.report.hits == 0 and session.report.misses == 4
        with use(client, CPU) as session:  # untimed, the rules' schedules rank ahead of another CPU's records
            tvm.compile(tuned["mod"], CPU)
        assert session.report.hits == 0 and session.report.transfers == 0 and session.report.misses == 4
        with use(client, CPU, rules=False) as session:  # the other CPU's records replay here: transfers, and the misses are still queued
            ex = tvm.compile(tuned["mod"], CPU)
        assert session.report.hits == 0 and session.report.transfers == 4 and session.report.misses_reported == 4
        assert all(k.detail.startswith("target:") for k in session.report.kernels)
        x = np.random.default_rng(3).standard_normal((4, 64)).astype("float32")
        np.testing.assert_allclose(run(ex, x, tuned["params"]), mlp_reference(x, tuned["params"]), rtol=1e-4, atol=1e-4)
        with use(client, OTHER_CPU) as session:
            tvm.compile(tuned["mod"], OTHER_CPU)
        assert session.report.hits == 4


def test_a_bogus_cpu_is_one_line_and_another_cpus_misses_are_named_at_compile_time(tmp_path: Path, tuned: dict) -> None:
    """LLVM only printed its own lines for an ``mcpu`` it does not know, and a compile for another CPU model queued misses
    that no worker on this machine would ever take, saying nothing."""
    from schedhub.hooks import UnknownCPU, host_target

    with pytest.raises(UnknownCPU, match="LLVM knows no CPU 'bogus'.*this machine's is"):
        with use(tmp_path / "store", {"kind": "llvm", "mcpu": "bogus"}):
            pass
    elsewhere = tvm.target.Target({"kind": "llvm", "mcpu": "skylake" if host_target()["mcpu"] != "skylake" else "znver3", "num-cores": 2})
    with use(tmp_path / "store", elsewhere) as session:
        tvm.compile(tuned["mod"], elsewhere)
    stranded = [p for p in session.report.problems if "misses queued for" in p]
    assert stranded == [f"{session.report.misses_reported} misses queued for {elsewhere.attrs['mcpu']}: a worker tunes only its own CPU model "
                        f"and this machine is a {host_target()['mcpu']}: run `schedhub worker` on a {elsewhere.attrs['mcpu']} machine, or "
                        "compile for this one (schedhub.hooks.host_target())"]  # fmt: skip
    own = tvm.target.Target(host_target())
    with use(tmp_path / "store", own) as session:  # this machine's own: nothing to say
        tvm.compile(tuned["mod"], own)
    assert not [p for p in session.report.problems if "misses queued for" in p]


def test_a_trace_that_fails_to_replay_falls_back_is_reported_and_verification_quarantines_it(tmp_path: Path, tuned: dict, registry: tuple[str, RegistryClient]) -> None:
    from schedhub.tuner.workloads.verify import verify_job

    _, source = registry
    by_op = {s.op: source.get(s.key)[0] for s in source.summaries()}
    dense, transpose = by_op["fused_matmul_add_relu"], by_op["transpose"]
    broken = [
        Record.from_obj(dense.to_dict() | {"trace": transpose.trace}),  # refers to a block the kernel lacks
        Record.from_obj(dense.to_dict() | {"trace": json.dumps([[["NoSuchInstruction", [], [], []]], []]), "run_secs": [1e-9]}),
    ]
    with ServerThread(tmp_path, tokens={TOKEN: "t"}, sync=False) as srv, RegistryClient(srv.url, token=TOKEN) as client:
        client.put_many(broken)
        with use(client, CPU) as session:
            ex = tvm.compile(tuned["mod"], CPU)
        outcome = {k.op: k.outcome for k in session.report.kernels}
        assert outcome["fused_matmul_add_relu"] == "fallback"
        # a client's failure is a complaint, not a verdict: the records stay until verification confirms it
        assert [r.served.complaints for r in client.get(dense.key)] == [1, 1]
        assert client.stats()["quarantined"] == 0
        leases = client.lease("verifier", max_jobs=5, lease_secs=60, tasks=("verify",))
        assert sorted(l.job["trace_id"] for l in leases) == sorted(r.trace_id for r in broken)
        for lease in leases:
            verdict = verify_job(lease.job)
            assert verdict["run_secs"] is None and "does not replay" in verdict["reason"]
            assert client.ack(lease.key, lease.lease_id, verdict) == "quarantined"
        assert client.stats()["quarantined"] == 2 and client.get(dense.key) == []
        with use(client, CPU, **GIVEN):
            tvm.compile(tuned["mod"], CPU)
        assert dense.key in {j["key"] for j in client.jobs("pending")}  # back in the queue for tuning
    x = np.random.default_rng(3).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(run(ex, x, tuned["params"]), mlp_reference(x, tuned["params"]), rtol=1e-4, atol=1e-4)


def _silent_server() -> tuple[socket.socket, threading.Event]:
    """Accepts connections and never answers: a registry that hangs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()

    def hold() -> None:
        held = []
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                pass
        for conn in held:
            conn.close()

    threading.Thread(target=hold, daemon=True).start()
    return sock, stop


# What a wrong or sick registry URL answers, and how long the hook may wait for it (× its timeout)
BROKEN = {
    "down": 1, "hangs": 1,
    "trickles": ANSWER_DEADLINE + 1,  # a byte every 0.1 s: a read timeout alone never fires
    "serves a web page": 1,  # a URL that is not the registry's: JSONDecodeError out of tvm.compile before
    "answers garbage": 1,
}  # fmt: skip


@contextlib.contextmanager
def _broken_registry(kind: str) -> Iterator[str]:
    if kind == "down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: connection refused
        yield url
    elif kind == "hangs":
        sock, stop = _silent_server()
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            stop.set()
            sock.close()
    else:
        reply = {"trickles": Reply(200, "application/msgpack", b"\x80" * 1000, byte_every=0.1),
                 "serves a web page": Reply(200, "text/html", b"<html>It works!</html>"),
                 "answers garbage": Reply(200, "application/msgpack", packb({"records": [1, 2], "entries": "x"}))}[kind]  # fmt: skip
        with ScriptedServer(reply) as scripted:
            yield scripted.url


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_dead_hanging_or_wrong_registry_never_breaks_the_compile(kind: str, tuned: dict) -> None:
    with _broken_registry(kind) as url, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with use(url, CPU, timeout=0.5) as session:
            ex = tvm.compile(tuned["mod"], CPU)
            tvm.compile(tuned["mod"], CPU)  # a second build in the block does not try again
    assert len([w for w in caught if issubclass(w.category, RegistryFallbackWarning)]) == 1
    assert sum(r.lookups for r in session.reports) == 1
    assert session.reports[0].lookup_secs < 0.5 * BROKEN[kind] + 0.5  # what the timeout promises, not more
    assert all(k.outcome == "offline" for r in session.reports for k in r.kernels)
    kernels = len(session.reports[0].kernels)
    assert " 0 misses, 0 fallbacks (1 lookup in" in session.reports[0].summary()  # not misses, as if the registry had answered
    # a registry that is down still leaves the CPU's kernels the rules' schedules (hooks.metaschedule.rules), not the unscheduled default
    assert f"the registry could not be reached: {kernels} kernels: {kernels} got the CPU rules' schedules, 0 TVM's default ones" in session.reports[0].summary()
    assert all(k.detail.startswith("ruled:") for k in session.reports[0].kernels)
    x = np.random.default_rng(4).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(run(ex, x, tuned["params"]), mlp_reference(x, tuned["params"]), rtol=1e-4, atol=1e-4)


def test_a_local_store_serves_relax_build_and_other_threads_are_untouched(tmp_path: Path, tuned: dict, registry: tuple[str, RegistryClient]) -> None:
    _, source = registry
    from schedhub.registry import LocalRegistry

    with LocalRegistry(tmp_path / "local") as local:
        local.put_many(rec for s in source.summaries() for rec in source.get(s.key))
    elsewhere: list = []
    with use(tmp_path / "local", CPU) as session:
        ex = relax.build(tuned["mod"], CPU)
        thread = threading.Thread(target=lambda: elsewhere.append(relax.get_pipeline("default")))
        thread.start()
        thread.join()
        inside = relax.get_pipeline("default")
    after = relax.get_pipeline("default")
    assert "SchedhubPipeline" in str(inside)
    assert session.report.hits == 4 and session.report.lookups == 1
    assert "SchedhubPipeline" not in str(elsewhere[0]) and "SchedhubPipeline" not in str(after)
    x = np.random.default_rng(5).standard_normal((4, 64)).astype("float32")
    np.testing.assert_allclose(run(ex, x, tuned["params"]), mlp_reference(x, tuned["params"]), rtol=1e-4, atol=1e-4)


MORE_THAN_THE_MACHINE = str(2 * (os.cpu_count() or 1))  # not far more: 64 threads on 2 cores made TVM's import take 16 s


@pytest.mark.parametrize("env", [{}, {"TVM_NUM_THREADS": MORE_THAN_THE_MACHINE}, {"TVM_NUM_THREADS": "2x"}, {"OMP_NUM_THREADS": "1"},
                                 {"TVM_NUM_THREADS": "-3", "OMP_NUM_THREADS": "2"}])  # fmt: skip
def test_the_thread_count_the_hook_reads_is_the_one_tvms_pool_starts_with(env: dict[str, str]) -> None:
    """Read from the environment as TVM does (starting the pool to ask would fix its size too early): a fresh process each."""
    clean = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")} | env
    code = ("import tvm\nfrom schedhub.hooks import runtime_threads\npredicted = runtime_threads()\n"
            "print(predicted, int(tvm.get_global_func('runtime.NumThreads')()))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out[0] == out[1], f"{env}: predicted {out[0]}, TVM's pool runs {out[1]}"


def test_a_target_whose_cores_tvm_would_leave_idle_is_warned_about_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cores = min(2, len(os.sched_getaffinity(0)))
    if cores < 2:
        pytest.skip("needs a machine with two cores")
    here = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": cores})
    mod, _ = export(MLP(), "x")

    def warnings_compiling(target: tvm.target.Target, threads: str) -> tuple[list[str], list[str]]:
        monkeypatch.setenv("TVM_NUM_THREADS", threads)
        with warnings.catch_warnings(record=True) as caught, use(tmp_path / "store", target, report_misses=False) as session:
            warnings.simplefilter("always")
            tvm.compile(mod, target)
            tvm.compile(mod, target)
        return [str(w.message) for w in caught if issubclass(w.category, IdleCoresWarning)], [p for r in session.reports for p in r.problems]

    said, problems = warnings_compiling(here, "1")
    assert len(said) == 1 and f"TVM_NUM_THREADS={cores}" in said[0] and len(problems) == 1 and problems[0] in said[0]
    assert warnings_compiling(here, str(cores)) == ([], [])
    elsewhere = tvm.target.Target({"kind": "llvm", "mcpu": "skylake" if host_cpu() != "skylake" else "znver1", "num-cores": 16})
    assert warnings_compiling(elsewhere, "1") == ([], [])  # built for another machine: this process's threads say nothing


class Uneven(nn.Module):
    """Kernels whose cost order is neither the model's order nor their names': a small layer called three
    times (3 × 16k multiply-adds, 16k each), a wide one once (64k), a head once (24k)."""

    def __init__(self) -> None:
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(3)])
        self.wide = nn.Linear(64, 256)
        self.head = nn.Linear(256, 24)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        for block in self.blocks:
            x = nn.relu(block(x))
        return self.head(nn.sigmoid(self.wide(x)))


def test_a_compile_queues_its_misses_costliest_first_counting_every_call(tmp_path: Path) -> None:
    """The queue hands out one caller's jobs in the order they were first reported, so a worker's first passes follow the order the
    misses were reported: the costliest kernel of the module first (calls × its work on the default schedule)."""
    from schedhub.registry import LocalRegistry

    mod, _ = export(Uneven(), "x")
    layers = {(64, 256): "wide", (64, 64): "block", (256, 24): "head"}  # by the matmul's weight operand
    found = {k.identity.key: (layers.get(tuple(k.identity.args_info[1][2])) if "matmul" in k.name else None, k.calls) for k in kernels(mod, CPU, NO_REWRITES)}
    assert sorted(v for v in found.values() if v[0]) == [("block", 3), ("head", 1), ("wide", 1)]  # and three transposes
    with LocalRegistry(tmp_path / "store") as store:
        with use(store, CPU, cache=tmp_path / "cache", **GIVEN) as session:
            tvm.compile(mod, CPU)
        assert session.report.misses == len(found)
        leased = [found[lease.job["key"]][0] for lease in store.lease("w", max_jobs=10, lease_secs=60)]
    assert [layer for layer in leased if layer] == ["wide", "block", "head"]  # 64k, 3 × 16k, 24k: not the names' order (wide, head, block)
