"""`ftrain run` with real processes and no torchrun: bad input and refused relaunches change nothing, a job
that ignores SIGTERM is killed with its own sessions, every process of an ended attempt is killed, a relaunch
whose attempt cannot be opened is not started (through torchrun: tests/e2e/test_supervisor.py)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ftrain import settings
from ftrain.domain.lifecycle import FailIntent
from ftrain.host.job_signals import children
from ftrain.supervise.open_attempt import NotOpened
from ftrain.supervise.procs import attempt_marks, attempt_processes, end_attempt
from ftrain.supervise.supervisor import Relaunches, Supervisor
from tests.support.builders import Intents
from tests.support.cli import Cli
from tests.support.processes import free_port
from tests.support.stand_in_trainer import ONE_GPU, starts
from tests.support.stand_in_trainer import cli as cli  # the fixtures
from tests.support.stand_in_trainer import trainer as trainer
from tests.support.training import alive


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
        ("wide", "ftrain run: run wide was launched as P 1×2 fsdp; relaunch it with the same project, "
                 "--gpus-per-node and --strategy (--nodes may change)"),
    ]  # fmt: skip
    for run_id, message in refusals:
        assert cli("run", "P", *ONE_GPU, "--run-id", run_id, *cmd) == (1, "", message + "\n")
    monkeypatch.setenv("FTRAIN_NATS_URL", f"nats://127.0.0.1:{free_port()}")
    code, out, err = cli("run", "P", *ONE_GPU, *cmd)
    assert (code, out, err.count("\n")) == (1, "", 1) and err.startswith("ftrain run: "), err
    monkeypatch.setenv("FTRAIN_NATS_URL", cli.env["FTRAIN_NATS_URL"])
    assert cli.last_seq() == before
    assert starts(state) == []


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


def test_every_process_of_an_ended_attempt_is_killed_even_stopped_and_in_its_own_session(
    tmp_path: Path,
) -> None:
    """Only this attempt's: the next attempt of the run lives on, and so does an attempt of another run with
    the same id and number on the host (another supervisor: its nonce differs)."""
    marks = attempt_marks("r", 7)
    assert attempt_marks("r", 7)[settings.ATTEMPT_NONCE] != marks[settings.ATTEMPT_NONCE]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    orphan = subprocess.Popen(sleeper, env={**os.environ, **marks}, start_new_session=True)
    others = [
        subprocess.Popen(sleeper, env={**os.environ, **other})
        for other in ({**marks, "FTRAIN_ATTEMPT": "8"}, attempt_marks("r", 7))
    ]
    try:
        os.kill(orphan.pid, signal.SIGSTOP)
        assert attempt_processes(marks) == [orphan.pid]
        assert end_attempt(marks, timeout=5) == []
        assert orphan.wait(timeout=5) == -signal.SIGKILL and [p.poll() for p in others] == [None, None]
    finally:
        for proc in [orphan, *others]:
            proc.kill()


def test_ending_an_attempt_spares_another_supervisors_attempt_of_the_same_run(tmp_path: Path) -> None:
    """Run ids repeat (every `ftrain demo` is dist-demo-1x2): a supervisor ending its attempt 1 of r
    leaves another supervisor's attempt 1 of r running (found by run id and number alone, it was SIGKILLed)."""
    twin = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, **attempt_marks("r", 1)}
    )
    try:
        outcome = Supervisor(
            "r",
            lambda hosts: ["true"],
            os.environ,
            tmp_path / "ckpt",
            Relaunches(),
            Intents(),
            attempt=1,
            opener=lambda hosts: pytest.fail("the attempt succeeded: nothing to relaunch"),
            hosts=("localhost",),
        ).run()
        assert outcome.status == "completed" and twin.poll() is None
    finally:
        twin.kill()


def test_the_children_of_a_process_reaped_while_they_are_listed_are_none_never_an_error() -> None:
    """A watcher lists a supervisor's children while the supervisor exits (the restart experiment's follow
    loop did, and died of FileNotFoundError: /proc/<pid>/task vanished between the glob's check and its
    scan). Here a thread lists each of 200 short-lived processes' children while it is reaped; the old
    glob raised on about one reap in six."""
    raised: list[BaseException] = []
    for _ in range(200):
        proc = subprocess.Popen(["true"])
        reaped = threading.Event()

        def list_until_reaped(pid: int = proc.pid, reaped: threading.Event = reaped) -> None:
            while not reaped.is_set():
                try:
                    assert children(pid) == []
                except BaseException as error:  # a thread's error is lost unless collected
                    raised.append(error)
                    return

        lister = threading.Thread(target=list_until_reaped)
        lister.start()
        proc.wait()
        reaped.set()
        lister.join()
    assert raised == []
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '60'])"])
    try:
        deadline = time.monotonic() + 10
        while not (kids := children(parent.pid)):
            assert time.monotonic() < deadline, "the parent never started its child"
            time.sleep(0.02)
        assert len(kids) == 1 and alive(kids[0])
    finally:
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


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


def test_a_relaunch_may_name_more_nodes_than_the_launch_and_its_resumed_says_the_world(
    cli: Cli, trainer: tuple[Path, Path]
) -> None:
    """`ftrain run --run-id R --nodes 2` after a 1-node launch failed (a requeue that got a larger allocation):
    the attempt runs on both nodes (a torchrun each through --node-exec, here both on this machine), and its
    `resumed` names them, the checkpoint's 1 rank before and 2 after."""
    script, state = trainer
    cli.ok("launch", "P", *ONE_GPU, "--run-id", "grow")
    cli.ok("checkpoint", "grow", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}")
    cli.ok("fail", "grow")
    two = ("--nodes", "2", "--gpus-per-node", "1", "--nodelist", "localhost,127.0.0.1", "--node-exec",
           "env NODE={host}", "--rdzv-port", str(free_port()))  # fmt: skip
    code, out, err = cli("run", "P", *two, "--run-id", "grow", "--", str(script), str(state), "exit0")
    assert code == 0, out + err
    events = [json.loads(line)["event"] for line in cli.ok("events", "tail", "grow", "--json")]
    resumed = next(e for e in events if e["type"] == "resumed")
    assert (resumed["hosts"], resumed["saved_world"], resumed["world"]) == (["localhost", "127.0.0.1"], 1, 2)
    assert events[-1]["type"] == "completed", events
    status = "\n".join(cli.ok("status", "grow"))
    assert "nodes       localhost, 127.0.0.1 (2 nodes, launched on 1: 2 GPUs)" in status, status
