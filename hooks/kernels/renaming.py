"""A workload's parameters renamed ``arg0..argN`` and its comments dropped: the text a kernel's key hashes.

Parameter names come from Relax variable names (``x``, ``l1_bias``), so without the rename one dense layer in two
models would get two keys. :func:`rename_parameters` is what every key was made by: Python's tokenizer, each name that
is a parameter's and not an attribute (after a ``.``) renamed, comments dropped, lines right-stripped, blank lines
dropped. It took 3.7 ms a ResNet-18 kernel, most of a first compile's identities (84 kernels where ``"auto"`` weighs four
options); :func:`_renamed_by_scan` gives the same text in one regular-expression pass, 6× sooner, for the scripts TVM
prints (no triple-quoted string, no line continued by a backslash, one plain signature), and the tokenizer takes any
other. Tested equal on every kernel of the bench networks under every rewrite.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

#: One lexeme at a time, as Python's tokenizer splits a line: strings and numbers whole (so neither a name in a string
#: nor a number's exponent is taken for a name), ``...`` one operator.
_LEXEME = re.compile("|".join([
    rf"(?P<string>{tokenize.String})", rf"(?P<comment>{tokenize.Comment})", rf"(?P<number>{tokenize.Number})",
    r"(?P<name>\w+)", r"(?P<newline>\n)", r"(?P<space>[ \t\f\r]+)", r"(?P<op>\.\.\.|.)",
]))  # fmt: skip
_OPENING, _CLOSING = "([{", ")]}"


def rename_parameters(script: str) -> str:
    """``script`` (one function's TVMScript) with its parameters renamed ``arg0..argN`` and its comments dropped."""
    return _renamed_by_scan(script) or _renamed_by_tokens(script)


def _renamed_by_tokens(script: str) -> str:
    tree = ast.parse(script)
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    if len(funcs) != 1:
        raise ValueError(f"expected one function in the workload script, found {len(funcs)}")
    names = {a.arg: f"arg{i}" for i, a in enumerate(funcs[0].args.args)}
    out: list[tokenize.TokenInfo] = []
    previous = ""
    for tok in tokenize.generate_tokens(io.StringIO(script).readline):
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.NAME and tok.string in names and previous != ".":
            tok = tok._replace(string=names[tok.string])
        previous = tok.string if tok.type == tokenize.OP else ""
        out.append(tok)
    return _kept_lines(tokenize.untokenize(out))


def _renamed_by_scan(script: str) -> str | None:
    """What :func:`_renamed_by_tokens` gives, or None where the script is not one this scan reads as the tokenizer does."""
    if '"""' in script or "'''" in script or "\\\n" in script:
        return None
    lexemes = [(m.lastgroup or "", m.group()) for m in _LEXEME.finditer(script)]
    names = _parameters([each for each in lexemes if each[0] not in ("space", "comment", "newline")])
    if names is None:
        return None
    out: list[str] = []
    after_dot = False  # the tokenizer's "previous token was the operator '.'" (a comment or a line end resets it)
    for kind, text in lexemes:
        if kind == "comment":
            after_dot = False
            continue
        if kind == "name" and not after_dot and text in names:
            text = names[text]
        if kind != "space":
            after_dot = kind == "op" and text == "."
        out.append(text)
    return _kept_lines("".join(out))


def _parameters(lexemes: list[tuple[str, str]]) -> dict[str, str] | None:
    """The one function's positional parameters, each to its new name; None where there is not exactly one ``def``
    or its signature holds more than plain parameters (``*``, ``/``): the tokenizer's path decides those."""
    defs = [i for i, (kind, text) in enumerate(lexemes) if kind == "name" and text == "def"]
    if len(defs) != 1 or lexemes[defs[0] + 2 : defs[0] + 3] != [("op", "(")]:
        return None
    names: dict[str, str] = {}
    depth = 0
    for i in range(defs[0] + 2, len(lexemes) - 1):
        kind, text = lexemes[i]
        if kind == "op" and text in _OPENING:
            depth += 1
        elif kind == "op" and text in _CLOSING:
            depth -= 1
            if depth == 0:
                return names
        elif depth == 1 and kind == "op" and text in ("*", "/", "**"):
            return None
        elif depth == 1 and kind == "name" and lexemes[i - 1][1] in ("(", ",") and lexemes[i + 1][1] in (":", ",", ")", "="):
            names.setdefault(text, f"arg{len(names)}")
    return None


def _kept_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip()) + "\n"
