"""`ftrain run`: real torchrun, a real nats-server, real checkpoint directories, and a stand-in trainer
(tests/support/stand_in_trainer.py). Refusals and the supervisor without torchrun:
tests/integration/test_supervisor.py; its pure parts: tests/unit/test_supervisor_rules.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ftrain.supervise.attempts import RELAY
from tests.support.builders import SIGNER
from tests.support.cli import Cli
from tests.support.processes import free_port
from tests.support.stand_in_trainer import ONE_GPU, RUN, starts
from tests.support.stand_in_trainer import cli as cli  # the fixtures
from tests.support.stand_in_trainer import trainer as trainer

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


FAKE_SRUN = '''#!{python}
"""Stand-in srun: records its argv and environment, then runs the step's command once per task, here."""
import json, os, subprocess, sys

argv = sys.argv[1:]
keys = ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_NATS_URL", "FTRAIN_HOME")
with open(os.environ["FAKE_SRUN_LOG"], "w") as f:
    json.dump({{"argv": argv, "env": {{k: os.environ.get(k) for k in keys}}}}, f)
cut = next(i for i, a in enumerate(argv) if not a.startswith("--"))
tasks = int(next(a for a in argv[:cut] if a.startswith("--ntasks=")).split("=")[1])
procs = [
    subprocess.Popen(argv[cut:], env={{**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i)}})
    for i in range(tasks)
]
sys.exit(max(p.wait() for p in procs))
'''


def timeline(cli: Cli, run_id: str) -> list[str]:
    """The run's events, each as `type` plus what matters here."""

    def gist(e: dict[str, Any]) -> str:
        if e["type"] == "failed":
            return f"failed {e['reason']} {e['exit_code']}"
        if e["type"] in ("checkpointed", "resumed"):
            return f"{e['type']} {e['step']}"
        return str(e["type"])

    return [gist(entry["event"]) for entry in json.loads(cli.ok("replay", run_id, "--json")[0])]


def last_line(text: str) -> str:
    return text.splitlines()[-1]


# -- end to end, through torchrun ------------------------------------------------------------------------------


def test_fails_twice_then_completes(cli: Cli, trainer: tuple[Path, Path]) -> None:
    script, state = trainer
    code, out, err = cli(
        "run", "P", *ONE_GPU, "--backoff", "0.1", "--", str(script), str(state),
        "ckpt+exit3", "ckpt+kill", "ckpt",
    )  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:2] == [
        f"Launched {RUN} — 1×1 GPUs, fsdp, rdzv localhost:29500",
        f"  torchrun --nnodes=1 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=localhost:29500 "
        f"--rdzv_id={RUN} {script} {state} ckpt+exit3 ckpt+kill ckpt",
    ]
    assert re.fullmatch(
        r"Attempt 1 of 4 failed \(exit code 3\) after \d+\.\d s — checkpoint step 10; retrying in 0\.1 s",
        lines[2],
    )
    assert re.fullmatch(
        r"Attempt 2 of 4 failed \(killed by SIGKILL\) after \d+\.\d s — checkpoint step 20; retrying in 0\.2 s",
        lines[3],
    )
    assert re.fullmatch(r"Attempt 3 of 4 succeeded after \d+\.\d s — checkpoint step 30", lines[4])
    assert re.fullmatch(rf"Completed {RUN} — \d+\.\d\d GPU-hours \(running wall time × GPUs\)", lines[5])
    assert "Root Cause" in err  # torchrun's own report is passed through
    assert timeline(cli, RUN) == [
        "launched", "checkpointed 10", "failed exit-code 3", "resumed 10", "checkpointed 20",
        "failed signal 137", "resumed 20", "checkpointed 30", "completed",
    ]  # fmt: skip
    ckpt_dir = str(cli.storage() / RUN)
    assert {(s["FTRAIN_RUN_ID"], s["FTRAIN_CKPT_DIR"]) for s in starts(state)} == {(RUN, ckpt_dir)}
    assert [s["FTRAIN_ATTEMPT"] for s in starts(state)] == ["1", "2", "3"]
    assert cli.ok("audit", "verify") == [
        f"Verified 9 event(s) in 1 run(s): every chain intact and anchored; signed by {SIGNER} (1 run(s))"
    ]


def test_gives_up_after_max_retries(cli: Cli, trainer: tuple[Path, Path]) -> None:
    script, state = trainer
    code, out, err = cli(
        "run", "P", *ONE_GPU, "--max-retries", "1", "--backoff", "0",
        "--", str(script), str(state), "ckpt+exit3", "ckpt+exit4",
    )  # fmt: skip
    assert code == 1
    assert last_line(err) == f"ftrain run: run {RUN} gave up after 1 retry (last: exit code 4)"
    assert re.fullmatch(
        r"Attempt 2 of 2 failed \(exit code 4\) after \d+\.\d s — checkpoint step 20", last_line(out)
    )
    assert timeline(cli, RUN) == [
        "launched", "checkpointed 10", "failed exit-code 3", "resumed 10", "checkpointed 20", "failed exit-code 4"
    ]  # fmt: skip


def test_relaunches_a_failed_run_and_gives_up_without_progress(cli: Cli, trainer: tuple[Path, Path]) -> None:
    script, state = trainer
    cli.ok("launch", "P", *ONE_GPU, "--run-id", "r1")
    cli.ok("checkpoint", "r1", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}")
    cli.ok("fail", "r1")
    code, out, err = cli(
        "run", "P", *ONE_GPU, "--run-id", "r1", "--max-retries", "5", "--backoff", "0",
        "--", str(script), str(state), "exit1", "exit1", "ckpt",
    )  # fmt: skip
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "Relaunching r1 — failure 1 (last: preempted), step 10, 0 resume(s) so far"
    assert re.fullmatch(
        r"Attempt 2 \(1 of 6 in this job start\) failed \(exit code 1\) after \d+\.\d s — checkpoint step 10 \(no progress\); "
        r"retrying in 0 s",
        lines[1],
    )
    assert lines[2].startswith("Attempt 3 (2 of 6 in this job start) failed (exit code 1) after ") and lines[
        2
    ].endswith("(no progress)")
    assert last_line(err) == (
        "ftrain run: run r1 gave up: 2 attempts in a row made no progress (last: exit code 1)"
    )
    assert timeline(cli, "r1") == [
        "launched", "checkpointed 10", "failed preempted None", "resumed 10", "failed exit-code 1",
        "resumed 10", "failed exit-code 1",
    ]  # fmt: skip
    assert [s["FTRAIN_ATTEMPT"] for s in starts(state)] == ["2", "3"]  # the lines' numbers: the log's


def test_sigterm_is_forwarded_and_recorded_as_preempted(
    cli: Cli, env: dict[str, str], trainer: tuple[Path, Path]
) -> None:
    script, state = trainer
    supervisor = subprocess.Popen(
        [str(Path(sys.executable).with_name("ftrain")), "run", "P", *ONE_GPU,
         "--", str(script), str(state), "ckpt+wait"],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "started").exists():
            assert supervisor.poll() is None and time.monotonic() < deadline, supervisor.communicate()
            time.sleep(0.05)
        supervisor.send_signal(signal.SIGTERM)
        out, err = supervisor.communicate(timeout=60)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 143, err
    # the trainer itself got the warning (SIGUSR1, for the SIGTERM), and names the signal that was sent
    assert (state / "terminated").read_text() == "SIGTERM (relayed as SIGUSR1)"
    assert re.fullmatch(
        r"Attempt 1 of 4 stopped by SIGTERM after \d+\.\d s — checkpoint step 10", last_line(out)
    )
    assert last_line(err) == f"ftrain run: run {RUN} stopped by SIGTERM (recorded as failed: preempted)"
    assert timeline(cli, RUN) == ["launched", "checkpointed 10", "failed preempted 143"]


def test_torchrun_max_restarts_is_passed_through(cli: Cli, trainer: tuple[Path, Path]) -> None:
    script, state = trainer
    code, out, err = cli(
        "run", "P", *ONE_GPU, "--max-restarts", "1", "--", str(script), str(state), "exit3", "ckpt"
    )
    assert code == 0, err
    assert re.fullmatch(r"Attempt 1 of 4 succeeded after \d+\.\d s — checkpoint step 20", out.splitlines()[2])
    assert [s["TORCHELASTIC_RESTART_COUNT"] for s in starts(state)] == ["0", "1"]
    assert timeline(cli, RUN) == ["launched", "checkpointed 20", "completed"]


def test_two_nodes_under_slurm_run_one_srun_step(
    cli: Cli, env: dict[str, str], trainer: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, state = trainer
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "srun").chmod(0o755)
    srun_log = tmp_path / "srun.json"
    port = free_port()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost,127.0.0.1")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(srun_log))
    run_id = "P-slurm-4242"  # inside a Slurm job, the job names the run
    code, out, err = cli(
        "run", "P", "--nodes", "2", "--gpus-per-node", "1", "--rdzv-port", str(port),
        "--", str(script), str(state), "ckpt",
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines()[0] == f"Launched {run_id} — 2×1 GPUs, fsdp, rdzv localhost:{port}"
    handed = json.loads(srun_log.read_text())
    assert handed["argv"] == [
        "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--nodelist=localhost,127.0.0.1",
        "--export=ALL", *RELAY, TORCHRUN, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
        f"--rdzv_endpoint=localhost:{port}", f"--rdzv_id={run_id}", str(script), str(state), "ckpt",
    ]  # fmt: skip
    assert handed["env"] == {
        "FTRAIN_RUN_ID": run_id,
        "FTRAIN_CKPT_DIR": str(cli.storage() / run_id),
        "FTRAIN_NATS_URL": env["FTRAIN_NATS_URL"],
        "FTRAIN_HOME": env["FTRAIN_HOME"],
    }
    assert timeline(cli, run_id) == ["launched", "checkpointed 10", "completed"]
    launch = json.loads(cli.ok("status", run_id, "--json")[0])["launch"]
    assert (launch["hosts"], launch["allocation_source"]) == (["localhost", "127.0.0.1"], "slurm")


def test_two_supervisors_relaunching_one_run_start_one_trainer(
    cli: Cli, env: dict[str, str], trainer: tuple[Path, Path]
) -> None:
    script, state = trainer
    cli.ok("launch", "P", *ONE_GPU, "--run-id", "r1")
    cli.ok("checkpoint", "r1", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}")
    cli.ok("fail", "r1")
    argv = [str(Path(sys.executable).with_name("ftrain")), "run", "P", *ONE_GPU, "--run-id", "r1",
            "--", str(script), str(state), "exit0"]  # fmt: skip
    both = [
        subprocess.Popen(
            argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = sorted((p.wait(timeout=120), *p.communicate()) for p in both)
    (won, _, won_err), (lost, lost_out, lost_err) = results
    assert (won, lost) == (0, 1), won_err
    assert lost_out == "" and lost_err.count("\n") == 1 and "is running (another supervisor?)" in lost_err
    assert len(starts(state)) == 1 and starts(state)[0]["FTRAIN_ATTEMPT"] == "2"
    assert timeline(cli, "r1") == [
        "launched",
        "checkpointed 10",
        "failed preempted None",
        "resumed 10",
        "completed",
    ]
