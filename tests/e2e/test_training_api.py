"""The public training API end to end: the examples resumed bit-identically under `ftrain run`, and a warning
signal saved on every rank under torchrun (its configuration: tests/unit/test_training_config.py; one process:
tests/integration/test_training_api.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftrain.train.preemption import PREEMPTED_EXIT
from ftrain.workers.manifest import decode_manifest
from tests.support.processes import free_port, ftrain_process

FINAL = "FINAL step="


# -- end to end: the examples under torchrun and `ftrain run` ----------------------------------------------


def _job_env(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    for name in ("FTRAIN_KILL_AT", "FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_ATTEMPT"):
        env.pop(name, None)
    env.update(extra or {})
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


def _torchrun(module: str, *args: str, nproc: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", module, *args,
    ]  # fmt: skip


def _final(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(FINAL)]
    assert lines, out[-3000:]
    return lines[-1].rpartition("params_sha256=")[2]


EXAMPLES = [("ftrain.examples.ddp", 2), ("ftrain.examples.single_process", 1)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each example's final digest, trained in one go."""
    digests = {}
    for module, nproc in EXAMPLES:
        tmp = tmp_path_factory.mktemp(module.rpartition(".")[2])
        command = (
            _torchrun(module, "--location", str(tmp / "run"), nproc=nproc)
            if nproc > 1
            else [sys.executable, "-m", module, "--location", str(tmp / "run")]
        )
        result = subprocess.run(
            command, env=_job_env(tmp), capture_output=True, text=True, timeout=180, check=False
        )
        assert result.returncode == 0, result.stderr[-3000:]
        digests[module] = _final(result.stdout)
    return digests


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("module", "nproc"), EXAMPLES)
def test_each_example_killed_under_ftrain_run_resumes_to_the_uninterrupted_digest_with_goodput_known(
    tmp_path: Path, env: dict[str, str], uninterrupted: dict[str, str], module: str, nproc: int
) -> None:
    run_id = f"api-{module.rpartition('.')[2].replace('_', '-')}"
    kill_once = tmp_path / "kill-once"
    kill_once.mkdir()
    job = _job_env(tmp_path, {**env, "FTRAIN_KILL_AT": "step:25", "FTRAIN_KILL_ONCE": str(kill_once)})
    result = ftrain_process(
        ["run", "api", "--nodes", "1", "--gpus-per-node", str(nproc), "--run-id", run_id,
         "--backoff", "0", "--checkpoint-every", "10steps", "--dataset-revision", "A1-rev",
         "--", "python", "-m", module],
        job, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert _final(result.stdout) == uninterrupted[module]
    assert "RESUMED from step=20" in result.stdout
    storage = Path(env.get("FTRAIN_STORAGE") or Path(env["FTRAIN_HOME"]) / "checkpoints")
    manifest = decode_manifest((storage / run_id / "step-60" / "manifest.json").read_bytes())
    assert manifest.dataset_revision == "A1-rev"  # the launch's, passed to the trainer by the supervisor
    cost = ftrain_process(["cost", "--run", run_id, "--json"], env)
    assert cost.returncode == 0, cost.stderr
    goodput = json.loads(cost.stdout)["goodput"]
    assert goodput["unknown"] == [], goodput
    assert goodput["lost_steps"] == 5  # reached 25, resumed from 20


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_save", [False, True])
def test_a_warning_signal_saves_the_next_step_on_every_rank_and_exits_83_then_nothing_is_lost(
    tmp_path: Path, async_save: bool
) -> None:
    from tests.support.training import FINAL as TRAINER_FINAL
    from tests.support.training import RESUMED, torchrun_command

    ckpt = tmp_path / "run"
    flags = ("--train-iters", "400", "--save-interval", "1000", *(("--async-ckpt",) if async_save else ()))
    job = _job_env(tmp_path, {"FTRAIN_STEP_DELAY": "0.05"})
    child = subprocess.Popen(
        torchrun_command(ckpt, *flags), env=job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    metrics = ckpt / "metrics" / "metrics-0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not metrics.exists() or len(metrics.read_bytes().splitlines()) < 5
    ):
        time.sleep(0.2)  # training, its handlers installed
    workers = _workers_of(child.pid)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGUSR1)  # as Slurm's --signal=USR1 delivers it: to every task
    out, err = child.communicate(timeout=120)
    assert child.returncode != 0 and f"exitcode  : {PREEMPTED_EXIT}" in err, err[-3000:]
    assert "FINAL" not in out
    saved = sorted(int(p.name.removeprefix("step-")) for p in ckpt.glob("step-*"))
    assert len(saved) == 1 and 0 < saved[0] < 400, (saved, err[-3000:])
    assert "PREEMPTED by SIGUSR1: checkpoint at step" in err
    again = subprocess.run(
        torchrun_command(ckpt, *flags), env={**job, "FTRAIN_STEP_DELAY": ""}, capture_output=True, text=True,
        timeout=180, check=False,
    )  # fmt: skip
    match = RESUMED.search(again.stdout)
    assert again.returncode == 0 and match and int(match.group(1)) == saved[0], again.stderr[-3000:]
    assert TRAINER_FINAL.search(again.stdout)


def _workers_of(agent: int) -> list[int]:
    """The trainer processes torchrun `agent` started (its children running ftrain.examples.train)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent == agent and b"ftrain.examples.train" in cmdline:
            found.append(int(entry.name))
    return found
