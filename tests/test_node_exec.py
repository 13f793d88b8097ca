"""`ftrain run --node-exec TEMPLATE`: the template's rules, each node's command line, and the runner that holds
one attempt's node commands together as an srun step with --kill-on-bad-exit does (real processes here; the
template `env NODE={host}` stands in for `ssh {host}`, starting each "node" on this machine)."""

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ftrain.events.jetstream.server import ServerProcess
from ftrain.projections.lifecycle import FailIntent
from ftrain.supervise.attempts import attempt_commands
from ftrain.supervise.elastic import next_hosts
from ftrain.supervise.failure_report import FailureReport, failure
from ftrain.supervise.launch_spec import LaunchSpec
from ftrain.supervise.node_exec import (
    NodeExit,
    TemplateError,
    each_node_command,
    node_argv,
    parse_node_exit,
    parse_template,
)
from ftrain.supervise.supervisor import Outcome, Relaunches, Supervisor
from tests.builders import Intents
from tests.conftest import ftrain_process, stream_last_seq

SPEC = LaunchSpec(
    run_id="r1",
    nodes=2,
    gpus_per_node=2,
    strategy="fsdp",
    rdzv_host="n1",
    train_cmd=("-m", "ftrain.examples.train"),
)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ssh {host}", ("ssh", "{host}")),
        ("ip netns exec ft-{host}", ("ip", "netns", "exec", "ft-{host}")),
        ("ssh -o 'ProxyJump bastion' {host}", ("ssh", "-o", "ProxyJump bastion", "{host}")),
    ],
)
def test_a_template_names_the_host(text: str, words: tuple[str, ...]) -> None:
    assert parse_template(text) == words


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "is empty"),
        ("ssh node1", "does not name {host}"),
        ("ssh '{host}", "No closing quotation"),
        ("ssh {host", "literal brace"),
        ("env {host} {host:d}", "{host:d} carries a format spec"),
        ("ssh {host:>999999999}", "{host:>999999999} carries a format spec"),
        ("ssh {host:{host}}", "carries a format spec"),
        ("ssh {host!r}", "{host!r} carries a conversion"),
        ("ssh {host.x}", "{host.x} is an attribute or index"),
        ("ssh {host[0]}", "{host[0]} is an attribute or index"),
        ("ssh {host} {}", "{} is positional"),
        ("ssh {host} {0}", "{0} is positional"),
        ("ssh {node}", "{node} is not a field"),
        ("ssh {host}}", "literal brace"),
    ],
)
def test_a_bad_template_is_refused_in_one_line(text: str, why: str) -> None:
    with pytest.raises(TemplateError, match="^" + ("--node-exec" if text else "")) as err:
        parse_template(text)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_each_node_gets_the_template_then_the_runs_variables_then_the_command() -> None:
    env = {
        "FTRAIN_RUN_ID": "r1",
        "FTRAIN_CKPT_DIR": "/c/r1",
        "FTRAIN_ATTEMPT": "2",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    argv = node_argv(("ssh", "{host}"), "n2", ["torchrun", "-m", "m"], env)
    assert argv == ["ssh", "n2", "env", "FTRAIN_RUN_ID=r1", "FTRAIN_CKPT_DIR=/c/r1", "FTRAIN_ATTEMPT=2",
                    "torchrun", "-m", "m"]  # fmt: skip


def test_an_attempt_runs_the_same_torchrun_on_every_host_through_the_runner() -> None:
    argv = attempt_commands(SPEC, "/bin/torchrun", slurm=False, node_exec="ssh {host}")(("n1", "n2"))
    assert argv[:3] == [sys.executable, "-m", "ftrain.supervise.each_node"]
    assert argv[3:9] == ["--template", "ssh {host}", "--host", "n1", "--host", "n2"]
    assert argv[9:12] == ["--", "/bin/torchrun", "--nnodes=2"]
    assert "--rdzv_endpoint=n1:29500" in argv and argv[-2:] == ["-m", "ftrain.examples.train"]
    assert argv == each_node_command("ssh {host}", ("n1", "n2"), argv[10:])


def test_an_attempt_on_fewer_hosts_has_its_world_and_rendezvous_there() -> None:
    argv = attempt_commands(SPEC, "/bin/torchrun", slurm=False, node_exec="ssh {host}")(("n2",))
    assert argv[3:7] == ["--template", "ssh {host}", "--host", "n2"]
    assert "--nnodes=1" in argv and "--rdzv_endpoint=n2:29500" in argv and "--nnodes=2" not in argv


@pytest.mark.parametrize(
    ("lost", "min_nodes", "hosts"),
    [
        (None, 1, ("a", "b", "c")),  # no node failed first
        (NodeExit("b", 137), 1, ("a", "c")),  # killed: lost, dropped
        (NodeExit("c", 255), 2, ("a", "b")),  # ssh lost its connection
        (NodeExit("b", 1), 1, ("a", "b", "c")),  # its training failed: the node is fine
        (NodeExit("b", 137), 3, ("a", "b", "c")),  # too few would be left: wait for it
        (NodeExit("x", 137), 1, ("a", "b", "c")),  # not one of this attempt's
    ],
)
def test_a_lost_node_is_dropped_only_while_min_nodes_are_left(
    lost: NodeExit | None, min_nodes: int, hosts: tuple[str, ...]
) -> None:
    assert next_hosts(("a", "b", "c"), lost, min_nodes) == hosts


def run_each(*hosts: str, script: str, template: str = "env NODE={host}") -> subprocess.Popen[str]:
    host_args = [a for h in hosts for a in ("--host", h)]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ftrain.supervise.each_node",
            "--template",
            template,
            *host_args,
            "--",
            "sh",
            "-c",
            script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FTRAIN_RUN_ID": "r1"},
    )


def test_every_node_runs_the_command_with_the_runs_variables() -> None:
    proc = run_each("a", "b", script='echo "$NODE $FTRAIN_RUN_ID"')
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(out.split("\n")[:2]) == ["a r1", "b r1"]


def test_the_first_node_to_fail_ends_the_others_and_gives_its_status(tmp_path: Path) -> None:
    marker = tmp_path / "a-survived"
    proc = run_each(
        "a", "b", script=f'if [ "$NODE" = b ]; then sleep 0.5; exit 3; fi; sleep 20; touch {marker}'
    )
    started = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3 and "b exited with status 3; ending the other nodes" in err, err
    assert time.monotonic() - started < 10 and not marker.exists()


def test_a_node_killed_by_a_signal_is_reported_as_a_shell_would() -> None:
    proc = run_each("a", script="kill -9 $$")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + 9
    assert [parse_node_exit(line) for line in err.splitlines() if line.startswith("each_node:")] == [
        NodeExit("a", 137)
    ]


ROOT_CAUSE = (
    b"Root Cause (first observed failure):\n[0]:\n  rank      : 2 (local_rank: 0)\n  exitcode  : 3 (pid: 9)\n"
)


@pytest.mark.parametrize(
    ("stderr", "returncode", "intent"),
    [
        (  # the node's launcher was killed: the node is gone, whatever the others' workers said after it
            b"each_node: n2 exited with status 137; ending the other nodes\n" + ROOT_CAUSE,
            137,
            FailIntent(
                reason="node-failure",
                exit_code=137,
                message="node n2 lost: its command was killed by SIGKILL",
            ),
        ),
        (  # ssh lost the connection
            b"each_node: n2 exited with status 255; ending the other nodes\n",
            255,
            FailIntent(reason="node-failure", exit_code=255, message="node n2 lost: its command exited 255"),
        ),
        (  # a worker on n2 exited 3 and its torchrun reported it, then exited 1: the training failed, not n2
            ROOT_CAUSE + b"each_node: n2 exited with status 1; ending the other nodes\n",
            1,
            FailIntent(
                reason="exit-code", exit_code=3, message="a training process exited 3; the launcher exited 1"
            ),
        ),
    ],
)
def test_a_lost_node_is_told_from_a_failed_training(
    stderr: bytes, returncode: int, intent: FailIntent
) -> None:
    report = FailureReport()
    for i in range(0, len(stderr), 5):  # lines split anywhere
        report.feed(stderr[i : i + 5])
    assert failure(returncode, report.worker_exit, report.node) == intent


def supervise_nodes(
    tmp_path: Path,
    script: str,
    recorder: Intents,
    relaunches: Relaunches,
    opener: Callable[[tuple[str, ...]], int],
    min_nodes: int | None = None,
) -> Outcome:
    """A supervisor running `script` on "nodes" a and b through the runner (`$NODE` says which)."""
    return Supervisor(
        "r1",
        lambda hosts: each_node_command("env NODE={host}", hosts, ["sh", "-c", script]),
        {**os.environ, "FTRAIN_RUN_ID": "r1"},
        tmp_path / "ckpt",
        relaunches,
        recorder,
        attempt=1,
        opener=opener,
        hosts=("a", "b"),
        min_nodes=min_nodes,
    ).run()


def test_the_supervisor_records_a_lost_node_as_node_failure_naming_it(tmp_path: Path) -> None:
    script = 'if [ "$NODE" = b ]; then sleep 0.3; kill -9 $$; fi; sleep 20'
    recorder = Intents()
    outcome = supervise_nodes(
        tmp_path,
        script,
        recorder,
        Relaunches(max_retries=0),
        lambda _: pytest.fail("no relaunch: --max-retries 0"),
    )
    lost = FailIntent(
        reason="node-failure",
        exit_code=137,
        message="node b lost: its command was killed by SIGKILL",
        attempt=1,
    )
    assert recorder.intents == [lost]
    assert outcome.status == "gave-up" and outcome.message.endswith(f"(last: {lost.message})")


def test_with_min_nodes_the_relaunch_goes_on_without_the_lost_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node b is lost in attempt 1; with --min-nodes 1 attempt 2 is opened and run on node a alone."""
    once = tmp_path / "b-lost"
    script = f'if [ "$NODE" = b ] && mkdir {once}; then sleep 0.3; kill -9 $$; fi; sleep 0.6'
    opened: list[tuple[str, ...]] = []

    def opener(hosts: tuple[str, ...]) -> int:
        opened.append(hosts)
        return 2

    recorder = Intents()
    outcome = supervise_nodes(tmp_path, script, recorder, Relaunches(max_retries=1, backoff=0), opener, 1)
    assert outcome.status == "completed" and opened == [("a",)]
    assert [type(i).__name__ for i in recorder.intents] == ["FailIntent", "CompleteIntent"]
    assert "going on without b (--min-nodes 1): 1 node(s), a; retrying in 0 s" in capsys.readouterr().out


def test_sigterm_reaches_every_node() -> None:
    proc = run_each("a", "b", script='trap "echo $NODE stopped; exit 0" TERM; sleep 20 & wait')
    time.sleep(1.5)
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert sorted(out.split()) == ["a", "b", "stopped", "stopped"] and proc.returncode == 0


@pytest.mark.parametrize("template", ["env {host} {host:d}", "ssh {host:>999999999}", "ssh {host} {host!s}"])
async def test_ftrain_run_refuses_a_format_spec_before_anything_is_appended(
    env: dict[str, str], server: ServerProcess, template: str
) -> None:
    refused = ftrain_process(["run", "P", "--nodes", "2", "--gpus-per-node", "1", "--nodelist", "n[1-2]",
                              "--run-id", "r-spec", "--node-exec", template], env)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("ftrain run: error: --node-exec") and "Traceback" not in refused.stderr
    assert await stream_last_seq(server) == 0  # no `launched`, no `failed`: the run does not exist


def test_ftrain_run_refuses_a_bad_template_and_too_few_hosts(env: dict[str, str]) -> None:
    bad = ftrain_process(["run", "P", "--nodes", "2", "--gpus-per-node", "1", "--nodelist", "n[1-2]",
                          "--node-exec", "ssh node1"], env)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not name {host}" in bad.stderr
    few = ftrain_process(
        ["run", "P", "--nodes", "2", "--gpus-per-node", "1", "--node-exec", "ssh {host}"], env
    )
    assert few.returncode == 2 and "needs as many hosts" in few.stderr, few.stderr
