"""Object graphs in a trace: the read path walks a trace for them only where its JSON text may hold one
(``registry._limits.may_hold_graphs``), so that test must never skip one, however a hostile writer spells it."""

from __future__ import annotations

import json

import pytest

from schedhub.registry import InvalidRecord, Record
from schedhub.registry._limits import graph_strings, may_hold_graphs

from .conftest import UNCHECKED_TRACE, make_record

GRAPH = next(s for s in graph_strings(json.loads(UNCHECKED_TRACE)))


def escaped(text: str, graph: str, written: str) -> str:
    """``text`` with the JSON literal of ``graph`` written as ``written`` (another spelling of the same string)."""
    literal = json.dumps(graph)
    assert literal in text and json.loads(written) == graph
    return text.replace(literal, written)


SPELLINGS = {
    "plain": UNCHECKED_TRACE,
    "brace escaped": escaped(UNCHECKED_TRACE, GRAPH, '"\\u007b' + json.dumps(GRAPH)[2:]),
    "every character escaped": escaped(UNCHECKED_TRACE, GRAPH, '"' + "".join(f"\\u{ord(c):04x}" for c in GRAPH) + '"'),
    "after escaped whitespace": escaped(json.dumps([[["X", [], [" \n\t" + GRAPH], []]], []]), " \n\t" + GRAPH, '" \\n\\t' + json.dumps(GRAPH)[1:]),
    "in an object": json.dumps([[["X", [], [{"k": GRAPH, GRAPH: 1}], []]], []]),
    "beside quotes and braces that are no graph": json.dumps([[["X", [], ['a"{b', "\\", "}{", '"{"', GRAPH], []]], ["{x"]]),
    "no graph": json.dumps([[["Split", ["l1", None, 4], [], ["l2", "l3"]]], [[0, [1, 2]]]]),
}


@pytest.mark.parametrize("name", SPELLINGS)
def test_a_text_that_holds_a_graph_is_walked_and_one_that_cannot_is_not(name: str) -> None:
    text = SPELLINGS[name]
    walked = graph_strings(json.loads(text))
    assert (name == "no graph") == (not walked)
    assert may_hold_graphs(text) == bool(walked), "a trace's walk skipped" if walked else "a trace without a brace walked"


@pytest.mark.parametrize("name", [n for n in SPELLINGS if n != "no graph"])
def test_a_graph_tvm_would_load_unchecked_is_refused_however_it_is_spelt(name: str) -> None:
    good = make_record(1, 1e-3)
    with pytest.raises(InvalidRecord, match="object graph"):
        Record.from_obj({**good.to_dict(), "trace": SPELLINGS[name]})
