"""One network compiled from several registries and timed side by side with its PyTorch twin: did a later run's
tuning buy the network anything, measured at one moment of the machine (runs hours apart see its speed move).

    python -m bench.studies.registries --store before=DIR --store after=DIR [--network resnet18] [--image 224 | --seq 128]
                                       [--prepack] [--conv winograd] [--math fast] [--layout NHWC] [--rounds 7] [--out FILE]
                                       [--min-tiles NAME=N] [--tiles NAME=M[,M]]

``--min-tiles NAME=N`` compiles store NAME with Winograd's threshold at N output tiles (``hooks.rewrites.winograd.MIN_TILES``)
instead of the hook's: one registry holding both a layer's direct and its Winograd records, compiled both ways
(``--store wino=DIR --store direct3=DIR --min-tiles direct3=17``: ResNet-18's 14×14 stage direct), says which the
network runs faster at one moment. ``--tiles NAME=4`` compiles store NAME with Winograd's F(4×4, 3×3) alone
(``hooks.rewrites.winograd.TILES``): ResNet-18's 7×7 stage direct rather than F(2×2, 3×3).

Each registry must hold a record of every kernel the compile looks up (``hooks.use`` with the given rewrites): a miss
or a transfer is an error, not a figure. The networks and PyTorch (in a process of its own) run in interleaved rounds;
each is reported against PyTorch and against the first registry, paired round by round.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from schedhub.hooks.rewrites import Rewrites
from schedhub.tuner.execution import tvm_env
from schedhub.tuner.compare.torch_process import TorchProcess

from ..models import MODES, TORCH_TWINS, Network, build_network, check_agreement, network_input, time_side_by_side
from ..report import REPO, environment
from ..stats import ratio
from ..torch_export import RELAX
from .cache_flush import compiled


def named_store(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` as (name, folder)."""
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"{text!r}: write a registry as NAME=DIR")
    if not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"{folder}: no such folder")
    return name, Path(folder)


def min_tiles_of(text: str) -> tuple[str, int]:
    """``NAME=N`` as (name, a threshold of output tiles)."""
    name, sep, count = text.partition("=")
    if not sep or not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: write a threshold as NAME=N, N a count of output tiles")
    return name, int(count)


def tile_sizes(text: str) -> tuple[int, ...]:
    """``M[,M...]`` as Winograd's tile sizes, largest first (``hooks.rewrites.winograd.TILES``)."""
    parts = text.split(",")
    if not all(m in ("2", "4") for m in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: write Winograd's tile sizes as M[,M], each M 4 or 2")
    return tuple(sorted({int(m) for m in parts}, reverse=True))


def tiles_of(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=M[,M...]`` as (name, :func:`tile_sizes`)."""
    name, sep, sizes = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: write Winograd's tile sizes as NAME=M[,M], each M 4 or 2")
    return name, tile_sizes(sizes)


def compiled_with_winograd(mod: Any, target: Any, store: Path, rewrites: Rewrites, min_tiles: int | None, tiles: tuple[int, ...] | None) -> Any:
    """:func:`.cache_flush.compiled`, with Winograd's threshold at ``min_tiles`` output tiles and its tile sizes
    ``tiles`` where given."""
    from schedhub.hooks.rewrites import winograd

    kept = winograd.MIN_TILES, winograd.TILES
    winograd.MIN_TILES, winograd.TILES = min_tiles or kept[0], tiles or kept[1]
    try:
        return compiled(mod, target, store, rewrites)
    finally:
        winograd.MIN_TILES, winograd.TILES = kept


def add_network_options(parser: argparse.ArgumentParser) -> None:
    """The options that say which network, at which shape, compiled with which rewrites."""
    parser.add_argument("--network", default="resnet18")
    parser.add_argument("--image", type=int, help="the image size (the convolutional networks)")
    parser.add_argument("--seq", type=int, help="the sequence length (bert_layer)")
    parser.add_argument("--prepack", action="store_true")
    parser.add_argument("--conv", default="direct")
    parser.add_argument("--math", default="exact")
    parser.add_argument("--layout", default="given", help="the convolutions' layout, every store's (hooks.use(..., layout=...))")


def network_of(args: argparse.Namespace) -> tuple[Network, Rewrites, str]:
    """The network at batch 1, built as the full table builds it (``bench.models``: imported from its PyTorch twin or
    in Relax); its rewrites; and the options that asked for them (for a result's command)."""
    shape = {**({"image": args.image} if args.image else {}), **({"seq": args.seq} if args.seq else {})}
    frontend = next((n.frontend for n in MODES["full"]["networks"] if n.name == args.network), RELAX)
    rewrites = Rewrites(prepack=args.prepack, conv=args.conv, math=args.math, layout=args.layout)
    said = f"--network {args.network}" + "".join(f" --{k} {v}" for k, v in shape.items()) + "".join(f" {f}" for f in rewrites.flags())
    return Network(args.network, 1, shape, frontend), rewrites, said


def host_network(args: argparse.Namespace) -> tuple[Any, Network, Rewrites, str]:
    """TVM prepared (``tvm_env.prepare``), this host's target, and :func:`network_of` ``args``."""
    import tvm

    tvm_env.prepare()
    return (tvm.target.Target(tvm_env.host_target()), *network_of(args))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.registries", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=named_store, action="append", required=True, help="NAME=DIR, a registry that tuned the network (repeat)")
    add_network_options(parser)
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds")
    parser.add_argument("--min-tiles", type=min_tiles_of, action="append", default=[], help="NAME=N: compile store NAME with Winograd's threshold at N tiles")
    parser.add_argument("--tiles", type=tiles_of, action="append", default=[], help="NAME=M[,M]: compile store NAME with these Winograd tile sizes")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "registries.json")
    args = parser.parse_args()
    stores, min_tiles, tiles = dict(args.store), dict(args.min_tiles), dict(args.tiles)
    if len(stores) != len(args.store):
        parser.error("each --store needs a name of its own")
    if set(min_tiles) - set(stores) or set(tiles) - set(stores):
        parser.error(f"--min-tiles or --tiles names no --store: {sorted((set(min_tiles) | set(tiles)) - set(stores))}")
    import tvm

    tvm_env.prepare()
    target = tvm.target.Target(tvm_env.host_target())
    network, rewrites, said = network_of(args)
    with tempfile.TemporaryDirectory(prefix="schedhub-registries-") as tmp:
        mod, func, weights, input_shape = build_network(network, Path(tmp))
        x = network_input(input_shape)
        executables = {name: compiled_with_winograd(mod, target, folder, rewrites, min_tiles.get(name), tiles.get(name)) for name, folder in stores.items()}
        with TorchProcess(cwd=REPO) as torch_proc:
            twin = torch_proc.load_network(network.name, weights, x, factory=TORCH_TWINS, batch=network.batch, **network.shape)
            timing, errors = time_side_by_side(executables, x, args.rounds, twin, torch_proc.time_network, func=func)
    check_agreement(args.network, errors)
    first = next(iter(stores))
    result: dict[str, Any] = {
        "command": "python -m bench.studies.registries " + " ".join(f"--store {n}={f}" for n, f in stores.items()) + f" {said} --rounds {args.rounds}"
                   + "".join(f" --min-tiles {n}={t}" for n, t in min_tiles.items()) + "".join(f" --tiles {n}={','.join(map(str, t))}" for n, t in tiles.items()),
        "environment": environment(),
        "timing_ms": timing,
        "vs_pytorch": {name: ratio(timing["pytorch"], timing[name], paired=True) for name in stores},
        f"vs_{first}": {name: ratio(timing[first], timing[name], paired=True) for name in stores if name != first},
    }
    print(json.dumps({k: result[k] for k in result if k.startswith("vs_")}, indent=1, default=str))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
