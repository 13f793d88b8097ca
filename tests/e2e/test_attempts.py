"""Attempts are fenced: real torchrun jobs of the reference trainer whose old processes outlive their attempt.

A SIGKILL to torchrun's process group takes the workers with it (parent-death signal); an attempt stopped
while a relaunch takes over (a node cut off, a process stopped) and continued afterwards writes nothing the run
trusts. Either way the relaunched job ends bit-identical to an uninterrupted one.
"""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ftrain.host.job_signals import children, signal_job
from ftrain.workers.layout import MARKER, complete_steps
from ftrain.workers.manifest import decode_marker
from ftrain.workers.storage.file.fence_file import owner
from tests.support.processes import ftrain_process
from tests.support.training import (
    alive,
    final_digest,
    launch_logged,
    torchrun,
    torchrun_command,
    torchrun_env,
    wait_for,
)

pytestmark = pytest.mark.timeout(600)
ITERS = ("--train-iters", "40", "--save-interval", "10")
RUN = "fenced-1"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of an uninterrupted run."""
    return final_digest(torchrun(tmp_path_factory.mktemp("reference") / "ckpt", *ITERS))


def start(ckpt: Path, out: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A job in its own process group (torchrun's agent leads it), its output in `out`.{out,err}."""
    return subprocess.Popen(
        torchrun_command(ckpt, *ITERS),
        env=torchrun_env(env),
        stdout=out.with_suffix(".out").open("w"),
        stderr=out.with_suffix(".err").open("w"),
        text=True,
        start_new_session=True,
    )


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file())


def test_sigkill_to_torchruns_process_group_takes_every_worker_and_the_relaunch_ends_bit_identical(
    tmp_path: Path, reference: str
) -> None:
    ckpt = tmp_path / "ckpt"
    job = start(ckpt, tmp_path / "killed")
    try:
        wait_for(lambda: (ckpt / "step-10" / MARKER).exists(), job, "the first checkpoint")
        workers = children(job.pid)
        assert len(workers) == 2
        os.killpg(
            job.pid, signal.SIGKILL
        )  # kill -9 -PGID: the agent's group; each worker has a session of its own
        assert job.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 3
        while any(alive(w) for w in workers):
            assert time.monotonic() < deadline, "a worker outlived its torchrun agent"
            time.sleep(0.02)
        landed = tree(ckpt)
        time.sleep(1)
        assert tree(ckpt) == landed, "something written after the kill"
    finally:
        signal_job(job.pid, signal.SIGKILL)
    assert final_digest(torchrun(ckpt, *ITERS)) == reference


def test_a_stopped_attempt_continued_after_a_relaunch_writes_nothing_trusted_and_the_run_ends_bit_identical(
    tmp_path: Path, env: dict[str, str], reference: str
) -> None:
    ckpt, job_env = launch_logged(RUN, env)
    old = start(ckpt, tmp_path / "old", job_env)
    try:
        wait_for(lambda: (ckpt / "step-10" / MARKER).exists(), old, "the first checkpoint")
        signal_job(old.pid, signal.SIGSTOP)  # the agent and both workers freeze, as a node cut off would
        assert ftrain_process(["fail", RUN], env).returncode == 0  # what a relaunch after a lost node does
        # the relaunch runs elsewhere, as it would with a node cut off: its own node-local outbox, and the
        # user's signing key copied there (one user, one key on every node)
        other_home = tmp_path / "other-node"
        shutil.copytree(Path(env["FTRAIN_HOME"]) / "keys", other_home / "keys")
        new = start(ckpt, tmp_path / "new", {**job_env, "FTRAIN_HOME": str(other_home)})
        wait_for(lambda: owner(ckpt) == 2, new, "the relaunch to claim the directory")
        signal_job(old.pid, signal.SIGCONT)
        assert new.wait(timeout=180) == 0
        assert old.wait(timeout=120) != 0
    finally:
        signal_job(old.pid, signal.SIGKILL)
    digest = final_digest(subprocess.CompletedProcess([], 0, (tmp_path / "new.out").read_text(), ""))
    assert digest == reference
    assert "attempt 1 is superseded by attempt 2" in (tmp_path / "old.err").read_text()

    entries = json.loads(ftrain_process(["replay", RUN, "--json"], env).stdout)
    events = [e["event"] for e in entries]
    failed = next(i for i, e in enumerate(events) if e["type"] == "failed")
    assert events[failed + 1]["type"] == "resumed"
    assert {e["attempt"] for e in events[failed + 1 :]} == {2}, "nothing of attempt 1 after the relaunch"
    assert {
        decode_marker((ckpt / f"step-{s}" / MARKER).read_bytes()).attempt for s in complete_steps(ckpt)
    } == {2}
    assert ftrain_process(["audit", "verify"], env).returncode == 0
