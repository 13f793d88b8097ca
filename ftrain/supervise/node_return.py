"""Whether a node an elastic relaunch dropped (`--min-nodes`) can take an attempt again: before each later
relaunch the supervisor asks every dropped node, the way the attempt itself would reach it, whether it reaches
the event log (`node_ready`); the nodes that answer in time come back (`relaunch_nodes.rejoined`), so a run
shrunk by a lost node grows again once the allocation has the node. Nothing here imports torch."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from ftrain.supervise.node_exec import node_argv, parse_template

PROBE_SECONDS: Final = 10
"""How long a dropped node gets to answer: a node that does not is left out of this relaunch."""


READY: Final = (sys.executable, "-m", "ftrain.supervise.node_ready")
"""What the probe runs on the node: it answers when the node reaches the event log."""


def node_probe(*, slurm: bool, node_exec: str | None = None) -> Callable[[str], list[str]] | None:
    """The argv that exits 0 when `host` can take part in an attempt again: `node_ready` through the
    --node-exec template, or in a one-task srun step on it that gives up when Slurm cannot place it at once;
    None on one host alone (nothing is ever dropped)."""
    if node_exec is not None:
        template = parse_template(node_exec)
        return lambda host: node_argv(template, host, READY, {})
    if slurm:
        return lambda host: [
            "srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", f"--immediate={PROBE_SECONDS}", *READY,
        ]  # fmt: skip
    return None


def answering(
    probe: Callable[[str], Sequence[str]],
    hosts: Sequence[str],
    env: Mapping[str, str],
    timeout: float = PROBE_SECONDS,
) -> set[str]:
    """The hosts whose probe, run with the attempts' environment `env`, exits 0 within `timeout` seconds, all
    asked at once; a probe still running then is killed with its process group (an `ssh` to a node that is
    gone can hang far longer)."""
    probes = {
        host: subprocess.Popen(
            probe(host),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for host in hosts
    }
    deadline = time.monotonic() + timeout
    answered: set[str] = set()
    for host, proc in probes.items():
        try:
            if proc.wait(max(0.0, deadline - time.monotonic())) == 0:
                answered.add(host)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return answered
