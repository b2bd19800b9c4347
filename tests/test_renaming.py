"""A workload's parameters renamed (hooks/kernels/renaming.py): the one-pass scan gives, byte for byte, the text the tokenizer
gave every key, and leaves to the tokenizer any script it does not read as the tokenizer does."""

from __future__ import annotations

import pytest
import tvm

from schedhub.hooks.kernels.identity import as_module
from schedhub.hooks.pipeline import fusion_passes
from schedhub.hooks.kernels.renaming import _renamed_by_scan, _renamed_by_tokens, rename_parameters
from schedhub.hooks.rewrites import Rewrites
from schedhub.tuner.networks import models

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def kernel_scripts() -> list[str]:
    """Every kernel TVM prints for three small networks under the rewrites that change their TIR."""
    scripts = []
    for name, shape in (("resnet18", {"image": 32}), ("mobilenetv2", {"image": 32}), ("bert_layer", {"seq": 8}), ("mlp", {})):
        mod = models.export_with_weights(name, **shape)[0]
        for rewrites in (Rewrites(), Rewrites("NHWC", prepack=True), Rewrites(math="fast"), Rewrites(conv="winograd")):
            with CPU:
                fused = fusion_passes(rewrites)(mod)
            scripts += [as_module(f).script() for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return list(dict.fromkeys(scripts))


def test_every_kernel_is_renamed_by_the_scan_to_the_tokenizers_text() -> None:
    scripts = kernel_scripts()
    assert len(scripts) > 60
    for script in scripts:
        scanned = _renamed_by_scan(script)
        assert scanned is not None, script[:400]  # TVM's own scripts never need the tokenizer
        assert scanned == _renamed_by_tokens(script), script[:400]


TRICKY = '''# from tvm.script import tir as T
@T.prim_func(private=True)
def main(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32"), n: T.int32 = 4):  # A, B: "quoted"
    T.func_attr({"A": "def B", 'B': 1})
    for i in range(8):  # a comment naming n
        B[i] = A[i] * T.float32(1.e-5) + x.A + .5 + 0x1F + 2j + T.f(A=A, n=n)
        y = (A,
             B) . n
    z = ...
'''


def test_names_in_strings_comments_attributes_and_numbers_are_left_as_the_tokenizer_leaves_them() -> None:
    scanned = _renamed_by_scan(TRICKY)
    assert scanned == _renamed_by_tokens(TRICKY)
    assert "def main(arg0: T.Buffer" in scanned and '"A": "def B"' in scanned and "x.A" in scanned and "T.f(arg0=arg0, arg2=arg2)" in scanned
    assert "#" not in scanned and "arg1) . n" in scanned  # an attribute after a spaced dot is kept


@pytest.mark.parametrize("script", [
    'def main(A: int):\n    s = """A"""\n    return A\n',  # a triple-quoted string
    "def main(A: int, *rest: int):\n    return A\n",  # more than plain parameters
    "def main(A: int):\n    return A + \\\n        1\n",  # a line continued by a backslash
])  # fmt: skip
def test_a_script_the_scan_does_not_read_as_the_tokenizer_does_goes_to_the_tokenizer(script: str) -> None:
    assert _renamed_by_scan(script) is None
    assert rename_parameters(script) == _renamed_by_tokens(script)


def test_a_script_of_two_functions_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one function"):
        rename_parameters("def main(A: int):\n    def inner(B: int):\n        return B\n    return A\n")
