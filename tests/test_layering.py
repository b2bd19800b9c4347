"""The registry (and the CLI's registry commands) run on a box without TVM or Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


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


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"registry": "schedhub.registry", "hooks": "schedhub.hooks", "tuner": "schedhub.tuner", "cli": "schedhub.cli"}
#: Each package's subpackages, lowest first: each may import only those before it (and the package's own top-level
#: modules, such as ``hooks.pipeline`` or the tuner's worker, any of them); a pair in UNORDERED imports neither way.
LAYERS = {"hooks": ["kernels", "build", "metaschedule", "rewrites", "serving"], "tuner": ["execution", "workloads", "networks", "compare"]}
UNORDERED = {("metaschedule", "rewrites")}


def _module_name(path: Path, folder: str) -> str:
    """``hooks/serving/session.py`` → ``schedhub.hooks.serving.session`` (a package's ``__init__`` is the package)."""
    parts = path.relative_to(ROOT / folder).with_suffix("").parts
    return ".".join([PACKAGES[folder], *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _imports(path: Path, folder: str) -> set[str]:
    """The modules of ``folder``'s package that a file imports anywhere (function-level imports included), by full name."""
    import ast

    name = _module_name(path, folder)
    package = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *([node.module] if node.module else [])])
            if not base.startswith(PACKAGES[folder]):
                continue
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from package import module`
    return found


def _graph(folder: str) -> dict[str, set[str]]:
    files = {_module_name(p, folder): p for p in (ROOT / folder).rglob("*.py")}
    return {name: {m for m in _imports(path, folder) if m in files and m != name} for name, path in files.items()}


def test_no_import_cycles_inside_a_package() -> None:
    for folder in PACKAGES:
        graph = {m: deps for m, deps in _graph(folder).items()}
        inits = {m for m in graph if (ROOT / folder / Path(*m.split(".")[2:]) / "__init__.py").exists()}  # a package's __init__ may re-export

        def reaches(start: str, goal: str, seen: set[str]) -> bool:
            return any(n == goal or (n not in seen and n not in inits and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

        cycles = sorted(m for m in graph if m not in inits and reaches(m, m, {m}))
        assert not cycles, f"{PACKAGES[folder]}: modules on an import cycle: {cycles}"


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_subpackages_are_layers_each_importing_only_those_below(folder: str) -> None:
    """hooks: kernels < build < metaschedule, rewrites < serving < pipeline; tuner: execution < workloads < networks <
    compare < worker, demo. What a newcomer reads from the tree holds."""
    layer = {name: i for i, name in enumerate(LAYERS[folder])}
    wrong = []
    for module, deps in _graph(folder).items():
        parts = module.split(".")
        if len(parts) < 4 and not (ROOT / folder / parts[-1]).is_dir():  # the package's own top level imports every layer
            continue
        mine = parts[2]
        for dep in deps:
            dparts = dep.split(".")
            theirs = dparts[2] if len(dparts) > 2 else None
            if theirs == mine:
                continue
            if theirs not in layer or layer[theirs] > layer[mine] or (mine, theirs) in UNORDERED or (theirs, mine) in UNORDERED:
                wrong.append(f"{module} imports {dep}")
    assert not wrong, wrong
    assert sorted(p.name for p in (ROOT / folder).iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS[folder])


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
