"""The registry server's read path under concurrent load: requests/s and latency of ``GET /v1/records/{key}`` and of a
20-key ``POST /v1/lookup``, driven by wrk, optionally side by side with an older revision of the registry.

    python -m bench.serverload                         # this checkout's registry alone
    python -m bench.serverload --against 80e5356       # and an older revision, alternating rounds on one machine

``python -m bench registry`` runs it for this checkout alone and records it with the commit, so RESULTS.md compares
the server's requests/s run to run.

Each revision builds its own store with its own code from the same records (``--records`` keys, one ~2 KB record
each) and serves it with its own ``serve()`` in a process of its own. wrk (Debian's ``wrk``: one thread, 16
connections, msgpack answers) runs pinned to the last core; the servers are not pinned. Rounds alternate which
revision goes first, so a slow moment of the shared machine falls on both. The older revision is taken with
``git archive`` (its ``registry/`` only) and imported through a path that puts it before the installed one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack

from .report import REPO, environment
from .revisions import check_imports_from, child_env, revision_source
from .stats import summary

LOOKUP_KEYS = 20
BODIES = 64  # distinct lookup bodies wrk cycles through
PATHS = 2000  # distinct GET paths wrk cycles through

#: Run by each revision's own interpreter setup: builds its store from the same record fields with its own code.
_BUILD = r"""
import json, sys
from schedhub.registry import SCHEMA_VERSION, LocalRegistry, Record, canonical_target, record_key
root, count, pad = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
target = canonical_target({"kind": "llvm", "mcpu": "znver5", "num-cores": 2, "keys": ["cpu"]})
fingerprint = "tvm=0.27.0.post1;bench"
records, keys = [], []
for n in range(1, count + 1):
    text = f"# workload {n}\n# {'x' * pad}\n@T.prim_func\ndef main(arg0: T.Buffer(({n}, 64), 'float32')): pass\n"
    trace = [[["GetSBlock", [], ["matmul", "main"], ["b0"]], ["Split", ["l1", "None", 4], [], ["l2", "l3"]]], []]
    records.append(Record.from_obj({
        "key": record_key(fingerprint, target, text), "schema": SCHEMA_VERSION, "fingerprint": fingerprint,
        "target": target, "workload": text, "op": f"fused_op{n % 3}", "args_info": [["TENSOR", "float32", [n, 64]]],
        "trace": json.dumps(trace), "run_secs": [1e-3, 1.01e-3], "provenance": {"host_cpu": "bench"}}))
    keys.append(records[-1].key)
with LocalRegistry(root, sync=False) as reg:
    for start in range(0, len(records), 500):
        reg.put_many(records[start:start + 500], "bench")
print(json.dumps(keys))
"""

_SERVE = "import sys; from schedhub.registry import serve; serve(sys.argv[1], '127.0.0.1', int(sys.argv[2]), log_level='warning')"

_GET_LUA = """
local paths = {%s}
request = function()
  return wrk.format("GET", paths[math.random(#paths)], {["Accept"] = "application/msgpack"})
end
"""

_LOOKUP_LUA = """
local bodies = {%s}
request = function()
  return wrk.format("POST", "/v1/lookup", {["Accept"] = "application/msgpack", ["Content-Type"] = "application/msgpack"},
                    bodies[math.random(#bodies)])
end
"""


def lua_string(data: bytes) -> str:
    """``data`` as a Lua string literal (every byte escaped: msgpack bodies are binary)."""
    return '"' + "".join(f"\\{b}" for b in data) + '"'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(shim: Path, root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(root), str(port)], env=child_env(shim), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"bench.serverload: the server on {root} did not come up")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def wrk(url: str, script: Path, seconds: float, connections: int) -> dict[str, float]:
    """One wrk run: requests/s, p50 and p99 in ms, non-2xx answers."""
    pin = ["taskset", "-c", str((os.cpu_count() or 1) - 1)] if shutil.which("taskset") else []
    out = subprocess.run([*pin, "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script), url],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": rps, "p50_ms": latency_ms(out, "50%"), "p99_ms": latency_ms(out, "99%"), "non_2xx": int(bad.group(1)) if bad else 0}


def latency_ms(out: str, pct: str) -> float:
    value, unit = re.search(rf"^\s+{re.escape(pct)}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def scripts(keys: list[str], scratch: Path, seed: int) -> dict[str, Path]:
    rng = random.Random(seed)
    paths = [f"/v1/records/{k}" for k in rng.sample(keys, min(PATHS, len(keys)))]
    bodies = [msgpack.packb({"keys": rng.sample(keys, LOOKUP_KEYS)}) for _ in range(BODIES)]
    out = {"get": scratch / "get.lua", "lookup20": scratch / "lookup.lua"}
    out["get"].write_text(_GET_LUA % ",".join(f'"{p}"' for p in paths))
    out["lookup20"].write_text(_LOOKUP_LUA % ",".join(lua_string(b) for b in bodies))
    return out


def measure(revisions: list[str], *, records: int = 2000, pad: int = 1700, rounds: int = 2, seconds: float = 8.0,
            connections: int = 16) -> dict[str, dict[str, list[dict[str, float]]]]:  # fmt: skip
    """wrk runs per revision ('worktree': this checkout) and request kind, ``rounds`` each, alternating the order."""
    if shutil.which("wrk") is None:
        raise SystemExit("bench.serverload needs wrk (Debian: apt-get install wrk)")
    runs: dict[str, dict[str, list[dict[str, float]]]] = {r: {"get": [], "lookup20": []} for r in revisions}
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    with tempfile.TemporaryDirectory(prefix="schedhub-serverload-") as tmp:
        scratch = Path(tmp)
        try:
            keys: list[str] = []
            for rev in revisions:
                shim = revision_source(rev, scratch)
                check_imports_from(shim)
                built = subprocess.run([sys.executable, "-c", _BUILD, str(scratch / rev / "store"), str(records), str(pad)],
                                       env=child_env(shim), check=True, capture_output=True, text=True)  # fmt: skip
                keys = json.loads(built.stdout.strip().splitlines()[-1])
                servers[rev] = start_server(shim, scratch / rev / "store")
            lua = scripts(keys, scratch, seed=1)
            for r in range(rounds):
                for rev in revisions if r % 2 == 0 else revisions[::-1]:
                    for kind, script in lua.items():
                        wrk(servers[rev][1], script, 1.0, connections)  # warm-up
                        run = wrk(servers[rev][1], script, seconds, connections)
                        runs[rev][kind].append(run)
                        print(f"round {r + 1} {rev:>10} {kind:>8}: {run['rps']:8.0f} req/s, p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms",
                              flush=True)  # fmt: skip
        finally:
            for proc, _ in servers.values():
                stop(proc)
    return runs


def summarized(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Per request kind: median requests/s, p50 and p99 over the rounds."""
    return {kind: {field: summary([r[field] for r in rs]) for field in ("rps", "p50_ms", "p99_ms")} for kind, rs in runs.items() if rs}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serverload", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", help="an older revision (commit) to serve side by side with this checkout")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--pad", type=int, default=1700, help="comment bytes in each workload: the record's size (~2 KB)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serverload.json")
    args = parser.parse_args()
    revisions = ["worktree", *([args.against] if args.against else [])]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "registry"], cwd=REPO, capture_output=True, text=True).stdout.strip())
    runs = measure(revisions, records=args.records, pad=args.pad, rounds=args.rounds, seconds=args.seconds, connections=args.connections)
    result: dict[str, Any] = {
        "command": "python -m bench.serverload " + " ".join(sys.argv[1:]),
        "revisions": {"worktree": f"{head}{'+dirty' if dirty else ''}", **({"against": args.against} if args.against else {})},
        "records": args.records, "seconds": args.seconds, "connections": args.connections, "runs": runs,
        "summary": {rev: summarized(r) for rev, r in runs.items()}, "environment": environment(),
    }  # fmt: skip
    if args.against:
        result["ratio"] = {kind: summary([now["rps"] / then["rps"] for now, then in zip(runs["worktree"][kind], runs[args.against][kind])])
                           for kind in ("get", "lookup20")}  # fmt: skip
        for kind, s in result["ratio"].items():
            print(f"{kind}: worktree / {args.against} requests/s: median {s['median']:.2f} (per round {s['min']:.2f}-{s['max']:.2f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
