"""The registry (and the CLI's registry commands) run on a box without TVM or Ray."""

from __future__ import annotations

import subprocess
import sys


def test_registry_and_cli_import_neither_tvm_nor_ray() -> None:
    code = (
        "import sys, schedhub.registry, schedhub.cli.main\n"
        "from schedhub.registry import create_app\n"
        "create_app('/tmp/never-opened')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'tvm_ffi', 'ray'))\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
