"""Preemption the way a cluster delivers it, on a real Slurm (tests/support/slurm_cluster.py): the batch
scripts of examples/slurm submitted as written (only the time limit, the warning and the job's size
overridden, on sbatch's command line or in the environment), real torchrun on CPU with gloo, the reference
trainer. Each ends with the digest of an uninterrupted run, and prints what it measured (the README's
figures)."""

import json
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT
from tests.support.processes import ftrain_process
from tests.support.slurm_cluster import Slurm
from tests.support.slurm_cluster import slurm as slurm  # the fixture
from tests.support.training import FINAL, final_digest, torchrun

pytestmark = pytest.mark.timeout(900)
EXAMPLES = ROOT / "examples" / "slurm"
ITERS = ("--train-iters", "40", "--save-interval", "10")
TRAIN = " ".join(("-m", "ftrain.examples.train", *ITERS))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of an uninterrupted run."""
    return final_digest(torchrun(tmp_path_factory.mktemp("reference") / "ckpt", *ITERS))


def job_env(env: dict[str, str], project: str, **extra: str) -> dict[str, str]:
    """What the example scripts read, for a CPU job of the reference trainer: 2 processes, one step a second."""
    return {**env, "PROJECT": project, "GPUS_PER_NODE": "2", "TRAIN": TRAIN, "OMP_NUM_THREADS": "1",
            "FTRAIN_STEP_DELAY": "1", **extra}  # fmt: skip


def events(run: str, env: dict[str, str]) -> list[dict[str, Any]]:
    done = ftrain_process(["replay", run, "--json"], env)
    assert done.returncode == 0, done.stderr
    return [entry["event"] for entry in json.loads(done.stdout)]


def gist(seen: list[dict[str, Any]]) -> list[str]:
    """`checkpointed:10`, `failed:preempted`, `resumed:13` …"""
    out = []
    for e in seen:
        detail = e.get("step") if e["type"] in ("checkpointed", "resumed") else e.get("reason")
        out.append(e["type"] + (f":{detail}" if detail is not None else ""))
    return out


def moment(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"]).timestamp()


def trained(ckpt: Path) -> list[dict[str, Any]]:
    """Rank 0's metrics so far, across attempts."""
    path = ckpt / "metrics" / "metrics-0.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith(b"}")]


def job_ends(slurm: Slurm, job: int) -> list[dict[str, str]]:
    """Each run of `job` that ended, from the jobcomp file (start, end, state), oldest first."""
    path = slurm.work / "jobcomp.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines if f"JobId={job} " in line + " "]


def wait_for(condition: Any, what: str, timeout: float, slurm: Slurm, out: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            shown = out.read_text()[-4000:] if out.exists() else "(no output)"
            pytest.fail(f"timed out waiting for {what}\n{shown}\n{slurm.logs()}")
        time.sleep(0.2)


def finished(
    slurm: Slurm, job: int, out: Path, run: str, env: dict[str, str], reference: str, timeout: float = 300
) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Wait for `job` to complete; it must have ended with the uninterrupted digest, after one failure that a
    `resumed` followed. Its output, the run's events, and that `failed`."""
    done = slurm.wait_job(job, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], timeout)
    text = out.read_text()
    assert done["JobState"] == "COMPLETED", text[-4000:]
    digests = FINAL.findall(text)
    assert digests and digests[-1][1] == reference, text[-4000:]
    seen = events(run, env)
    failed = next(e for e in seen if e["type"] == "failed")
    assert seen[seen.index(failed) + 1]["type"] == "resumed" and seen[-1]["type"] == "completed", gist(seen)
    return text, seen, failed


def test_a_time_limit_with_an_early_warning_saves_requeues_and_resumes_with_nothing_lost(
    slurm: Slurm, env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """examples/slurm/train.sbatch with a 1-minute limit and the warning 50 s ahead (Slurm sends it within 30 s
    of that): the workers save at the next step and exit 83, the run is recorded failed (preempted, the step
    saved), `ftrain run --requeue-on-failure` requeues the job, and the requeued job (given a longer limit, as a
    longer partition would) resumes the same run from the step saved: no step trained twice."""
    out = tmp_path / "job.out"
    job = slurm.sbatch("--time=1", "--signal=B:USR1@50", f"--output={out}", str(EXAMPLES / "train.sbatch"),
                       env=job_env(env, "tl"), cwd=tmp_path)  # fmt: skip
    run, ckpt = f"tl-slurm-{job}", Path(env["FTRAIN_STORAGE"]) / f"tl-slurm-{job}"
    wait_for(lambda: slurm.job(job).get("Restarts") == "1", "the job to be requeued", 150, slurm, out)
    requeued = time.time()
    slurm.scontrol("update", f"JobId={job}", "TimeLimit=10")
    wait_for(lambda: slurm.job(job)["JobState"] == "RUNNING", "the requeued job to start", 150, slurm, out)
    started_again = time.time()
    text, seen, failed = finished(slurm, job, out, run, env, reference)
    said = re.fullmatch(r"SIGUSR1: the workers saved step (\d+) and exited 83", failed["message"])
    assert said, failed
    saved = int(said[1])
    assert (failed["reason"], failed["exit_code"]) == ("preempted", 83)
    assert gist(seen)[: seen.index(failed) + 2][-2:] == ["failed:preempted", f"resumed:{saved}"]
    assert gist(seen)[-1] == "completed"
    opened = seen[seen.index(failed) + 1]
    first = seen[0]["job"]
    assert (first["scheduler"], first["id"], first["restarts"]) == ("slurm", str(job), 0)
    assert None not in (first["cluster"], first["started"])  # SLURM_CLUSTER_NAME, scontrol's StartTime
    assert opened["job"] == {**first, "restarts": 1, "started": opened["job"]["started"]}  # the job, requeued
    assert opened["job"]["started"] > first["started"]  # as scontrol shows it: ISO 8601, local time
    restart = next(m for m in trained(ckpt) if "train/restart_seconds" in m)
    assert restart["train/lost_steps"] == 0, restart
    reached = max(m["train/iter"] for m in trained(ckpt) if moment_of(m) < moment(failed))
    assert reached == saved, "a step trained past the save"
    assert "Requeueing slurm job" in text and f"Relaunching {run}" in text

    first = job_ends(slurm, job)[0]
    ended = datetime.fromisoformat(first["EndTime"]).timestamp()
    warned = warning_time(text)
    first_step = next(m["time"] for m in trained(ckpt) if "train/restart_seconds" in m)
    print(f"\ntime limit + warning: signal → job exit {ended - warned:.1f} s (recorded failed after "
          f"{moment(failed) - warned:.1f} s), requeue → running again {started_again - requeued:.1f} s, "
          f"requeued job start → first productive step {first_step - started_again:.1f} s, lost steps "
          f"{restart['train/lost_steps']}; events: {' '.join(gist(seen))}")  # fmt: skip


def moment_of(record: dict[str, Any]) -> float:
    return float(record["time"])


def warning_time(text: str) -> float:
    """When the relay handed the workers the warning (its line carries the time)."""
    found = re.search(r"relay: \S+ → \S+ to worker\(s\) [\d ]+ at (\d+\.\d+)", text)
    assert found, text[-3000:]
    return float(found[1])


def test_two_requeues_of_one_job_racing_start_one_trainer(
    slurm: Slurm, env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    """A job whose run failed is started twice at once (two `ftrain run` in one job: the job's id names one run):
    one opens the attempt and trains to the end, the other is refused and starts nothing."""
    out = tmp_path / "job.out"
    script = tmp_path / "twice.sbatch"
    line = f"ftrain run race --nodes 1 --gpus-per-node 2 --requeue-on-failure -- {TRAIN}"
    script.write_text(
        "#!/bin/bash\n"
        f'ftrain launch race --nodes 1 --gpus-per-node 2 -- {TRAIN} && ftrain fail "race-slurm-$SLURM_JOB_ID"\n'
        f"{line} > a.out 2> a.err & {line} > b.out 2> b.err & wait\n"
    )
    job = slurm.sbatch(f"--output={out}", str(script), env=job_env(env, "race", FTRAIN_STEP_DELAY="0"),
                       cwd=tmp_path)  # fmt: skip
    done = slurm.wait_job(job, ["COMPLETED", "FAILED", "CANCELLED"], 300)
    results = sorted(((tmp_path / f"{n}.out").read_text(), (tmp_path / f"{n}.err").read_text()) for n in "ab")
    won = [r for r in results if FINAL.search(r[0])]
    lost = [r for r in results if not FINAL.search(r[0])]
    assert done["JobState"] == "COMPLETED" and len(won) == len(lost) == 1, results
    assert FINAL.search(won[0][0])[2] == reference  # type: ignore[index]
    assert "is running (another supervisor?)" in lost[0][1] and "Requeueing" not in lost[0][0], lost
    assert gist(events(f"race-slurm-{job}", env)) == [
        "launched", "failed:preempted", "resumed:0", *[f"checkpointed:{s}" for s in (10, 20, 30, 40)], "completed"
    ]  # fmt: skip


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_scancel_term_then_plain_scancel_during_the_save_trusts_nothing_half_written(
    slurm: Slurm, env: dict[str, str], tmp_path: Path, reference: str, mode: str
) -> None:
    """`scancel --full --signal=TERM` (the batch shell, `ftrain run`, and every step), then at once a plain
    `scancel`: the workers start the save the warning asks for and are SIGKILLed inside it (FTRAIN_KILL_AT at
    the shard write of any step the save may fall on, as KillWait's SIGKILL does to a save too slow for it). The
    half-written step is never recorded nor resumed from; the job, cancelled, is not requeued (by Slurm or by
    --requeue-on-failure, though Slurm would take the request); resubmitted with
    the run's id (RUN_ID, as the example script says), it resumes from the last sealed step and completes."""
    out = tmp_path / "job.out"
    train = TRAIN + (" --async-ckpt" if mode == "async" else "")
    kills = ",".join(f"write:{s}" for s in range(11, 20))
    extra = {"TRAIN": train, "FTRAIN_KILL_AT": kills, "FTRAIN_KILL_ONCE": str(tmp_path / "once")}
    job = slurm.sbatch(f"--output={out}", str(EXAMPLES / "train.sbatch"), env=job_env(env, f"sc{mode}", **extra),
                       cwd=tmp_path)  # fmt: skip
    run, ckpt = f"sc{mode}-slurm-{job}", Path(env["FTRAIN_STORAGE"]) / f"sc{mode}-slurm-{job}"
    wait_for(lambda: any(m.get("train/iter", 0) >= 12 for m in trained(ckpt)), "step 12", 120, slurm, out)
    signalled = time.time()
    slurm.scancel("--full", "--signal=TERM", str(job))
    slurm.scancel(str(job))
    assert slurm.wait_job(job, ["CANCELLED", "FAILED", "COMPLETED"], 120)["JobState"] == "CANCELLED"
    half = sorted(p.name for p in ckpt.glob(".step-*.tmp*"))  # async writes to the node-local stage first
    assert half or mode == "async", sorted(p.name for p in ckpt.iterdir())
    first = events(run, env)
    assert [e["step"] for e in first if e["type"] == "checkpointed"] == [10], gist(first)
    assert first[-1]["type"] == "failed", gist(first)
    assert f"Not requeueing slurm job {job}: it is being cancelled" in out.read_text()
    ended = datetime.fromisoformat(job_ends(slurm, job)[-1]["EndTime"]).timestamp()

    again = slurm.sbatch(f"--output={out}", str(EXAMPLES / "train.sbatch"),
                         env=job_env(env, f"sc{mode}", TRAIN=train, RUN_ID=run), cwd=tmp_path)  # fmt: skip
    done = slurm.wait_job(again, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], 300)
    text = out.read_text()
    assert done["JobState"] == "COMPLETED", text[-4000:]
    assert FINAL.findall(text)[-1][1] == reference
    seen = events(run, env)
    opened = seen[len(first)]
    assert (opened["type"], opened["step"], opened["job"]["id"]) == ("resumed", 10, str(again)), gist(seen)
    assert [e["step"] for e in seen if e["type"] == "checkpointed"] == [10, 20, 30, 40]
    restart = next(m for m in trained(ckpt) if "train/restart_seconds" in m)
    print(f"\nscancel TERM + plain scancel, killed inside the save ({mode}): half-written {half} never trusted; "
          f"signal → job exit {ended - signalled:.1f} s; resubmitted, resumed from {opened['step']} (lost steps "
          f"{restart.get('train/lost_steps', 'unknown')}); events: {' '.join(gist(seen))}")  # fmt: skip


def test_the_batch_scripts_are_valid_bash() -> None:
    for script in EXAMPLES.glob("*.sbatch"):
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0, script
