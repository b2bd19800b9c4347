"""The hostile review's attacks, re-run for figures: what each cost before (the review's numbers,
quoted) and what it costs now, on a real server on 127.0.0.1.

    python -m bench.studies.trust [--quick] [--only SECTION ...] [--out FILE]

Writes JSON (``bench/results/<mode>/trust.json``) and prints the table the README and the issue
quote. ``--quick`` fuzzes 1,000 cases instead of 10,000+ and opens 300 slowloris connections, not 900.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.cli.transfer_cmds import pull_into
from schedhub.hooks import use
from schedhub.hooks.kernels.identity import workload_module
from schedhub.registry import Identity, LocalRegistry, Principal, Record, RegistryClient, ServerThread, record_key
from schedhub.tuner.networks import models
from schedhub.hooks.metaschedule.msdb import trace_text

from .. import fuzz
from ..stats import percentile

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})
TOKENS = {"admin": Principal("root", "admin"), "alice": Principal("alice"), "w": Principal("tuner", "worker"), "r": Principal("reader", "read")}


class MatMul(nn.Module):
    def __init__(self) -> None:
        self.w = nn.Parameter((512, 512), "float32")

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.matmul(x, self.w)


def matmul_model() -> tuple[tvm.IRModule, Any]:
    mod, _ = MatMul().export_tvm({"forward": {"x": nn.spec.Tensor((128, 512), "float32")}})
    (kernel,) = models.kernels(mod, CPU, NO_REWRITES)
    return mod, kernel.identity


def scheduled(identity: Any, how: str) -> str:
    """A trace of the matmul kernel: 'tiled' (honest: tiles, vectorized), 'default' (none), 'bomb'."""
    sch = tvm.s_tir.Schedule(workload_module(identity.workload))
    block = sch.get_sblock("matmul")
    i, j, k = sch.get_loops(block)
    if how == "tiled":
        i0, i1 = sch.split(i, [None, 8])
        j0, j1 = sch.split(j, [None, 16])
        sch.reorder(i0, j0, k, i1, j1)
        sch.vectorize(j1)
    elif how == "bomb":
        for loop in (i, j, k):
            sch.unroll(loop)
    return trace_text(sch.trace)


def forward_us(registry: Any, mod: tvm.IRModule, trust: Any = "verified", rounds: int = 5) -> tuple[float, str]:
    """Median forward time of the model compiled through the hook, and the trace it was served."""
    with use(registry, CPU, trust=trust) as session:
        ex = tvm.compile(mod, CPU)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((128, 512)).astype("float32"))
    w = tvm.runtime.tensor(np.random.default_rng(1).standard_normal((512, 512)).astype("float32"))
    timer = vm.time_evaluator("forward", tvm.cpu(), number=20, repeat=rounds)
    return statistics.median(timer(x, w).results) * 1e6, session.report.kernels[0].detail


def poisoning(tmp: Path) -> dict[str, Any]:
    mod, ident = matmul_model()
    honest, poison = Record(ident, scheduled(ident, "tiled"), [1e-3]), Record(ident, scheduled(ident, "default"), [1e-10])
    with ServerThread(tmp / "poison", tokens=TOKENS, sync=False) as srv, RegistryClient(srv.url, token="w") as worker, \
            RegistryClient(srv.url, token="alice") as alice, RegistryClient(srv.url, token="r") as reader:  # fmt: skip
        worker.put(honest)
        clean_us, _ = forward_us(reader, mod)
        alice.put(poison)
        attacked_us, served = forward_us(reader, mod)
        attacked_any_us, served_any = forward_us(reader, mod, trust="any")
        pull_into(reader, tmp / "poison-mirror", "lmdb", None, None, 0)  # a store pulled for offline use
        mirror_us, served_mirror = forward_us(tmp / "poison-mirror", mod)
    with LocalRegistry(tmp / "poison-only") as only:
        only.put(poison)
        poisoned_us, _ = forward_us(only, mod)
    return {"clean_us": clean_us, "attacked_us": attacked_us, "attacked_trust_any_us": attacked_any_us, "mirror_us": mirror_us, "poison_served_us": poisoned_us,
            "served_honest": served == honest.trace_id and served_any == honest.trace_id, "mirror_served_honest": served_mirror == honest.trace_id}  # fmt: skip


def ownership(tmp: Path) -> dict[str, Any]:
    """Another push token tries to overwrite, evict and quarantine one pusher's records."""
    _, ident = matmul_model()
    honest = Record(ident, scheduled(ident, "tiled"), [1e-3], {"host_cpu": "alice"})
    with ServerThread(tmp / "own", tokens={**TOKENS, "mallory": Principal("mallory")}, sync=False) as srv, \
            RegistryClient(srv.url, token="alice") as alice, RegistryClient(srv.url, token="mallory") as mallory:  # fmt: skip
        alice.put(honest)
        mallory.put(Record(ident, honest.trace, [1e-9], {"host_cpu": "mallory"}))
        for factor in (2, 4, 8, 32, 64, 128, 256, 512):  # eight other traces, each claimed faster
            sch = tvm.s_tir.Schedule(workload_module(ident.workload))
            sch.split(sch.get_loops(sch.get_sblock("matmul"))[1], [None, factor])
            mallory.put(Record(ident, trace_text(sch.trace), [1e-9 * factor]))
        try:
            mallory.quarantine(ident.key, honest.trace_id, "mine now")
            quarantined = True
        except Exception:  # Forbidden
            quarantined = False
        entries = alice.get(ident.key)
    mine = next((r for r in entries if r.trace_id == honest.trace_id), None)
    return {"owner_kept": mine is not None and mine.served.pushed_by == "alice" and mine.run_secs == honest.run_secs,
            "mallory_entries": sum(r.served.pushed_by == "mallory" for r in entries), "entries": len(entries), "quarantine_accepted": quarantined}  # fmt: skip


def compile_bomb(tmp: Path, rounds: int) -> dict[str, Any]:
    mod, ident = matmul_model()
    with LocalRegistry(tmp / "bomb") as reg:
        reg.put(Record(ident, scheduled(ident, "bomb"), [1e-9]))
    fallback, bombed = [], []
    for _ in range(rounds):
        for store, into in ((tmp / "empty", fallback), (tmp / "bomb", bombed)):
            start = time.perf_counter()
            with use(store, CPU):
                tvm.compile(mod, CPU)
            into.append(time.perf_counter() - start)
    return {"fallback_secs": statistics.median(fallback), "bombed_secs": statistics.median(bombed),
            "ratio": statistics.median(b / f for b, f in zip(bombed, fallback))}  # fmt: skip


def _probe_while(url: str, work: Callable[[], None]) -> dict[str, float]:
    """/healthz latencies while ``work`` runs; the work's wall time."""
    stop, latencies = threading.Event(), []

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                start = time.perf_counter()
                http.get("/healthz")
                latencies.append(time.perf_counter() - start)

    prober = threading.Thread(target=probe)
    prober.start()
    start = time.perf_counter()
    try:
        work()
    finally:
        wall = time.perf_counter() - start
        stop.set()
        prober.join()
    return {"work_secs": wall, "healthz_p50_ms": percentile(latencies, 50) * 1e3, "healthz_max_ms": max(latencies) * 1e3}


def stall(tmp: Path) -> dict[str, Any]:
    """The review's request: one key of large records asked 4096 times; and the queue listing of 200 large jobs."""
    _, ident = matmul_model()
    big = ident.workload + "#" * (500_000 - len(ident.workload)) + "\n"  # near the 512K-character limit
    fat = Record.from_obj(ident.to_dict() | {"workload": big, "key": record_key(ident.fingerprint, ident.target, big), "trace": "[[],[]]", "run_secs": [1e-3]})
    with ServerThread(tmp / "stall", tokens=TOKENS, sync=False) as srv, RegistryClient(srv.url, token="admin") as admin:
        admin.put(fat)
        body = json.dumps({"keys": [fat.key] * 4096}).encode()

        def lookups() -> None:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda _: httpx.post(f"{srv.url}/v1/lookup", content=body, timeout=120).raise_for_status(), range(4)))

        under_lookups = _probe_while(srv.url, lookups)
        misses = []
        for n in range(200):
            text = f"@T.prim_func\ndef main(arg0: T.Buffer(({n + 1}, 8), 'float32')): pass\n" + "#" * 480_000 + "\n"
            misses.append(Identity.from_obj(ident.to_dict() | {"workload": text, "key": record_key(ident.fingerprint, ident.target, text),
                                                                       "args_info": [["TENSOR", "float32", [n + 1, 8]]]}))  # fmt: skip
        for i in range(0, 200, 20):
            admin.report_misses(misses[i : i + 20])
        listing = httpx.get(f"{srv.url}/v1/queue?limit=500", timeout=60)
    return {**{f"lookup_{k}": v for k, v in under_lookups.items()}, "queue_listing_bytes_200_jobs": len(listing.content)}


def queue_abuse(tmp: Path) -> dict[str, Any]:
    """Attempts on someone else's lease, unbounded renews, expired leases, lying args_info: how many were accepted."""
    _, ident = matmul_model()
    tokens = {**TOKENS, "w2": Principal("other", "worker")}
    accepted, attempts = 0, 0
    with ServerThread(tmp / "queue", tokens=tokens, sync=False) as srv, RegistryClient(srv.url, token="w") as mine, RegistryClient(srv.url, token="w2") as other:
        mine.report_misses([ident])
        lease = mine.lease("a", lease_secs=60)[0]
        listed = httpx.get(f"{srv.url}/v1/queue").text
        for call in (lambda: other.renew(lease.key, lease.lease_id, 60), lambda: other.ack(lease.key, lease.lease_id),
                     lambda: other.fail(lease.key, lease.lease_id, "x"), lambda: other.release(lease.key, lease.lease_id, "x"),
                     lambda: mine.renew(lease.key, lease.lease_id, 1e15),
                     lambda: mine._call("POST", "/v1/misses", {"misses": [ident.to_dict() | {"args_info": [["TENSOR", "float32", [1]]]}]})):  # fmt: skip
            attempts += 1
            try:
                call()
                accepted += 1
            except Exception:  # LeaseLost, InvalidRecord: refused
                pass
        mine.release(lease.key, lease.lease_id, "bench")
        short = mine.lease("a", lease_secs=0.2)[0]
        time.sleep(0.3)
        shown = mine.job(short.key)["state"]
        attempts += 1
        try:
            mine.renew(short.key, short.lease_id, 60)
            accepted += 1
        except Exception:
            pass
    return {"attempts": attempts, "accepted": accepted, "lease_id_listed": lease.lease_id in listed, "expired_lease_reads_as": shown}


def history(tmp: Path, jobs: int, workload_bytes: int = 256 << 10) -> dict[str, Any]:
    """A read token's misses that die as fast as a worker fails them, each with a large workload: the store's bytes and the
    dead jobs kept, with no budget on a caller's ended work and with the default one (``--kept-bytes``)."""
    from schedhub.registry import CallerBounds

    default = CallerBounds().kept_bytes
    out: dict[str, Any] = {"jobs": jobs, "workload_bytes": workload_bytes, "budget_bytes": default}
    for name, budget in (("unbounded", 1 << 60), ("budget", default)):
        root, fail_secs = tmp / f"history-{name}", []
        with ServerThread(root, tokens=TOKENS, sync=False, bounds=CallerBounds(kept_bytes=budget)) as srv, \
                RegistryClient(srv.url, token="r") as reader, RegistryClient(srv.url, token="w") as worker:  # fmt: skip
            for n in range(jobs):
                text = f"@T.prim_func\ndef main(arg0: T.Buffer(({n + 1}, 64), 'float32')): pass\n# {'x' * workload_bytes}\n"
                ident = _record(n).identity
                reader.report_misses([Identity.from_obj(ident.to_dict() | {"workload": text, "key": record_key(ident.fingerprint, ident.target, text)})])
                while leases := worker.lease("bench", lease_secs=60):
                    started = time.perf_counter()
                    worker.fail(leases[0].key, leases[0].lease_id, "ScheduleError: bench")
                    fail_secs.append(time.perf_counter() - started)
        with LocalRegistry(root, readonly=True) as reg:
            info, page = reg.store.env.info(), reg.store.env.stat()["psize"]
            out[name] = {"store_mib": round((info["last_pgno"] + 1) * page / 2**20, 1), "dead_jobs_kept": reg.queue.counts()["dead"],
                         "fail_ms": round(statistics.median(fail_secs) * 1e3, 2)}  # fmt: skip
    return out


def turns(tmp: Path, backlog: int, own: int = 5) -> dict[str, Any]:
    """One read token (a CI run) reports ``backlog`` misses twice over (its bound of misses awaiting tuning), then another
    (a developer) reports ``own``; a worker leases and acks one job at a time: at which lease each of the developer's
    jobs came out, and what a report and a lease cost with that queue."""
    from schedhub.registry import CallerBounds

    tokens = {"ci": Principal("ci", "read"), "dev": Principal("dev", "read"), "w": Principal("tuner", "worker")}
    bounds = CallerBounds(misses_per_minute=10**6, misses_awaiting=backlog)
    with ServerThread(tmp / "turns", tokens=tokens, sync=False, bounds=bounds) as srv, RegistryClient(srv.url, token="ci") as ci, \
            RegistryClient(srv.url, token="dev") as dev, RegistryClient(srv.url, token="w") as worker:  # fmt: skip
        theirs = [_record(n).identity for n in range(backlog)]
        report_secs = []
        for _again in range(2):
            for start in range(0, backlog, 500):
                started = time.perf_counter()
                ci.report_misses(theirs[start : start + 500])
                report_secs.append((time.perf_counter() - started) / len(theirs[start : start + 500]))
        mine = {_record(backlog + n).identity.key for n in range(own)}
        dev.report_misses([_record(backlog + n).identity for n in range(own)])
        positions, lease_secs = [], []
        for position in range(1, backlog + own + 1):
            started = time.perf_counter()
            (lease,) = worker.lease("bench", lease_secs=60, tasks=("tune",))
            worker.ack(lease.key, lease.lease_id)
            lease_secs.append(time.perf_counter() - started)
            if lease.key in mine:
                positions.append(position)
                if len(positions) == own:
                    break
    return {"backlog": backlog, "own": own, "own_leased_at": positions, "report_ms_per_miss": round(statistics.median(report_secs) * 1e3, 3),
            "lease_and_ack_ms": round(statistics.median(lease_secs) * 1e3, 2)}  # fmt: skip


def _pushes_while(pusher: RegistryClient, fresh: Iterator[int], work: Callable[[], Any]) -> tuple[list[float], float]:
    """Push one new record at a time until ``work`` (on a thread) is done: each push's seconds, and the work's."""
    done, secs = threading.Event(), []
    runner = threading.Thread(target=lambda: (work(), done.set()))
    started = time.perf_counter()
    runner.start()
    while not done.is_set() or not secs:
        t = time.perf_counter()
        pusher.put(_record(next(fresh)))
        secs.append(time.perf_counter() - t)
    runner.join()
    return secs, time.perf_counter() - started


def _latencies(alone: list[float], during: list[float]) -> dict[str, Any]:
    return {"push_alone_p50_ms": round(percentile(alone, 50) * 1e3, 2), "push_during_p50_ms": round(percentile(during, 50) * 1e3, 2),
            "push_during_max_ms": round(max(during) * 1e3, 1), "pushes_during": len(during)}  # fmt: skip


def _filled(root: Path, records: int, claims: int) -> None:
    with LocalRegistry(root, sync=False) as reg:
        for start in range(0, records, 5000):
            reg.put_many([_record(n) for n in range(start, min(start + 5000, records))], "bob", verified=True)
        reg.put_many([_record(records + n) for n in range(claims)], "alice", verified=False)


def forgetting(tmp: Path, records: int, claims: int) -> dict[str, Any]:
    """An admin forgets a caller with ``claims`` claims (each with its verification queued) in a store of ``records``
    other records, while another pusher pushes one record at a time: the forget's time and the pushes' latencies,
    against the same pushes with nothing else going on, with the forget taken out 500 items a commit (as served) and
    in one commit. Then (batched) `schedhub backup`'s copy of that live store, the pushes going on."""
    from schedhub.registry import _forget

    out: dict[str, Any] = {"records": records, "claims": claims}
    for name, batch in (("batched", _forget.BATCH), ("one_commit", 1 << 30)):
        root = tmp / f"forget-{name}"
        _filled(root, records, claims)
        with ServerThread(root, tokens=TOKENS, sync=True) as srv, RegistryClient(srv.url, token="admin") as admin, \
                RegistryClient(srv.url, token="w") as pusher:  # fmt: skip
            fresh = iter(range(records + claims, records + claims + 100_000))
            alone, _ = _pushes_while(pusher, fresh, lambda: time.sleep(3))
            _forget.BATCH, saved = batch, _forget.BATCH
            try:
                gone: dict[str, int] = {}
                during, wall = _pushes_while(pusher, fresh, lambda: gone.update(admin.forget("alice")))
            finally:
                _forget.BATCH = saved
            out[name] = {"forget_secs": round(wall, 2), "gone": gone, **_latencies(alone, during)}
            if name == "batched":
                with LocalRegistry(root, readonly=True) as reg:
                    copied: list[int] = []
                    during, wall = _pushes_while(pusher, fresh, lambda: copied.append(reg.backup(tmp / "backup")))
                    out["backup"] = {"secs": round(wall, 2), "copy_mib": round(copied[0] / 2**20, 1),
                                     "store_file_mib": round((root / "data.mdb").stat().st_size / 2**20, 1), **_latencies(alone, during)}  # fmt: skip
    return out


def fuzzing(tmp: Path, examples: int) -> dict[str, Any]:
    with ServerThread(tmp / "fuzz", tokens={fuzz.TOKEN: Principal("fuzzer", "admin")}, sync=False) as srv:
        run = fuzz.fuzz(srv.url, examples)
    return {"cases": run.cases, "by_status": {str(k): v for k, v in sorted(run.by_status.items())}, "5xx": sum(v for k, v in run.by_status.items() if k >= 500)}


def timeouts(tmp: Path, connections: int) -> dict[str, Any]:
    """Half-sent headers (slowloris) and a body shorter than its Content-Length, at the default timeouts."""
    with ServerThread(tmp / "slow", sync=False) as srv:
        socks = []
        for _ in range(connections):
            s = socket.create_connection((srv.host, srv.port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        short = socket.create_connection((srv.host, srv.port))
        short.sendall(b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        started = time.monotonic()
        time.sleep(12)  # the header timeout is 10 s
        still_open = 0
        for s in socks:
            s.settimeout(0.2)
            try:
                closed = s.recv(1) == b""
            except (TimeoutError, socket.timeout):
                closed = False
            except OSError:  # reset by the server
                closed = True
            still_open += not closed
            s.close()
        short.settimeout(60)
        answer = short.recv(200)
        body_cut_secs = time.monotonic() - started
        short.close()
    return {"slowloris_connections": connections, "still_open_after_12s": still_open, "short_body_answer": answer.split(b"\r\n")[0].decode(),
            "short_body_cut_after_secs": body_cut_secs}  # fmt: skip


def _record(n: int) -> Record:
    """A small valid record of its own key (workload ``n``)."""
    from schedhub.registry import SCHEMA_VERSION, canonical_target

    target = canonical_target({"kind": "llvm", "mcpu": "bench"})
    text = f"@T.prim_func\ndef main(arg0: T.Buffer(({n + 1}, 64), 'float32')): pass\n"
    return Record.from_obj({"key": record_key("bench", target, text), "schema": SCHEMA_VERSION, "fingerprint": "bench", "target": target,
                            "workload": text, "op": "bench_op", "args_info": [["TENSOR", "float32", [n + 1, 64]]],
                            "trace": '[[["GetSBlock",[],["b","main"],["b0"]]],[]]', "run_secs": [1e-4 * (1 + n % 7)]})  # fmt: skip


class _Served:
    """``schedhub serve`` in its own process (fsync on), killable with SIGKILL."""

    def __init__(self, root: Path) -> None:
        import os
        import subprocess
        import sys

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "schedhub.cli.main", "serve", "--root", str(root), "--port", str(port)],
                                     env={**os.environ, "SCHEDHUB_TOKEN": "bench-admin"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        for _ in range(600):
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def durability(tmp: Path, pushers: int, per_pusher: int, kills: int) -> dict[str, Any]:
    """Concurrent pushes (single PUTs and batches) and kill -9 of the server under load: what was acknowledged must be stored."""
    root = tmp / "durable"
    server = _Served(root)

    def push(offset: int, count: int, batch: int) -> None:
        with RegistryClient(server.url, token="bench-admin", timeout=30) as client:
            records = [_record(offset + i) for i in range(count)]
            for i in range(0, count, batch):
                client.put_many(records[i : i + batch]) if batch > 1 else client.put(records[i])

    figures: dict[str, Any] = {}
    for label, batch, count in (("single_put_per_sec", 1, 250), ("batched_records_per_sec", per_pusher, per_pusher)):
        start = time.perf_counter()
        with ThreadPoolExecutor(pushers) as pool:
            list(pool.map(lambda w: push((1 + w) * 1_000_000 + batch * 100_000, count, batch), range(pushers)))
        figures[label] = pushers * count / (time.perf_counter() - start)
    server.kill()
    acked: list[str] = []
    lock = threading.Lock()
    for cycle in range(kills):
        server = _Served(root)
        stop = threading.Event()

        def keep_pushing(w: int) -> None:
            n = 50_000_000 + cycle * 1_000_000 + w * 100_000
            with RegistryClient(server.url, token="bench-admin", timeout=5, retries=0) as client:
                while not stop.is_set():
                    record = _record(n)
                    n += 1
                    try:
                        client.put(record)
                    except Exception:  # the server was killed: this push was never acknowledged
                        return
                    with lock:
                        acked.append(record.key)

        threads = [threading.Thread(target=keep_pushing, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5 + (cycle % 5) * 0.2)
        server.kill()
        stop.set()
        for t in threads:
            t.join()
    with LocalRegistry(root) as reg:
        present = {key for key in acked if reg.exists(key)}
        stored_batches = sum(reg.exists(_record((1 + w) * 1_000_000 + per_pusher * 100_000 + i).key) for w in range(pushers) for i in range(per_pusher))
    return {**figures, "pushers": pushers, "batched_records_stored": stored_batches, "batched_records_sent": pushers * per_pusher,
            "kill9_cycles": kills, "acknowledged_under_kill9": len(acked), "lost": len(acked) - len(present)}  # fmt: skip


def ray_exposure() -> dict[str, Any]:
    import psutil

    from schedhub.tuner.execution import cluster

    cluster.start(num_cpus=2)
    time.sleep(2)
    me = psutil.Process()
    pids = {p.pid for p in me.children(recursive=True)} | {me.pid}
    addresses = sorted({c.laddr.ip for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids})
    cluster.stop()
    return {"listening_addresses": addresses, "non_loopback": [a for a in addresses if a not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="run these sections, keeping the others' recorded figures")
    args = parser.parse_args()
    out = args.out or Path(__file__).parent / "results" / ("quick" if args.quick else "full") / "trust.json"
    results: dict[str, Any] = json.loads(out.read_text()) if args.only and out.exists() else {}
    with tempfile.TemporaryDirectory(prefix="schedhub-trust-") as tmp_dir:
        tmp = Path(tmp_dir)
        for name, fn in (("poisoning", lambda: poisoning(tmp)), ("ownership", lambda: ownership(tmp)), ("compile_bomb", lambda: compile_bomb(tmp, 5)),
                         ("stall", lambda: stall(tmp)), ("queue", lambda: queue_abuse(tmp)), ("history", lambda: history(tmp, 300 if args.quick else 1000)),
                         ("turns", lambda: turns(tmp, 4096)),
                         ("forget", lambda: forgetting(tmp, 20_000 if args.quick else 100_000, 5_000 if args.quick else 20_000)),
                         ("fuzz", lambda: fuzzing(tmp, 45 if args.quick else 480)), ("timeouts", lambda: timeouts(tmp, 300 if args.quick else 900)),
                         ("ray", ray_exposure), ("durability", lambda: durability(tmp, 8, 200 if args.quick else 1000, 5 if args.quick else 20))):  # fmt: skip
            if args.only and name not in args.only:
                continue
            started = time.time()
            results[name] = fn()
            print(f"{name} ({time.time() - started:.0f} s): {json.dumps(results[name])}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
