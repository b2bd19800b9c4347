"""schemathesis over /openapi.json against a real server: valid and invalid cases for every
operation, with an admin token so the cases reach validation behind the auth checks. No answer
may be a 5xx. The default run covers every operation briefly; ``-m slow`` runs over 10,000 cases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fuzz import TOKEN, fuzz
from schedhub.registry import Principal, RegistryClient, ServerThread

from .conftest import make_record


@pytest.fixture
def seeded_server(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path, tokens={TOKEN: Principal("fuzzer", "admin")}, sync=False) as srv:
        with RegistryClient(srv.url, token=TOKEN) as client:  # something for the cases to find
            client.put_many([make_record(w, 1e-3 * (w + 1)) for w in range(8)])
            client.report_misses([make_record(w, 1e-3).identity for w in range(8, 12)])
        yield srv


def test_every_operation_fuzzed_briefly_answers_below_500(seeded_server: ServerThread) -> None:
    run = fuzz(seeded_server.url, 12)
    assert run.cases >= 200 and not run.errors, run.errors[:5]
    assert sum(n for s, n in run.by_status.items() if 400 <= s < 500) > run.cases // 4  # the invalid cases were refused


@pytest.mark.slow
def test_ten_thousand_fuzzed_cases_answer_below_500(seeded_server: ServerThread) -> None:
    run = fuzz(seeded_server.url, 480)
    print(f"schemathesis: {run.cases} cases, statuses {dict(sorted(run.by_status.items()))}")
    assert run.cases >= 10_000 and not run.errors, run.errors[:5]
