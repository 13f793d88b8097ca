"""Who may resume a run, against the real log with no torchrun (each start here is refused before any process
starts; the requeues that do start one: tests/e2e/test_requeue_bound.py): a new Slurm job whose id was used before
is no requeue of the old one, a relaunch trains on the data it was launched with, and one user's job never
relaunches or takes over another's run; with the log out of reach no requeue is asked for (the rules, pure:
tests/unit/test_slurm_rules.py, test_deciders.py)."""

import os
from pathlib import Path

import pytest

from ftrain.events.schema import SchedulerJob
from tests.support.cli import Cli
from tests.support.processes import free_port
from tests.support.slurm_job import pbs_job, slurm_job, stand_in_qstat, stand_in_scontrol
from tests.support.stand_in_trainer import ONE_GPU, starts
from tests.support.stand_in_trainer import cli as cli  # the fixtures
from tests.support.stand_in_trainer import trainer as trainer


def test_a_new_job_with_a_recycled_id_does_not_resume_the_old_jobs_run(
    cli: Cli, trainer: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job 4242 (restart count 0) launched P-slurm-4242 and failed; a slurmctld reset later, a new job 4242
    (restart count 0 again, another start) would have resumed it, checkpoint and dataset revision included."""
    script, state = trainer
    calls = stand_in_scontrol(tmp_path, monkeypatch)
    slurm_job(monkeypatch, 0, "2026-12-04T10:00:00")
    cli.ok("launch", "P", *ONE_GPU, "--dataset-revision", "v1")
    cli.ok("checkpoint", "P-slurm-4242", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}")
    cli.ok("fail", "P-slurm-4242")
    before = cli.last_seq()
    slurm_job(monkeypatch, 0, "2026-12-09T08:00:00")
    refusal = (
        "ftrain run: run P-slurm-4242 was started by an earlier slurm job 4242 (restart count 0); this one "
        "(restart count 0) is no requeue of it but a new job with a recycled id or a second start within the "
        "job: pass --run-id NEW to start a run of its own, or --run-id P-slurm-4242 to resume that run on purpose\n"
    )
    command = ("--", str(script), str(state), "exit0")
    assert cli("run", "P", *ONE_GPU, "--dataset-revision", "v2", *command) == (1, "", refusal)
    slurm_job(
        monkeypatch, 1, "2026-12-09T08:00:00", user="bob"
    )  # a requeue of job 4242, but of bob's job 4242
    owner = "ftrain run: run P-slurm-4242 was launched by alice@{}, not by bob: pass a --run-id of your own\n"
    code, out, err = cli("run", "P", *ONE_GPU, "--dataset-revision", "v1", *command)
    assert (code, out, err) == (1, "", owner.format(os.uname().nodename))
    slurm_job(monkeypatch, 1, "2026-12-09T08:00:00")  # alice's requeue, with another dataset revision
    data = (
        "ftrain run: run P-slurm-4242 was launched with --dataset-revision 'v1', not 'v2': relaunch it with the "
        "same, or pass a new --run-id for a new run\n"
    )
    assert cli("run", "P", *ONE_GPU, "--dataset-revision", "v2", *command) == (1, "", data)
    assert cli.last_seq() == before
    assert starts(state) == []
    assert set(calls.read_text().splitlines()) == {"show job --oneliner 4242"}  # each start's start time


def test_a_pbs_job_is_told_by_qstats_run_count_a_requeue_resumes_and_a_recycled_id_does_not(
    cli: Cli, trainer: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PBS puts no run count in the environment: `qstat -f` shows it. Job 4242.srvA's first run launched
    P-pbs-4242 and failed; a new 4242.srvA (a reset server: run 1 again, another start) is refused; the
    job's own requeue (`qrerun`: run 2) resumes the run."""
    script, state = trainer
    calls = stand_in_qstat(tmp_path, monkeypatch)
    pbs_job(monkeypatch, 1, "Fri Dec  4 10:00:00 2026")
    cli.ok("launch", "P", *ONE_GPU)
    cli.ok("fail", "P-pbs-4242")
    before = cli.last_seq()
    pbs_job(monkeypatch, 1, "Wed Dec  9 08:00:00 2026")
    command = ("--", str(script), str(state), "exit0")
    code, out, err = cli("run", "P", *ONE_GPU, *command)
    assert (code, out) == (1, "")
    assert "(restart count 1); this one (restart count 1) is no requeue of it" in err and err.count("\n") == 1
    assert cli.last_seq() == before and starts(state) == []
    pbs_job(monkeypatch, 2, "Wed Dec  9 08:00:00 2026")
    code, out, err = cli("run", "P", *ONE_GPU, *command)
    assert code == 0, err
    assert "Relaunching P-pbs-4242" in out and [s["FTRAIN_ATTEMPT"] for s in starts(state)] == ["2"]
    assert set(calls.read_text().splitlines()) == {"-f 4242.srvA"}


def test_another_users_run_is_neither_taken_over_nor_relaunched(
    cli: Cli, trainer: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two users of one log, one --run-id: bob's `ftrain run` neither records alice's running run lost (a
    takeover) nor, once it failed, resumes it."""
    script, state = trainer
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    cli.ok("launch", "P", *ONE_GPU, "--run-id", "shared")
    monkeypatch.setenv("USER", "bob")
    monkeypatch.setenv("LOGNAME", "bob")
    before = cli.last_seq()
    owner = (
        f"ftrain run: run shared was launched by alice@{os.uname().nodename}, not by bob: pass a --run-id of "
        "your own\n"
    )
    command = ("--", str(script), str(state), "exit0")
    assert cli("run", "P", *ONE_GPU, "--run-id", "shared", *command) == (1, "", owner)
    assert cli.last_seq() == before  # alice's run, not recorded lost
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    cli.ok("fail", "shared")
    monkeypatch.setenv("USER", "bob")
    monkeypatch.setenv("LOGNAME", "bob")
    before = cli.last_seq()
    assert cli("run", "P", *ONE_GPU, "--run-id", "shared", *command) == (1, "", owner)
    assert cli.last_seq() == before
    assert starts(state) == []


def test_no_requeue_when_the_log_cannot_say_whether_the_job_start_made_progress(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown progress is no progress: the scheduler is not asked (a requeue that may fail the same way)."""
    from ftrain.cli.launch import requeue_if_progressed

    calls = stand_in_scontrol(tmp_path, monkeypatch)
    monkeypatch.setenv("FTRAIN_NATS_URL", f"nats://127.0.0.1:{free_port()}")
    assert requeue_if_progressed(SchedulerJob("slurm", "4242", 0), "P-slurm-4242") is False
    err = capsys.readouterr().err
    assert (
        err.startswith("ftrain run: not requeueing slurm job 4242: progress unknown (")
        and err.count("\n") == 1
    )
    assert not calls.exists()
