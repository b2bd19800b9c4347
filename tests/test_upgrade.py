"""A TVM upgrade with two real builds: records an older apache-tvm tuned and pushed are served to
this build as ``compiler`` transfers, replayed and checked on its own kernels, and its own keys are
queued for tuning.

The older build (apache-tvm 0.27.0: another libtvm, so another fingerprint and other keys) runs in a
venv of its own, built once from PyPI and kept in ``SCHEDHUB_OLD_TVM_VENV`` (default
``~/.cache/schedhub/venv-apache-tvm-0.27.0``). Slow: ``pytest -m slow tests/test_upgrade.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import tvm

from schedhub import hooks
from schedhub.registry import LocalRegistry
from schedhub.tuner.networks import models
from schedhub.tuner.execution import tvm_env

REPO = Path(__file__).resolve().parent.parent
OLD_TVM = "apache-tvm==0.27.0"


def old_tvm_venv() -> Path:
    """A venv with schedhub (this checkout) on the older TVM build; created on first use."""
    venv = Path(os.environ.get("SCHEDHUB_OLD_TVM_VENV", Path.home() / ".cache" / "schedhub" / f"venv-{OLD_TVM.replace('==', '-')}"))
    if (venv / ".ready").exists():
        return venv
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [OLD_TVM if dep.startswith("apache-tvm==") else dep for dep in project["optional-dependencies"]["tvm"]]
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *project["dependencies"], *pins], check=True, timeout=1800)
    subprocess.run([*pip, "--no-deps", "-e", str(REPO)], check=True, timeout=600)
    (venv / ".ready").touch()
    return venv


def fingerprint_of(python: Path) -> str:
    code = "from schedhub.hooks.kernels.identity import compiler_fingerprint; print(compiler_fingerprint())"
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_records_an_older_tvm_build_tuned_are_served_as_compiler_transfers(tmp_path: Path) -> None:
    venv = old_tvm_venv()
    old_fingerprint = fingerprint_of(venv / "bin" / "python")
    new_fingerprint = hooks.kernels.identity.compiler_fingerprint()
    assert old_fingerprint.startswith("tvm=0.27.0;") and old_fingerprint != new_fingerprint

    store = tmp_path / "store"
    tune = [str(venv / "bin" / "schedhub"), "tune", "-r", str(store), "-m", "mlp:batch=4", "--trials", "4", "--trials-per-iter", "4",
            "--concurrency", "1", "--num-cpus", "2"]  # fmt: skip  # the rewrites this CPU tunes best: what the compile below asks neighbours for
    subprocess.run(tune, check=True, timeout=1200, cwd=tmp_path)

    target = tvm.target.Target(tvm_env.host_target())
    mod, _, input_shape = models.export_with_weights("mlp", batch=4)  # the module `schedhub tune -m mlp:batch=4` tuned
    with LocalRegistry(store) as registry:
        pushed = registry.summaries()
        assert pushed and {registry.get(s.key)[0].identity.fingerprint for s in pushed} == {old_fingerprint}
        with hooks.use(registry, target) as session:
            transferred = tvm.compile(mod, target)
        report = session.report
        assert report.hits == 0 and report.transfers == len(report.kernels) == len(pushed)
        assert all(k.detail.startswith("compiler:") for k in report.kernels)
        queued = {j["key"] for j in registry.jobs("pending")}
        assert queued == {k.key for k in report.kernels}  # this build's keys, to tune
        assert not queued & {s.key for s in pushed}
    default = tvm.compile(mod, target)
    x = np.random.default_rng(0).standard_normal(input_shape).astype("float32")
    got, want = (tvm.relax.VirtualMachine(ex, tvm.cpu())["forward"](tvm.runtime.tensor(x)).numpy() for ex in (transferred, default))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
