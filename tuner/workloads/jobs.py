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
import time
from dataclasses import dataclass
from typing import Any

from ..execution.cluster import configure_environment


class ClusterNotReady(RuntimeError):
    """The cluster's job agent did not come up in time (a head node just started, or a loaded machine)."""


AGENT_WAIT_SECS = 90.0  # a head node's job agent comes up seconds after the node does; longer on a loaded machine


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


def submit(address: str, tune_args: list[str], work: dict[str, Any], *, attempt: int = 1, python: str | None = None, env: dict[str, str] | None = None,
           agent_wait_secs: float = AGENT_WAIT_SECS) -> Submission:  # fmt: skip
    """Start ``schedhub tune TUNE_ARGS`` as a Ray Job, once per distinct ``work``; while the cluster's job agent is not
    up yet, asked again every 2 s for ``agent_wait_secs``, then :class:`ClusterNotReady`."""
    client = _client(address)
    job_id = submission_id(work, attempt)
    entrypoint = shlex.join([python or sys.executable, "-m", "schedhub.cli.main", "tune", *tune_args])
    deadline = time.monotonic() + agent_wait_secs
    while True:
        try:
            client.submit_job(entrypoint=entrypoint, submission_id=job_id, runtime_env={"env_vars": dict(env or {})} if env else None,
                              metadata={"schedhub": "tune"})  # fmt: skip
        except RuntimeError as exc:
            if "already exists" in str(exc):
                return Submission(job_id, False, str(client.get_job_status(job_id)))
            if "No available agent" not in str(exc):
                raise
            if time.monotonic() > deadline:  # Ray asks to "try again later": that is done here, then said in one line
                raise ClusterNotReady(f"the Ray cluster at {address} has no job agent up after {agent_wait_secs:g} s; try again once its head "
                                      "node is fully started (ray status)") from None  # fmt: skip
            time.sleep(2.0)
            continue
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
