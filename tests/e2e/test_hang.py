"""The hang watchdog end to end: a real `ftrain run` (torchrun, CPU, gloo, 2 ranks) whose node is stopped
mid-run (`FTRAIN_STOP_AT`) is ended within --hang-timeout plus a few seconds, recorded `failed` (hang) naming
the ranks, relaunched, and ends bit-identical to an uninterrupted run; a slow save is no hang, nor a start-up
or restore longer than the timeout (the beacons and the watchdog alone: tests/integration/test_hang.py,
tests/unit/test_hang_beacon.py)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import ftrain_process, run_marks
from tests.support.training import final_digest, is_relay, stopped, torchrun, wait_for

ITERS = ("--train-iters", "20", "--save-interval", "5")
HANG_TIMEOUT = 8


def _run(
    env: dict[str, str], run_id: str, *options: str, timeout: float = 420
) -> subprocess.CompletedProcess[str]:
    return ftrain_process(
        ["run", "P", "--nodes", "1", "--gpus-per-node", "2", "--run-id", run_id, "--backoff", "0.5",
         *options, "--", "-m", "ftrain.examples.train", *ITERS],
        env, timeout=timeout,
    )  # fmt: skip


def _failures(env: dict[str, str], run_id: str) -> list[dict[str, object]]:
    done = ftrain_process(["replay", run_id, "--json"], env)
    assert done.returncode == 0, done.stderr
    events = [e.get("event") or e for e in json.loads(done.stdout)]
    return [e for e in events if e.get("type") == "failed"]


@pytest.mark.timeout(900)
def test_a_stopped_node_is_ended_as_a_hang_relaunched_and_the_run_ends_bit_identical(
    env: dict[str, str], tmp_path: Path
) -> None:
    reference = final_digest(torchrun(tmp_path / "reference", *ITERS))
    faults = {
        **env,
        "FTRAIN_STOP_AT": "step:12",
        "FTRAIN_KILL_ONCE": str(tmp_path / "once"),
        "OMP_NUM_THREADS": "1",
    }
    done = _run(faults, "hung", "--hang-timeout", str(HANG_TIMEOUT))
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert final_digest(done) == reference
    (hang,) = _failures(env, "hung")
    assert hang["reason"] == "hang", hang
    message = str(hang["message"])
    assert re.search(r"^rank [01] on .* stopped \(SIGSTOP or frozen\) at step 1[12]", message), message
    stalled = int(re.search(r"no rank progressed for (\d+) s", message).group(1))  # type: ignore[union-attr]
    assert HANG_TIMEOUT <= stalled <= HANG_TIMEOUT + 5, message
    print(f"hang detected {stalled} s after the last progress (--hang-timeout {HANG_TIMEOUT})")


@pytest.mark.timeout(900)
def test_a_slow_checkpoint_is_not_a_hang(env: dict[str, str], tmp_path: Path) -> None:
    """Each step takes 1 s and the saves more than --hang-timeout would allow a step (the stop is released
    after 2 timeouts: a save stands still that long), yet the run completes in its first attempt."""
    slow = {**env, "FTRAIN_STOP_AT": "write:10", "FTRAIN_KILL_ONCE": str(tmp_path / "once"),
            "OMP_NUM_THREADS": "1", "FTRAIN_STEP_DELAY": "0.3"}  # fmt: skip
    job = subprocess.Popen(
        [str(Path(sys.executable).with_name("ftrain")), "run", "P", "--nodes", "1", "--gpus-per-node", "2",
         "--run-id", "slow", "--hang-timeout", "4", "--", "-m", "ftrain.examples.train", *ITERS],
        env={**os.environ, **slow}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        from ftrain.supervise.procs import attempt_processes

        def job_processes() -> list[int]:
            """The agent and both ranks: the signal relay above torchrun is no part of the stop."""
            return [p for p in attempt_processes(run_marks("slow", 1)) if not is_relay(p)]

        def all_stopped() -> bool:
            pids = job_processes()
            return len(pids) >= 3 and all(stopped(p) for p in pids)

        wait_for(all_stopped, job, "the save stopped", 300)
        time.sleep(2 * 4)  # two hang timeouts inside a save: within its allowance
        for pid in job_processes():
            os.kill(pid, signal.SIGCONT)
        out, err = job.communicate(timeout=300)
    finally:
        job.kill()
    assert job.returncode == 0, out + err[-4000:]
    assert _failures(env, "slow") == []


SLOW_START = """
import os, time, torch
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.process_exit import run_then_exit

def main():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = CheckpointManager(None, model=model, optimizer=optimizer, every=2)
    step = ckpt.load()
    time.sleep(float(os.environ["SLOW_START_SECONDS"]))  # a set-up or restore longer than --hang-timeout
    while step < 6:
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        step += 1
        if ckpt.due(step):
            ckpt.save(step)
    ckpt.close()

run_then_exit(main)
"""


@pytest.mark.timeout(300)
def test_a_start_up_longer_than_the_hang_timeout_is_no_hang(env: dict[str, str], tmp_path: Path) -> None:
    """The rank's beacon exists from the manager's start, but the watchdog arms at its first step: a start-up
    (or restore) three times --hang-timeout long is waited for (before: killed as hung at step 0)."""
    script = tmp_path / "slow_start.py"
    script.write_text(SLOW_START)
    done = ftrain_process(
        ["run", "P", "--nodes", "1", "--gpus-per-node", "1", "--run-id", "slow-start", "--hang-timeout", "2",
         "--max-retries", "0", "--", str(script)],
        {**env, "SLOW_START_SECONDS": "6", "OMP_NUM_THREADS": "1"}, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert _failures(env, "slow-start") == []
