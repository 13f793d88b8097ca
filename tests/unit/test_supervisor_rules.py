"""`ftrain run`'s pure parts: the srun step of a two-node allocation and its environment, the failure report's
classification and the backoff (the supervisor with real processes: tests/integration/test_supervisor.py;
through torchrun: tests/e2e/test_supervisor.py)."""

from pathlib import Path

from ftrain.domain.lifecycle import FailIntent
from ftrain.supervise.attempts import child_env, srun_command
from ftrain.supervise.failure_report import FailureReport, failure
from ftrain.supervise.launch_spec import LaunchSpec
from ftrain.supervise.supervisor import backoff_delay


def test_srun_argv_and_environment_for_a_two_node_allocation() -> None:
    spec = LaunchSpec(
        run_id="dist-JPCP-2x4-fsdp", nodes=2, gpus_per_node=4, strategy="fsdp", rdzv_host="node07",
        train_cmd=("-m", "ftrain.examples.train"), max_restarts=2,
    )  # fmt: skip
    assert srun_command(spec, ("node07", "node08"), "/opt/venv/bin/torchrun") == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--nodelist=node[07-08]",
        "--export=ALL", "/opt/venv/bin/torchrun", "--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d",
        "--rdzv_endpoint=node07:29500", "--rdzv_id=dist-JPCP-2x4-fsdp", "--max_restarts=2",
        "-m", "ftrain.examples.train",
    ]  # fmt: skip
    outer = {"PATH": "/usr/bin", "FTRAIN_NATS_URL": "nats://log:4222", "FTRAIN_RUN_ID": "stale"}
    assert child_env(outer, "dist-JPCP-2x4-fsdp", Path("/lustre/ckpt/dist-JPCP-2x4-fsdp")) == {
        "PATH": "/usr/bin",
        "FTRAIN_NATS_URL": "nats://log:4222",
        "FTRAIN_RUN_ID": "dist-JPCP-2x4-fsdp",
        "FTRAIN_CKPT_DIR": "/lustre/ckpt/dist-JPCP-2x4-fsdp",
    }


TORCHRUN_REPORT = b"""\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 13606)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_14:05:21
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 13617)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 13617
============================================================
"""


def test_failure_report_and_classification() -> None:
    report = FailureReport()
    for i in range(0, len(TORCHRUN_REPORT), 7):  # lines split anywhere
        report.feed(TORCHRUN_REPORT[i : i + 7])
    assert report.worker_exit == -9
    assert failure(1, report.worker_exit) == FailIntent(
        reason="signal",
        exit_code=137,
        message="a training process was killed by SIGKILL; the launcher exited 1",
    )
    assert failure(-15, None) == FailIntent(
        reason="signal", exit_code=143, message="the launcher was killed by SIGTERM"
    )
    assert failure(1, 3).exit_code == 3
    assert failure(2, None) == FailIntent(reason="exit-code", exit_code=2, message="the launcher exited 2")
    assert [backoff_delay(5, n) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert backoff_delay(120, 3) == 120 and backoff_delay(0.5, 10_000) == 60
