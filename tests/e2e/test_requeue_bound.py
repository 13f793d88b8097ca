"""`--requeue-on-failure` through torchrun with the stand-in trainer and a stand-in `scontrol` (no slurmctld;
the real one: tests/e2e/test_slurm_jobs.py): a job start that saved nothing is not requeued, one that did is,
and a requeued job start resumes the job's run (the rules, pure: tests/unit/test_slurm_rules.py)."""

from pathlib import Path

import pytest

from tests.e2e.test_supervisor import timeline
from tests.support.cli import Cli
from tests.support.slurm_job import slurm_job, stand_in_scontrol
from tests.support.stand_in_trainer import ONE_GPU
from tests.support.stand_in_trainer import cli as cli  # the fixtures
from tests.support.stand_in_trainer import trainer as trainer

RUN = "P-slurm-4242"
NOT_REQUEUED = (
    f"ftrain run: not requeueing slurm job 4242: this job start recorded no checkpoint of {RUN}, so a requeue "
    "would fail the same way; fix the cause, then resubmit\n"
)


def test_a_job_start_that_saved_nothing_is_not_requeued_whatever_the_run_saved_before(
    cli: Cli, trainer: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three starts of job 4242, each failing: the first before its first checkpoint (not requeued), the
    second (requeued by hand, restart count 1) after saving step 20 (requeued), the third after resuming
    step 20 and saving nothing (not requeued, though the run holds a checkpoint): a command that fails the
    same way each time was requeued on every job start."""
    script, state = trainer
    calls = stand_in_scontrol(tmp_path, monkeypatch)
    run = ("run", "P", *ONE_GPU, "--requeue-on-failure", "--max-retries", "0",
           "--", str(script), str(state), "exit1", "ckpt+exit1", "exit1")  # fmt: skip

    slurm_job(monkeypatch, 0, "2026-12-04T10:00:00")
    code, out, err = cli(*run)
    assert code == 1 and err.endswith(NOT_REQUEUED) and "Requeueing" not in out, err
    assert "requeue" not in calls.read_text().split()

    slurm_job(monkeypatch, 1, "2026-12-04T11:00:00")
    code, out, err = cli(*run)
    assert code == 1 and out.splitlines()[-1] == "Requeueing slurm job 4242: scontrol requeue 4242", out
    assert calls.read_text().splitlines()[-2:] == ["show job --oneliner 4242", "requeue 4242"]

    slurm_job(monkeypatch, 2, "2026-12-04T12:00:00")
    code, out, err = cli(*run)
    assert code == 1 and err.endswith(NOT_REQUEUED) and "Requeueing" not in out, err
    assert calls.read_text().split().count("requeue") == 1
    assert timeline(cli, RUN) == [
        "launched", "failed exit-code 1", "resumed 0", "checkpointed 20", "failed exit-code 1", "resumed 20",
        "failed exit-code 1",
    ]  # fmt: skip
