"""An attempt ends with its supervisor, whatever kills it: a real `ftrain run` (torchrun, CPU, gloo, 2 ranks)
SIGKILLed at start-up, while training, mid-save and mid-fan-out of an async save leaves none of its attempt's
processes (relay, torchrun, workers, stopped or not) running: each dies of its parent-death signal within
seconds, before another supervisor could take the run over and an orphan could go on saving."""

import os
import signal
import time
from pathlib import Path

import pytest

from ftrain.supervise.procs import attempt_processes
from tests.support.processes import run_marks
from tests.support.training import is_relay, stopped, supervised, wait_for

GONE_SECONDS = 10.0
PHASES = {  # what the job is doing when its supervisor dies: FTRAIN_STOP_AT holds it there; flags; variables
    "start-up": ("", (), {}),
    "training": ("step:2", (), {}),
    "training, no relay": (
        "step:2",
        (),
        {"FTRAIN_SAVE_SIGNALS": "none"},
    ),  # torchrun is the attempt's process
    "mid-save": ("write:2", (), {}),
    "mid-fan-out": ("fanout:2", ("--async-ckpt", "--ckpt-stage-dir", "{stage}"), {}),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("phase", list(PHASES))
def test_every_process_of_an_attempt_dies_with_its_sigkilled_supervisor(
    env: dict[str, str], tmp_path: Path, phase: str
) -> None:
    stop_at, extra, variables = PHASES[phase]
    run_id = f"orphan-{phase.replace(', ', '-').replace(' ', '-')}"
    flags = [arg.format(stage=tmp_path / "stage") for arg in extra]
    job_env = {**env, "OMP_NUM_THREADS": "1", **variables}
    if stop_at:
        job_env["FTRAIN_STOP_AT"] = stop_at
    supervisor = supervised(run_id, job_env, "--train-iters", "50", "--save-interval", "2", *flags)
    marks = run_marks(run_id, 1)

    def reached() -> bool:
        found = attempt_processes(marks)
        if not stop_at:
            return bool(found)  # the attempt's first process is starting
        job = [pid for pid in found if not is_relay(pid)]
        return len(job) >= 3 and all(stopped(pid) for pid in job)  # torchrun and both ranks, held there

    try:
        wait_for(reached, supervisor, f"the attempt at {phase}", 240)
        os.kill(supervisor.pid, signal.SIGKILL)
        killed = time.monotonic()
        supervisor.wait()  # (its pipes stay open while an orphan holds them)
        while left := attempt_processes(marks):
            assert time.monotonic() - killed < GONE_SECONDS, f"{left} outlived their supervisor at {phase}"
            time.sleep(0.05)
        print(
            f"{phase}: every process of the attempt gone {time.monotonic() - killed:.2f} s after the SIGKILL"
        )
    finally:
        for pid in attempt_processes(marks):
            os.kill(pid, signal.SIGKILL)
        if supervisor.poll() is None:
            supervisor.kill()
        supervisor.communicate()
