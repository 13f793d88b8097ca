"""Async saves (`--async-ckpt`) to `s3://` storage on a real SeaweedFS, under real 2-process torchrun jobs: a
SIGKILL at any stage of a save leaves the previous sealed step, and the relaunch resumes from it and ends
bit-identical to an uninterrupted job on a file system; a store that dies mid-save fails that save closed while
training goes on, and once it is back saves land again; an attempt superseded while it was stopped seals
nothing, and the relaunch ends bit-identical."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ftrain.host.job_signals import children, signal_job
from ftrain.supervise.procs import attempt_processes
from ftrain.workers.layout import MARKER, WRITER_CLAIM
from ftrain.workers.s3.seaweed_server import kill_storage_server, throwaway_storage_server
from tests.e2e.test_s3_training import job_env, keys, sealed
from tests.support.processes import ftrain_process, run_marks
from tests.support.s3 import Endpoint, restart_seaweedfs
from tests.support.training import (
    final_digest,
    resumed_step,
    stopped,
    torchrun,
    torchrun_command,
    torchrun_env,
)

pytestmark = pytest.mark.timeout(300)
ITERS = ("--train-iters", "30", "--save-interval", "5")
ASYNC = (*ITERS, "--async-ckpt")
KILLED = -signal.SIGKILL


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of an uninterrupted 30-step job with sync saves to a file system."""
    return final_digest(torchrun(tmp_path_factory.mktemp("reference") / "ckpt", *ITERS))


def has(client: Any, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


class Job:
    """A job in a session of its own, its output collected line by line as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=lines.extend, args=(stream,), daemon=True)
            for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert self.proc.poll() is None, f"the job ended (rc={self.proc.returncode}) before {what}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.err)

    def result(self, timeout: float) -> subprocess.CompletedProcess[str]:
        self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(10)
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, "".join(self.out), "".join(self.err)
        )


def pause(pids: list[int]) -> None:
    """SIGSTOP every process, and wait until each has stopped."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not all(stopped(pid) for pid in pids):
        assert time.monotonic() < deadline, "the job did not stop"
        time.sleep(0.01)


def resume(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def test_async_saves_to_s3_killed_at_every_stage_leave_the_previous_step_and_the_relaunch_ends_bit_identical(
    weed: Endpoint, reference: str, tmp_path: Path
) -> None:
    """One FTRAIN_KILL_AT list names a stage of a different save each (each kill fires once): the job is killed
    at `stage` of step 10 (state in host buffers, nothing handed to the background), its relaunch resumes from
    5 and is killed at `write` of 15 (step claimed, shards written locally, nothing uploaded), the next at
    `finalize` of 20 (every rank's files uploaded, rank 0 holding every digest), and the last runs to the end.
    Four launches prove three stages and every resume, where a job and a relaunch per stage would take six;
    `fanout` (uploads done, nothing gathered) runs the same `Saver` code in the background thread as in
    the foreground, where test_s3_training's sync job is killed at it."""
    bucket = weed.new_bucket()
    uri = f"s3://{bucket}/ckpt/run-k"
    kills = {"stage": 10, "write": 15, "finalize": 20}
    kill_at = ",".join(f"{point}:{step}" for point, step in kills.items())
    env = {**job_env(weed, tmp_path), "FTRAIN_KILL_ONCE": str(tmp_path / "kills")}
    resumed = None
    for point, step in kills.items():
        job = torchrun(uri, *ASYNC, kill_at=kill_at, env=env)
        assert job.returncode == KILLED, f"{point}:{step}\n{job.stdout}\n{job.stderr[-3000:]}"
        assert resumed_step(job) == resumed
        previous = step - 5
        assert sealed(weed, bucket, "run-k") == list(range(previous, 0, -5))[:3], f"killed at {point}:{step}"
        assert f"ckpt/run-k/step-{step}/{MARKER}" not in keys(weed, bucket, f"ckpt/run-k/step-{step}/")
        resumed = previous

    last = torchrun(uri, *ASYNC, kill_at=kill_at, env=env)
    assert resumed_step(last) == 15
    assert final_digest(last) == reference
    assert sealed(weed, bucket, "run-k") == [30, 25, 20]
    leftovers = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file()
        and "metrics" not in p.parts
        and "kills" not in p.parts
        and not p.name.startswith("progress-")
    ]
    assert leftovers == [], "the upload and download work files are removed"


def test_async_saves_fail_closed_while_the_store_is_down_and_land_again_once_it_is_back(
    reference: str, tmp_path: Path
) -> None:
    """The job is held (SIGSTOP) once a save has begun, the store is SIGKILLed, the job continued: that save
    fails closed within the client's bounds and training goes on; the job is held again while the store
    restarts on the same ports, so the saves after it have a store to land in."""
    (tmp_path / "work").mkdir()
    with throwaway_storage_server(tmp_path / "weed") as proc:
        store = Endpoint("seaweedfs", proc.endpoint, proc.access_key, proc.secret_key, True)
        bucket = store.new_bucket()
        env = {**job_env(store, tmp_path / "work"), "FTRAIN_MAX_FAILED_SAVES": "100"}
        job = Job(torchrun_command(f"s3://{bucket}/ckpt/run-d", *ASYNC), torchrun_env(env))
        client = store.client()
        try:
            job.wait_for(lambda: has(client, bucket, f"ckpt/run-d/step-10/{WRITER_CLAIM}"), "step 10's save")
            pids = [job.proc.pid, *children(job.proc.pid)]
            pause(pids)
            kill_storage_server(proc)  # the store crashes mid-save
            resume(pids)
            down = time.monotonic()
            job.wait_for(lambda: job.said("not saved (1 of 100"), "a failed save")
            failed_within = time.monotonic() - down
            pause(pids)  # held while the store comes back
            proc = restart_seaweedfs(proc, (bucket, f"ckpt/run-d/step-5/{MARKER}"))
            resume(pids)
            result = job.result(timeout=180)
        finally:
            signal_job(job.proc.pid, signal.SIGKILL)
        assert final_digest(result) == reference
        failed = [int(s) for s in re.findall(r"checkpoint at step (\d+) not saved", result.stderr)]
        warnings = [line for line in job.err if "not saved" in line]
        assert failed and all("storage unavailable" in line for line in warnings), result.stderr
        assert failed_within < 30, f"the failed save took {failed_within:.1f} s to fail"
        for step in failed:
            assert f"ckpt/run-d/step-{step}/{MARKER}" not in keys(store, bucket, f"ckpt/run-d/step-{step}/")
        landed = sealed(store, bucket, "run-d")
        assert landed[0] == 30 and landed[1] > max(failed), (landed, failed)
        print(f"saves failed while the store was down: steps {failed}, the first in {failed_within:.1f} s")


def test_ftrain_run_async_on_s3_a_superseded_attempt_seals_nothing_and_the_relaunch_ends_bit_identical(
    weed: Endpoint, reference: str, tmp_path: Path, env: dict[str, str]
) -> None:
    """Attempt 1 is stopped mid-save; meanwhile attempt 2 claims the run's fence, as a relaunch on another node
    would; continued, attempt 1 refuses to seal that step and stops (exit 1, one line). The supervisor's
    relaunch is attempt 2: it resumes from the step before and ends bit-identical. Attempt 1 cannot start
    again either."""
    run = "s3-fence"
    bucket = weed.new_bucket()
    (tmp_path / "work").mkdir()
    run_env = {
        **os.environ,
        **env,
        **job_env(weed, tmp_path / "work"),
        "FTRAIN_STORAGE": f"s3://{bucket}/ckpt",
        "OMP_NUM_THREADS": "1",
    }
    argv = ["run", "proj", "--run-id", run, "--nodes", "1", "--gpus-per-node", "2", "--nodelist", "localhost",
            "--max-retries", "1", "--backoff", "0.2", "--", "-m", "ftrain.examples.train", *ASYNC]  # fmt: skip
    job = Job([str(Path(sys.executable).with_name("ftrain")), *argv], run_env)
    client = weed.client()
    try:
        job.wait_for(lambda: has(client, bucket, f"ckpt/{run}/step-10/{WRITER_CLAIM}"), "step 10's save")
        old = attempt_processes(run_marks(run, 1))
        pause(old)
        weed.run(bucket, run).claim(2)  # what the relaunch does first
        resume(old)
        result = job.result(timeout=240)
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
        for pid in attempt_processes(run_marks(run, 1)) + attempt_processes(run_marks(run, 2)):
            os.kill(pid, signal.SIGKILL)
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr[-3000:]}"
    line = rf"train: checkpoint at step (\d+) not saved: attempt 1 is superseded by attempt 2 of {run}; writing nothing"
    fenced = re.findall(line, result.stderr)
    assert len(fenced) == 1, result.stderr[-3000:]
    refused = int(fenced[0])
    assert "Attempt 1 of 2 failed" in out and "Attempt 2 of 2 succeeded" in out, out
    assert f"RESUMED from step={refused - 5} " in out, out
    assert final_digest(result) == reference
    assert sealed(weed, bucket, run) == [30, 25, 20]
    events = json.loads(ftrain_process(["replay", run, "--json"], run_env).stdout)
    saved = [
        (e["event"]["step"], e["event"]["attempt"]) for e in events if e["event"]["type"] == "checkpointed"
    ]
    assert saved == [(s, 1 if s < refused else 2) for s in range(5, 31, 5)], saved

    late = torchrun(
        f"s3://{bucket}/ckpt/{run}", *ASYNC, env={**job_env(weed, tmp_path), "FTRAIN_ATTEMPT": "1"}
    )
    assert late.returncode != 0 and "FINAL" not in late.stdout
    assert late.stderr.count(f"train: attempt 1 is superseded by attempt 2 of {run}; writing nothing\n") == 1
    assert sealed(weed, bucket, run) == [30, 25, 20]
