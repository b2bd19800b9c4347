"""A weights' layout rewrite done in numpy (hooks/rewrites/tiling.py): a rewrite that tiles its input is read as a reshape and a
transpose that compute what TVM's build of it computes, bit for bit; any other form is left to TVM's build."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from schedhub.hooks.rewrites.tiling import MAX_SPLIT, tilings

# fmt: off
@T.prim_func(private=True, s_tir=True)
def tiles(w: T.Buffer((T.int64(16), T.int64(3), T.int64(8)), "float32"), b: T.Buffer((T.int64(1), T.int64(16), T.int64(1)), "float32"),
          w_out: T.Buffer((T.int64(2), T.int64(3), T.int64(2), T.int64(8), T.int64(4)), "float32"),
          b_out: T.Buffer((T.int64(1), T.int64(4), T.int64(4)), "float32")):
    for a0, a1, a2 in T.grid(T.int64(1), T.int64(16), T.int64(1)):  # dimensions of extent 1 dropped, and one added
        with T.sblock("b_global"):
            v0, v1, v2 = T.axis.remap("SSS", [a0, a1, a2])
            b_out[T.int64(0), v1 // T.int64(4), v1 % T.int64(4)] = b[v0, v1, v2]
    for a0, a1, a2 in T.grid(T.int64(16), T.int64(3), T.int64(8)):
        with T.sblock("w_global"):
            v0, v1, v2 = T.axis.remap("SSS", [a0, a1, a2])
            w_out[v0 // T.int64(8), v1, v0 % T.int64(8) // T.int64(4), v2, v0 % T.int64(4)] = w[v0, v1, v2]


@T.prim_func(private=True, s_tir=True)
def padded(w: T.Buffer((T.int64(6), T.int64(3)), "float32"), out: T.Buffer((T.int64(3), T.int64(2), T.int64(4)), "float32")):
    for a0, a1 in T.grid(T.int64(6), T.int64(3)):  # 6 is no multiple of 4: the last tile is cut short
        with T.sblock("w_global"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            out[v1, v0 // T.int64(4), v0 % T.int64(4)] = w[v0, v1]


@T.prim_func(private=True, s_tir=True)
def cut(w: T.Buffer((T.int64(24), T.int64(96)), "float32"), b: T.Buffer((T.int64(1), T.int64(24)), "float32"),
        w_out: T.Buffer((T.int64(1), T.int64(2), T.int64(4), T.int64(16), T.int64(24)), "float32"), b_out: T.Buffer((T.int64(1), T.int64(24)), "float32")):
    for a0, a1 in T.grid(T.int64(1), T.int64(24)):  # a modulo past the values, a quotient always 0
        with T.sblock("b_global"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            b_out[v1 // T.int64(32), v1 % T.int64(32)] = b[v0, v1]
    for a0, a1 in T.grid(T.int64(24), T.int64(96)):  # as MobileNet-V2's rewrites: 24 in tiles of 16, the outer cut short
        with T.sblock("w_global"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            w_out[v0 // T.int64(32), v0 % T.int64(32) // T.int64(16), v1 // T.int64(24), v0 % T.int64(16), v1 % T.int64(24)] = w[v0, v1]


@T.prim_func(private=True, s_tir=True)
def ragged(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(2), T.int64(3)), "float32")):
    for a0 in range(T.int64(8)):  # a tile of 4 cut into tiles of 3: one inside another cut short
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            out[v0 // T.int64(4), v0 % T.int64(4) // T.int64(3), v0 % T.int64(4) % T.int64(3)] = w[v0]


@T.prim_func(private=True, s_tir=True)
def summed(w: T.Buffer((T.int64(4), T.int64(4)), "float32"), out: T.Buffer((T.int64(16),), "float32")):
    for a0, a1 in T.grid(T.int64(4), T.int64(4)):
        with T.sblock("w_global"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            out[v1 * T.int64(4) + v0] = w[v0, v1]


@T.prim_func(private=True, s_tir=True)
def guarded(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(4)), "float32")):
    for a0 in range(T.int64(8)):
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            T.where(a0 < T.int64(4))
            out[v0 // T.int64(4), v0 % T.int64(4)] = w[v0]


@T.prim_func(private=True, s_tir=True)
def partial(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(4)), "float32")):
    for a0 in range(T.int64(4)):  # half the input
        with T.sblock("w_global"):
            v0 = T.axis.spatial(T.int64(8), a0)
            out[v0 // T.int64(4), v0 % T.int64(4)] = w[v0]


@T.prim_func(private=True, s_tir=True)
def gathered(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(4)), "float32")):
    for a0, a1 in T.grid(T.int64(2), T.int64(4)):  # over the output, reading where it comes from
        with T.sblock("w_global"):
            v0, v1 = T.axis.remap("SS", [a0, a1])
            out[v0, v1] = w[v0 * T.int64(4) + v1]


@T.prim_func(private=True, s_tir=True)
def repeated(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(4)), "float32")):
    for a0 in range(T.int64(8)):  # one tile taken twice, the other never
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            out[v0 % T.int64(2), v0 % T.int64(4)] = w[v0]


@T.prim_func(private=True, s_tir=True)
def zeroed(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(8)), "float32")):
    for a0 in range(T.int64(8)):  # the second row never written
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            out[T.int64(0), v0] = w[v0]


@T.prim_func(private=True, s_tir=True)
def misshapen(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(4), T.int64(2)), "float32")):
    for a0 in range(T.int64(8)):  # tiles of 4 and 2 written into dimensions of 2 and 4
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            out[v0 % T.int64(2), v0 // T.int64(2)] = w[v0]


@T.prim_func(private=True, s_tir=True)
def strided(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(4)), "float32", strides=(T.int64(8), T.int64(1)))):
    for a0 in range(T.int64(8)):  # rows 8 apart: not the compact tensor Relax passes
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            out[v0 // T.int64(4), v0 % T.int64(4)] = w[v0]


@T.prim_func(private=True, s_tir=True)
def scaled(w: T.Buffer((T.int64(8),), "float32"), out: T.Buffer((T.int64(2), T.int64(4)), "float32")):
    for a0 in range(T.int64(8)):
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            out[v0 // T.int64(4), v0 % T.int64(4)] = w[v0] * T.float32(2)
# fmt: on


def built(func: tvm.tirx.PrimFunc, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """What TVM's build of ``func`` writes to its outputs (zeroed first) given ``inputs``."""
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=tvm.target.Target("llvm"))
    outs = [tvm.runtime.tensor(np.zeros([int(d) for d in b.shape], b.dtype)) for b in list(func.params)[len(inputs) :]]
    lib["main"](*[tvm.runtime.tensor(a) for a in inputs], *outs)
    return [o.numpy() for o in outs]


TILINGS = {"tiles": (tiles, [(16, 3, 8), (1, 16, 1)], [0, 1]), "padded": (padded, [(6, 3)], [0]), "cut": (cut, [(24, 96), (1, 24)], [0, 1])}  # the function, its inputs' shapes, each output's input


@pytest.mark.parametrize("name", TILINGS)
def test_a_rewrite_that_tiles_its_inputs_computes_in_numpy_what_tvm_builds(name: str) -> None:
    """What TVM's build writes, bit for bit; where it pads, into outputs zeroed before (the padding left as it was)."""
    func, shapes, sources = TILINGS[name]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype("float32") for shape in shapes]
    found = tilings(func, len(inputs))
    assert found is not None and [t.source for t in found] == sources
    for ours, tvms in zip([t.apply(inputs) for t in found], built(func, inputs), strict=True):
        assert ours.shape == tvms.shape
        np.testing.assert_array_equal(ours, tvms)


NOT_TILINGS = {"ragged": ragged, "summed": summed, "guarded": guarded, "partial": partial, "gathered": gathered, "repeated": repeated, "zeroed": zeroed,
               "misshapen": misshapen, "strided": strided, "scaled": scaled}


@pytest.mark.parametrize("func", NOT_TILINGS.values(), ids=NOT_TILINGS.keys())
def test_a_rewrite_that_is_not_plainly_a_tiling_is_left_to_tvm(func: tvm.tirx.PrimFunc) -> None:
    assert tilings(func, 1) is None


def test_a_tiling_is_read_only_with_its_inputs_counted_right() -> None:
    assert tilings(tiles, 0) is None and tilings(tiles, 4) is None
    assert tilings(tiles, 3) is None  # the first output taken for an input: no block writes it, one writes no output


def split_in_halves(parts: int) -> tvm.tirx.PrimFunc:
    """A rewrite of an input of 2**parts elements into ``parts`` dimensions of 2 (a bit each)."""
    shape = ", ".join(["T.int64(2)"] * parts)
    indices = ", ".join(f"v0 // T.int64({2 ** (parts - 1 - i)}) % T.int64(2)" for i in range(parts))
    return tvm.script.from_source(f"""
@T.prim_func(private=True, s_tir=True)
def halves(w: T.Buffer((T.int64({2 ** parts}),), "float32"), out: T.Buffer(({shape}), "float32")):
    for a0 in range(T.int64({2 ** parts})):
        with T.sblock("w_global"):
            v0 = T.axis.remap("S", [a0])
            out[{indices}] = w[v0]
""")


def test_a_tiling_into_more_dimensions_than_numpy_takes_is_left_to_tvm() -> None:
    small = tilings(split_in_halves(3), 1)
    assert small is not None
    np.testing.assert_array_equal(small[0].apply([np.arange(8, dtype="float32")]), np.arange(8, dtype="float32").reshape(2, 2, 2))
    assert tilings(split_in_halves(MAX_SPLIT), 1) is not None
    assert tilings(split_in_halves(MAX_SPLIT + 1), 1) is None
