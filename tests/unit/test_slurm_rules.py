"""The scheduler side of preemption without a scheduler, pure: the run a job's id names, the exact requeue
and state commands (PBS has no server here: the command is what is tested), the warning and the stop signals,
each node's torchrun under the relay, srun's node failure (the relay and the commands with real processes:
tests/integration/test_slurm_relay.py)."""

import signal

import msgspec
import pytest

from ftrain.events.schema import Checkpointed, Launched, Resumed, SchedulerJob
from ftrain.supervise.attempts import RELAY, attempt_commands
from ftrain.supervise.failure_report import FailureReport, failure
from ftrain.supervise.launch_spec import LaunchSpec
from ftrain.supervise.node_exec import NodeExit
from ftrain.supervise.relay import stop_signals, torchrun_env, warning_signal
from ftrain.supervise.scheduler_job import (
    NotAJob,
    current_job,
    ended_by_hand,
    identified,
    identity_command,
    job_run_id,
    made_progress,
    may_resume,
    recorded_jobs,
    rendezvous_port,
    requeue_command,
    start_time,
    state_command,
)

USR1, TERM, INT = signal.SIGUSR1, signal.SIGTERM, signal.SIGINT


@pytest.mark.parametrize(
    ("env", "job", "run_id"),
    [
        ({"SLURM_JOB_ID": "4242"}, SchedulerJob("slurm", "4242", 0), "P-slurm-4242"),
        (
            {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"},
            SchedulerJob("slurm", "4242", 2),
            "P-slurm-4242",
        ),
        ({"SLURM_JOB_ID": "9", "PBS_JOBID": "7.s"}, SchedulerJob("slurm", "9", 0), "P-slurm-9"),
        (
            {"PBS_JOBID": "1234.pbs01.example.org"},
            SchedulerJob("pbs", "1234.pbs01.example.org", None),
            "P-pbs-1234",
        ),
        ({"PBS_JOBID": "1234[7].pbs01"}, SchedulerJob("pbs", "1234[7].pbs01", None), "P-pbs-1234_7"),
        ({"PBS_JOBID": "1234"}, SchedulerJob("pbs", "1234", None), "P-pbs-1234"),
        (
            {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "", "SLURM_CLUSTER_NAME": "c1"},
            SchedulerJob("slurm", "7", 0, "c1"),
            "P-slurm-7",
        ),
        ({"SLURM_JOB_ID": "007"}, SchedulerJob("slurm", "007", 0), "P-slurm-007"),  # not job 7's
    ],
)
def test_a_jobs_id_names_its_run_and_survives_a_requeue(
    env: dict[str, str], job: SchedulerJob, run_id: str
) -> None:
    assert current_job(env) == job
    assert job_run_id("P", job) == run_id


@pytest.mark.parametrize(
    ("job", "port"),
    [
        (None, 29500),  # torchrun's own, outside a job
        (SchedulerJob("slurm", "4242", 0), 24242),
        (SchedulerJob("slurm", "4243", 3), 24243),  # a requeue keeps the job's port
        (SchedulerJob("slurm", "1234567", 0), 24567),
        (SchedulerJob("slurm", "10000", 0), 20000),
        (SchedulerJob("pbs", "1234.pbs01.example.org", None), 21234),
        (SchedulerJob("pbs", "1234[7].pbs01", None), 22347),  # two subjobs of one array: two ports
        (SchedulerJob("pbs", "1234[8].pbs01", None), 22348),
        (SchedulerJob("pbs", "1234.pbs2.example.org", None), 21234),  # the server's digits are not the job's
        (SchedulerJob("pbs", "x.pbs01", None), 29500),  # no number to take a port from
        (SchedulerJob("pbs", "²³.pbs01", None), 29500),  # digits int() takes, but no ASCII ones
        (SchedulerJob("slurm", "9" * 5000, 0), 29999),  # beyond int()'s 4300 digits
    ],
)
def test_jobs_sharing_a_node_get_rendezvous_ports_of_their_own(job: SchedulerJob | None, port: int) -> None:
    """On one port the second job's agent would join the first job's store and die with it."""
    assert rendezvous_port(job) == port


def test_outside_a_job_there_is_none_and_each_scheduler_has_its_requeue_command() -> None:
    assert current_job({}) is None and current_job({"SLURM_JOB_ID": " "}) is None
    assert requeue_command(SchedulerJob("slurm", "4242", 1)) == ["scontrol", "requeue", "4242"]
    assert requeue_command(SchedulerJob("pbs", "1234.pbs01", None)) == ["qrerun", "1234.pbs01"]
    assert state_command(SchedulerJob("slurm", "7", 0)) == ["scontrol", "show", "job", "--oneliner", "7"]
    assert state_command(SchedulerJob("pbs", "7.s", None)) is None
    # as `scontrol show job -o` shows a job inside its SIGTERM handler: plain scancel, then the time limit
    assert ended_by_hand("JobId=7 JobName=x UserId=root(0) JobState=COMPLETING Reason=None Dependency=(null)")
    assert not ended_by_hand("JobId=7 JobState=COMPLETING Reason=TimeLimit Dependency=(null)")
    assert not ended_by_hand("JobId=7 JobState=RUNNING Reason=None") and ended_by_hand(
        "JobState=CANCELLED Reason=x"
    )


def test_the_warning_is_the_first_save_signal_that_is_not_a_stop_signal() -> None:
    assert warning_signal((USR1, TERM)) == USR1
    assert warning_signal((TERM, signal.SIGUSR2)) == signal.SIGUSR2
    assert warning_signal((TERM,)) == TERM
    assert stop_signals((USR1, TERM)) == (TERM, INT, USR1)
    shielded = torchrun_env({"A": "1"}, stop_signals((USR1, TERM)))
    assert shielded["PET_SIGNALS_TO_HANDLE"] == shielded["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGHUP,SIGQUIT"


def test_each_nodes_torchrun_runs_under_the_relay_when_the_trainer_saves_on_a_signal() -> None:
    spec = LaunchSpec(
        run_id="r", nodes=2, gpus_per_node=1, strategy="fsdp", rdzv_host="n1", train_cmd=("x.py",)
    )
    srun = attempt_commands(spec, "/v/torchrun", slurm=True, relayed=True)(("n1", "n2"))
    cut = srun.index("--export=ALL") + 1
    assert srun[cut : cut + len(RELAY) + 1] == [*RELAY, "/v/torchrun"]
    local = attempt_commands(spec, "/v/torchrun", slurm=False, relayed=True)(("n1",))
    assert local[: len(RELAY) + 1] == [*RELAY, "/v/torchrun"]
    each = attempt_commands(spec, "/v/torchrun", slurm=False, node_exec="ssh {host}", relayed=True)(
        ("n1", "n2")
    )
    assert each[each.index("--") + 1 :][: len(RELAY) + 1] == [*RELAY, "/v/torchrun"]
    assert attempt_commands(spec, "/v/torchrun", slurm=False)(("n1",))[0] == "/v/torchrun"


def test_srun_naming_a_node_failure_blames_that_node() -> None:
    report = FailureReport()
    report.feed(b"srun: error: Node failure on n2\nsrun: error: n1: task 0: Killed\nsrun: Force Terminated")
    assert report.node == NodeExit("n2", 137) and report.node.lost
    assert failure(137, None, report.node).reason == "node-failure"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_RESTART_COUNT": "²"}, "SLURM_RESTART_COUNT='²' is not a count of restarts"),
        (
            {"SLURM_RESTART_COUNT": "1" * 5000},
            f"SLURM_RESTART_COUNT='{'1' * 40}…' is not a count of restarts",
        ),
        ({"SLURM_RESTART_COUNT": "-1"}, "SLURM_RESTART_COUNT='-1' is not a count of restarts"),
    ],
)
def test_a_restart_count_that_is_none_is_bad_input(env: dict[str, str], message: str) -> None:
    with pytest.raises(NotAJob) as refused:
        current_job({"SLURM_JOB_ID": "7", **env})
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("job", "variable"),
    [
        (SchedulerJob("slurm", "___", 0), "SLURM_JOB_ID='___'"),  # once `P-slurm-`
        (SchedulerJob("slurm", "12.3", 0), "SLURM_JOB_ID='12.3'"),  # once `12_3`, as `12_3` was
        (SchedulerJob("slurm", "12_3", 0), "SLURM_JOB_ID='12_3'"),
        (SchedulerJob("slurm", "²", 0), "SLURM_JOB_ID='²'"),
        (SchedulerJob("pbs", "1234_7.s", None), "PBS_JOBID='1234_7.s'"),  # as `1234[7].s` is named
        (SchedulerJob("pbs", "x.s", None), "PBS_JOBID='x.s'"),
        (SchedulerJob("pbs", "1234[].s", None), "PBS_JOBID='1234[].s'"),
    ],
)
def test_an_id_of_no_form_the_rule_maps_names_no_run(job: SchedulerJob, variable: str) -> None:
    """Mapping punctuation to `_` made different ids one run; only the forms schedulers use are mapped."""
    with pytest.raises(NotAJob) as refused:
        job_run_id("P", job)
    assert str(refused.value) == f"{variable} is not a job id a run can be named after: pass --run-id"


def test_start_time_is_read_from_scontrol_show_job() -> None:
    shown = (
        "JobId=7 JobName=x RunTime=00:00:05 SubmitTime=2026-12-04T16:00:00 StartTime=2026-12-04T16:20:50 Ends"
    )
    assert start_time(shown) == "2026-12-04T16:20:50"
    assert start_time("JobId=7 StartTime=Unknown EndTime=Unknown") is None
    assert start_time("slurm_load_jobs error: Invalid job id specified") is None


PBS_PRO_SHOWN = """Job Id: 1234.srvA
    Job_Name = train
    job_state = R
    ctime = Fri Dec  4 16:00:00 2026
    run_count = 2
    stime = Fri Dec  4 16:20:50 2026
    Variable_List = PBS_O_HOME=/home/alice,PBS_O_LANG=C.UTF-8,
\tPBS_O_WORKDIR=/home/alice
"""
TORQUE_SHOWN = """Job Id: 1234.srvA
    Job_Name = train
    job_state = R
    start_count = 3
    start_time = 1764865250
"""


def test_a_pbs_job_start_is_identified_by_qstat_run_count_and_start_time() -> None:
    """PBS gives no run count in the environment: `qstat -f` does (PBS Pro's run_count/stime, Torque's
    start_count/start_time); a qstat that shows neither, or an error, leaves the job as it was."""
    job = SchedulerJob("pbs", "1234.srvA", None)
    assert identity_command(job) == ["qstat", "-f", "1234.srvA"]
    assert identity_command(SchedulerJob("slurm", "7", 0)) == ["scontrol", "show", "job", "--oneliner", "7"]
    assert identified(job, PBS_PRO_SHOWN) == SchedulerJob(
        "pbs", "1234.srvA", 2, None, "Fri Dec 4 16:20:50 2026"
    )
    assert identified(job, TORQUE_SHOWN) == SchedulerJob("pbs", "1234.srvA", 3, None, "1764865250")
    assert identified(job, "qstat: Unknown Job Id 1234.srvA\n") == job
    assert identified(job, "    run_count = ²\n    stime = " + "9" * 99 + "\n").restarts is None
    assert len(identified(job, "    stime = " + "9" * 99 + "\n").started or "") == 32
    slurm = SchedulerJob("slurm", "7", 0)
    assert (
        identified(slurm, "JobId=7 StartTime=2026-12-04T16:20:50 EndTime=x").started == "2026-12-04T16:20:50"
    )


def test_a_pbs_requeue_resumes_and_a_recycled_pbs_id_is_refused() -> None:
    """qrerun raises the run count: a higher count resumes, the same count and start a second `ftrain run` of
    the job start resumes, the first count again with another start (a reset server reusing 1234) does not."""
    first = identified(
        SchedulerJob("pbs", "1234.srvA", None), PBS_PRO_SHOWN.replace("run_count = 2", "run_count = 1")
    )
    assert (
        may_resume([first], identified(SchedulerJob("pbs", "1234.srvA", None), PBS_PRO_SHOWN), "P-pbs-1234")
        is None
    )
    assert may_resume([first], first, "P-pbs-1234") is None
    recycled = msgspec.structs.replace(first, started="Mon Dec 14 08:00:00 2026")
    refusal = may_resume([first], recycled, "P-pbs-1234")
    assert refusal is not None and "(restart count 1); this one (restart count 1) is no requeue" in refusal


JOB = SchedulerJob("slurm", "4242", 0, "c1", "2026-12-04T16:20:50")
AGAIN = SchedulerJob("slurm", "4242", 0, "c1", "2026-12-09T08:00:00")  # a new job, its id recycled


def job_at(restarts: int, started: str | None = JOB.started, cluster: str | None = "c1") -> SchedulerJob:
    return SchedulerJob("slurm", "4242", restarts, cluster, started)


@pytest.mark.parametrize(
    ("recorded", "job"),
    [
        ([JOB], job_at(1, "2026-12-04T18:00:00")),  # requeued: one more restart, a new start
        ([JOB, job_at(1, "b"), job_at(1, "b")], job_at(2, "c")),  # relaunched within its start, then requeued
        ([JOB], JOB),  # a second `ftrain run` within the job start: the same start time
        ([job_at(0, None, None)], job_at(1, "x")),  # an older ftrain recorded no cluster nor start
        ([job_at(3, "x")], job_at(3, "x", None)),  # SLURM_CLUSTER_NAME unset this time
        ([SchedulerJob("pbs", "1234.s", None)], SchedulerJob("pbs", "1234.s", None)),  # PBS cannot tell
    ],
)
def test_a_requeue_or_the_same_job_start_resumes_the_jobs_run(
    recorded: list[SchedulerJob], job: SchedulerJob
) -> None:
    assert may_resume(recorded, job, "P-slurm-4242") is None


AFTER = "pass --run-id NEW to start a run of its own, or --run-id P-slurm-4242 to resume that run on purpose"


@pytest.mark.parametrize(
    ("recorded", "job", "message"),
    [
        ([JOB], AGAIN, "run P-slurm-4242 was started by an earlier slurm job 4242 on cluster c1 (restart count 0); "
                       "this one (restart count 0) is no requeue of it but a new job with a recycled id or a "
                       f"second start within the job: {AFTER}"),
        ([JOB, job_at(2, "x")], job_at(1, "y"), "(restart count 2); this one (restart count 1) is no requeue"),
        ([JOB], job_at(0, None), "(restart count 0); this one (restart count 0) is no requeue"),  # no start time
        ([JOB], SchedulerJob("slurm", "4242", 1, "c2"),
         f"run P-slurm-4242 was not started by this slurm job 4242 on cluster c2: {AFTER}"),
        ([SchedulerJob("pbs", "4242.srvA", None)], SchedulerJob("pbs", "4242.srvB", None),
         "run P-slurm-4242 was not started by this pbs job 4242.srvB: "),
        ([], JOB, "run P-slurm-4242 was not started by this slurm job 4242 on cluster c1: "),  # launched outside
    ],
)  # fmt: skip
def test_a_new_job_with_a_recycled_id_is_refused_with_what_to_do(
    recorded: list[SchedulerJob], job: SchedulerJob, message: str
) -> None:
    refusal = may_resume(recorded, job, "P-slurm-4242")
    assert refusal is not None and message in refusal, refusal
    assert refusal.endswith(AFTER)


LAUNCHED = Launched(run_id="r", project="p", strategy="fsdp", nodes=1, gpus_per_node=1, hosts=("a",),
                    allocation_source="slurm", rdzv_endpoint="a:1", command=("torchrun",), storage="s", job=JOB)  # fmt: skip


def checkpointed(step: int) -> Checkpointed:
    return Checkpointed(
        run_id="r", step=step, epoch=0, shards=1, uri=f"u{step}", checkpoint_hash="h", size_bytes=1
    )


def resumed(job: SchedulerJob | None) -> Resumed:
    """A `resumed` opened by the supervisor of job start `job` (None: a trainer continuing its attempt)."""
    opened = Resumed(
        run_id="r", checkpoint_seq=2, step=10, epoch=0, uri="u10", checkpoint_hash="h", resume_count=1
    )
    return opened if job is None else msgspec.structs.replace(opened, job=job)


def test_a_job_start_made_progress_when_it_recorded_a_checkpoint_after_opening_its_attempt() -> None:
    requeued = job_at(1, "b")
    first = [LAUNCHED, checkpointed(10)]
    assert made_progress(first, JOB) and not made_progress(first, requeued)  # not opened by that start
    stuck = [*first, resumed(requeued), resumed(None), resumed(requeued)]  # relaunched within it, never saved
    assert not made_progress(stuck, requeued) and made_progress(stuck, JOB)
    assert made_progress([*stuck, checkpointed(20)], requeued)
    assert not made_progress([LAUNCHED], JOB)
    assert recorded_jobs(stuck) == [JOB, requeued, requeued]
