"""Why a network runs slower than the sum of its kernels alone: the kernels replayed in the network's order.

    python -m bench.studies.gap --store DIR [--network resnet18 --image 224] [--prepack] [--conv winograd] [--rounds 5]

The network compiles through the hook from ``--store`` (every kernel a hit). One forward pass is run with an instrument
that keeps each kernel call's function and arguments (the VM's own tensors: its weights, and activations in its memory
pool). Then, in interleaved rounds:

- ``network``: the forward pass as the VM runs it (its ``time_evaluator``);
- ``once``: the kernel calls replayed from Python in the network's order, each timed (their sum: the network less the
  VM's own work between kernels);
- ``twice``: the same, each kernel run once more just before it is timed, so it finds its weights, workspace, output
  and every core's caches as it left them: how the tuner times a kernel alone;
- ``touched``: each kernel's weights and output read by this thread just before it is timed: are the arguments'
  cache lines what ``twice`` buys?
- ``evicted``: before each kernel, :data:`EVICT_BYTES` written here (every cache of this core and the shared one
  emptied, the workspace a kernel allocates inside itself too), then its input read back: a kernel alone timed cold but
  for its input, as a network's kernel runs after its producer. Does it say what a kernel pays in the network better
  than MetaSchedule's flushed timing (``flushed``: every argument but the input flushed), which leaves the
  kernel's own workspace warm?

After those rounds the pages under every tensor the instrument saw are collapsed into 2 MB huge pages
(``madvise(MADV_COLLAPSE)``, Linux 6.1 and later) and ``network`` and ``once`` are timed again (``huge_pages``): is it
the TLB? (Those rounds come after the others, so that ratio is not paired round by round.)

Recorded: each arm's total per round; ``vs_once``, ``once``'s total over each arm's (above 1: the arm is faster); each
kernel's median ms in every arm.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..models import build_network, network_input
from ..report import REPO, environment
from ..stats import ratio, summary
from .cache_flush import compiled
from .registries import add_network_options, host_network

HUGE_PAGE = 2 << 20
EVICT_BYTES = 128 << 20  # 4x the largest L3 of this project's machines
MADV_COLLAPSE = 25
REPLAYS = 9  # replays a round, its median kept
ARMS = ("network", "once", "twice", "touched", "evicted", "flushed")


@dataclass(frozen=True)
class Call:
    """One kernel call of a forward pass: the function, its arguments, and the arguments as numpy views."""

    name: str
    func: Callable[..., Any]
    args: tuple[Any, ...]
    arrays: tuple[np.ndarray, ...]


def kernel_calls(vm: Any, arg: Any, func: str) -> list[Call]:
    """The kernel calls (not the VM's builtins) of one forward pass, in order."""
    import tvm

    calls: list[Call] = []

    def instrument(function: Any, name: str, before: bool, _ret: Any, *args: Any) -> int:
        if before and not name.startswith("vm.builtin"):
            arrays = tuple(np.from_dlpack(a) for a in args if isinstance(a, tvm.runtime.Tensor))
            calls.append(Call(name.removesuffix("_prepacked"), function, args, arrays))
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    vm[func](arg)
    vm.set_instrument(None)
    return calls


@functools.lru_cache(maxsize=1)
def _scratch() -> np.ndarray:
    """:data:`EVICT_BYTES` of this process's memory, written once so that its pages are there."""
    return np.ones(EVICT_BYTES, dtype=np.uint8)


def replay(calls: list[Call], prepare: str) -> list[float]:
    """Seconds of each call, replayed in order; before each, ``prepare``: nothing (``once``), the call itself
    (``twice``), its weights and output read here (``touched``), the caches emptied and its input read back
    (``evicted``), or every argument but the input flushed (``flushed``, as MetaSchedule's timing does)."""
    import tvm

    scratch = _scratch() if prepare == "evicted" else None
    flush = tvm.get_global_func("cache_flush_cpu_non_first_arg")
    times = []
    for n, call in enumerate(calls):
        if prepare == "twice":
            call.func(*call.args)
        elif prepare == "touched":
            for array in call.arrays[1:]:
                array.sum()
        elif prepare == "evicted":
            scratch.fill(n % 256)  # type: ignore[union-attr]
            call.arrays[0].sum()
        elif prepare == "flushed":
            flush(*call.args)
        started = time.perf_counter()
        call.func(*call.args)
        times.append(time.perf_counter() - started)
    return times


def collapse(calls: list[Call]) -> dict[str, int]:
    """Collapse the 2 MB spans under every argument of ``calls`` into huge pages; how many did and did not."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    spans = set()
    for array in (a for call in calls for a in call.arrays):
        start, end = array.ctypes.data, array.ctypes.data + array.nbytes
        spans.update(range(start & ~(HUGE_PAGE - 1), end, HUGE_PAGE))
    done = sum(libc.madvise(span, HUGE_PAGE, MADV_COLLAPSE) == 0 for span in spans)
    return {"spans": len(spans), "collapsed": done}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.gap", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="a registry that tuned the network with these rewrites")
    add_network_options(parser)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "studies" / "gap.json")
    args = parser.parse_args()
    import tvm
    from tvm import relax

    target, network, rewrites, said = host_network(args)
    with tempfile.TemporaryDirectory(prefix="schedhub-gap-") as tmp:
        mod, func, _, input_shape = build_network(network, Path(tmp))
        vm = relax.VirtualMachine(compiled(mod, target, args.store, rewrites), tvm.cpu())
    arg = tvm.runtime.tensor(network_input(input_shape))
    for _ in range(3):
        vm[func](arg)
    calls = kernel_calls(vm, arg, func)
    evaluator = vm.time_evaluator(func, tvm.cpu(), number=1, repeat=REPLAYS, min_repeat_ms=0)

    def timed_round(arms: tuple[str, ...]) -> dict[str, list[float]]:
        """Each arm's per-call ms (``network``: one figure), the median of :data:`REPLAYS` passes."""
        out = {"network": [statistics.median(evaluator(arg).results) * 1e3]} if "network" in arms else {}
        for arm in (a for a in arms if a != "network"):
            passes = [replay(calls, arm) for _ in range(REPLAYS)]
            out[arm] = [statistics.median(p[i] for p in passes) * 1e3 for i in range(len(calls))]
        return out

    rounds: dict[str, list[dict[str, list[float]]]] = defaultdict(list)
    for _ in range(args.rounds):
        for arm, per_call in timed_round(ARMS).items():
            rounds[arm].append(per_call)
    pages = collapse(calls)
    for _ in range(args.rounds):
        for arm, per_call in timed_round(("network", "once")).items():
            rounds[f"{arm}_huge_pages"].append(per_call)
    totals = {arm: summary([sum(r) for r in per_round]) for arm, per_round in rounds.items()}
    per_kernel = [{"name": call.name, "shapes": [list(a.shape) for a in call.arrays], "weights_mb": sum(a.nbytes for a in call.arrays[1:-1]) / 1e6,
                   **{arm: statistics.median(r[i] for r in rounds[arm]) for arm in ARMS[1:]}}
                  for i, call in enumerate(calls)]  # fmt: skip
    result = {
        "command": f"python -m bench.studies.gap --store {args.store} {said} --rounds {args.rounds}",
        "environment": environment(),
        "total_ms": totals,
        "vs_once": {arm: ratio(totals["once"], totals[arm], paired=True) for arm in ARMS if arm != "once"},
        "huge_pages": {**pages, "network": ratio(totals["network"], totals["network_huge_pages"], paired=False),
                       "once": ratio(totals["once"], totals["once_huge_pages"], paired=False)},  # fmt: skip
        "kernels": per_kernel,
    }
    print(json.dumps({k: result[k] for k in ("vs_once", "huge_pages")}, indent=1, default=str))
    print(json.dumps({arm: round(t["median"], 3) for arm, t in totals.items()}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
