"""The scheduler side of preemption with real processes and no scheduler: the signal relay between the
scheduler and the workers, with real processes standing in for torchrun and its workers (no torch); the run a
PBS job names and `--requeue-on-failure` through the real console script; the requeue command handed to a
stand-in `qrerun` (the pure rules: tests/unit/test_slurm_rules.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftrain.events.schema import SchedulerJob
from ftrain.supervise.attempts import RELAY
from tests.support.processes import ftrain_process
from tests.unit.test_slurm_rules import INT, TERM, USR1

AGENT = """
import json, os, signal, subprocess, sys, time
log = sys.argv[1]
def note(who):
    def handler(signum, frame):
        with open(log, "a") as f:
            f.write(json.dumps([who, signal.Signals(signum).name]) + "\\n")
    return handler
if len(sys.argv) > 2:  # a worker: records what it gets, exits 83 on the warning
    def warned(signum, frame):
        from ftrain.settings import stop_note
        from ftrain.train.preemption import stop_name
        note(stop_name(signal.Signals(signum), stop_note()))(signum, frame)
        sys.exit(83)
    signal.signal(signal.SIGUSR1, warned)
    signal.signal(signal.SIGTERM, note("worker"))
    open(sys.argv[2], "w").close()
    while True:
        time.sleep(0.05)
workers = [subprocess.Popen([sys.executable, __file__, log, f"{log}.up{i}"], start_new_session=True) for i in (0, 1)]
print(json.dumps({"ignored": open("/proc/self/status").read().split("SigIgn:")[1].split()[0],
                  "handled": os.environ.get("PET_SIGNALS_TO_HANDLE")}), flush=True)
sys.exit(max(w.wait() for w in workers))
"""


def test_the_relay_hands_the_workers_one_warning_whatever_and_however_often_it_is_signalled(
    tmp_path: Path,
) -> None:
    """A stand-in torchrun (it starts two workers in sessions of their own, as torchrun does): the relay gets
    SIGTERM twice and SIGINT; each worker gets SIGUSR1 once, the stand-in none (it ignores them), and the relay
    exits with the stand-in's status."""
    agent, log = tmp_path / "agent.py", tmp_path / "signals.jsonl"
    agent.write_text(AGENT)
    env = {**os.environ, "FTRAIN_SAVE_SIGNALS": "USR1,TERM"}
    relay = subprocess.Popen([*RELAY, sys.executable, str(agent), str(log)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not all(Path(f"{log}.up{i}").exists() for i in (0, 1)):
            assert relay.poll() is None and time.monotonic() < deadline, relay.communicate()
            time.sleep(0.02)
        for signum in (TERM, TERM, INT):
            relay.send_signal(signum)
            time.sleep(0.2)
        out, err = relay.communicate(timeout=20)
    finally:
        if relay.poll() is None:
            os.killpg(relay.pid, signal.SIGKILL)
    assert relay.returncode == 83, err
    got = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    assert got == [("SIGTERM (relayed as SIGUSR1)", "SIGUSR1")] * 2  # the stop signal named right
    shown = json.loads(out)
    ignored = int(shown["ignored"], 16)
    assert all(ignored & (1 << (s - 1)) for s in (TERM, INT, USR1)) and shown["handled"] == "SIGHUP,SIGQUIT"
    assert err.count("relay: SIGTERM → SIGUSR1 to worker(s)") == 1


def test_with_no_save_signals_the_relay_is_not_there(tmp_path: Path) -> None:
    done = subprocess.run([*RELAY, sys.executable, "-c", "import os; print(os.getpid())"],
                          env={**os.environ, "FTRAIN_SAVE_SIGNALS": "none"}, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0 and "relay:" not in done.stderr


def test_requeue_on_failure_outside_a_job_is_bad_input(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLURM_JOB_ID", "PBS_JOBID"):
        monkeypatch.delenv(name, raising=False)
    done = ftrain_process(["run", "P", "--nodes", "1", "--gpus-per-node", "1", "--requeue-on-failure", "--",
                           "x.py"], {k: v for k, v in env.items()})  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "ftrain run: error: --requeue-on-failure needs a Slurm job (SLURM_JOB_ID) or a PBS job (PBS_JOBID)\n"
    )
    assert ftrain_process(["list", "--json"], env).stdout.count("run_id") == 0


@pytest.mark.parametrize(
    ("job", "extra", "line"),
    [
        ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "²"}, (),
         "SLURM_RESTART_COUNT='²' is not a count of restarts"),  # isdigit() said yes, int() said no
        ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "9" * 5000}, (),
         f"SLURM_RESTART_COUNT='{'9' * 40}…' is not a count of restarts"),  # beyond int()'s 4300 digits
        ({"SLURM_JOB_ID": "7" * 5000}, ("--run-id", "x"), "out of bounds: Expected `str` of length <= 256 - at `$.job.id`"),
        ({"SLURM_JOB_ID": "___"}, (), "SLURM_JOB_ID='___' is not a job id a run can be named after: pass --run-id"),
        ({"PBS_JOBID": "12-34.s"}, (), "PBS_JOBID='12-34.s' is not a job id a run can be named after"),
    ],
)  # fmt: skip
def test_a_scheduler_variable_that_names_no_job_is_bad_input(
    env: dict[str, str], job: dict[str, str], extra: tuple[str, ...], line: str
) -> None:
    """Once a traceback, or (`___`) the run `P-slurm-` that every id of punctuation alone shared."""
    done = ftrain_process(["launch", "P", "--nodes", "1", "--gpus-per-node", "1", *extra, "--", "x.py"],
                          {**env, **job})  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert done.stderr.startswith("ftrain launch: error: ") and line in done.stderr, done.stderr
    assert ftrain_process(["list", "--json"], env).stdout.count("run_id") == 0


def test_inside_a_pbs_job_the_run_is_the_jobs_and_the_launch_records_it(env: dict[str, str]) -> None:
    job = {"PBS_JOBID": "1234.pbs01.example.org"}
    first = ftrain_process(
        ["launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--", "x.py"], {**env, **job}
    )
    assert first.returncode == 0, first.stderr
    status = json.loads(ftrain_process(["status", "P-pbs-1234", "--json"], env).stdout)
    assert status["launch"]["job"] == {
        "scheduler": "pbs", "id": "1234.pbs01.example.org", "restarts": None, "cluster": None, "started": None
    }  # fmt: skip
    again = ftrain_process(
        ["launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--", "x.py"], {**env, **job}
    )
    assert again.returncode == 1 and "P-pbs-1234" in again.stderr, again.stderr  # the job's run, never a -2


def test_the_requeue_command_is_handed_to_the_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No PBS server exists here: a stand-in `qrerun` on PATH records what it is handed."""
    from ftrain.cli.launch import requeue

    bin_dir, seen = tmp_path / "bin", tmp_path / "argv"
    bin_dir.mkdir()
    (bin_dir / "qrerun").write_text(f'#!/bin/sh\necho "$@" > {seen}\n')
    (bin_dir / "qrerun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert requeue(SchedulerJob("pbs", "1234.pbs01", None)) is True
    assert seen.read_text() == "1234.pbs01\n"
    (bin_dir / "qrerun").write_text("#!/bin/sh\necho 'qrerun: Unauthorized Request' >&2\nexit 159\n")
    assert requeue(SchedulerJob("pbs", "1234.pbs01", None)) is False


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGABRT])  # the stop signals it ignores
def test_the_relay_ends_by_the_signal_that_ended_torchrun_so_the_supervisor_reads_it_as_such(
    signum: signal.Signals,
) -> None:
    child = f"import os, signal; os.kill(os.getpid(), {int(signum)})"
    relayed = subprocess.run(
        [sys.executable, "-m", "ftrain.supervise.relay", "--", sys.executable, "-c", child],
        env={**os.environ, "FTRAIN_SAVE_SIGNALS": "USR1,TERM"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (relayed.returncode, relayed.stderr) == (-signum, "")
