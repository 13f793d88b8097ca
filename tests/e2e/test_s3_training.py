"""The reference trainer saving to and resuming from `s3://` storage on a real SeaweedFS, under real 2-process
torchrun jobs: sync saves end bit-identical to a job on a file system; a SIGKILL mid-upload leaves the previous
sealed step, and a relaunch resumes from it; a flipped byte in a shard object is skipped; a store that goes
away makes saves fail closed while training goes on, until too many fail in a row."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ftrain.workers.layout import MARKER
from ftrain.workers.s3.seaweed_server import kill_storage_server, throwaway_storage_server
from tests.support.paths import ROOT
from tests.support.processes import ftrain_process
from tests.support.s3 import Endpoint, restart_seaweedfs
from tests.support.training import final_digest, resumed_step, torchrun, torchrun_command, torchrun_env

pytestmark = pytest.mark.timeout(300)
ITERS = ("--train-iters", "30", "--save-interval", "5")
KILLED = -signal.SIGKILL


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An uninterrupted 30-step job on a file system: its checkpoint directory and final digest."""
    ckpt = tmp_path_factory.mktemp("reference") / "ckpt"
    return ckpt, final_digest(torchrun(ckpt, *ITERS))


@pytest.fixture(scope="module")
def reference(reference_run: tuple[Path, str]) -> str:
    """The digest of an uninterrupted 30-step job on a file system."""
    return reference_run[1]


def job_env(weed: Endpoint, work: Path) -> dict[str, str]:
    return {**weed.env(), "TMPDIR": str(work)}


def sealed(weed: Endpoint, bucket: str, run: str) -> list[int]:
    """The run's steps with a marker, newest first."""
    found = weed.run(bucket, run).complete()
    return [d.step for d in found]


def keys(weed: Endpoint, bucket: str, prefix: str) -> list[str]:
    listed = weed.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for o in listed.get("Contents", ())]


def test_sync_saves_to_s3_end_bit_identical_after_a_kill_mid_upload(
    weed: Endpoint, reference: str, tmp_path: Path
) -> None:
    bucket = weed.new_bucket()
    uri = f"s3://{bucket}/ckpt/run-a"
    env = job_env(weed, tmp_path)
    first = torchrun(uri, *ITERS, kill_at="fanout:20", env=env)  # rank files uploaded, nothing sealed
    assert first.returncode == KILLED, first.stderr[-3000:]
    assert sealed(weed, bucket, "run-a") == [15, 10, 5]
    assert f"ckpt/run-a/step-20/{MARKER}" not in keys(weed, bucket, "ckpt/run-a/step-20/")

    second = torchrun(uri, *ITERS, env=env)
    assert resumed_step(second) == 15
    assert final_digest(second) == reference
    assert sealed(weed, bucket, "run-a") == [30, 25, 20]  # keep-last-3 on S3
    leftovers = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and "metrics" not in p.parts and not p.name.startswith("progress-")  # lost work's
    ]
    assert leftovers == [], "the upload and download work files are removed"


def test_a_flipped_byte_in_a_shard_object_is_skipped_and_the_older_step_resumed(
    weed: Endpoint, reference: str, tmp_path: Path
) -> None:
    bucket = weed.new_bucket()
    uri = f"s3://{bucket}/ckpt/run-b"
    env = job_env(weed, tmp_path)
    first = torchrun(uri, *ITERS, kill_at="step:22", env=env)
    assert first.returncode == KILLED and sealed(weed, bucket, "run-b") == [20, 15, 10]
    client, key = weed.client(), "ckpt/run-b/step-20/__1_0.distcp"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))

    second = torchrun(uri, *ITERS, env=env)
    assert "step 20" in second.stdout and "hash mismatch" in second.stdout, second.stdout
    assert resumed_step(second) == 15
    assert final_digest(second) == reference
    aside = {k.split("/")[2] for k in keys(weed, bucket, "ckpt/run-b/step-20.corrupt-")}
    assert len(aside) == 1, "the corrupt step is kept, set aside"


@pytest.mark.parametrize("mode", [(), ("--async-ckpt",)], ids=["sync", "async"])
def test_saves_fail_closed_while_the_store_is_down_and_too_many_stop_the_job(
    tmp_path: Path, mode: tuple[str, ...]
) -> None:
    """Async: the failure that stops the job is raised in the background and surfaces at the next save."""
    with throwaway_storage_server(tmp_path / "weed") as proc:
        store = Endpoint("seaweedfs", proc.endpoint, proc.access_key, proc.secret_key, True)
        bucket = store.new_bucket()
        uri = f"s3://{bucket}/ckpt/run-c"
        env = {**job_env(store, tmp_path), "FTRAIN_MAX_FAILED_SAVES": "2", "AWS_MAX_ATTEMPTS": "2"}
        job = subprocess.Popen(
            torchrun_command(uri, "--train-iters", "400", "--save-interval", "5", *mode),
            env=torchrun_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not sealed(store, bucket, "run-c") and time.monotonic() < deadline:
                time.sleep(0.2)
            before = sealed(store, bucket, "run-c")
            os.kill(proc.pid, signal.SIGKILL)  # the store goes away mid-run
            started = time.monotonic()
            out, err = job.communicate(timeout=180)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    assert before, "a first save landed before the store went away"
    elapsed = time.monotonic() - started
    assert job.returncode == 1, err[-3000:]
    warnings = [line for line in err.splitlines() if "not saved (1 of 2" in line]
    assert len(warnings) == 1 and "storage unavailable" in warnings[0], err[-3000:]
    stop = [line for line in err.splitlines() if "checkpoint saves in a row failed (limit 2)" in line]
    assert len(stop) == 1, err[-3000:]
    assert "FINAL" not in out and elapsed < 120, "bounded in time, and the job stopped"


def test_ftrain_run_on_s3_relaunches_after_a_sigkill_and_resumes_from_the_newest_sealed_step(
    weed: Endpoint, reference: str, tmp_path: Path, env: dict[str, str]
) -> None:
    bucket = weed.new_bucket()
    run_env = {
        **env,
        **job_env(weed, tmp_path / "work"),
        "FTRAIN_STORAGE": f"s3://{bucket}/ckpt",
        "FTRAIN_KILL_AT": "step:22",
        "FTRAIN_KILL_ONCE": str(tmp_path / "kills"),
        "OMP_NUM_THREADS": "1",
    }
    (tmp_path / "work").mkdir()
    result = ftrain_process(
        ["run", "proj", "--run-id", "s3-run", "--nodes", "1", "--gpus-per-node", "2", "--nodelist", "localhost",
         "--max-retries", "2", "--backoff", "0.2", "--", "-m", "ftrain.examples.train", *ITERS],
        run_env,
        timeout=240,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr[-3000:]}"
    assert re.search(r"Attempt 1 of 3 failed \(killed by SIGKILL\) .* — checkpoint step 20;", out), out
    assert "RESUMED from step=20 (epoch=0)" in out
    assert "Attempt 2 of 3 succeeded" in out and "checkpoint step 30" in out, out + result.stderr[-4000:]
    assert final_digest(result) == reference
    assert sealed(weed, bucket, "s3-run") == [30, 25, 20]

    status = ftrain_process(["status", "s3-run"], run_env)
    assert status.returncode == 0 and f"s3://{bucket}/ckpt/s3-run/step-30" in status.stdout, status
    audit = ftrain_process(["audit", "verify", "s3-run"], run_env)
    assert audit.returncode == 0 and "every chain intact" in audit.stdout, audit
    events = ftrain_process(["replay", "s3-run", "--json"], run_env)
    kinds = [e["event"]["type"] for e in json.loads(events.stdout)]
    assert kinds.count("failed") == 1 and kinds[-1] == "completed", kinds
    checkpointed = [e["event"] for e in json.loads(events.stdout) if e["event"]["type"] == "checkpointed"]
    assert [c["step"] for c in checkpointed] == [5, 10, 15, 20, 25, 30]
    assert all(c["uri"].startswith(f"s3://{bucket}/ckpt/s3-run/step-") for c in checkpointed)


def test_the_store_killed_mid_run_fails_saves_closed_and_once_restarted_the_next_save_lands(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "work").mkdir()
    with throwaway_storage_server(tmp_path / "weed") as proc:
        store = Endpoint("seaweedfs", proc.endpoint, proc.access_key, proc.secret_key, True)
        bucket = store.new_bucket()
        run_env = {
            **os.environ,
            **env,
            **job_env(store, tmp_path / "work"),
            "FTRAIN_STORAGE": f"s3://{bucket}/ckpt",
            "FTRAIN_MAX_FAILED_SAVES": "100",
            "AWS_MAX_ATTEMPTS": "1",
            "OMP_NUM_THREADS": "1",
        }
        argv = ["run", "proj", "--run-id", "s3-back", "--nodes", "1", "--gpus-per-node", "2", "--nodelist",
                "localhost", "--max-retries", "0", "--", "-m", "ftrain.examples.train", "--train-iters", "300",
                "--save-interval", "10"]  # fmt: skip
        job = subprocess.Popen(
            [str(Path(sys.executable).with_name("ftrain")), *argv],
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        err: list[str] = []
        first_failure = threading.Event()

        def read_stderr() -> None:
            assert job.stderr is not None
            for line in job.stderr:
                err.append(line)
                if "not saved (1 of 100" in line:
                    first_failure.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 120
            while not (before := sealed(store, bucket, "s3-back")) and time.monotonic() < deadline:
                time.sleep(0.2)
            kill_storage_server(proc)  # the store crashes mid-run
            assert first_failure.wait(60), "".join(err)[-3000:]
            probe = (bucket, f"ckpt/s3-back/step-{before[0]}/{MARKER}")
            proc = restart_seaweedfs(proc, probe)  # same data directory, keys and ports
            out, _ = job.communicate(timeout=180)
            reader.join(5)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        stderr = "".join(err)
        assert job.returncode == 0, f"{out}\n{stderr[-3000:]}"
        failed = [int(s) for s in re.findall(r"checkpoint at step (\d+) not saved", stderr)]
        assert failed and all("storage unavailable" in line for line in err if "not saved" in line), stderr
        assert "FINAL step=300" in out
        print(f"saves failed while the store was down: steps {failed}")
        # once the store is back: no marker and no `checkpointed` event for a failed step; later saves landed
        for step in failed:
            assert f"ckpt/s3-back/step-{step}/{MARKER}" not in keys(
                store, bucket, f"ckpt/s3-back/step-{step}/"
            )
        assert sealed(store, bucket, "s3-back") == [300, 290, 280]
        events = json.loads(ftrain_process(["replay", "s3-back", "--json"], run_env).stdout)
        recorded = [e["event"]["step"] for e in events if e["event"]["type"] == "checkpointed"]
        assert not set(recorded) & set(failed) and max(recorded) == 300 and max(failed) < 280, (
            recorded,
            failed,
        )
        assert recorded == sorted(set(range(10, 301, 10)) - set(failed)), (recorded, failed)
        assert events[-1]["event"]["type"] == "completed"
        audit = ftrain_process(["audit", "verify", "s3-back"], run_env)
        assert audit.returncode == 0 and "every chain intact" in audit.stdout, audit


def page_blocks(page: str, section: str) -> list[str]:
    """The python blocks of a page's section, as written."""
    text = (ROOT / page).read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.DOTALL)


def test_the_stock_pytorch_recipe_runs_on_local_and_s3_checkpoints(
    weed: Endpoint, reference_run: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, s3 = page_blocks("docs/export.md", "Without ftrain: stock PyTorch")
    ckpt, digest = reference_run
    monkeypatch.chdir(tmp_path)
    ns: dict[str, object] = {}
    exec(local.replace('"ckpts/my-run/step-30"', repr(str(ckpt / "step-30"))), ns)
    assert ns["params_sha256"](ns["model"]) == digest
    assert (tmp_path / "step-30.pt").is_file()

    bucket = weed.new_bucket()
    job = torchrun(f"s3://{bucket}/ckpt/my-run", *ITERS, env=job_env(weed, tmp_path))
    assert final_digest(job) == digest
    for key, value in weed.env().items():
        monkeypatch.setenv(key, value)
    ns = {}
    exec(s3.replace('"my-bucket"', repr(bucket)), ns)
    assert ns["step_dir"] == "step-30-local" and (tmp_path / "step-30-local" / ".metadata").is_file()
    ns = {}
    exec(local.replace('"ckpts/my-run/step-30"', '"step-30-local"').replace('"step-30.pt"', '"s3.pt"'), ns)
    assert ns["params_sha256"](ns["model"]) == digest
