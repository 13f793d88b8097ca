"""What each attempt of `ftrain run` runs: torchrun on this host, one srun step over the allocation, or torchrun
on every node through the --node-exec template — each node's under the signal relay (`relay`) when the trainer
saves on a signal; and the environment that tells the trainer its run. Pure functions (but for picking a free
port); nothing imports torch.
"""

import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import msgspec

from ftrain import settings
from ftrain.supervise.hostlist import compress_hostlist
from ftrain.supervise.launch_spec import LaunchSpec, build_command
from ftrain.supervise.node_exec import each_node_command

RELAY: Final = (sys.executable, "-m", "ftrain.supervise.relay", "--")
"""What each node's torchrun runs under when the trainer saves on a signal (FTRAIN_SAVE_SIGNALS not `none`)."""


def local_command(spec: LaunchSpec, torchrun: str, port: int, relay: Sequence[str] = ()) -> list[str]:
    """torchrun for this host alone, on a private loopback rendezvous so concurrent runs never meet."""
    argv = build_command(msgspec.structs.replace(spec, rdzv_host="127.0.0.1", rdzv_port=port))
    return [*relay, torchrun, *argv[1:]]


def srun_command(
    spec: LaunchSpec, hosts: Sequence[str], torchrun: str, relay: Sequence[str] = ()
) -> list[str]:
    """One srun step running the per-host torchrun command once on every host of the allocation.

    Every task runs the same argv: the c10d rendezvous on the rank-0 host hands out node ranks (torchrun reads
    --node-rank only for the static backend), so nothing host-specific has to be spliced in per node. The
    environment (FTRAIN_RUN_ID, FTRAIN_CKPT_DIR) travels with --export=ALL; --kill-on-bad-exit tears the other
    nodes down when one fails, so the attempt ends as a whole.
    """
    return [
        "srun",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        f"--nodelist={compress_hostlist(hosts)}",
        "--export=ALL",
        *relay,
        torchrun,
        *build_command(spec)[1:],
    ]


def attempt_commands(
    spec: LaunchSpec, torchrun: str, *, slurm: bool, node_exec: str | None = None, relayed: bool = False
) -> Callable[[Sequence[str]], list[str]]:
    """The argv of each new attempt on its hosts: through the --node-exec template on every host, one srun step,
    or torchrun here alone (a fresh free port every time); `relayed`: each node's under the signal relay. An
    attempt on fewer hosts than launched (an elastic relaunch) has its rendezvous on the first of them."""
    relay = RELAY if relayed else ()

    def on(hosts: Sequence[str]) -> list[str]:
        placed = msgspec.structs.replace(spec, nodes=len(hosts), rdzv_host=hosts[0])
        if node_exec is not None:
            return each_node_command(node_exec, hosts, [*relay, torchrun, *build_command(placed)[1:]])
        if slurm:
            return srun_command(placed, hosts, torchrun, relay)
        return local_command(spec, torchrun, free_port(), relay)

    return on


def child_env(
    env: Mapping[str, str],
    run_id: str,
    ckpt_dir: Path | str,
    *,
    checkpoint_every: str | None = None,
    dataset_revision: str | None = None,
) -> dict[str, str]:
    """The trainer's environment: ours, plus the run, its checkpoint location and what the launch said of
    the cadence and the dataset revision: all the checkpoint manager needs to record, save and resume."""
    launch = {settings.CHECKPOINT_EVERY: checkpoint_every, settings.DATASET_REVISION: dataset_revision}
    given = {name: value for name, value in launch.items() if value}
    return {**env, settings.RUN_ID: run_id, settings.CKPT_DIR: str(ckpt_dir), **given}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
