"""Registry benchmark: open + first lookup vs MetaSchedule's JSONDatabase, HTTP GET/s, batch lookup.

    python -m bench.registry            # schedhub stores of 1k/100k/1M records, JSONDatabases of 1k/10k/100k
    python -m bench.registry --quick    # 1k/10k/100k and 1k/10k

Every timing is a median over fresh processes (the store or database is opened inside the timed
region; imports are not). Both sides hold the same workloads (TE matmuls of distinct shapes, their
canonical TIR) and the same real MetaSchedule traces.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import httpx

from schedhub.registry import SCHEMA_VERSION, LocalRegistry, Record, record_key

from . import serverload
from .report import environment
from .stats import percentile, summary, summary_ms

RECORDS_PER_KEY = 4  # schedhub keeps the top records of a key; a tuning log keeps every trial
RECORDS_PER_WORKLOAD = 100
REPS = 5
SENTINEL = 977


def matmul(n: int) -> Any:
    import tvm
    from tvm import te

    a, b = te.placeholder((n, 64), name="A"), te.placeholder((64, 128), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((n, 128), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def trace_of(mod: Any, tile: int) -> Any:
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("matmul"))
    jo, ji = sch.split(j, factors=[None, tile])
    sch.reorder(i, jo, k, ji)
    sch.vectorize(ji)
    return sch.trace


def target() -> Any:
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": "znver1", "num-cores": 2})


def matmuls() -> Any:
    """``workload(n, op=, fingerprint=)``: the identity fields (a dict) of the matmul of ``n`` rows, canonical as the hook
    makes it (TVM prints one template; the rest are its text with the sentinel replaced), for this compiler or another."""
    from schedhub.hooks.kernels.identity import args_info, canonical_workload, compiler_fingerprint, target_text

    template, args_template = canonical_workload(matmul(SENTINEL)), json.dumps(args_info(matmul(SENTINEL)))
    ours, tgt = compiler_fingerprint(), target_text(target())

    def workload(n: int, op: str = "fused_matmul", fingerprint: str | None = None, dtype: str = "float32") -> dict[str, Any]:
        text, fp = template.replace(str(SENTINEL), str(n)).replace("float32", dtype), fingerprint or ours
        return {"key": record_key(fp, tgt, text), "schema": SCHEMA_VERSION, "fingerprint": fp, "target": tgt, "workload": text, "op": op,
                "args_info": json.loads(args_template.replace(str(SENTINEL), str(n)).replace("float32", dtype))}  # fmt: skip

    return workload


def lease_ms(root: Path, unsuitable: int, rounds: int = 7) -> dict[str, Any]:
    """A worker's lease with ``unsuitable`` pending jobs of a compiler it does not run (anyone may report a miss for
    any fingerprint) queued before the one it can take: naming its compiler, kind and device, as `schedhub worker`
    does (the queue reads the jobs of its fit), and naming no device (the queue reads every pending job). Medians."""
    from schedhub.registry import Identity
    from schedhub.registry._keys import target_device

    workload = matmuls()
    with LocalRegistry(root, sync=False) as reg:
        for start in range(1, unsuitable + 1, 5000):
            reg.report_misses([Identity.from_obj(workload(n, fingerprint="tvm=0.0")) for n in range(start, min(start + 5000, unsuitable + 1))])
        ours = [Identity.from_obj(workload(n)) for n in range(1, 2 * rounds + 1)]
        fingerprint, device = ours[0].fingerprint, target_device(ours[0].target)
        out: dict[str, Any] = {"unsuitable_jobs": unsuitable}
        for name, named in (("naming_device_ms", device), ("naming_no_device_ms", None)):
            secs = []
            for _ in range(rounds):
                reg.report_misses([ours.pop()])
                started = time.perf_counter()
                leases = reg.lease("bench", 1, 60, fingerprint=fingerprint, kind="llvm", device=named)
                secs.append(time.perf_counter() - started)
                assert leases and leases[0].job["fingerprint"] == fingerprint, "the suitable job was not leased"
            out[name] = summary_ms(secs)
    return out


def build_store(root: Path, records: int, own_ops: bool = False) -> float:
    """A schedhub store of ``records`` records over records/4 keys, all of one op or (``own_ops``) each key
    its own (as a pusher that names a new op with every record makes it); returns seconds to build."""
    from schedhub.hooks.metaschedule.msdb import plain_json

    traces = [json.dumps(plain_json(trace_of(matmul(SENTINEL), t).as_json()), separators=(",", ":")) for t in (4, 8, 16, 32)]
    workload = matmuls()
    rng = random.Random(0)
    start = time.perf_counter()
    with LocalRegistry(root, sync=False) as reg:
        store = reg.store
        for base in range(0, records // RECORDS_PER_KEY, 5000):
            with store.write() as txn:
                for n in range(base + 1, min(base + 5000, records // RECORDS_PER_KEY) + 1):
                    obj = {**workload(n, op=f"fused_matmul_{n}" if own_ops else "fused_matmul"), "provenance": {"host_cpu": "znver1", "trials": 64}}
                    for trace in traces[:RECORDS_PER_KEY]:
                        store.put(Record.from_obj({**obj, "trace": trace, "run_secs": [rng.uniform(1e-5, 1e-3)]}), "bench", txn=txn)
        store.env.sync(True)
    return time.perf_counter() - start


def fill_queue(root: Path) -> int:
    """One queue job per key of the store (each done: its records exist), as a registry that served its misses has."""
    with LocalRegistry(root, sync=False) as reg:
        identities = [records[0].identity for _, records in reg.iter_served(page=1000)]
        for start in range(0, len(identities), 5000):
            reg.report_misses(identities[start : start + 5000])
        reg.store.env.sync(True)
    return len(identities)


def rare_target() -> str:
    """The canonical target of a CPU few tuned for: its trial logs are a handful among every key's."""
    from schedhub.registry import canonical_target

    return canonical_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2, "keys": ["cpu"]})


def fill_trials(root: Path, rare_entries: int = 8) -> int:
    """The measurement log of a registry whose tuners logged every key: one entry per key (its records'
    traces and times), ``rare_entries`` entries of the same workloads on :func:`rare_target`, and as many of
    another structure (matmuls in :data:`RARE_DTYPE`) on the store's target. Returns entries."""
    from schedhub.registry import Identity, Trial, TrialLog

    rare, workload = rare_target(), matmuls()
    with LocalRegistry(root, sync=False) as reg:
        served = [(records[0].identity, [Trial(r.trace, r.mean_secs) for r in records]) for _, records in reg.iter_served(page=1000)]
        logs = [TrialLog(identity, trials) for identity, trials in served]
        for n, (identity, trials) in enumerate(served[:rare_entries]):
            moved = {**identity.to_dict(), "target": rare, "key": record_key(identity.fingerprint, rare, identity.workload)}
            logs.append(TrialLog(Identity.from_obj(moved), trials))
            logs.append(TrialLog(Identity.from_obj(workload(n + 1, dtype=RARE_DTYPE)), trials))
        for start in range(0, len(logs), 2000):
            with reg.store.write() as txn:
                for log in logs[start : start + 2000]:
                    reg.push_trials(log, "bench", verified=True, txn=txn)
        reg.store.env.sync(True)
    return len(logs)


RARE_DTYPE = "float64"  # of the matmuls :func:`fill_trials` logs as another structure than the store's


def filtered_reads(url: str, rounds: int, by_server: Callable[[Any], int], by_client: Callable[[Any], int], *, same_filter: bool = False) -> dict[str, Any]:
    """``by_server(client)`` (entries the server's filter gave) against ``by_client(client)`` (entries the client's own
    filter kept), timed alternately on one connection after a warm-up (the connection, the server's first read); with
    ``same_filter`` each round checks that both kept the same number, more than none."""
    from schedhub.registry import RegistryClient

    server_secs, client_secs = [], []
    with RegistryClient(url, timeout=120) as client:
        by_server(client)
        for _ in range(rounds):
            start = time.perf_counter()
            found = by_server(client)
            server_secs.append(time.perf_counter() - start)
            start = time.perf_counter()
            client_found = by_client(client)
            client_secs.append(time.perf_counter() - start)
            assert not same_filter or client_found == found > 0
    return {"entries": found, "client_found": client_found, "server_filtered_ms": summary_ms(server_secs), "client_filtered_ms": summary_ms(client_secs),
            "client_over_server": summary([c / s for c, s in zip(client_secs, server_secs)])}  # fmt: skip


def structure_read_ms(url: str, rounds: int) -> dict[str, Any]:
    """What a search's cost model starts from (``tuner.workloads.logmodel.model_log``): the log entries of one structure that the
    store's target logged a few of, paged with the structure given to the server, against the target's entries paged
    and kept by the client (what ``model_log`` did before the server filtered by structure, up to 2,000 entries)."""
    from schedhub.registry import Identity

    wanted = Identity.from_obj(matmuls()(1, dtype=RARE_DTYPE))
    return filtered_reads(
        url, rounds,
        lambda client: len(list(client.iter_trial_logs(verified_only=True, target=wanted.target, structure=wanted.structure, page=33))),
        lambda client: sum(log.identity.structure == wanted.structure
                           for log in islice(client.iter_trial_logs(verified_only=True, target=wanted.target, page=200), 2000)),
    )  # fmt: skip


def log_read_ms(url: str, rounds: int) -> dict[str, Any]:
    """What a cost model for :func:`rare_target` reads: its log entries, paged with the target given to
    the server, against every entry paged and kept by the client (what the hook did before the server filtered)."""
    target = rare_target()
    return filtered_reads(url, rounds, lambda client: len(list(client.iter_trial_logs(target=target, page=200))),
                          lambda client: sum(log.identity.target == target for log in client.iter_trial_logs(page=200)), same_filter=True)


#: Public listings a caller may ask of any registry, each one page: the cost must not grow with the store or queue.
LISTINGS = {"stats_ms": "/v1/stats", "op_page_ms": "/v1/records?op=fused_matmul&limit=100",
            "unmatched_target_ms": "/v1/records?target=cuda&limit=100", "op_unmatched_target_ms": "/v1/records?op=fused_matmul&target=cuda&limit=100",
            "dead_jobs_ms": "/v1/queue?state=dead&limit=100"}  # fmt: skip


def build_json_database(work_dir: Path, records: int) -> float:
    from tvm.s_tir import meta_schedule as ms

    work_dir.mkdir(parents=True)
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    tgt, rng = target(), random.Random(0)
    start = time.perf_counter()
    for n in range(1, records // RECORDS_PER_WORKLOAD + 1):
        mod = matmul(n)
        workload = db.commit_workload(mod)
        args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        traces = [trace_of(mod, t) for t in (4, 8, 16, 32)]
        for r in range(RECORDS_PER_WORKLOAD):
            db.commit_tuning_record(ms.database.TuningRecord(traces[r % 4], workload, [rng.uniform(1e-5, 1e-3)], tgt, args))
    return time.perf_counter() - start


_OPEN_SCHEDHUB = """
import sys, time
from schedhub.registry import LocalRegistry
key = sys.argv[2]
t = time.perf_counter()
reg = LocalRegistry(sys.argv[1], readonly=True)
found = reg.get(key)
print(time.perf_counter() - t, len(found))
"""

_OPEN_METASCHEDULE = """
import sys, time
import tvm
from bench.registry import matmul, target
from tvm.s_tir import meta_schedule as ms
mod, tgt = matmul(int(sys.argv[2])), target()
t = time.perf_counter()
db = ms.database.JSONDatabase(work_dir=sys.argv[1], allow_missing=False)
found = db.query_tuning_record(mod, tgt, "main")
print(time.perf_counter() - t, int(found is not None))
"""


def time_open(script: str, path: Path, arg: str) -> dict[str, float]:
    times = []
    for _ in range(REPS):
        out = subprocess.run([sys.executable, "-c", script, str(path), arg], capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent)
        seconds, found = out.stdout.split()
        assert int(found) > 0, f"lookup found nothing in {path}"
        times.append(float(seconds))
    return summary_ms(times)


def some_keys(root: Path, count: int) -> list[str]:
    with LocalRegistry(root, readonly=True) as reg:
        keys = [s.key for s in reg.summaries()]
    return random.Random(1).sample(keys, min(count, len(keys)))


def http_load(url: str, keys: list[str], seconds: float, threads: int = 16) -> dict[str, float]:
    """GETs of random keys over keep-alive connections from ``threads`` threads in this process."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        rng = random.Random(i)
        with httpx.Client(base_url=url, headers={"accept": "application/msgpack"}) as c:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = c.get(f"/v1/records/{rng.choice(keys)}")
                latencies[i].append(time.perf_counter() - t)
                assert r.status_code == 200

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    flat = [x for lat in latencies for x in lat]
    return {"requests_per_s": len(flat) / (time.perf_counter() - start), "p50_ms": percentile(flat, 50) * 1e3, "p99_ms": percentile(flat, 99) * 1e3, "threads": threads}


def batch_lookup(url: str, keys: list[str], rounds: int = 200) -> dict[str, Any]:
    from schedhub.registry import RegistryClient

    rng = random.Random(2)
    batch_t, seq_t = [], []
    with RegistryClient(url) as c:
        for _ in range(rounds):
            chosen = rng.sample(keys, 50)
            t = time.perf_counter()
            assert len(c.lookup_raw(chosen)) == 50
            batch_t.append(time.perf_counter() - t)
        for _ in range(rounds // 10):
            chosen = rng.sample(keys, 50)
            t = time.perf_counter()
            for k in chosen:
                c.get_raw(k)
            seq_t.append(time.perf_counter() - t)
    return {"lookup_50_ms": summary_ms(batch_t),
            "lookup_50_p99_ms": percentile(batch_t, 99) * 1e3,
            "sequential_50_gets_ms": summary_ms(seq_t)}  # fmt: skip


def page_ms(url: str, rounds: int = 20) -> dict[str, float]:
    """GET one page ``rounds`` times after a warm-up on one connection: ms per request (a client per
    request measured httpx's own set-up, ~15 ms of TLS context, not the server)."""
    samples = []
    with httpx.Client(timeout=60) as client:
        client.get(url).raise_for_status()
        for _ in range(rounds):
            start = time.perf_counter()
            client.get(url).raise_for_status()
            samples.append((time.perf_counter() - start) * 1e3)
    return summary(samples)


def serve(root: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "schedhub.cli.main", "serve", "--root", str(root), "--port", str(port), "--read-only"],
                            start_new_session=True, stderr=subprocess.DEVNULL)  # fmt: skip
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/schedhub-bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.out = args.out or Path(__file__).parent / "results" / ("quick" if args.quick else "full") / "registry.json"
    store_sizes = [1_000, 10_000, 100_000] if args.quick else [1_000, 100_000, 1_000_000]
    ms_sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    results: dict[str, Any] = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
                               "command": "python -m bench.registry" + (" --quick" if args.quick else ""), "schedhub": {}, "metaschedule": {},
                               "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": environment()["commit"]}  # fmt: skip

    for size in store_sizes:
        root = args.workdir / f"store-{size}"
        build = build_store(root, size)
        key = some_keys(root, 1)[0]
        results["schedhub"][size] = {"open_first_lookup_ms": time_open(_OPEN_SCHEDHUB, root, key),
                                     "build_records_per_s": size / build, "disk_mb": sum(f.stat().st_size for f in root.iterdir()) / 1e6}  # fmt: skip
        print(f"schedhub {size:>9} records: {results['schedhub'][size]}", flush=True)
    for size in ms_sizes:
        work = args.workdir / f"ms-{size}"
        build = build_json_database(work, size)
        results["metaschedule"][size] = {"open_first_lookup_ms": time_open(_OPEN_METASCHEDULE, work, "1"),
                                         "build_records_per_s": size / build, "disk_mb": sum(f.stat().st_size for f in work.iterdir()) / 1e6}  # fmt: skip
        print(f"metaschedule {size:>9} records: {results['metaschedule'][size]}", flush=True)

    served = args.workdir / f"store-{store_sizes[1]}"
    keys = some_keys(served, 5000)
    port = 18470
    proc = serve(served, port)
    try:
        url = f"http://127.0.0.1:{port}"
        http_load(url, keys, 1.0)  # warm-up
        runs = [http_load(url, keys, 5.0) for _ in range(3)]
        results["http"] = {"store_records": store_sizes[1], "runs": runs,
                           "requests_per_s": summary([r["requests_per_s"] for r in runs]),
                           "p50_ms": summary([r["p50_ms"] for r in runs]), "p99_ms": summary([r["p99_ms"] for r in runs])}  # fmt: skip
        single = [http_load(url, keys, 3.0, threads=1) for _ in range(3)]
        results["http_one_connection"] = {"requests_per_s": summary([r["requests_per_s"] for r in single]),
                                          "p50_ms": summary([r["p50_ms"] for r in single]), "p99_ms": summary([r["p99_ms"] for r in single])}  # fmt: skip
        results["batch"] = batch_lookup(url, keys)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    results["dashboard"] = {}
    for size in (s for s in store_sizes if s <= 100_000):  # the dashboard reads kept aggregates: its time must not grow with the store
        jobs = fill_queue(args.workdir / f"store-{size}")
        trial_logs = fill_trials(args.workdir / f"store-{size}")
        proc = serve(args.workdir / f"store-{size}", port)
        try:
            results["dashboard"][size] = {"page_ms": page_ms(f"http://127.0.0.1:{port}/"), "jobs": jobs, "trial_logs": trial_logs,
                                          **{name: page_ms(f"http://127.0.0.1:{port}{path}") for name, path in LISTINGS.items()},
                                          "log_read": log_read_ms(f"http://127.0.0.1:{port}", rounds=3),
                                          "structure_read": structure_read_ms(f"http://127.0.0.1:{port}", rounds=3)}  # fmt: skip
            print(f"dashboard {size:>9} records: {results['dashboard'][size]['page_ms']['median']:.1f} ms", flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
    size = max(s for s in store_sizes if s <= 100_000)
    build_store(args.workdir / "own-ops", size, own_ops=True)
    proc = serve(args.workdir / "own-ops", port)
    try:  # the aggregates grow with the names they count: the dashboard must read a ranking's first rows, the stats kept counts
        results["own_ops"] = {"records": size, "ops": size // RECORDS_PER_KEY, "page_ms": page_ms(f"http://127.0.0.1:{port}/"),
                              "stats_ms": page_ms(f"http://127.0.0.1:{port}/v1/stats")}  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    if shutil.which("wrk"):  # the server under concurrent load from a client that is not the bottleneck (a Python client was)
        results["server_load"] = serverload.summarized(serverload.measure(["worktree"], rounds=1 if args.quick else 3, seconds=5.0)["worktree"])
    else:
        print("bench.registry: wrk is not installed (apt-get install wrk): the server-load figures are left out", flush=True)
    results["lease"] = lease_ms(args.workdir / "lease", 100_000 if args.quick else 1_000_000)
    print(json.dumps({k: results[k] for k in ("http", "http_one_connection", "batch", "own_ops", "lease")}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
