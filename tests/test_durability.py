"""A real `schedhub serve` process, several pushing processes, and kill -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from schedhub.registry import LocalRegistry

from .conftest import TOKEN

REPO = Path(__file__).resolve().parent.parent
TOP_K = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(root: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    env = {**os.environ, "SCHEDHUB_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "schedhub.cli.main", "serve", "--root", str(root), "--port", str(port)],
                            env=env, start_new_session=True, stderr=subprocess.PIPE)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "server exited"
        assert time.time() < deadline, "server did not come up"
        time.sleep(0.05)
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)


def start_pushers(url: str, tmp: Path, count: int, keys: int, workers: int = 4) -> list[tuple[subprocess.Popen, Path]]:
    out = []
    for w in range(workers):
        log = tmp / f"acked-{w}.txt"
        cmd = [sys.executable, "-m", "tests.pusher", url, str(w), str(count), str(keys), str(log)]
        out.append((subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL), log))
    return out


def acked(logs: list[Path]) -> dict[str, list[tuple[str, float]]]:
    by_key: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for log in logs:
        for line in log.read_text().splitlines():
            key, tid, mean = line.split()
            by_key[key].append((tid, float(mean)))
    return by_key


def stored(root: Path) -> tuple[dict[str, list[tuple[str, float]]], set[tuple[str, str]]]:
    with LocalRegistry(root) as reg:
        keys = {s.key: [(r.trace_id, r.mean_secs) for r in reg.get(s.key)] for s in reg.summaries()}
        logged = {(m["key"], m["tid"]) for _, m in reg.store.measurements()}
    return keys, logged


def test_kill_9_mid_push_loses_no_acknowledged_record(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with serve(root) as (url, proc):
        pushers = start_pushers(url, tmp_path, count=5000, keys=25)
        deadline = time.time() + 60
        while sum(len(log.read_text().splitlines()) for _, log in pushers if log.exists()) < 400:
            assert time.time() < deadline, "pushers made no progress"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for p, _ in pushers:
            p.wait(60)
    claimed = acked([log for _, log in pushers])
    assert sum(len(v) for v in claimed.values()) >= 400
    with serve(root) as (url, _):  # the environment opens and serves again
        assert httpx.get(url + "/v1/stats").json()["keys"] == len(claimed)
    records, logged = stored(root)
    for key, pushed in claimed.items():
        kept = records[key]
        assert [m for _, m in kept] == sorted(m for _, m in kept)
        for tid, mean in pushed:
            assert (key, tid) in logged  # every acknowledged measurement survived
            assert tid in {t for t, _ in kept} or (len(kept) == TOP_K and mean >= kept[-1][1])


def test_four_pushing_processes_lose_nothing_and_keep_the_true_top_k(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with serve(root) as (url, _):
        pushers = start_pushers(url, tmp_path, count=150, keys=10)
        for p, _ in pushers:
            assert p.wait(120) == 0
    claimed = acked([log for _, log in pushers])
    assert sum(len(v) for v in claimed.values()) == 600
    records, logged = stored(root)
    assert len(logged) == 600
    for key, pushed in claimed.items():
        best = sorted(pushed, key=lambda p: p[1])[:TOP_K]
        assert [t for t, _ in records[key]] == [t for t, _ in best]


def test_a_full_store_refuses_writes_with_what_to_do_and_still_serves_reads(tmp_path: Path) -> None:
    """A full LMDB map fails every write. Locally and over HTTP that is StoreFull (507, a kind of unavailability, so a
    compile falls back), naming the remedy; nothing of the failed write is kept, and reads go on."""
    from schedhub.registry import RegistryClient, RegistryUnavailable, ServerThread, StoreFull

    from .conftest import make_record

    with LocalRegistry(tmp_path / "full", sync=False, map_size=1 << 20) as local:  # the server shares this environment
        kept = []
        with pytest.raises(StoreFull, match=r"store is full .*\(SCHEDHUB_MAP_SIZE"):
            for i in range(10_000):
                batch = [make_record(1000 + 10 * i + j, 1e-3) for j in range(10)]
                local.put_many(batch)
                kept += batch
        assert kept and len(local.lookup([r.key for r in kept + batch])) == len(kept)  # the failed batch left nothing
        with ServerThread(tmp_path / "full", sync=False) as srv, RegistryClient(srv.url, timeout=10) as client:
            with pytest.raises(RegistryUnavailable, match="507: the registry's store is full"):
                client.put_many(batch)
            assert client.get(kept[0].key)[0].trace_id == kept[0].trace_id


def test_a_backup_taken_while_a_server_writes_is_a_whole_compacted_store(tmp_path: Path) -> None:
    """`schedhub backup` copies a live store in one read transaction: the copy opens as a store with everything of one
    moment (records, queue, log) while pushes go on, leaves out the pages freed by what was taken out, and refuses to
    write over a store."""
    import threading

    from click.testing import CliRunner

    from schedhub.cli.main import cli
    from schedhub.registry import RegistryClient, ServerThread

    from .conftest import make_record

    src = tmp_path / "src"
    with LocalRegistry(src, sync=False) as reg:
        reg.put_many([make_record(w, 1e-3) for w in range(2000)], "mallory", verified=False)  # claims, each verification queued
        reg.report_misses([make_record(5000, 1e-3).identity], by="reader")
        reg.forget("mallory")  # their pages are free now
        reg.put_many([make_record(w, 1e-3) for w in range(3000, 3010)], "alice", verified=True)
    with ServerThread(src, tokens={TOKEN: "admin"}, sync=False) as srv, RegistryClient(srv.url, token=TOKEN) as client:
        stop, pushed = threading.Event(), []

        def push() -> None:
            while not stop.is_set():
                record = make_record(4000 + len(pushed), 1e-3)
                client.put(record)
                pushed.append(record.key)

        pusher = threading.Thread(target=push)
        pusher.start()
        try:
            while len(pushed) < 5:
                time.sleep(0.01)
            result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy"), "--root", str(src)], catch_exceptions=False)
            during = len(pushed)
            time.sleep(0.2)
        finally:
            stop.set()
            pusher.join()
        assert result.exit_code == 0, result.output
        assert len(pushed) > during  # pushes went on past the copy
        again = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy"), "--root", str(src)])
        assert again.exit_code == 1 and "already holds a store" in again.output
    with LocalRegistry(tmp_path / "copy", sync=False) as copy:
        keys = {summary.key for summary in copy.store.page(limit=10_000).items}
        alices = {make_record(w, 1e-3).key for w in range(3000, 3010)}
        copied = keys - alices
        assert alices <= keys and len(copied) >= 5 and copied == set(pushed[: len(copied)])  # one moment: the pushes up to it
        assert [j["key"] for j in copy.jobs()] == [make_record(5000, 1e-3).identity.key]
        assert copy.stats()["measurements"] == 2000 + len(keys)  # the log of every push, mallory's too
    assert (tmp_path / "copy" / "data.mdb").stat().st_size < (src / "data.mdb").stat().st_size / 2
