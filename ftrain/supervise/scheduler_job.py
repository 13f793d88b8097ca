"""The scheduler job `ftrain run` runs in, and what follows from it: the run a requeued job resumes, whether a
job start is a requeue at all, whether to ask for another go, and the command that asks. Pure (reads a given
environment or events, runs nothing).

Rule: inside a Slurm job, with no --run-id, the run is `<project>-slurm-<SLURM_JOB_ID>`; inside a PBS job,
`<project>-pbs-<PBS_JOBID up to its first dot>` (`1234.server` → `1234`; an array subjob `1234[7].server` →
`1234_7`). Any other form of id (Slurm's are digits; PBS's `SEQ[INDEX].server`) names no run: bad input, pass
--run-id. A job id survives a requeue (Slurm: `scontrol requeue`, `--requeue` after a node failure or
preemption; PBS: `qrerun`), so the requeued job's `ftrain run` finds its run failed and resumes it; a job
submitted anew gets a new id, hence a new run, unless it passes --run-id.

Rule: a job start that meets the run its id derives resumes it only when the log says it is that job: the run
recorded this job (same scheduler and id, same SLURM_CLUSTER_NAME where both say one), and either
SLURM_RESTART_COUNT is higher than every count the run recorded for it (a requeue: each raises it by one), or
it is that count and `scontrol show job` gives the start time recorded with it (a second `ftrain run` within
one job start). Else it is refused with one line (exit 1): a new job with a recycled id (a wrapped counter, a
reset slurmctld: restart count 0 again, another start time), a job of another server whose PBS id has the same
number. To go on, pass --run-id: a new id starts a run of its own; the run's id resumes it on purpose. PBS puts
no run count in a job's environment: `qstat -f` gives it (PBS Pro's `run_count` and `stime`, Torque's
`start_count` and `start_time`; `qrerun` raises the count) and the same rule applies; a PBS whose `qstat` shows
neither (or does not answer in time) leaves the count unknown, and a job start the run recorded resumes it.

Rule: with --requeue-on-failure, a failed job start asks for a requeue only when it made progress: the run
recorded a checkpoint after this job start opened its attempt (launched or resumed, with this job's id and
restart count). A job start that saved nothing would fail the same way on every requeue.

Rule: inside a job, with no --rdzv-port, torchrun's rendezvous port is `JOB_PORT_BASE + <the job id's number> mod
JOB_PORT_SPAN` (20000–29999, below Linux's ephemeral range), not torchrun's 29500. The number is the digits of the
id before its first dot: a PBS array's subjobs (`1234[7].server`, `1234[8].server`) share a job number but not
an index, so `12347` and `12348` (a Slurm array's tasks have job ids of their own). Jobs share nodes (two 4-GPU
jobs on an 8-GPU node): on one port, the second job's rank-0 agent fails to bind and joins the first job's store
as a client, so it lives only as long as that job. Two jobs on one node whose ids differ by a multiple of
JOB_PORT_SPAN still meet; --rdzv-port settles that.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from ftrain.events.schema import AnyEvent, Checkpointed, Launched, Resumed, SchedulerJob
from ftrain.supervise.launch_spec import DEFAULT_RDZV_PORT

SLURM_JOB_ID: Final = "SLURM_JOB_ID"
SLURM_RESTART_COUNT: Final = "SLURM_RESTART_COUNT"
SLURM_CLUSTER_NAME: Final = "SLURM_CLUSTER_NAME"
PBS_JOBID: Final = "PBS_JOBID"
_COUNT: Final = re.compile(r"[0-9]{1,18}")
"""A restart count: ASCII digits (`str.isdigit` takes `²`, which `int` refuses), fewer than int64's."""
_PBS_ID: Final = re.compile(r"([0-9]+)(?:\[([0-9]+)\])?(?:\..+)?")
_DIGITS: Final = re.compile(r"[0-9]+")
"""ASCII digits, not the regex digit class: it takes any script's digits, some of which `int` refuses."""
_STARTED_MAX: Final = 32
"""The longest start time a `SchedulerJob` records (its schema's bound)."""
JOB_PORT_BASE: Final = 20000
JOB_PORT_SPAN: Final = 10000


class NotAJob(ValueError):
    """A scheduler variable that names no job ftrain can act on: bad input, said in one line."""


def current_job(env: Mapping[str, str]) -> SchedulerJob | None:
    """The Slurm or PBS job of `env` (Slurm first), with Slurm's requeue count and cluster; None outside both.
    NotAJob for a restart count that is not one."""
    if job_id := env.get(SLURM_JOB_ID, "").strip():
        count = env.get(SLURM_RESTART_COUNT, "").strip() or "0"
        if not _COUNT.fullmatch(count):
            raise NotAJob(f"{SLURM_RESTART_COUNT}={_shown(count)} is not a count of restarts")
        cluster = env.get(SLURM_CLUSTER_NAME, "").strip() or None
        return SchedulerJob("slurm", job_id, int(count), cluster)
    if job_id := env.get(PBS_JOBID, "").strip():
        return SchedulerJob("pbs", job_id, None)
    return None


def job_run_id(project: str, job: SchedulerJob) -> str:
    """The run a job resumes when no --run-id is given (the rule in this module's docstring); NotAJob for an id
    of no form the rule maps, so that two different ids never name one run by their punctuation."""
    if job.scheduler == "slurm" and _DIGITS.fullmatch(job.id):
        return f"{project}-slurm-{job.id}"
    if job.scheduler == "pbs" and (parts := _PBS_ID.fullmatch(job.id)):
        return f"{project}-pbs-{parts[1]}" + (f"_{parts[2]}" if parts[2] is not None else "")
    variable = SLURM_JOB_ID if job.scheduler == "slurm" else PBS_JOBID
    raise NotAJob(f"{variable}={_shown(job.id)} is not a job id a run can be named after: pass --run-id")


def _shown(value: str) -> str:
    """A scheduler variable's value for a one-line message: quoted, and cut short when long."""
    return repr(value if len(value) <= 40 else value[:40] + "…")


def may_resume(recorded: Sequence[SchedulerJob], job: SchedulerJob, run_id: str) -> str | None:
    """Whether a start of `job` may resume `run_id`, the run its id derives, whose launched/resumed events
    recorded the jobs `recorded`: None when it is that job's requeue (the rule in this module's docstring),
    else the one line that refuses it and says what to do next."""
    same = [r for r in recorded if _same_job(r, job)]
    after = f"pass --run-id NEW to start a run of its own, or --run-id {run_id} to resume that run on purpose"
    if not same:
        return f"run {run_id} was not started by this {job.scheduler} job {job.id}{_on(job)}: {after}"
    if job.restarts is None:
        return None
    seen = max(r.restarts or 0 for r in same)
    this_start = job.started is not None and any((r.restarts, r.started) == (seen, job.started) for r in same)
    if job.restarts > seen or this_start:
        return None
    return (
        f"run {run_id} was started by an earlier {job.scheduler} job {job.id}{_on(job)} (restart count {seen}); "
        f"this one (restart count {job.restarts}) is no requeue of it but a new job with a recycled id or a "
        f"second start within the job: {after}"
    )


def _same_job(recorded: SchedulerJob, job: SchedulerJob) -> bool:
    """One job, perhaps at another restart: scheduler and id, and the cluster where both name one (an older
    ftrain recorded none)."""
    clusters = {recorded.cluster, job.cluster} - {None}
    return (recorded.scheduler, recorded.id) == (job.scheduler, job.id) and len(clusters) <= 1


def start_time(shown: str) -> str | None:
    """The StartTime `scontrol show job --oneliner` shows (`2026-12-04T16:20:50`); None when it shows none."""
    found = re.search(r"\bStartTime=([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\s|$)", shown)
    return found[1] if found else None


def identity_command(job: SchedulerJob) -> list[str]:
    """The command that shows what tells this start of `job` from another: Slurm's `scontrol show job`, PBS's
    `qstat -f`."""
    return state_command(job) or ["qstat", "-f", job.id]


def identified(job: SchedulerJob, shown: str) -> SchedulerJob:
    """`job` with what `identity_command` showed of this start: Slurm's StartTime; PBS's run count and start
    time (PBS Pro: `run_count`, `stime`; Torque: `start_count`, `start_time`). What it does not show stays
    as it was (unknown)."""
    if job.scheduler == "slurm":
        return msgspec.structs.replace(job, started=start_time(shown))
    count = _pbs_attribute(shown, "run_count", "start_count")
    started = _pbs_attribute(shown, "stime", "start_time")
    return msgspec.structs.replace(
        job,
        restarts=int(count) if count is not None and _COUNT.fullmatch(count) else job.restarts,
        started=started[:_STARTED_MAX] if started is not None else job.started,
    )


def _pbs_attribute(shown: str, *names: str) -> str | None:
    """The value `qstat -f` shows for the first of `names` it has (`    run_count = 2`), stripped."""
    for name in names:
        if found := re.search(rf"^\s+{name} = (.+)$", shown, re.MULTILINE):
            return " ".join(found[1].split())
    return None


def _on(job: SchedulerJob) -> str:
    return f" on cluster {job.cluster}" if job.cluster else ""


def recorded_jobs(events: Sequence[AnyEvent]) -> list[SchedulerJob]:
    """The jobs a run's `launched` and `resumed` events recorded, in order."""
    return [e.job for e in events if isinstance(e, Launched | Resumed) and isinstance(e.job, SchedulerJob)]


def made_progress(events: Sequence[AnyEvent], job: SchedulerJob) -> bool:
    """Whether the job start `job` (its id and restart count) recorded a checkpoint in the run of `events`: a
    `checkpointed` after the first `launched`/`resumed` it appended. No such event: it opened nothing, no."""
    opened = next(
        (i for i, e in enumerate(events) if isinstance(e, Launched | Resumed) and e.job == job), None
    )
    return opened is not None and any(isinstance(e, Checkpointed) for e in events[opened + 1 :])


def rendezvous_port(job: SchedulerJob | None) -> int:
    """The rendezvous port when --rdzv-port is not given (the rule in this module's docstring)."""
    digits = "".join(_DIGITS.findall(job.id.split(".", 1)[0])) if job is not None else ""
    # the last 8 digits carry the remainder (JOB_PORT_SPAN divides 10**8), and int() takes no more than 4300
    return JOB_PORT_BASE + int(digits[-8:]) % JOB_PORT_SPAN if digits else DEFAULT_RDZV_PORT


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
