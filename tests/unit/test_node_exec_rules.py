"""`ftrain run --node-exec TEMPLATE`, pure: the template's rules, each node's command line, which node a lost
node's relaunch drops and how a dropped one is asked back, and a lost node told from a failed training (the
runner and the supervisor with real processes: tests/integration/test_node_exec.py)."""

import socket
import sys

import pytest

from ftrain.domain.lifecycle import FailIntent
from ftrain.supervise.attempts import attempt_commands
from ftrain.supervise.failure_report import FailureReport, failure
from ftrain.supervise.launch_spec import LaunchSpec
from ftrain.supervise.node_exec import (
    NodeExit,
    TemplateError,
    each_node_command,
    node_argv,
    parse_template,
)
from ftrain.supervise.node_ready import reaches_log
from ftrain.supervise.node_return import PROBE_SECONDS, READY, node_probe
from ftrain.supervise.relaunch_nodes import next_hosts, rejoined

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


@pytest.mark.parametrize(
    ("hosts", "answered", "rejoined_hosts"),
    [
        (("b", "c"), {"a"}, ("a", "b", "c")),  # rank 0's node is the allocation's first again
        (("a",), {"c"}, ("a", "c")),
        (("a", "c"), set(), ("a", "c")),
    ],
)
def test_a_dropped_node_that_answers_comes_back_in_its_place(
    hosts: tuple[str, ...], answered: set[str], rejoined_hosts: tuple[str, ...]
) -> None:
    assert rejoined(("a", "b", "c"), hosts, answered) == rejoined_hosts


def test_a_dropped_node_is_asked_as_the_attempt_reaches_it() -> None:
    """`node_ready` through the template, or in a one-task srun step that gives up when Slurm cannot place it;
    one host alone has nothing to ask."""
    over_ssh = node_probe(slurm=False, node_exec="ssh -o 'ConnectTimeout 5' {host}")
    assert over_ssh is not None and over_ssh("n2") == ["ssh", "-o", "ConnectTimeout 5", "n2", "env", *READY]
    in_slurm = node_probe(slurm=True)
    assert in_slurm is not None and in_slurm("n2") == [
        "srun", "--nodes=1", "--ntasks=1", "--nodelist=n2", f"--immediate={PROBE_SECONDS}", *READY,
    ]  # fmt: skip
    assert node_probe(slurm=False) is None


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


def test_a_node_is_ready_once_it_reaches_a_server_of_the_log() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listening,
        socket.create_server(("127.0.0.1", 0)) as closed,
    ):
        up, down = (f"nats://127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))
        closed.close()  # nothing listens on its port any more
        assert reaches_log({"FTRAIN_NATS_URL": f"{down},{up}"}, timeout=1)
        assert not reaches_log({"FTRAIN_NATS_URL": down}, timeout=1)
    assert reaches_log({})  # the embedded server: nothing to reach over the network
