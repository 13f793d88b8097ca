"""`ftrain run`: real torchrun, a real nats-server, real checkpoint directories, and a stand-in trainer.

The stand-in trainer imports no torch: it counts its starts in a file, follows one action list per start, and
records its checkpoints through the ftrain CLI so the run's event sequence stays legal.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ftrain.projections.lifecycle import FailIntent
from ftrain.supervise.attempts import RELAY, child_env, srun_command
from ftrain.supervise.failure_report import FailureReport, failure
from ftrain.supervise.launch_spec import LaunchSpec
from ftrain.supervise.opening import NotOpened
from ftrain.supervise.procs import attempt_processes, end_attempt
from ftrain.supervise.supervisor import Relaunches, Supervisor, backoff_delay
from tests.builders import SIGNER, Intents
from tests.conftest import free_port
from tests.test_cli import Cli
from tests.training import alive

RUN = "dist-P-1x1-fsdp"
ONE_GPU = ("--nodes", "1", "--gpus-per-node", "1")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

TRAINER = '''
"""Stand-in trainer: python trainer.py STATE_DIR ACTIONS_OF_START_1 ACTIONS_OF_START_2 ...

It records no `resumed`: the supervisor opens each relaunch's attempt with one itself."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

state, plans = Path(sys.argv[1]), sys.argv[2:]
if os.environ["RANK"] != "0":
    sys.exit(0)
counter = state / "starts"
start = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(start))
keys = ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_NATS_URL", "TORCHELASTIC_RESTART_COUNT", "FTRAIN_ATTEMPT")
with (state / "env.jsonl").open("a") as f:
    f.write(json.dumps({k: os.environ.get(k) for k in keys}) + "\\n")
run, ckpt_dir = os.environ["FTRAIN_RUN_ID"], Path(os.environ["FTRAIN_CKPT_DIR"])


def ftrain(*args):
    done = subprocess.run([str(Path(sys.executable).with_name("ftrain")), *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"trainer: ftrain {' '.join(args)} failed: {done.stderr}")


def terminated(signum, frame):
    (state / "terminated").touch()
    sys.exit(0)


for action in plans[start - 1].split("+"):
    if action == "ckpt":
        ftrain("checkpoint", run, "--step", str(start * 10), "--epoch", "0", "--shards", "1", "--state", "{}")
        assert (ckpt_dir / f"step-{start * 10}" / ".complete").exists(), "FTRAIN_CKPT_DIR is not the run's"
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "wait":
        signal.signal(signal.SIGTERM, terminated)
        signal.signal(signal.SIGUSR1, terminated)  # the warning the relay hands the workers for a SIGTERM
        (state / "started").touch()
        time.sleep(60)
    elif action.startswith("exit"):
        sys.exit(int(action[4:]))
'''

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


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return Cli(capsys, env)


@pytest.fixture
def trainer(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-in trainer script and its (empty) state directory."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    state = tmp_path / "trainer-state"
    state.mkdir()
    return script, state


def timeline(cli: Cli, run_id: str) -> list[str]:
    """The run's events, each as `type` plus what matters here."""

    def gist(e: dict[str, Any]) -> str:
        if e["type"] == "failed":
            return f"failed {e['reason']} {e['exit_code']}"
        if e["type"] in ("checkpointed", "resumed"):
            return f"{e['type']} {e['step']}"
        return str(e["type"])

    return [gist(entry["event"]) for entry in json.loads(cli.ok("replay", run_id, "--json")[0])]


def starts(state: Path) -> list[dict[str, str | None]]:
    path = state / "env.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


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
        r"Attempt 2 of 7 failed \(exit code 1\) after \d+\.\d s — checkpoint step 10 \(no progress\); "
        r"retrying in 0 s",
        lines[1],
    )
    assert lines[2].startswith("Attempt 3 of 7 failed (exit code 1) after ") and lines[2].endswith(
        "(no progress)"
    )
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
    assert (state / "terminated").exists()  # the trainer itself got the warning (SIGUSR1, for the SIGTERM)
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


# -- refused before anything runs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--run-id", "a.b"), "ftrain run: error: argument --run-id: run id 'a.b' is invalid"),
        (("--max-retries", "-1"), "ftrain run: error: argument --max-retries: -1 is not between 0 and 9223372036854775807"),
        (("--backoff", "-1"), "ftrain run: error: argument --backoff: '-1' is not a number between 0 and 1e+12"),
        (("--nproc-per-node", "0"), "ftrain run: error: argument --nproc-per-node: 0 is not between 1 and 1024"),
        (("--max-restarts", "x"), "ftrain run: error: argument --max-restarts: 'x' is not an integer"),
        (("--nodes", "2"), "ftrain run: error: --nodes 2 needs a Slurm allocation (SLURM_JOB_ID is not set)"),
        (("--strategy", "megatron", "--tp", "2", "--nproc-per-node", "1"),
         "ftrain run: error: megatron: tensor_parallel*pipeline_parallel (2*1=2) must divide"),
        (("--", "--lr", "1"), "ftrain run: error: training command starts with unsupported option '--lr'"),
    ],
)  # fmt: skip
def test_bad_input_is_exit_2_and_changes_nothing(
    cli: Cli, trainer: tuple[Path, Path], args: tuple[str, ...], message: str
) -> None:
    script, state = trainer
    cli.ok("launch", "Q", *ONE_GPU)
    before = cli.last_seq()
    command = () if "--" in args else ("--", str(script), str(state), "ckpt")
    code, out, err = cli("run", "P", "--nodes", "1", "--gpus-per-node", "2", *args, *command)
    assert (code, out) == (2, "")
    assert err.startswith(message), err
    assert err.count("\n") == 1
    assert cli.last_seq() == before
    assert starts(state) == []


def test_relaunch_refusals_exit_1_and_change_nothing(
    cli: Cli, trainer: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, state = trainer
    cmd = ("--", str(script), str(state), "ckpt")
    cli.ok("launch", "P", *ONE_GPU, "--run-id", "live")
    cli.ok("launch", "P", *ONE_GPU, "--run-id", "done")
    cli.ok("complete", "done")
    cli.ok("launch", "P", "--nodes", "1", "--gpus-per-node", "2", "--run-id", "wide")
    cli.ok("fail", "wide")
    before = cli.last_seq()
    refusals = [
        ("live", "ftrain run: run live is running (another supervisor?); if it is dead, record that first: "
                 "ftrain fail live"),
        ("done", "ftrain run: run done is completed; nothing may follow completion"),
        ("wide", "ftrain run: run wide was launched as P 1×2 fsdp; relaunch it with the same project, --nodes, "
                 "--gpus-per-node and --strategy"),
    ]  # fmt: skip
    for run_id, message in refusals:
        assert cli("run", "P", *ONE_GPU, "--run-id", run_id, *cmd) == (1, "", message + "\n")
    monkeypatch.setenv("FTRAIN_NATS_URL", f"nats://127.0.0.1:{free_port()}")
    code, out, err = cli("run", "P", *ONE_GPU, *cmd)
    assert (code, out, err.count("\n")) == (1, "", 1) and err.startswith("ftrain run: "), err
    monkeypatch.setenv("FTRAIN_NATS_URL", cli.env["FTRAIN_NATS_URL"])
    assert cli.last_seq() == before
    assert starts(state) == []


# -- the pure parts --------------------------------------------------------------------------------------------


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


def test_a_job_ignoring_sigterm_is_killed_with_its_own_sessions(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(  # neither process ever ends on its own: only a SIGKILL lets `run` return
        "import os, signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: signal.pause()'], start_new_session=True)\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "while True: signal.pause()\n"
    )

    def preempt() -> None:
        while not pids.exists() or not pids.read_text():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=preempt, daemon=True).start()
    recorder = Intents()
    handler = signal.getsignal(signal.SIGTERM)
    supervisor = Supervisor(
        "r",
        lambda hosts: [sys.executable, str(stubborn)],
        os.environ,
        tmp_path / "ckpt",
        Relaunches(),
        recorder,
        attempt=1,
        opener=lambda hosts: pytest.fail("a stopped run is not relaunched"),
        hosts=("localhost",),
        grace=0.3,
    )
    try:
        outcome = supervisor.run()
        assert outcome.status == "stopped" and outcome.exit_code == 143
        assert recorder.intents == [
            FailIntent(
                reason="preempted",
                exit_code=143,
                message="SIGTERM forwarded to the training processes",
                attempt=1,
            )
        ]
        deadline = time.monotonic() + 5  # SIGKILL is sent; the grandchild dies when next scheduled
        while any(alive(int(pid)) for pid in pids.read_text().split()):
            assert time.monotonic() < deadline, "a process outlived the SIGKILL"
            time.sleep(0.02)
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:  # a failure must not leave them running forever
        for pid in map(int, pids.read_text().split() if pids.exists() else ()):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


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


def test_every_process_of_an_ended_attempt_is_killed_even_stopped_and_in_its_own_session(
    tmp_path: Path,
) -> None:
    mine = {**os.environ, "FTRAIN_RUN_ID": "r", "FTRAIN_ATTEMPT": "7"}
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=mine, start_new_session=True
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**mine, "FTRAIN_ATTEMPT": "8"}
    )
    try:
        os.kill(orphan.pid, signal.SIGSTOP)
        assert orphan.pid in attempt_processes("r", 7) and other.pid not in attempt_processes("r", 7)
        assert end_attempt("r", 7, timeout=5) == []
        assert orphan.wait(timeout=5) == -signal.SIGKILL and other.poll() is None
    finally:
        orphan.kill()
        other.kill()


def test_a_relaunch_whose_attempt_cannot_be_opened_is_not_started(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    job = [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(3)"]

    def unreachable(hosts: tuple[str, ...]) -> int:
        raise NotOpened("the event log is out of reach (TimeoutError: )")

    recorder = Intents()
    outcome = Supervisor(
        "r",
        lambda hosts: job,
        os.environ,
        tmp_path / "ckpt",
        Relaunches(backoff=0),
        recorder,
        attempt=1,
        opener=unreachable,
        hosts=("localhost",),
    ).run()
    assert outcome == (
        "gave-up",
        1,
        "run r not relaunched: the event log is out of reach (TimeoutError: )",
        True,
    )
    assert starts.read_text() == "x"
    assert [i.attempt for i in recorder.intents] == [1]
