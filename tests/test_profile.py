"""``schedhub profile``: real kernels timed with TVM's default schedule and the registry's, across threads."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from click.testing import CliRunner

from schedhub.hooks.rewrites import NO_REWRITES
from schedhub.cli.main import cli
from schedhub.registry import LocalRegistry
from schedhub.tuner.networks import plan
from schedhub.tuner.networks.models import kernels

from .hand_tuner import tune

MODEL = json.dumps({"name": "mlp", "features": 32, "hidden": 64})


def test_profile_writes_a_row_per_kernel_schedule_and_thread_count(tmp_path: Path) -> None:
    target = tvm.target.Target(plan.resolve_target("host"))
    mlp = kernels(plan.load(plan.parse_model(MODEL)), target, NO_REWRITES)
    with LocalRegistry(tmp_path / "store", sync=False) as reg:
        records = {r.key: r for r in (tune(k.identity) for k in mlp[:2])}  # two kernels tuned, the rest never
        reg.put_many(list(records.values()))
    out, plot = tmp_path / "profile.csv", tmp_path / "profile.png"
    command = [sys.executable, "-m", "schedhub.cli.main", "profile", "-r", str(tmp_path / "store"), "-m", MODEL, "--threads", "2,1", "-o", str(out),
               "--plot", str(plot), "--no-prepack"]  # fmt: skip  (the records were tuned unpacked)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)  # a fresh process: TVM's thread pool sized by the command
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["op", "calls", "shapes", "dtype", "gflop", "schedule", "source", "threads", "latency_us", "gflops"]
    # at 1 and 2 threads: every kernel's default, the two tuned ones' hits, and the third's rules' schedule (ranked
    # ahead of a transfer from its neighbour, untimed)
    assert len(rows) == 2 * (len(mlp) + 3) and [r["schedule"] for r in rows].count("ruled") == 2
    assert {r["source"] for r in rows if r["schedule"] == "hit"} == {rec.trace_id for rec in records.values()}
    assert {r["threads"] for r in rows} == {"1", "2"} and all(float(r["latency_us"]) > 0 for r in rows)
    matmul = next(r for r in rows if "matmul" in r["op"])
    assert float(matmul["gflop"]) > 0 and float(matmul["gflops"]) == pytest.approx(float(matmul["gflop"]) / (float(matmul["latency_us"]) * 1e-6))
    assert plot.stat().st_size > 5_000 and f"{len(rows)} rows" in done.stdout + done.stderr

    plain = CliRunner().invoke(cli, ["profile", "--defaults-only", "-m", MODEL, "--threads", "1", "-o", str(out)], catch_exceptions=False)
    assert plain.exit_code == 0 and {r["schedule"] for r in csv.DictReader(out.open())} == {"default"}


def test_profile_refuses_bad_thread_counts() -> None:
    for bad in ("0", "two", ""):
        done = CliRunner().invoke(cli, ["profile", "--defaults-only", "-m", "mlp", "--threads", bad])
        assert done.exit_code == 2 and "--threads" in done.output


def test_profile_plans_the_kernels_schedhub_tune_tunes(tmp_path: Path) -> None:
    """A tuned network's kernels are NHWC and prepacked on AVX2 or AVX-512 (``schedhub tune``'s default rewrites): a profile
    that planned them without the rewrites timed kernels no record was ever tuned for."""
    model = json.dumps({"torch": "tests.torch_factories:conv_bn", "inputs": {"x": [1, 3, 16, 16]}})
    spec = plan.resolve_target("host")
    mod = plan.load(plan.parse_model(model))
    tuning = plan.tuning_rewrites(spec, "auto", "exact", None, "direct", [mod])

    def planned(rewrites: object) -> set[tuple[str, str]]:
        return {(k.identity.op, " ".join("x".join(map(str, a[2])) for a in k.identity.args_info)) for k in kernels(mod, tvm.target.Target(spec), rewrites)}

    if planned(tuning) == planned(None):
        pytest.skip("this CPU tunes without rewrites (no AVX2)")
    out = tmp_path / "profile.csv"
    for flags, rewrites in (([], tuning), (["--layout", "given", "--no-prepack"], None)):
        done = CliRunner().invoke(cli, ["profile", "--defaults-only", "-m", model, "--threads", "1", "-o", str(out), *flags], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        assert {(r["op"], r["shapes"]) for r in csv.DictReader(out.open())} == planned(rewrites)
