"""The fence is claimed when the log opens an attempt, before any of its processes starts: a real `ftrain run`
(torchrun, CPU, gloo, 2 ranks) whose supervisor alone is SIGSTOPped keeps training and saving; once its lease
expired a second `ftrain run` takes the run over, and from the moment it opened attempt 2 the old attempt can
neither seal nor prune (its ranks end, fenced, at their next save). Every checkpoint the log recorded is there
for the takeover, which resumes from the newest; the stopped supervisor, continued at the end, stops and
records nothing over the new holder (before: the old attempt went on saving until the new trainer's start-up
claim, and pruned the steps the log vouches for)."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from ftrain.supervise.procs import attempt_processes
from ftrain.workers.layout import complete_steps, parse_set_aside
from tests.support.processes import ftrain_process, run_marks
from tests.support.training import RESUMED, stopped, supervised, wait_for

ITERS = ("--train-iters", "40", "--save-interval", "5", "--keep", "2")  # two unrecorded saves prune them all
TTL = 3
RUN = "fenced"


def _events(env: dict[str, str]) -> list[dict[str, object]]:
    replay = ftrain_process(["replay", RUN, "--json"], env)
    assert replay.returncode == 0, replay.stderr
    return [e["event"] for e in json.loads(replay.stdout) if e["event"]]


@pytest.mark.timeout(900)
def test_a_stopped_supervisors_attempt_is_fenced_once_the_takeover_opens_its_attempt(
    env: dict[str, str], tmp_path: Path
) -> None:
    slow = {**env, "OMP_NUM_THREADS": "1", "FTRAIN_STEP_DELAY": "0.4"}  # a save every 2 s
    first = supervised(RUN, slow, *ITERS, lease_ttl=TTL)
    old = run_marks(RUN, 1)
    ckpt = Path(env["FTRAIN_STORAGE"]) / RUN
    second: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: len(complete_steps(ckpt)) >= 2, first, "two checkpoints", 300)
        os.kill(first.pid, signal.SIGSTOP)  # the supervisor alone: its attempt goes on training and saving
        second = supervised(RUN, {**env, "OMP_NUM_THREADS": "1"}, *ITERS, lease_ttl=TTL)
        out, err = second.communicate(timeout=600)
        assert second.returncode == 0, out + err[-3000:]
        assert f"Took {RUN} over: " in out, out
        wait_for(lambda: not attempt_processes(old), None, "the old attempt to end, fenced", 60)
        events = _events(env)
        recorded = [e["step"] for e in events if e["type"] == "checkpointed" and e["attempt"] == 1]
        [opened] = [e for e in events if e["type"] == "resumed" and e["attempt"] == 2]
        assert opened["step"] == max(recorded)  # the newest the log held when attempt 2 was opened
        resumed = RESUMED.search(out)
        assert resumed and int(resumed.group(1)) == max(recorded), out
        assert [e for e in events if e["type"] == "corrupt_skipped"] == [], (
            "a recorded checkpoint was missing"
        )
        set_aside = [parse_set_aside(p.name) for p in ckpt.iterdir() if parse_set_aside(p.name)]
        # A seal checks the fence, then renames: one whose check came just before the takeover's claim is
        # sealed, its record refused, and the takeover set it aside (kept, never counted). At most that one,
        # newer than every recorded step; nothing sealed later, nothing recorded lost.
        assert len(set_aside) <= 1 and all(k == "unrecorded" and n > max(recorded) for n, k in set_aside), (
            f"the old attempt sealed steps after the takeover: {set_aside}"
        )
        seq = len(events)
        os.kill(first.pid, signal.SIGCONT)
        _, first_err = first.communicate(timeout=60)
        assert first.returncode == 1, first_err
        assert f"ftrain run: run {RUN}'s lease was taken over by " in first_err, first_err
        assert len(_events(env)) == seq  # nothing recorded over the new holder
        print(f"attempt 1 recorded steps {recorded}; attempt 2 resumed from {max(recorded)}")
    finally:
        for pid in attempt_processes(old):
            os.kill(pid, signal.SIGKILL)
        for job in (first, second):
            if job is not None and job.poll() is None:
                if stopped(job.pid):
                    os.kill(job.pid, signal.SIGCONT)
                job.kill()
                job.communicate()
