"""schemathesis over a registry's /openapi.json: valid and invalid cases for every operation, sent
with a token so they reach validation behind the auth checks. Used by tests/test_fuzz.py and by
``python -m bench.studies.trust``; a 5xx answer is a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

TOKEN = "fuzz-admin"  # the admin token a fuzzed server is started with


@dataclass
class FuzzRun:
    cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def fuzz(url: str, examples: int, token: str = TOKEN) -> FuzzRun:
    """``examples`` valid and ``examples`` invalid cases per operation (fewer where none can be made)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    run, session = FuzzRun(), requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            def call(case: schemathesis.Case) -> None:
                response = case.call(headers={"authorization": f"Bearer {token}"}, session=session, timeout=30)
                run.cases += 1
                run.by_status[response.status_code] = run.by_status.get(response.status_code, 0) + 1
                if response.status_code >= 500:
                    run.errors.append(f"{operation.label} -> {response.status_code}: {response.text[:300]}")

            try:
                call()
            except Unsatisfiable:  # an operation without parameters has no invalid form
                pass
    return run
