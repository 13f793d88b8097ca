"""A real `ftrain run` (torchrun, CPU, gloo, 2 ranks) whose supervisor is SIGKILLed with its whole job, as a
lost node's would be: a relaunch is refused while the supervisor lives; after the kill two relaunches race,
one takes the run over within the lease's TTL and a few seconds (no `ftrain fail`), records `failed` (lost)
naming the old supervisor, and the run ends bit-identical to an uninterrupted one."""

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ftrain.supervise.procs import attempt_processes
from ftrain.workers.layout import complete_steps
from tests.support.processes import ftrain_process, run_marks
from tests.support.training import FINAL, final_digest, supervised, torchrun, wait_for

ITERS = ("--train-iters", "20", "--save-interval", "5")
TTL = 5
RUN = "leased"


@pytest.mark.timeout(900)
def test_a_dead_supervisors_run_is_taken_over_by_one_of_two_racing_relaunches_within_its_ttl(
    env: dict[str, str], tmp_path: Path
) -> None:
    reference = final_digest(torchrun(tmp_path / "reference", *ITERS))
    slow = {**env, "OMP_NUM_THREADS": "1", "FTRAIN_STEP_DELAY": "0.5"}
    first = supervised(RUN, slow, *ITERS, lease_ttl=TTL)
    ckpt = Path(env["FTRAIN_STORAGE"]) / RUN
    wait_for(lambda: bool(complete_steps(ckpt)), first, "the first checkpoint", 300)

    second = ftrain_process(["run", "P", "--nodes", "1", "--gpus-per-node", "2", "--run-id", RUN,
                             "--", "-m", "ftrain.examples.train", *ITERS], slow, timeout=60)  # fmt: skip
    assert second.returncode == 1 and "is running (another supervisor?)" in second.stderr, second.stderr
    assert f"pid {first.pid} (attempt 1)" in second.stderr

    for pid in [
        first.pid,
        *attempt_processes(run_marks(RUN, 1)),
    ]:  # the node is lost: supervisor, torchrun, workers
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    first.communicate()
    env_after = {**env, "OMP_NUM_THREADS": "1"}
    racing = [supervised(RUN, env_after, *ITERS, lease_ttl=TTL) for _ in range(2)]
    took: dict[int, float] = {}

    def watch(job: subprocess.Popen[str], out: list[str]) -> None:
        assert job.stdout is not None
        for line in job.stdout:
            if line.startswith("Took ") and job.pid not in took:
                took[job.pid] = time.monotonic() - killed
            out.append(line)

    outputs: list[list[str]] = [[], []]
    readers = [threading.Thread(target=watch, args=(j, o)) for j, o in zip(racing, outputs, strict=True)]
    for reader in readers:
        reader.start()
    codes = [job.wait(timeout=600) for job in racing]
    for reader in readers:
        reader.join()
    errors = [job.stderr.read() if job.stderr else "" for job in racing]
    assert sorted(codes) == [0, 1], (codes, errors)
    winner = codes.index(0)
    assert "is running (another supervisor?)" in errors[1 - winner], errors
    match = FINAL.search("".join(outputs[winner]))
    assert match and match.group(2) == reference, "".join(outputs[winner]) + errors[winner][-3000:]
    assert list(took) == [racing[winner].pid] and took[racing[winner].pid] <= TTL + 5, took
    replay = ftrain_process(["replay", RUN, "--json"], env)
    failed = [e["event"] for e in json.loads(replay.stdout) if e["event"] and e["event"]["type"] == "failed"]
    assert [f["reason"] for f in failed] == ["lost"]
    assert re.search(
        rf"its supervisor \S+ pid {first.pid} \(attempt 1\) stopped renewing", failed[0]["message"]
    )
    print(f"lease TTL {TTL} s: taken over {took[racing[winner].pid]:.1f} s after the SIGKILL")
