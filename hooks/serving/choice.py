"""Rewrites chosen by what the registry holds: ``use(..., layout="auto", prepack="auto")``, ``use``'s defaults.

A record is found only under the rewrites it was tuned with (:mod:`.rewrites`), so a compile with fixed rewrites
misses every record tuned with others, however much faster they are. A compile that leaves a rewrite to ``"auto"``
fuses the network once for each value it may take, looks every option's kernels up in the compile's one batch
request, and compiles the option the registry's records say is fastest:

1. the largest share of its kernels with a record the session would serve (its ``trust``), so that a network tuned in
   full under one option is not left for one that is half tuned;
2. then, among options held in full, the least time those records claim, each kernel's best record's mean time × the
   calls of it in the module: the network's run as the registry knows it (on znver4, ResNet-18@224's sum was 28.0 ms
   NCHW and 21.9 ms NHWC prepacked, the network 28.2 and 20.7 ms). A share rather than a count of missed calls, and no
   time where kernels are missed: options differ in their kernels (NHWC adds transposes), and MobileNet-V2 from a
   store of ResNet-18's records held one NHWC kernel, the input's transpose both networks share, and nothing in the
   given layout; ranked on missed calls and then time, the given layout (one kernel fewer, claiming nothing) won, and
   ran its rules' schedules 2.6× slower.

Where no option holds more than another, the *lead* is compiled (:func:`leading`): the option the CPU is best tuned
with (:func:`tuned_best`: NHWC prepacked on AVX2 and AVX-512, what ``schedhub tune`` tunes there; the given layout
unpacked elsewhere), and the compile's one request asks neighbours to transfer for the lead's kernels only. Where no
option holds a record of the network (an empty registry, one holding other networks or this one at other shapes, a
registry that is down), the lead is compiled whatever its kernel count: its misses get the CPU rules' schedules
(:mod:`.rules`), which beat the given layout's (ResNet-18@160 ran 24 ms ruled NHWC prepacked, 97 ms ruled in the given
layout, znver3), and the misses queued are the kernels worth a worker's time. Misses are reported under the option
compiled, as a fixed compile's are. A layout that converts nothing in the network (NHWC where it has no convolutions)
is not an option.

Only the rewrites that keep the math exact are offered: the convolutions' layout (a transpose) and prepacking (a
weights' repack). Fast math and Winograd round differently, so a compile takes them only when its caller names them.
Prepacking is a CPU rewrite (MetaSchedule's GPU postprocessors lay out no weights): on a GPU target ``"auto"`` leaves
the weights as given.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tvm
import tvm_ffi
from tvm import relax

from schedhub.registry import Identity, Record

from ..kernels.cache import KernelCache
from ..rewrites.constants import constant_tensor
from ..kernels.defaults import is_gpu
from ..kernels.identity import compiler_fingerprint, kept_identity, target_text
from ..rewrites.layouts import LAYOUTS, Layout, converts
from ..rewrites import Math, Rewrites
from ..rewrites.winograd import Conv

AUTO = "auto"
Auto = Literal["auto"]

#: A kernel of one option's module: its identity and how many times the module calls it.
Kernel = tuple[Identity, int]


@dataclass(frozen=True)
class RewriteOptions:
    """The rewrites a compile may take, the first where the registry prefers none (one option: fixed rewrites)."""

    options: tuple[Rewrites, ...]

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError("a compile needs at least one set of rewrites to choose from")

    @classmethod
    def of(cls, layout: Layout | Auto, math: Math, prepack: bool | Auto, conv: Conv) -> RewriteOptions:
        """Every combination of the values ``use(...)`` was given, ``"auto"`` standing for each value of its rewrite."""
        if prepack != AUTO and not isinstance(prepack, bool):
            raise ValueError(f"prepack is True, False or {AUTO!r}, not {prepack!r}")
        if layout != AUTO and layout not in LAYOUTS:
            raise ValueError(f"unknown convolution layout {layout!r}: schedhub converts to one of {', '.join(LAYOUTS)}, or chooses with {AUTO!r}")
        layouts: tuple[str, ...] = LAYOUTS if layout == AUTO else (layout,)
        prepacks = (False, True) if prepack == AUTO else (prepack,)
        return cls(tuple(Rewrites(each, math, packed, conv) for each in layouts for packed in prepacks))  # type: ignore[arg-type]

    @property
    def fixed(self) -> bool:
        return len(self.options) == 1

    @property
    def first(self) -> Rewrites:
        return self.options[0]

    def for_target(self, target: tvm.target.Target | None) -> RewriteOptions:
        """The options that make sense on ``target``: on a GPU, no prepacking where unpacked weights are an option too."""
        if target is None or not is_gpu(target) or self.fixed:
            return self
        unpacked = tuple(r for r in self.options if not r.prepack)
        return RewriteOptions(unpacked) if unpacked else self

    def for_module(self, mod: tvm.IRModule) -> RewriteOptions:
        """The options less those whose layout converts nothing in ``mod``, where the given layout is an option too:
        they would fuse into the given layout's kernels (a network without convolutions is fused once a packing)."""
        if self.fixed or not any(r.layout == "given" for r in self.options):
            return self
        changes = {layout: layout == "given" or converts(layout, mod) for layout in {r.layout for r in self.options}}  # type: ignore[arg-type]
        return RewriteOptions(tuple(r for r in self.options if changes[r.layout]))


@dataclass(frozen=True)
class Holding:
    """What the registry holds for one option's kernels."""

    rewrites: Rewrites
    kernels: int  # distinct kernels of the option's module
    held: int  # of them, with a record the session would serve
    missed_calls: int  # calls of the kernels without one
    held_secs: float  # Σ best record's mean time × calls, over the kernels with one

    def rank(self) -> tuple[float, float]:
        """Lower is better: the largest share of the option's kernels held, then, where it holds them all, the least
        time it claims. A share, not a count of missed calls: options differ in their kernels (NHWC adds the input's
        and output's transposes), and where kernels are missed the times claimed are of different kernels (an option
        holding one kernel another network shares claims more than one holding none), so they decide nothing."""
        share = self.held / self.kernels if self.kernels else 0.0
        return (-share, self.held_secs if share == 1.0 else 0.0)

    def describe(self) -> str:
        """e.g. "convolutions NHWC, weights prepacked: 22 of 22 kernels held, 21.9 ms"."""
        return f"{self.rewrites.describe() or 'no rewrites'}: {self.held} of {self.kernels} kernels held, {self.held_secs * 1e3:.3g} ms"


def holding(rewrites: Rewrites, kernels: Sequence[Kernel], records: Callable[[Identity], list[Record]]) -> Holding:
    """What ``records`` (a session's, best first) hold for the kernels of ``rewrites``' module."""
    held, missed_calls, secs = 0, 0, 0.0
    for identity, calls in kernels:
        found = records(identity)
        if found:
            held += 1
            secs += found[0].mean_secs * calls
        else:
            missed_calls += calls
    return Holding(rewrites, len(kernels), held, missed_calls, secs)


#: The kernel cache's kind for an option's kernels, by compiler, target, network (:func:`network_digest`), this package's
#: source (:func:`source_digest`: a version that rewrites the network otherwise fuses it anew) and rewrites.
OPTION_KERNELS = "option-kernels"

#: Constants of at most this many elements are part of :func:`network_digest` by value: legalization writes a scalar's
#: value into the kernel that uses it (``legalize_ops.common._try_convert_to_scalar_const``, NMS's box count); any
#: other constant (a weight, a bias) is an argument, its values no kernel's.
_SMALL_CONSTANT = 1


def network_digest(mod: tvm.IRModule) -> str:
    """What names a network's kernels, and no more: its structure, and the values of its scalar constants only. A module
    that differs from another in its weights' values alone fuses into the same kernels, and its digest costs 0.9 ms for
    ResNet-18@224 where a structural hash of its 44 MB of weights took 24. (A digest that named other kernels could cost
    only the choice: the option chosen is fused and its kernels identified anew, as every compile's are.)"""
    digest = hashlib.sha256(str(tvm_ffi.structural_hash(mod, skip_tensor_content=True)).encode())

    def visit(expr: relax.Expr) -> None:
        value = constant_tensor(expr)
        if value is not None and math.prod(int(d) for d in value.shape) <= _SMALL_CONSTANT:
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode() + value.numpy().tobytes())

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return digest.hexdigest()


def network_parts(mod: tvm.IRModule, target: tvm.target.Target) -> tuple[str, ...]:
    """What names the kernels of ``mod`` on ``target`` before the rewrites: the compiler, the target, the network
    (:func:`network_digest`) and the hook's source (:func:`source_digest`: another version may rewrite it otherwise)."""
    return (compiler_fingerprint(), target_text(target), network_digest(mod), source_digest())


def kept_kernels(cache: KernelCache, parts: tuple[str, ...]) -> list[Kernel] | None:
    """An option's kernels as an earlier compile on this machine found them (None: not kept, or not readable as such).
    What lets a later compile weigh an option without fusing it and identifying its kernels."""
    entry = cache.get(OPTION_KERNELS, *parts)
    try:
        if entry is None:
            return None
        kernels = [(kept_identity(each["identity"]), each["calls"]) for each in entry["kernels"]]
        if all(identity is not None and type(calls) is int and calls > 0 for identity, calls in kernels):
            return kernels  # type: ignore[return-value]
        return None
    except (KeyError, TypeError):  # an entry of another shape: fused again
        return None


def keep_kernels(cache: KernelCache, parts: tuple[str, ...], kernels: Sequence[Kernel]) -> None:
    cache.put(OPTION_KERNELS, parts, {"kernels": [{"identity": identity.to_dict(), "calls": calls} for identity, calls in kernels]})


#: The kernel cache's kind for an option TVM could not rewrite a network to, by what names the option's kernels (this
#: package's source among it: a version that rewrites the network otherwise tries again).
OPTION_FAILED = "option-failed"


def kept_failure(cache: KernelCache, parts: tuple[str, ...]) -> str | None:
    """Why TVM could not rewrite the network as an option says, where an earlier compile on this machine found so."""
    entry = cache.get(OPTION_FAILED, *parts)
    why = entry.get("failed") if isinstance(entry, dict) else None
    return why if isinstance(why, str) else None


def keep_failure(cache: KernelCache, parts: tuple[str, ...], why: str) -> None:
    cache.put(OPTION_FAILED, parts, {"failed": why})


@functools.cache
def source_digest() -> str:
    """The SHA-256 of the hook's Python source, every subpackage's (its passes among it)."""
    digest = hashlib.sha256()
    hooks = Path(__file__).resolve().parent.parent
    for path in sorted(hooks.rglob("*.py")):
        digest.update(path.relative_to(hooks).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def choose(holdings: Sequence[Holding]) -> Holding:
    """The option to compile: the best :meth:`Holding.rank`, the earliest on a tie."""
    return min(holdings, key=Holding.rank)


#: The CPU feature under which NHWC, prepacked records made a network beat PyTorch where the same tuning without them
#: lost: every AVX-512 machine of README's table (znver4, znver5, rocketlake; ResNet-18@224 on znver4, 25 minutes each
#: way: 1.24× against 0.93×), and AVX2 code on znver4 against PyTorch held to AVX2 (20 minutes each: 1.14× against 0.74×,
#: ``bench/results/studies/avx2-resnet18-*.json``). AVX-512 CPUs have it too.
WIDE_VECTORS = "avx2"


def has_wide_vectors(target: tvm.target.Target | dict[str, Any]) -> bool:
    """Whether ``target`` is a CPU whose LLVM target has AVX2 or more (its ``mcpu``'s or its ``mattr``'s)."""
    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    return tgt.kind.name == "llvm" and bool(tvm.target.codegen.target_has_features(WIDE_VECTORS, tgt))


def tuned_best(target: tvm.target.Target | dict[str, Any], math: Math, conv: Conv) -> Rewrites:
    """The rewrites ``target``'s kernels are best tuned with, as far as measured: NHWC convolutions (the given layout
    with Winograd, which converts NCHW ones) and prepacked weights on a CPU with AVX2 or AVX-512; none elsewhere (no
    other CPU was measured to gain by them). What ``schedhub tune`` takes where none is named, and what a compile
    takes, and so queues, where the registry holds no record of the network (:func:`leading`)."""
    wide = has_wide_vectors(target)
    return Rewrites("NHWC" if wide and conv == "direct" else "given", math, wide, conv)


def compiled_first(target: tvm.target.Target | dict[str, Any], modules: Sequence[tvm.IRModule] = (), math: Math = "exact", conv: Conv = "direct") -> Rewrites:
    """The rewrites a compile with ``use(...)``'s defaults takes for a network the registry holds nothing of, and what
    ``schedhub tune`` takes where none is named: :func:`tuned_best`, with the given layout where that layout converts
    nothing in ``modules`` (no convolution: the same keys, said as they are)."""
    best = tuned_best(target, math, conv)
    converted = not modules or any(converts(best.layout, mod) for mod in modules)
    return best if converted else dataclasses.replace(best, layout="given")


def leading(options: Sequence[Rewrites], target: tvm.target.Target) -> Rewrites:
    """The option a compile asks neighbours for at once and takes where no option holds more records than another:
    the one ``target`` is best tuned with (:func:`tuned_best`; its layout where the network has no convolution to
    convert), so that its misses get the CPU rules' schedules and transfers of what ``schedhub tune`` tunes there, and
    the misses queued are the kernels worth a worker's time; the first where it is not among ``options``."""
    first = options[0]
    best = tuned_best(target, first.math, first.conv)
    layouts = {r.layout for r in options}
    wanted = dataclasses.replace(best, layout=best.layout if best.layout in layouts else first.layout)
    return wanted if wanted in options else first
