"""A network's compile through the hook side by side with another revision's: the first compile on a machine (an empty
kernel cache), the next one in the same process, one in a fresh process on the kernel cache those two filled (a
user's script run again: the case that pays each process's one-time costs with nothing to build), and one of the same
network with other weights in a fresh process on that cache (a new checkpoint of a model the machine compiled before:
its kernels are known, its weights not).

    python -m bench.compile_cost --store DIR --against REV [--network resnet18] [--frontend torch.export]
                                 [--layout NHWC] [--prepack | --auto | --defaults] [--rounds 3]

``--network`` is one of the full mode's networks at batch 1 (``resnet18`` and ``mobilenetv2`` at 224 px, ``bert_layer``
at seq 128, ``mlp``); ``--frontend`` how ResNet-18 and MobileNet-V2 are imported from their PyTorch twins: ``torch.export``
as ``schedhub tune`` imports them (BatchNorm folded at import), ``torch.export plain`` by ``from_exported_program``
alone, as the README imports a model. ``--auto`` compiles with ``layout="auto", prepack="auto"``, ``--defaults`` with
no rewrite named (each revision's own defaults: what a user's plain ``use(...)`` gets there). DIR is a registry
holding the network's records (a ``bench.models --keep-store``), copied for each revision's processes and not changed.
The network is built once and handed to every process as TVM's JSON. Each round runs one revision, then the other
(this tree's first, then REV's, then the other way round). Prints each revision's medians and their ratios
(``before / this``: above 1, this tree compiles faster); writes nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .report import REPO
from .revisions import PACKAGES, alternating, checked_shims, child_env
from .stats import summary
from .torch_export import RELAX, TORCH_EXPORT, TORCH_EXPORT_PLAIN

_CHILD = """
import json, sys, time
from pathlib import Path
import tvm
from schedhub import hooks
from schedhub.registry import LocalRegistry
from schedhub.tuner.execution import tvm_env
module, store, cache, rewrites, compiles = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
tvm_env.prepare()
mod = tvm.ir.load_json(Path(module).read_text())
target = tvm.target.Target(tvm_env.host_target())
secs, summaries = [], []
with LocalRegistry(store) as reg:
    for _ in range(compiles):
        start = time.perf_counter()
        with hooks.use(reg, target, report_misses=False, cache=cache, **rewrites) as session:
            tvm.compile(mod, target)
        secs.append(time.perf_counter() - start)
        summaries.append(session.report.summary())
print(json.dumps({"secs": secs, "summary": summaries[-1]}))
"""

PHASES = ("first", "next", "rerun", "reweighted")


def _compiles(shim: Path, module: Path, store: Path, cache: Path, rewrites: dict[str, Any], compiles: int) -> dict[str, Any]:
    cmd = [sys.executable, "-c", _CHILD, str(module), str(store), str(cache), json.dumps(rewrites), str(compiles)]
    out = subprocess.run(cmd, cwd=REPO, env=child_env(shim), check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def compile_secs(shim: Path, modules: tuple[Path, Path], store: Path, rewrites: dict[str, Any]) -> dict[str, Any]:
    """One revision's four compiles: two in one process on an empty kernel cache, then one in a fresh process on it, then
    one of the network with other weights (``modules``: the network, then it reweighted) in another fresh process."""
    module, other = modules
    with tempfile.TemporaryDirectory(prefix="schedhub-compile-cost-") as tmp:
        shutil.copytree(store, Path(tmp) / "store")
        cache = Path(tmp) / "cache"
        both = _compiles(shim, module, Path(tmp) / "store", cache, rewrites, 2)
        again = _compiles(shim, module, Path(tmp) / "store", cache, rewrites, 1)
        reweighted = _compiles(shim, other, Path(tmp) / "store", cache, rewrites, 1)
    return {"first": both["secs"][0], "next": both["secs"][1], "rerun": again["secs"][0], "reweighted": reweighted["secs"][0], "summary": again["summary"]}


def network_json(network: str, frontend: str, scratch: Path) -> tuple[Path, Path]:
    """The network (full mode, batch 1) as TVM's JSON, built once for every process; then the same with other weights."""
    import tvm

    from .models import Network, build_network, networks_of

    shipped = networks_of("full", [network], 1)[0]
    frontend = frontend if shipped.frontend != RELAX else RELAX  # the BERT layer and the MLP have no PyTorch import here
    mod = build_network(Network(shipped.name, shipped.batch, shipped.shape, frontend), scratch)[0]
    paths = scratch / "network.json", scratch / "reweighted.json"
    for path, each in zip(paths, (mod, reweighted(mod)), strict=True):
        path.write_text(tvm.ir.save_json(each))
    return paths


def reweighted(mod: Any, factor: float = 1.5) -> Any:
    """``mod`` with every float tensor constant of more than one element multiplied by ``factor``: the same network,
    other weights."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Reweighted(PyExprMutator):  # type: ignore[misc]
        def visit_generic_const_(self, const: Any) -> Any:  # noqa: N802 (TVM's visitor name)
            value = const.value.numpy() if isinstance(const.value, tvm.runtime.Tensor) else None
            if value is None or value.size < 2 or value.dtype.kind != "f":
                return const
            return relax.const((value * factor).astype(value.dtype))

    out = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = Reweighted(mod).visit_expr(func)
    return out


def against_revision(rev: str, store: Path, network: str, frontend: str, rewrites: dict[str, Any], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="schedhub-compile-cost-") as scratch:
        modules = network_json(network, frontend, Path(scratch))
        shims = checked_shims(("worktree", rev), Path(scratch), PACKAGES)
        runs = alternating(shims, rounds, lambda _, shim: compile_secs(shim, modules, store, rewrites))
    this, before = runs["worktree"], runs[rev]
    return {"against": rev, "network": network, "frontend": frontend, "rewrites": rewrites, "rounds": rounds,
            "summaries": {"this": this[-1]["summary"], "before": before[-1]["summary"]},
            **{f"{which}_{phase}_secs": summary([r[phase] for r in each]) for which, each in (("this", this), ("before", before)) for phase in PHASES},
            **{f"{phase}_before_over_this": summary([b[phase] / t[phase] for b, t in zip(before, this)]) for phase in PHASES}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a registry holding the network's records (copied, not changed)")
    parser.add_argument("--against", metavar="REV", required=True, help="the git revision to compare with")
    parser.add_argument("--network", default="resnet18", choices=["resnet18", "mobilenetv2", "bert_layer", "mlp"])
    parser.add_argument("--frontend", default=TORCH_EXPORT, choices=[TORCH_EXPORT, TORCH_EXPORT_PLAIN])
    parser.add_argument("--layout", default="given", choices=["given", "NHWC"])
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--prepack", action="store_true")
    choice.add_argument("--auto", action="store_true", help='layout="auto", prepack="auto" (not with --layout)')
    choice.add_argument("--defaults", action="store_true", help="no rewrite named: each revision's own defaults (not with --layout)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if (args.auto or args.defaults) and args.layout != "given":
        parser.error("--auto and --defaults choose the layout: leave --layout out")
    rewrites: dict[str, Any] = {}  # --defaults: none named
    if args.auto:
        rewrites = {"layout": "auto", "prepack": "auto"}
    elif not args.defaults:
        rewrites = {"layout": args.layout, "prepack": args.prepack}
    print(json.dumps(against_revision(args.against, args.store, args.network, args.frontend, rewrites, args.rounds), indent=1))


if __name__ == "__main__":
    main()
