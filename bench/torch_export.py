"""A shipped network's PyTorch twin imported through ``torch.export`` and TVM's PyTorch frontend.

    python -m bench.torch_export NAME WEIGHTS.npz OUT.json [key=value ...] [plain=1]
    python -m bench.torch_export --factory PKG.MOD:FACTORY 1,3,224,224 OUTDIR

Runs in a process of its own (the benchmark process never imports PyTorch): builds the twin from
``bench.torch_models`` with the given weights (by Relax parameter name), exports it with
``torch.export`` and converts it as ``schedhub tune`` converts a PyTorch model
(``schedhub.tuner.networks.plan.from_torch_export``: weights bound as constants, BatchNorm folded into the
convolutions), as a user importing a trained model for inference would; ``plain=1``: by ``from_exported_program``
alone, as the README imports a model (BatchNorm apart, biases reshaped: the hook folds them). Writes the Relax module as TVM's
JSON (``tvm.ir.save_json``; read it back with ``tvm.ir.load_json`` under the same TVM build).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TORCH_EXPORT = "torch.export"  # the frontend name of a network imported this way
TORCH_EXPORT_PLAIN = "torch.export plain"  # imported by ``from_exported_program`` alone, as the README's user imports a model
RELAX = "relax"  # the frontend name of a network built with Relax's nn modules (the shipped models)


def import_twin(name: str, weights: dict[str, np.ndarray], shape: dict[str, int], workdir: Path, plain: bool = False) -> Any:
    """The Relax module (entry ``main``) of ``name``'s PyTorch twin with ``weights``, through ``torch.export``,
    converted in a child process (this process never imports PyTorch); ``plain``: by ``from_exported_program`` alone."""
    import tvm

    np.savez(workdir / "weights.npz", **weights)
    out = workdir / "exported.json"
    cmd = [sys.executable, "-m", "bench.torch_export", name, str(workdir / "weights.npz"), str(out), *(f"{k}={v}" for k, v in shape.items()),
           *(["plain=1"] if plain else [])]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, timeout=600)
    return tvm.ir.load_json(out.read_text())


def export_factory(factory: str, input_shape: list[int], workdir: Path) -> tuple[Any, np.ndarray, np.ndarray]:
    """A user's PyTorch model (``pkg.mod:factory``, zero arguments, seeding its own weights) imported as ``schedhub
    tune`` imports it, in a child process: (the Relax module, the input ``TorchProcess.load_module`` times it on, eager
    PyTorch's output on that input)."""
    import tvm

    cmd = [sys.executable, "-m", "bench.torch_export", "--factory", factory, ",".join(map(str, input_shape)), str(workdir)]
    subprocess.run(cmd, cwd=REPO, check=True, timeout=900)
    x, out = (np.load(workdir / f, allow_pickle=False) for f in ("x.npy", "out.npy"))
    return tvm.ir.load_json((workdir / "exported.json").read_text()), x, out


def _export_factory(factory: str, shape: str, workdir: str) -> None:
    import torch
    import tvm

    from schedhub.tuner.networks.plan import from_torch_export, torch_factory

    module_name, _, function = factory.partition(":")
    net = torch_factory(module_name, function)().eval()
    x = torch.randn(*map(int, shape.split(",")), generator=torch.Generator("cpu").manual_seed(0))  # as TorchProcess.load_module draws it
    with torch.no_grad():
        out = net(x)
        exported = torch.export.export(net, (x,))
    np.save(Path(workdir) / "x.npy", x.numpy())
    np.save(Path(workdir) / "out.npy", out.numpy())
    Path(workdir, "exported.json").write_text(tvm.ir.save_json(from_torch_export(exported)))


def main(name: str, weights_path: str, out: str, *options: str) -> None:
    import torch
    import tvm

    from schedhub.tuner.networks.plan import from_torch_export

    from .torch_models import build

    shape = {k: int(v) for k, v in (o.split("=", 1) for o in options)}
    plain = bool(shape.pop("plain", 0))
    with np.load(weights_path, allow_pickle=False) as data:
        weights = {k: data[k] for k in data.files}
    net = build(name, weights, **shape)
    x = torch.from_numpy(np.zeros(_input_shape(name, shape), "float32"))
    with torch.no_grad():
        exported = torch.export.export(net, (x,))
    if plain:
        from tvm.relax.frontend.torch import from_exported_program

        mod = from_exported_program(exported)
    else:
        mod = from_torch_export(exported)
    Path(out).write_text(tvm.ir.save_json(mod))


def _input_shape(name: str, shape: dict[str, int]) -> tuple[int, ...]:
    if name in ("resnet18", "mobilenetv2"):
        return (shape["batch"], 3, shape["image"], shape["image"])
    if name == "bert_layer":
        return (shape["batch"], shape["seq"], 768)
    raise ValueError(f"no torch.export input shape for {name!r}")


if __name__ == "__main__":
    if sys.argv[1] == "--factory":
        _export_factory(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
