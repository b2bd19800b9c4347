"""The registry (and the CLI's registry commands) run on a box without TVM or Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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


def _imports(path: Path, package: str) -> set[str]:
    """Modules of ``package`` that a file imports anywhere (function-level imports included)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found.update(n.split(".")[0] for n in names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
            found.add(node.module.split(".")[2])
    return found


def test_no_import_cycles_inside_a_package() -> None:
    root = Path(__file__).resolve().parent.parent
    for folder, package in (("registry", "schedhub.registry"), ("hooks", "schedhub.hooks"), ("tuner", "schedhub.tuner"), ("cli", "schedhub.cli")):
        graph = {p.stem: _imports(p, package) - {p.stem} for p in (root / folder).glob("*.py") if p.stem != "__init__"}

        def reaches(start: str, goal: str, seen: set[str]) -> bool:
            return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

        cycles = sorted(m for m in graph if reaches(m, m, {m}))
        assert not cycles, f"{package}: modules on an import cycle: {cycles}"


def test_the_pytorch_twins_build_without_tvm() -> None:
    """PyTorch is timed in a process that must never import TVM (next to TVM it ran 25–35× slower)."""
    code = (
        "import sys, bench.torch_models as m\n"
        "m.ResNet18(), m.MobileNetV2(), m.BertLayer(), m.MLP(64, 64)\n"
        "sys.exit(1 if 'tvm' in sys.modules else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_public_name_of_the_tuner_is_what_it_imports_on_use() -> None:
    import schedhub.tuner as tuner

    assert tuner.__all__
    for name in tuner.__all__:
        assert getattr(tuner, name).__name__ == name
