"""The scheduler side of preemption without a scheduler, pure: the run a job's id names, the exact requeue
and state commands (PBS has no server here: the command is what is tested), the warning and the stop signals,
each node's torchrun under the relay, srun's node failure (the relay and the commands with real processes:
tests/integration/test_slurm_relay.py)."""

import signal

import pytest

from ftrain.events.schema import SchedulerJob
from ftrain.supervise.attempts import RELAY, attempt_commands
from ftrain.supervise.failure_report import FailureReport, failure
from ftrain.supervise.launch_spec import LaunchSpec
from ftrain.supervise.node_exec import NodeExit
from ftrain.supervise.relay import stop_signals, torchrun_env, warning_signal
from ftrain.supervise.scheduler_job import (
    current_job,
    ended_by_hand,
    job_run_id,
    rendezvous_port,
    requeue_command,
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
