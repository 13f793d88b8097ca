"""Running the reference trainer under a real torchrun (CPU, gloo) from tests, in its own process group so a
`FTRAIN_KILL_AT` SIGKILL takes down the whole job and nothing else."""

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from tests.support.processes import free_port, ftrain_process

FINAL = re.compile(r"FINAL step=(\d+) params_sha256=([0-9a-f]{64})")
RESUMED = re.compile(r"RESUMED from step=(\d+) \(epoch=(\d+)\)")


def torchrun_command(ckpt_dir: Path, *args: str, nproc: int = 2) -> list[str]:
    """argv of one job of the reference trainer."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "-m", "ftrain.examples.train", "--ckpt-dir", str(ckpt_dir), *args,
    ]  # fmt: skip


def torchrun_env(env: dict[str, str] | None = None, kill_at: str | None = None) -> dict[str, str]:
    """The job's environment: this process's, plus `env`, plus the failure to inject (if any)."""
    child_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"}
    child_env.pop("FTRAIN_KILL_AT", None)
    if kill_at:
        child_env["FTRAIN_KILL_AT"] = kill_at
    return child_env


def torchrun(
    ckpt_dir: Path,
    *args: str,
    kill_at: str | None = None,
    env: dict[str, str] | None = None,
    nproc: int = 2,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """One job of the reference trainer (debug model), waiting for it to end."""
    return subprocess.run(
        torchrun_command(ckpt_dir, *args, nproc=nproc),
        env=torchrun_env(env, kill_at),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def final_digest(result: subprocess.CompletedProcess[str]) -> str:
    """The `FINAL` digest a finished job printed (fails the test with its output otherwise)."""
    match = FINAL.search(result.stdout)
    assert result.returncode == 0 and match, (
        f"rc={result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    )
    return match.group(2)


def resumed_step(result: subprocess.CompletedProcess[str]) -> int | None:
    """The step a job said it resumed from."""
    match = RESUMED.search(result.stdout)
    return int(match.group(1)) if match else None


def metrics(ckpt_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    """Every record rank `rank` logged, across restarts."""
    lines = (ckpt_dir / "metrics" / f"metrics-{rank}.jsonl").read_bytes().splitlines()
    return [msgspec.json.decode(line) for line in lines]


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def launch_logged(run_id: str, env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """`ftrain launch` a 2-process run; its checkpoint directory and the environment its jobs run with."""
    launched = ftrain_process(
        ["launch", "proj", "--run-id", run_id, "--nodes", "1", "--gpus-per-node", "2"], env
    )
    assert launched.returncode == 0, launched.stderr
    ckpt = Path(env["FTRAIN_STORAGE"]) / run_id
    return ckpt, {**env, "FTRAIN_RUN_ID": run_id, "FTRAIN_CKPT_DIR": str(ckpt)}


def wait_for(
    condition: Callable[[], bool], job: subprocess.Popen[Any] | None, what: str, timeout: float = 120
) -> None:
    """Poll `condition` until it holds; fails the test if `job` (if any) ends first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert job is None or job.poll() is None, f"the job ended (rc={job.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except FileNotFoundError:
        return False


def is_relay(pid: int) -> bool:
    """Whether process `pid` is ftrain's signal relay above a node's torchrun (no part of a stopped job)."""
    try:
        return b"ftrain.supervise.relay" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return False


def supervised(run_id: str, env: dict[str, str], *train: str, lease_ttl: int = 30) -> subprocess.Popen[str]:
    """A real `ftrain run` of the reference trainer on one node of 2 ranks (`train`: its flags), in a session of
    its own, with stdout and stderr piped."""
    argv = [str(Path(sys.executable).with_name("ftrain")), "run", "P", "--nodes", "1", "--gpus-per-node", "2",
            "--run-id", run_id, "--lease-ttl", str(lease_ttl), "--", "-m", "ftrain.examples.train", *train]  # fmt: skip
    return subprocess.Popen(
        argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
