"""The scheduler job `ftrain run` runs in, and what follows from it: the run a requeued job resumes, and the
command that asks the scheduler for another go. Pure (reads a given environment, runs nothing).

Rule: inside a Slurm job, with no --run-id, the run is `<project>-slurm-<SLURM_JOB_ID>`; inside a PBS job,
`<project>-pbs-<PBS_JOBID up to its first dot>` (`1234.server` → `1234`; an array index's brackets become `_`).
A job id survives a requeue (Slurm: `scontrol requeue`, `--requeue` after a node failure or preemption; PBS:
`qrerun`), so the requeued job's `ftrain run` finds its run failed and resumes it; a job submitted anew gets a new
id, hence a new run, unless it passes --run-id. SLURM_RESTART_COUNT says how many times the job was requeued.

Rule: inside a job, with no --rdzv-port, torchrun's rendezvous port is `JOB_PORT_BASE + <the job id's number> mod
JOB_PORT_SPAN` (20000–29999, below Linux's ephemeral range), not torchrun's 29500. The number is the digits of the
id before its first dot: a PBS array's subjobs (`1234[7].server`, `1234[8].server`) share a job number but not
an index, so `12347` and `12348` (a Slurm array's tasks have job ids of their own). Jobs share nodes (two 4-GPU
jobs on an 8-GPU node): on one port, the second job's rank-0 agent fails to bind and joins the first job's store
as a client, so it lives only as long as that job. Two jobs on one node whose ids differ by a multiple of
JOB_PORT_SPAN still meet; --rdzv-port settles that.
"""

import re
from collections.abc import Mapping
from typing import Final

from ftrain.events.schema import INT64_MAX, SchedulerJob
from ftrain.supervise.launch_spec import DEFAULT_RDZV_PORT

SLURM_JOB_ID: Final = "SLURM_JOB_ID"
SLURM_RESTART_COUNT: Final = "SLURM_RESTART_COUNT"
PBS_JOBID: Final = "PBS_JOBID"
_NOT_IN_RUN_ID: Final = re.compile(r"[^A-Za-z0-9_-]")
_DIGITS: Final = re.compile(r"\d+")
JOB_PORT_BASE: Final = 20000
JOB_PORT_SPAN: Final = 10000


def current_job(env: Mapping[str, str]) -> SchedulerJob | None:
    """The Slurm or PBS job of `env` (Slurm first), with Slurm's requeue count; None outside both."""
    if job_id := env.get(SLURM_JOB_ID, "").strip():
        count = env.get(SLURM_RESTART_COUNT, "").strip()
        return SchedulerJob("slurm", job_id, min(int(count), INT64_MAX) if count.isdigit() else 0)
    if job_id := env.get(PBS_JOBID, "").strip():
        return SchedulerJob("pbs", job_id, None)
    return None


def job_run_id(project: str, job: SchedulerJob) -> str:
    """The run a job resumes when no --run-id is given (the rule in this module's docstring)."""
    token = job.id.split(".", 1)[0] if job.scheduler == "pbs" else job.id
    return f"{project}-{job.scheduler}-{_NOT_IN_RUN_ID.sub('_', token).strip('_')}"


def rendezvous_port(job: SchedulerJob | None) -> int:
    """The rendezvous port when --rdzv-port is not given (the rule in this module's docstring)."""
    digits = "".join(_DIGITS.findall(job.id.split(".", 1)[0])) if job is not None else ""
    return JOB_PORT_BASE + int(digits) % JOB_PORT_SPAN if digits else DEFAULT_RDZV_PORT


def state_command(job: SchedulerJob) -> list[str] | None:
    """The command that shows the job's state (Slurm only: None for PBS)."""
    return ["scontrol", "show", "job", "--oneliner", job.id] if job.scheduler == "slurm" else None


def ended_by_hand(shown: str) -> bool:
    """Whether `scontrol show job` says the job is being ended other than by its time limit: cancelled
    (`scancel`: `JobState=COMPLETING Reason=None`, measured), or ended by the scheduler for a reason of its own.
    Such a job is never requeued, although Slurm would take the request; a running job (a warning signal, or
    `scancel --signal` alone) or one past its time limit (`Reason=TimeLimit`) is."""
    state = re.search(r"\bJobState=(\S+)", shown)
    reason = re.search(r"\bReason=(\S+)", shown)
    if state is None or state[1] == "RUNNING":
        return False
    return not (state[1] in ("COMPLETING", "TIMEOUT") and reason is not None and reason[1] == "TimeLimit")


def requeue_command(job: SchedulerJob) -> list[str]:
    """The command that puts the job back in the queue, to start again on a fresh allocation."""
    if job.scheduler == "slurm":
        return ["scontrol", "requeue", job.id]
    return ["qrerun", job.id]
