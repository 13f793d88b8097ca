"""The two ends a supervisor cannot record itself, through a real Slurm (tests/support/slurm_cluster.py) and
the example batch script as written: the whole job SIGKILLed with no warning (the supervisor's lease expires;
the requeued job takes the run over), and a frozen node (the hang watchdog ends the attempt; the relaunch
completes)."""

import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.test_slurm_jobs import EXAMPLES, events, finished, gist, job_env, trained, wait_for
from tests.e2e.test_slurm_jobs import reference as reference
from tests.support.slurm_cluster import Slurm
from tests.support.slurm_cluster import slurm as slurm  # the fixture

pytestmark = pytest.mark.timeout(900)
TTL = 10


def at(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["time"])).timestamp()


def test_a_job_sigkilled_without_warning_is_taken_over_once_its_lease_expires(
    slurm: Slurm, env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """Every process of the job SIGKILLed at once (the supervisor, the relay, torchrun, the workers), as the OOM
    killer or a dying node would: nothing is recorded. The job is requeued (`scontrol requeue`, as `--requeue` does after a node failure); its
    `ftrain run` finds the run still running under an expired lease, records it failed (lost, naming the old
    holder) and resumes it: no `ftrain fail`, and the run ends with the uninterrupted digest."""
    out = tmp_path / "job.out"
    job = slurm.sbatch(f"--output={out}", str(EXAMPLES / "train.sbatch"),
                       env=job_env(env, "dead", RUN_OPTIONS=f"--lease-ttl {TTL}"), cwd=tmp_path)  # fmt: skip
    run, ckpt = f"dead-slurm-{job}", Path(env["FTRAIN_STORAGE"]) / f"dead-slurm-{job}"
    wait_for(lambda: any(m.get("train/iter", 0) >= 12 for m in trained(ckpt)), "step 12", 120, slurm, out)
    killed = time.time()
    assert slurm.kill_job_processes(job)
    slurm.wait_job(job, ["FAILED", "CANCELLED", "COMPLETED"], 60)
    ended = time.time()
    assert gist(events(run, env))[-1] == "checkpointed:10"  # nobody recorded the end
    slurm.scontrol("requeue", str(job))
    slurm.start_now(job, ended)
    wait_for(lambda: slurm.job(job)["JobState"] == "RUNNING", "the requeued job to start", 60, slurm, out)
    started = time.time()
    _, seen, lost = finished(slurm, job, out, run, env, reference)
    assert lost["reason"] == "lost" and "stopped renewing its lease" in lost["message"], lost
    assert gist(seen)[seen.index(lost) + 1] == "resumed:10" and gist(seen)[-1] == "completed"
    assert at(lost) - killed <= TTL + (started - killed) + 5
    print(f"\nwhole job SIGKILLed: run taken over {at(lost) - killed:.1f} s after the kill ({at(lost) - started:.1f} s "
          f"after the requeued job started; lease TTL {TTL} s); events: {' '.join(gist(seen))}")  # fmt: skip


def test_a_frozen_node_is_found_hung_and_the_relaunch_completes(
    slurm: Slurm, env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """Every process of the node stopped (FTRAIN_STOP_AT at step 12, once): with HANG_TIMEOUT=10 the watchdog
    ends the attempt within the timeout and a few seconds, records it failed (hang, naming the ranks), and the
    relaunch in the same job completes with the uninterrupted digest."""
    out = tmp_path / "job.out"
    extra = {"HANG_TIMEOUT": "10", "FTRAIN_STOP_AT": "step:12", "FTRAIN_KILL_ONCE": str(tmp_path / "once"),
             "RUN_OPTIONS": "--backoff 1"}  # fmt: skip
    job = slurm.sbatch(f"--output={out}", str(EXAMPLES / "train.sbatch"), env=job_env(env, "hang", **extra),
                       cwd=tmp_path)  # fmt: skip
    run, ckpt = f"hang-slurm-{job}", Path(env["FTRAIN_STORAGE"]) / f"hang-slurm-{job}"
    _, seen, hung = finished(slurm, job, out, run, env, reference, timeout=400)
    assert hung["reason"] == "hang" and "rank" in hung["message"], hung
    assert gist(seen)[seen.index(hung) + 1] == "resumed:10" and gist(seen)[-1] == "completed"
    stopped = max(m["time"] for m in trained(ckpt) if m["time"] < at(hung))  # its last step before it froze
    assert at(hung) - stopped <= 10 + 5, (at(hung) - stopped, hung)
    print(f"\nnode frozen at step 12: found hung {at(hung) - stopped:.1f} s after its last step (timeout 10 s): "
          f"{hung['message']}; events: {' '.join(gist(seen))}")  # fmt: skip
