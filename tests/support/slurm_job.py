"""A Slurm or PBS job start simulated without a scheduler: its environment and a stand-in `scontrol` (or
`qstat`) on PATH that shows the job's start (and PBS's run count) and records every call (no slurmctld: the
real one is tests/support/slurm_cluster.py; no PBS server exists here)."""

import os
from pathlib import Path

import pytest

SCONTROL = """#!/bin/sh
echo "$@" >> "$SCONTROL_LOG"
if [ "$1" = show ]; then echo "JobId=$4 JobState=RUNNING Reason=None StartTime=$SCONTROL_START EndTime=Unknown"; fi
"""

QSTAT = """#!/bin/sh
echo "$@" >> "$QSTAT_LOG"
printf 'Job Id: %s\\n    job_state = R\\n    run_count = %s\\n    stime = %s\\n' "$2" "$QSTAT_RUNS" "$QSTAT_START"
"""


def stand_in_qstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in PBS Pro `qstat` on PATH: `qstat -f ID` shows run_count $QSTAT_RUNS and stime $QSTAT_START,
    and every call is recorded in the file returned."""
    bin_dir, log = tmp_path / "bin", tmp_path / "qstat.log"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "qstat").write_text(QSTAT)
    (bin_dir / "qstat").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("QSTAT_LOG", str(log))
    return log


def pbs_job(monkeypatch: pytest.MonkeyPatch, runs: int, started: str) -> None:
    """This process is now the `runs`-th run of PBS job 4242.srvA, started at `started`."""
    for name, value in (("PBS_JOBID", "4242.srvA"), ("QSTAT_RUNS", str(runs)), ("QSTAT_START", started)):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def stand_in_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `scontrol` on PATH (no slurmctld here): it shows the job started at $SCONTROL_START and
    records every call in the file returned."""
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SCONTROL_LOG", str(log))
    return log


def slurm_job(monkeypatch: pytest.MonkeyPatch, restarts: int, started: str, user: str = "alice") -> None:
    """This process is now a start of Slurm job 4242 of `user` (the actor a write records is $USER's)."""
    for name, value in (("SLURM_JOB_ID", "4242"), ("SLURM_RESTART_COUNT", str(restarts)),
                        ("SCONTROL_START", started), ("USER", user), ("LOGNAME", user)):  # fmt: skip
        monkeypatch.setenv(name, value)
