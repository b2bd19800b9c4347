"""Bulk tuning as Ray Jobs: ``schedhub submit`` runs ``schedhub tune`` on a cluster's head node.

A Ray Job runs once and Ray remembers no completed work, so:

- the submission id is derived from the work (models, sweeps, target, budget, registry): the same
  submission twice is one job, and ``submit`` reports the existing one instead of starting another;
- resume state lives in the registry: ``tune`` skips keys that already have records, so a new
  submission after a failure (``--attempt 2``) does only what is left.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from .cluster import configure_environment


@dataclass(frozen=True)
class Submission:
    submission_id: str
    created: bool  # False: a job with this id already existed (nothing new was started)
    status: str


def submission_id(work: dict[str, Any], attempt: int = 1) -> str:
    digest = hashlib.sha256(json.dumps(work, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    return f"schedhub-tune-{digest}" + (f"-{attempt}" if attempt > 1 else "")


def _client(address: str) -> Any:
    configure_environment()
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def submit(address: str, tune_args: list[str], work: dict[str, Any], *, attempt: int = 1, python: str | None = None, env: dict[str, str] | None = None) -> Submission:
    """Start ``schedhub tune TUNE_ARGS`` as a Ray Job, once per distinct ``work``."""
    client = _client(address)
    job_id = submission_id(work, attempt)
    entrypoint = shlex.join([python or sys.executable, "-m", "schedhub.cli.main", "tune", *tune_args])
    try:
        client.submit_job(entrypoint=entrypoint, submission_id=job_id, runtime_env={"env_vars": dict(env or {})} if env else None,
                          metadata={"schedhub": "tune"})  # fmt: skip
    except RuntimeError as exc:
        if "already exists" not in str(exc):
            raise
        return Submission(job_id, False, str(client.get_job_status(job_id)))
    return Submission(job_id, True, str(client.get_job_status(job_id)))


def status(address: str, job_id: str) -> dict[str, Any]:
    info = _client(address).get_job_info(job_id)
    return {"submission_id": job_id, "status": str(info.status), "message": info.message or "", "entrypoint": info.entrypoint,
            "start_time": info.start_time, "end_time": info.end_time}  # fmt: skip


def logs(address: str, job_id: str) -> str:
    return _client(address).get_job_logs(job_id)


def follow(address: str, job_id: str, write: Any = sys.stdout.write) -> str:
    """Stream the job's logs until it ends; returns its final status."""
    import asyncio

    client = _client(address)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    asyncio.run(tail())
    return str(client.get_job_status(job_id))
