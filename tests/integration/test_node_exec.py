"""`ftrain run --node-exec TEMPLATE`: the runner that holds one attempt's node commands together as an srun
step with --kill-on-bad-exit does, the supervisor over it, and the refusals of `ftrain run` (real processes
here; the template `env NODE={host}` stands in for `ssh {host}`, starting each "node" on this machine). The
template's rules and each node's command line: tests/unit/test_node_exec_rules.py."""

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ftrain.domain.lifecycle import FailIntent
from ftrain.events.jetstream.nats_server import ServerProcess
from ftrain.supervise.node_exec import (
    NodeExit,
    each_node_command,
    parse_node_exit,
)
from ftrain.supervise.node_return import node_probe
from ftrain.supervise.supervisor import Outcome, Relaunches, Supervisor
from ftrain.workers.layout import MARKER
from tests.support.builders import Intents
from tests.support.processes import ftrain_process
from tests.support.servers import stream_last_seq


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


def supervise_nodes(
    tmp_path: Path,
    script: str,
    recorder: Intents,
    relaunches: Relaunches,
    opener: Callable[[tuple[str, ...]], int],
    min_nodes: int | None = None,
    template: str = "env NODE={host}",
) -> Outcome:
    """A supervisor running `script` on "nodes" a and b through the runner (`$NODE` says which), asking a
    dropped node back through the same template."""
    return Supervisor(
        "r1",
        lambda hosts: each_node_command(template, hosts, ["sh", "-c", script]),
        {**os.environ, "FTRAIN_RUN_ID": "r1"},
        tmp_path / "ckpt",
        relaunches,
        recorder,
        attempt=1,
        opener=opener,
        hosts=("a", "b"),
        min_nodes=min_nodes,
        probe=node_probe(slurm=False, node_exec=template),
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


@pytest.mark.parametrize("comes_back", [True, False])
def test_with_min_nodes_a_dropped_node_that_answers_again_is_taken_back_at_the_next_relaunch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], comes_back: bool
) -> None:
    """Node b is lost in attempt 1 (it goes down: its "ssh" exits 255 from then on) and attempt 2 runs on a
    alone; its training fails, after b came back or not. Attempt 3 asks b first: back on both nodes when it
    answers, on a alone when it does not. Each attempt seals a step, so none counts as making no progress."""
    node = tmp_path / "node.sh"  # stands in for `ssh {host}`: 255 while the node is down
    node.write_text(f'host=$1; shift; [ -e {tmp_path}/down-$host ] && exit 255; exec env NODE=$host "$@"\n')
    sealed = tmp_path / "ckpt" / "step-$n"
    script = (
        f'if [ "$NODE" = a ]; then n=$(ls -d {tmp_path}/ckpt/step-* 2>/dev/null | wc -l); n=$((n + 1)); '
        f"mkdir -p {sealed} && touch {sealed}/{MARKER}; fi; "
        f'if [ "$NODE" = b ] && mkdir {tmp_path}/b-lost 2>/dev/null; then sleep 0.3; touch {tmp_path}/down-b; '
        "kill -9 $$; fi; "
        f'if [ "$NODE" = a ] && [ -e {tmp_path}/down-b ] && mkdir {tmp_path}/a-failed 2>/dev/null; then '
        + (f"rm {tmp_path}/down-b; " if comes_back else "")
        + "exit 1; fi; sleep 0.6"
    )
    opened: list[tuple[str, ...]] = []

    def opener(hosts: tuple[str, ...]) -> int:
        opened.append(hosts)
        return len(opened) + 1

    recorder = Intents()
    relaunches = Relaunches(max_retries=2, backoff=0)
    outcome = supervise_nodes(tmp_path, script, recorder, relaunches, opener, 1, f"sh {node} {{host}}")
    assert outcome.status == "completed", outcome
    assert opened == [("a",), ("a", "b") if comes_back else ("a",)]
    out = capsys.readouterr().out
    assert ("taking back b (answering again): 2 node(s), a, b; retrying in 0 s" in out) is comes_back, out


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
                              "--run-id", "r-spec", "--node-exec", template, "--", "-m", "ftrain.examples.train"], env)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("ftrain run: error: --node-exec") and "Traceback" not in refused.stderr
    assert await stream_last_seq(server) == 0  # no `launched`, no `failed`: the run does not exist


def test_ftrain_run_refuses_a_bad_template_and_too_few_hosts(env: dict[str, str]) -> None:
    bad = ftrain_process(["run", "P", "--nodes", "2", "--gpus-per-node", "1", "--nodelist", "n[1-2]",
                          "--node-exec", "ssh node1", "--", "-m", "ftrain.examples.train"], env)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not name {host}" in bad.stderr
    few = ftrain_process(
        [
            "run",
            "P",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--node-exec",
            "ssh {host}",
            "--",
            "-m",
            "ftrain.examples.train",
        ],
        env,
    )
    assert few.returncode == 2 and "needs as many hosts" in few.stderr, few.stderr
