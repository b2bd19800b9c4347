"""The registry's HTTP protocol under the wire attacks of the fourth hostile review, against an idle baseline.

    python -m bench.studies.wire [--pythonpath DIR] [--out FILE]

Serves a fresh store in a child process (``--pythonpath``: a folder whose ``schedhub/registry`` is another revision's,
e.g. a ``git worktree`` of it linked there) and, one attack at a time, measures from outside:

- ``pipelined_slowloris``: 50 connections each send a whole ``GET /healthz`` and, in the same packet, the start of a
  second request whose head then comes a byte a second; how many are still open 20 s later (the head deadline is 10 s);
- ``huge_header``: one connection sends one header as fast as it can, up to 24 MiB; the bytes the server took and the
  slowest ``/healthz`` meanwhile;
- ``pipeline_flood``: 50 connections each write 3,000 pipelined ``GET /healthz`` at once; the slowest ``/healthz`` meanwhile;
- ``trial_pagers``: a log of ~15 MB (80 entries of 64 trials, each trace ~3 KB) pushed, then 4 clients page
  ``GET /v1/trials`` over and over for 10 s; the slowest ``/healthz`` meanwhile;
- ``idle``: the slowest of 50 ``/healthz`` with nothing else going on.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def start_server(root: Path, pythonpath: str | None) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    code = "import sys; from schedhub.registry import serve; serve(sys.argv[1], port=0, log_level='error', announce=lambda u: print(u, flush=True))"
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    for _ in range(100):
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, url


def slowest_healthz_while(url: str, attack: Callable[[], Any]) -> tuple[Any, float]:
    """``attack()``'s result and the slowest ``/healthz`` answered while it ran (a timeout counts 30 s)."""
    stop, slowest = threading.Event(), [0.0]

    def probe() -> None:
        with httpx.Client(timeout=30) as client:
            while True:  # at least one, however short the attack
                start = time.monotonic()
                try:
                    client.get(f"{url}/healthz")
                except httpx.HTTPError:
                    pass
                slowest[0] = max(slowest[0], time.monotonic() - start)
                if stop.wait(0.05):
                    return

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        result = attack()
    finally:
        stop.set()
        prober.join()
    return result, slowest[0]


def _address(url: str) -> tuple[str, int]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


def pipelined_slowloris(url: str, connections: int = 50, seconds: float = 20.0) -> int:
    socks = [socket.create_connection(_address(url), timeout=5) for _ in range(connections)]
    for s in socks:
        s.sendall(HEALTHZ + b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    end, open_ = time.monotonic() + seconds, set(range(connections))
    while time.monotonic() < end:
        for i in list(open_):
            try:
                socks[i].sendall(b"a")
            except OSError:
                open_.discard(i)
        time.sleep(1)
    for i in list(open_):  # a closed connection reads its end once the answer is drained
        socks[i].setblocking(False)
        try:
            while chunk := socks[i].recv(65536):
                pass
            if chunk == b"":
                open_.discard(i)
        except BlockingIOError:
            pass
        except OSError:
            open_.discard(i)
    for s in socks:
        s.close()
    return len(open_)


def huge_header(url: str, total: int = 24 << 20) -> int:
    sock = socket.create_connection(_address(url), timeout=30)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sent = 0
    try:
        while sent < total:
            sock.sendall(b"a" * (256 << 10))
            sent += 256 << 10
    except OSError:
        pass
    sock.close()
    return sent


def pipeline_flood(url: str, connections: int = 50, requests: int = 3000) -> None:
    socks = [socket.create_connection(_address(url), timeout=30) for _ in range(connections)]
    writers = [threading.Thread(target=_send_quietly, args=(s, HEALTHZ * requests)) for s in socks]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    time.sleep(2)
    for s in socks:
        s.close()


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def fill_trial_log(url: str, entries: int = 80, trials: int = 64) -> None:
    """``entries`` trial logs of ``trials`` ~3 KB traces each, pushed to the registry at ``url`` (open: no token)."""
    from tvm import te

    from schedhub.hooks import workload_identity
    from schedhub.registry import RegistryClient, Trial, TrialLog

    def long_trace(variant: int) -> str:
        loops = [["GetLoops", ["b0"], [], [f"l{4 * i}", f"l{4 * i + 1}", f"l{4 * i + 2}"]] for i in range(40)]
        return json.dumps([[["GetSBlock", [], ["matmul", "main"], ["b0"]], *loops, ["Split", ["l1", "None", variant], [], ["l2", "l3"]]], []])

    with RegistryClient(url, timeout=60) as client:
        for n in range(entries):
            a, b = te.placeholder((n + 1, 16), name="A"), te.placeholder((16, 16), name="B")
            k = te.reduce_axis((0, 16), name="k")
            func = te.create_prim_func([a, b, te.compute((n + 1, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")])
            identity = workload_identity(func, {"kind": "llvm", "num-cores": 2})
            client.push_trials(TrialLog(identity, [Trial(long_trace(v), 1e-3 * (1 + v / 100)) for v in range(trials)]))


def trial_pagers(url: str, clients: int = 4, seconds: float = 10.0) -> int:
    """``clients`` threads paging the whole log again and again for ``seconds``; the pages read."""
    from schedhub.registry import RegistryClient

    stop, pages = threading.Event(), [0]

    def page() -> None:
        with RegistryClient(url, timeout=60) as client:
            while not stop.is_set():
                cursor, more = "", True
                while more and not stop.is_set():
                    _, cursor, more = client.trial_logs(cursor, 200)
                    pages[0] += 1

    threads = [threading.Thread(target=page) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return pages[0]


def measure(pythonpath: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp) / "store", pythonpath)
        try:
            idle = max(slowest_healthz_while(url, lambda: time.sleep(0.05))[1] for _ in range(50))
            still_open, during_slowloris = slowest_healthz_while(url, lambda: pipelined_slowloris(url))
            taken, during_header = slowest_healthz_while(url, lambda: huge_header(url))
            _, during_flood = slowest_healthz_while(url, lambda: pipeline_flood(url))
            fill_trial_log(url)
            pages, during_pagers = slowest_healthz_while(url, lambda: trial_pagers(url))
        finally:
            proc.terminate()
            proc.wait(10)
    return {"idle_healthz_max_s": idle, "pipelined_slowloris_open_after_20s": still_open, "pipelined_slowloris_healthz_max_s": during_slowloris,
            "huge_header_bytes_sent": taken, "huge_header_healthz_max_s": during_header, "pipeline_flood_healthz_max_s": during_flood,
            "trial_pages_read": pages, "trial_pagers_healthz_max_s": during_pagers}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythonpath", help="a folder whose schedhub/registry is the revision to measure (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rounds = [measure(args.pythonpath) for _ in range(args.rounds)]
    result = {"pythonpath": args.pythonpath or "", "rounds": rounds, "median": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
