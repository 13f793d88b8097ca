"""`ftrain run --node-exec TEMPLATE`: one torchrun per node without Slurm, through a per-node command template.

The template is how this site starts a command on a node — `ssh {host}`, `ip netns exec {host}`, a wrapper of
its own — with `{host}` replaced by each host of the node list. An attempt is then one process, `python -m
ftrain.supervise.each_node`, which starts the same torchrun command through the template on every node and
behaves as an srun step with `--kill-on-bad-exit=1` does: the first node whose command fails ends the others,
and its exit status is the attempt's (the runner names that node on stderr, in the one line `NodeExit` owns);
a SIGTERM or SIGINT is passed on to every node. The run's own variables (FTRAIN_RUN_ID, FTRAIN_CKPT_DIR,
FTRAIN_ATTEMPT, FTRAIN_ATTEMPT_NONCE, none of them secret) travel in the command line through `env`, since `ssh` does not carry an
environment; everything else a node needs (the log's URL and credentials, the storage's) comes from the node's
own environment, as it would for any job started there. Pure here; the runner is `ftrain.supervise.each_node`.
"""

import re
import shlex
import string
import sys
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

from ftrain import settings

HOST: Final = "{host}"
CARRIED: Final = (
    settings.RUN_ID,
    settings.CKPT_DIR,
    settings.ATTEMPT,
    settings.ATTEMPT_NONCE,
    settings.CHECKPOINT_EVERY,
    settings.DATASET_REVISION,
    settings.SAVE_SIGNALS,
)
"""The run's variables written into each node's command line."""
_NODE_FAILED: Final = re.compile(r"each_node: (\S+) exited with status (\d+); ending the other nodes")


class NodeExit(NamedTuple):
    """The first node whose command failed, as the runner reports it on stderr."""

    host: str
    status: int
    """As a shell reports it: 128 + N for signal N."""

    def line(self) -> str:
        """The runner's line; `parse_node_exit` reads it back."""
        return f"each_node: {self.host} exited with status {self.status}; ending the other nodes"

    @property
    def lost(self) -> bool:
        """Whether the node itself is gone rather than its training: its command was killed by a signal, or
        lost its connection (`ssh` exits 255). A training process that fails makes torchrun exit 1."""
        return self.status > 128


def parse_node_exit(line: str) -> NodeExit | None:
    """The node a runner's stderr line names as failed first (None: not such a line)."""
    found = _NODE_FAILED.fullmatch(line.strip())
    return NodeExit(found[1], int(found[2])) if found else None


class TemplateError(ValueError):
    """The template cannot start a command on a node; the message is one CLI error line."""


def parse_template(text: str) -> tuple[str, ...]:
    """The template's words; it must name `{host}`, plainly, and no other field: `str.format` would read a
    format spec, a conversion or an index too (`{host:>999999999}` pads to a gigabyte), so none passes here."""
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise TemplateError(f"--node-exec {text!r}: {exc}") from exc
    if not words:
        raise TemplateError("--node-exec is empty")
    for word in words:
        try:
            fields = [
                (name, spec, conversion)
                for _, name, spec, conversion in string.Formatter().parse(word)
                if name is not None
            ]
        except ValueError as exc:
            raise TemplateError(
                f"--node-exec {text!r}: {exc} (write a literal brace as {{{{ or }}}})"
            ) from exc
        for name, spec, conversion in fields:
            if problem := _field_problem(name, spec, conversion):
                shown = (
                    "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                )
                raise TemplateError(
                    f"--node-exec {text!r}: {shown} {problem} (only a plain {HOST} is filled in)"
                )
    if not any(HOST in word for word in words):
        raise TemplateError(f"--node-exec {text!r} does not name {HOST}")
    return words


def _field_problem(name: str, spec: str | None, conversion: str | None) -> str | None:
    """Why a replacement field is not a plain `{host}`; None when it is."""
    if not name or name.isdigit():
        return "is positional"
    if "." in name or "[" in name:
        return "is an attribute or index"
    if name != "host":
        return "is not a field"
    if conversion:
        return "carries a conversion"
    if spec:
        return "carries a format spec"
    return None


def node_argv(
    template: Sequence[str], host: str, command: Sequence[str], env: Mapping[str, str]
) -> list[str]:
    """The argv that runs `command` on `host`, with the run's variables set there."""
    carried = [f"{name}={env[name]}" for name in CARRIED if name in env]
    return [*(word.format(host=host) for word in template), "env", *carried, *command]


def each_node_command(text: str, hosts: Sequence[str], command: Sequence[str]) -> list[str]:
    """The one process an attempt runs: the runner, given the template, the hosts and the per-node command."""
    hosts_args = [arg for host in hosts for arg in ("--host", host)]
    return [
        sys.executable,
        "-m",
        "ftrain.supervise.each_node",
        "--template",
        text,
        *hosts_args,
        "--",
        *command,
    ]
