"""`schedhub submit` against a real Ray head node (`ray start --head` with the Jobs API)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedhub.registry import LocalRegistry

from .conftest import QUICK_FLAGS

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jobs_api() -> Iterator[str]:
    """A head node with 2 CPUs and the measurement resource; yields its Jobs API address."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    gcs, dashboard = free_port(), free_port()
    temp = tempfile.mkdtemp(prefix="h", dir="/tmp/schedhub-ray" if os.path.isdir("/tmp/schedhub-ray") else None)
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--num-cpus", "2", "--resources", '{"schedhub_measure_cpu": 1}', "--port", str(gcs),
         "--node-ip-address", "127.0.0.1", "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
         "--dashboard-port", str(dashboard), "--temp-dir", temp, "--disable-usage-stats"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            ok = subprocess.run([RAY, "job", "list", "--address", address], env=env, capture_output=True, timeout=60).returncode == 0
            if ok:
                break
            time.sleep(2)
        else:
            pytest.fail("the Ray head node's Jobs API did not come up")
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(5)
        except subprocess.TimeoutExpired:  # `ray start --block` cleans up slowly; its processes share the group
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)


def schedhub(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "schedhub.cli.main", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # 73 s in a 2-core CI run: out of the default run
def test_submit_runs_tune_as_a_ray_job_once_per_work(jobs_api: str, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    work = ["-r", store, "--model", "mlp:batch=2,features=16,hidden=16", "--target", '{"kind": "llvm", "mcpu": "znver1", "num-cores": 2}',
            "--trials", "2", "--trials-per-iter", "2", *QUICK_FLAGS, "--address", jobs_api]  # fmt: skip
    first = schedhub("submit", *work)
    assert first.returncode == 0 and first.stdout.startswith("submitted schedhub-tune-"), first.stdout + first.stderr
    job_id = first.stdout.split()[1]
    again = schedhub("submit", *work)
    assert again.stdout.startswith(f"already submitted {job_id}"), again.stdout + again.stderr

    logs = schedhub("jobs", "logs", job_id, "--address", jobs_api, "--follow", timeout=400)
    assert "1 model shape(s), 2 distinct kernels" in logs.stdout  # fc1 and fc2 are one 16→16 workload, logs.stdout + logs.stderr
    status = schedhub("jobs", "status", job_id, "--address", jobs_api)
    assert f"{job_id}: SUCCEEDED" in status.stdout, status.stdout + status.stderr + logs.stdout
    with LocalRegistry(store, readonly=True) as reg:
        assert len(reg.summaries()) == 2
    listed = subprocess.run([RAY, "job", "list", "--address", jobs_api], capture_output=True, text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert listed.stdout.count(job_id) == 1  # the second submit started nothing

    unknown = schedhub("submit", "-r", store, "--model", "nosuchmodel", "--address", jobs_api)
    assert unknown.returncode == 1 and "unknown model" in unknown.stderr
