"""Winograd convolutions: a network's 3×3 stride-1 convolutions computed as Winograd's F(4×4, 3×3) or F(2×2, 3×3).

F(m×m, 3×3) computes each m×m output tile from a (m+2)×(m+2) input tile with (m+2)² multiplications per
input-output channel pair, where the direct convolution needs 9·m²: for m = 4, 36 against 144, 4× fewer. What is left
is a batch of (m+2)² matrix products (the tiles × the input channels by the input channels × the output channels), the
input tiles' transform before and the output tiles' after. ``conv="winograd"`` makes a compile replace each eligible
``nn.conv2d`` with two TE computes (``call_te``):

- :func:`winograd_weights`, the weights' transform ``G·w·Gᵀ`` to ``(m+2, m+2, in, out)``: its input is the network's
  constant weights, so ``FoldConstant`` computes it at compile time (a weight that is a parameter is transformed at
  run time, once a call);
- :func:`winograd_conv2d`, the tiles' transforms and the batched product, with the tiles outermost-but-channels in every
  stage (``(m+2, m+2, tiles, channels)``), so that the product reads both operands along rows (against TOPI's NCHW
  Winograd, channels-major, the product alone ran 0.48 against 0.90 ms after 64 trials for ResNet's 56×56×64 layer).
  The output transform carries MetaSchedule's own CPU rule (``conv2d_nhwc_winograd_inverse``); the input transform
  carries :func:`schedule_data_pack`, schedhub's version of MetaSchedule's with fixed compute locations (with sampled
  ones, MetaSchedule's rule made some seeds' searches end in TVM's "The block no longer exists in the IRModule"; the
  fixed ones are what its fastest searches chose, and after 16 trials on seeds 0–2 ran 0.88–1.02 ms against its
  0.85–1.16 on seeds 1–3 for ResNet's 56×56×64 layer). With ``prepack`` the schedule lays the transformed
  weights out through the function's ``layout_free_buffers``; the batched product's block names no layout-free
  buffer itself, as TOPI's does (a block-level reference made before ``FuseTIR`` was suspected of the same error
  before the seeds were found to cause it; not isolated).

CPU targets only (a GPU compile keeps its direct convolutions). Eligible: NCHW data, OIHW weights, 3×3, stride 1,
dilation 1, one group, float32, static shapes, and at least :data:`MIN_TILES` output tiles of some m in :data:`TILES`;
the largest such m is taken (:func:`tile_size`). The transformed weights are (m+2)²/9 of the direct convolution's
(F(4×4): 4×, F(2×2): 16/9), and each is used once per tile: with few tiles the product reads more weight bytes than
it multiplies, and in a network those weights come from memory. ResNet's last stage (7×7 outputs) has 4 tiles of 4×4,
37.7 MB of F(4×4) weights a layer: tuned with F(4×4) there, ResNet-18@224 ran no faster (21.1 ms against 21.5 direct,
``bench/results/studies/winograd-min-tiles-4.json``, rocketlake), although those kernels alone ran 0.89 ms against
1.48–1.81. It has 16 tiles of 2×2 and 16.8 MB of F(2×2) weights a layer, and on flushed caches (weights from memory, as
in a network) F(2×2) ran that layer 2.10× faster than direct and 1.19× faster than F(4×4) (829, 1744 and 983 µs after
64 trials each, znver5, ``bench/results/studies/winograd-tiles-7x512.json``). Where 4×4 tiles reach the threshold
F(4×4) stays: on 14×14×256, 640 µs flushed against F(2×2)'s 752 and direct's 1075 (``winograd-tiles-14x256.json``).

The result differs from the direct convolution's by rounding (F(4×4, 3×3) in float32: relative errors about 1e-5 of
the outputs' scale; F(2×2, 3×3) less), so this is opt-in, and part of what a kernel *is*: its workloads and keys
differ from the direct compile's.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import tvm
from tvm import relax, te, topi
from tvm.relax import PyExprMutator, expr_functor
from tvm.topi.nn.winograd_util import winograd_transform_matrices

from ..kernels.relax_mutation import mutate_relax_functions

Conv = Literal["direct", "winograd"]
CONVS: tuple[str, ...] = get_args(Conv)

TILES = (4, 2)  # m, each output tile m×m: a convolution takes the first with MIN_TILES tiles (:func:`tile_size`)
DATA_PACK_RULE = "schedhub_winograd_data_pack"  # the input transform's custom rule (:func:`schedule_data_pack`)
MIN_TILES = 16  # fewer output tiles than this and the direct convolution reads fewer weight bytes per multiply


def check_conv(conv: str) -> Conv:
    """``conv`` if schedhub knows it, else a ValueError naming those it does."""
    if conv not in CONVS:
        raise ValueError(f"unknown convolution algorithm {conv!r}: schedhub computes 3×3 convolutions as one of {', '.join(CONVS)}")
    return conv  # type: ignore[return-value]


def winograd_weights(weight: te.Tensor, tile: int = TILES[0]) -> te.Tensor:
    """OIHW 3×3 weights transformed for F(m×m, 3×3), m = ``tile``: ``(m+2, m+2, in, out)``, ``G·w·Gᵀ`` per channel pair."""
    _, _, g = winograd_transform_matrices(tile, 3, str(weight.dtype))
    out_channels, in_channels = (int(d) for d in weight.shape[:2])
    alpha, kh, kw = tile + 2, te.reduce_axis((0, 3), "kh"), te.reduce_axis((0, 3), "kw")
    return te.compute((alpha, alpha, in_channels, out_channels),
                      lambda e, n, ci, co: te.sum(weight[co, ci, kh, kw] * g[e, kh] * g[n, kw], axis=[kh, kw]), name="winograd_weights")  # fmt: skip


def output_tiles(height: int, width: int, padding: tuple[int, int, int, int], tile: int) -> tuple[int, int, int, int]:
    """A 3×3 stride-1 convolution's output height and width on a ``height``×``width`` image padded by ``padding``
    (top, left, bottom, right), and its rows and columns of ``tile``×``tile`` output tiles."""
    top, left, bottom, right = padding
    out_h, out_w = height + top + bottom - 2, width + left + right - 2
    return out_h, out_w, -(-out_h // tile), -(-out_w // tile)


def tile_size(batch: int, height: int, width: int, padding: tuple[int, int, int, int]) -> int | None:
    """The largest m of :data:`TILES` that gives the convolution at least :data:`MIN_TILES` m×m output tiles (None:
    none does, it stays direct). F(2×2, 3×3) saves 2.25× the multiplications where F(4×4) saves 4×, for weights
    16/9 of the direct convolution's where F(4×4)'s are 4×: the one a layer with few pixels can afford."""
    for tile in TILES:
        _, _, rows, cols = output_tiles(height, width, padding, tile)
        if batch * rows * cols >= MIN_TILES:
            return tile
    return None


def winograd_conv2d(data: te.Tensor, packed: te.Tensor, padding: tuple[int, int, int, int]) -> te.Tensor:
    """A 3×3 stride-1 NCHW convolution of ``data`` by weights transformed with :func:`winograd_weights` (for the m
    their shape says, ``(m+2, m+2, in, out)``); ``padding`` is (top, left, bottom, right)."""
    batch, channels, height, width = (int(d) for d in data.shape)
    alpha, out_channels = int(packed.shape[0]), int(packed.shape[3])
    tile = alpha - 2
    top, left, _, _ = padding
    out_h, out_w, rows, cols = output_tiles(height, width, padding, tile)
    tiles = batch * rows * cols
    a, b, _ = winograd_transform_matrices(tile, 3, str(data.dtype))
    padded = topi.nn.pad(data, (0, 0, top, left), (0, 0, rows * tile + 2 - height - top, cols * tile + 2 - width - left), name="data_pad")

    def tile_at(p: Any) -> tuple[Any, Any, Any]:  # (image, first row, first column) of tile p
        return p // (rows * cols), (p // cols) % rows * tile, p % cols * tile

    def pixel(e: Any, n: Any, p: Any, ci: Any) -> Any:
        image, row, col = tile_at(p)
        return padded[image, ci, row + e, col + n]

    input_tile = te.compute((alpha, alpha, tiles, channels), pixel, name="input_tile", attrs={"schedule_rule": "None"})
    ra, rb = te.reduce_axis((0, alpha), "r_a"), te.reduce_axis((0, alpha), "r_b")
    data_pack = te.compute((alpha, alpha, tiles, channels), lambda e, n, p, ci: te.sum(input_tile[ra, rb, p, ci] * b[ra, e] * b[rb, n], axis=[ra, rb]),
                           name="data_pack", attrs={"schedule_rule": DATA_PACK_RULE})  # fmt: skip
    ci = te.reduce_axis((0, channels), "ci")
    product = te.compute((alpha, alpha, tiles, out_channels), lambda e, n, p, co: te.sum(data_pack[e, n, p, ci] * packed[e, n, ci, co], axis=ci),
                         name="bgemm")  # fmt: skip
    ra, rb = te.reduce_axis((0, alpha), "r_a"), te.reduce_axis((0, alpha), "r_b")
    inverse = te.compute((tile, tile, tiles, out_channels), lambda vh, vw, p, co: te.sum(product[ra, rb, p, co] * a[ra, vh] * a[rb, vw], axis=[ra, rb]),
                         name="inverse", attrs={"schedule_rule": "conv2d_nhwc_winograd_inverse"})  # fmt: skip
    return te.compute((batch, out_channels, out_h, out_w),
                      lambda i, co, h, w: inverse[h % tile, w % tile, i * rows * cols + h // tile * cols + w // tile, co], name="conv2d_winograd")  # fmt: skip


def _producer_inlining_constants(sch: Any, block: Any) -> Any:
    """``block``'s one producer that reads something, each constant producer (a transform matrix) inlined."""
    found = None
    for producer in sch.get_producers(block):
        if sch.get(producer).reads:
            found = producer
        else:
            sch.compute_inline(producer)
    return found


def schedule_data_pack(sch: Any, data_pack: Any) -> list[Any]:
    """The input transform's CPU rule: its tiles and channels split as sampled, the (m+2)² transform unrolled inside
    them, the input tiles computed inside the inner tile loop, the padded input once, before (MetaSchedule's
    ``winograd.cc`` with these locations fixed: they were its fastest searches' choices)."""
    input_tile = _producer_inlining_constants(sch, data_pack)
    e, n, p, ci, r_a, r_b = sch.get_loops(data_pack)
    p_outer, p_inner = sch.split(p, sch.sample_perfect_tile(p, n=2, max_innermost_factor=64))
    c_outer, c_inner = sch.split(ci, sch.sample_perfect_tile(ci, n=2, max_innermost_factor=64))
    for loop in (e, n, r_a, r_b):
        sch.unroll(loop)
    sch.reorder(p_outer, c_outer, p_inner, c_inner, e, n, r_a, r_b)
    sch.compute_at(input_tile, p_inner, preserve_unit_loops=True)
    return [sch]


tvm.register_global_func(f"s_tir.meta_schedule.cpu.{DATA_PACK_RULE}", schedule_data_pack, override=True)


def _ints(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def eligible_tile(call: relax.Call) -> int | None:
    """The m of F(m×m, 3×3) :func:`winograd_conv2d` computes ``call`` with (module docstring), or None: not by Winograd."""
    if getattr(call.op, "name", "") != "relax.nn.conv2d":
        return None
    attrs, data, weight = call.attrs, call.args[0].ty, call.args[1].ty
    layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or attrs.data_layout)
    if layouts != ("NCHW", "OIHW", "NCHW") or _ints(attrs.strides) != (1, 1) or _ints(attrs.dilation) != (1, 1) or int(attrs.groups) != 1:
        return None
    if not (isinstance(data, relax.TensorType) and isinstance(weight, relax.TensorType)) or data.shape is None or weight.shape is None:
        return None
    if any(not isinstance(d, tvm.tirx.IntImm) for d in [*data.shape.values, *weight.shape.values]):
        return None
    if {str(data.dtype), str(weight.dtype), str(attrs.out_dtype or data.dtype)} != {"float32"} or _ints(weight.shape.values)[2:] != (3, 3):
        return None
    batch, _, height, width = _ints(data.shape.values)
    return tile_size(batch, height, width, _ints(attrs.padding))  # type: ignore[arg-type]


@expr_functor.mutator
class _Winograd(PyExprMutator):
    """Each eligible convolution as :func:`winograd_weights` then :func:`winograd_conv2d` (``call_te``)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if (tile := eligible_tile(call)) is None:
            return call
        packed = self.builder_.emit(self.builder_.call_te(winograd_weights, call.args[1], tile, primfunc_name_hint="winograd_weights"))
        return self.builder_.call_te(winograd_conv2d, call.args[0], packed, _ints(call.attrs.padding), primfunc_name_hint="conv2d_winograd")


@tvm.transform.module_pass(opt_level=0, name="SchedhubWinograd")
def winograd_convolutions(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every Relax function's eligible convolutions computed by Winograd's F(m×m, 3×3) (on a CPU target, or none)."""
    target = tvm.target.Target.current(allow_none=True)
    if target is not None and "cpu" not in target.keys:
        return mod
    return mutate_relax_functions(_Winograd(mod), mod)


def conv_passes(conv: Conv) -> list[tvm.transform.Pass]:
    """The passes that compute a module's convolutions as ``conv`` says (none for "direct")."""
    return [winograd_convolutions] if check_conv(conv) == "winograd" else []
