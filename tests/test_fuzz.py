"""schemathesis over /openapi.json against a real server: valid and invalid cases for every
operation, with an admin token so the cases reach validation behind the auth checks. No answer
may be a 5xx. The default run covers every operation briefly; ``-m slow`` runs over 10,000 cases."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from schedhub.registry import Principal, ServerThread

from .conftest import make_record

TOKEN = "fuzz-admin"


@dataclass
class FuzzRun:
    cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def fuzz(url: str, examples: int) -> FuzzRun:
    """``examples`` valid and ``examples`` invalid cases per operation (fewer where none can be made)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    run, session = FuzzRun(), requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            def call(case: schemathesis.Case) -> None:
                response = case.call(headers={"authorization": f"Bearer {TOKEN}"}, session=session, timeout=30)
                run.cases += 1
                run.by_status[response.status_code] = run.by_status.get(response.status_code, 0) + 1
                if response.status_code >= 500:
                    run.errors.append(f"{operation.label} -> {response.status_code}: {response.text[:300]}")

            try:
                call()
            except Unsatisfiable:  # an operation without parameters has no invalid form
                pass
    return run


@pytest.fixture
def seeded_server(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path, tokens={TOKEN: Principal("fuzzer", "admin")}, sync=False) as srv:
        from schedhub.registry import RegistryClient

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
