"""The per-host launch command for each parallelism strategy.

Every strategy starts through ``torchrun`` with a c10d rendezvous on rank 0's host, so the
control plane restarts all of them the same way; strategies differ only in the arguments
handed to the training command. Pure: builds argv, runs nothing, never imports torch.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final

import msgspec

from ftrain.supervise.hostlist import is_valid_hostname

DEFAULT_RDZV_PORT: Final = 29500
"""torchrun's own default, the rendezvous port outside a scheduler job (`scheduler_job.rendezvous_port`)."""

__all__ = [
    "DEFAULT_STRATEGY",
    "DEFAULT_TRAIN_CMD",
    "STRATEGIES",
    "LaunchSpec",
    "LaunchSpecError",
    "build_command",
    "format_command",
]

STRATEGIES: Final = ("fsdp", "ddp", "zero", "megatron", "none")
"""How the job shards its model: a label for fsdp, ddp and none (a CPU job, a single process); zero and
megatron add their arguments to the training command."""

DEFAULT_STRATEGY: Final = "fsdp"
"""What a launch without --strategy records and builds its command for (a label: the command as given)."""

DEFAULT_TRAIN_CMD: Final = ("-m", "ftrain.examples.train")
"""The reference trainer, run as a module by torchrun's own interpreter."""

_INTERPRETERS: Final = frozenset({"python", "python3"})
# torchrun options that may legitimately open the training command; any other leading
# option would be parsed by torchrun as one of its own (e.g. a stray --nnodes=8).
_MODULE_FLAGS: Final = frozenset({"-m", "--module"})
_NO_PYTHON: Final = "--no-python"


class LaunchSpecError(ValueError):
    """A launch spec cannot produce a valid command; the message is one CLI error line."""


class LaunchSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything needed to write one host's torchrun command line."""

    run_id: str
    nodes: int
    gpus_per_node: int
    strategy: str
    rdzv_host: str
    rdzv_port: int = DEFAULT_RDZV_PORT
    train_cmd: tuple[str, ...]
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    deepspeed_config: str = "ds_config.json"
    max_restarts: int = 0
    """torchrun's own in-place restarts of failed workers (emitted only when above 0, torchrun's default)."""


def build_command(spec: LaunchSpec) -> list[str]:
    """argv for one host: ``torchrun <rendezvous options> <training command> <strategy args>``.

    How the training command is placed (torchrun starts Python itself unless told not to):

    - starts with ``-m``/``--module`` (a module) or its first word ends in ``.py``
      (a script): goes straight after the torchrun options;
    - starts with a bare ``python``/``python3``: that word is dropped and the rest is
      placed by the rule above; if the rest is neither (e.g. ``python -u x.py``) the
      whole command is run with ``--no-python`` instead, so interpreter flags survive;
    - starts with ``--no-python``: passed through as given;
    - starts with any other option: LaunchSpecError, since torchrun would take it as its own;
    - anything else (``./bin/train``, ``/opt/venv/bin/python``): ``--no-python`` + command.

    Strategy arguments (``--deepspeed ...`` for zero, the parallel sizes for megatron) are
    appended after the training command's own arguments. Invalid specs raise LaunchSpecError.
    """
    _validate(spec)
    return [*_torchrun_options(spec), *_place_train_cmd(spec.train_cmd), *_strategy_args(spec)]


def format_command(argv: Sequence[str]) -> str:
    """Shell-quoted command line, safe to copy into a terminal."""
    return shlex.join(argv)


def _torchrun_options(spec: LaunchSpec) -> list[str]:
    return [
        "torchrun",
        f"--nnodes={spec.nodes}",
        f"--nproc_per_node={spec.gpus_per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={spec.rdzv_host}:{spec.rdzv_port}",
        f"--rdzv_id={spec.run_id}",
        *([f"--max_restarts={spec.max_restarts}"] if spec.max_restarts else []),
    ]


def _place_train_cmd(cmd: tuple[str, ...]) -> list[str]:
    if not cmd or not cmd[0]:
        raise LaunchSpecError("training command is empty")
    first = cmd[0]
    if first in _INTERPRETERS:
        rest = cmd[1:]
        if not rest:
            raise LaunchSpecError(f"training command {format_command(cmd)!r} names no script or module")
        return list(rest) if _python_target(rest) else [_NO_PYTHON, *cmd]
    if _python_target(cmd):
        return list(cmd)
    if first == _NO_PYTHON:
        if len(cmd) < 2:
            raise LaunchSpecError("training command '--no-python' names no executable")
        return list(cmd)
    if first.startswith("-"):
        raise LaunchSpecError(
            f"training command starts with unsupported option {first!r}; "
            "only -m/--module or --no-python may come first"
        )
    return [_NO_PYTHON, *cmd]


def _python_target(cmd: Sequence[str]) -> bool:
    """True when torchrun's own interpreter can run ``cmd``: ``-m module ...`` or ``x.py ...``."""
    if cmd[0] in _MODULE_FLAGS:
        if len(cmd) < 2 or not cmd[1] or cmd[1].startswith("-"):
            raise LaunchSpecError(f"training command {format_command(cmd)!r}: {cmd[0]} needs a module name")
        return True
    return cmd[0].endswith(".py")


def _strategy_args(spec: LaunchSpec) -> list[str]:
    if spec.strategy == "zero":
        return ["--deepspeed", "--deepspeed_config", spec.deepspeed_config]
    if spec.strategy == "megatron":
        return [
            "--tensor-model-parallel-size",
            str(spec.tensor_parallel),
            "--pipeline-model-parallel-size",
            str(spec.pipeline_parallel),
        ]
    return []


def _validate(spec: LaunchSpec) -> None:
    """Reject specs torchrun or the strategy would only reject later, on every host."""
    if spec.strategy not in STRATEGIES:
        raise LaunchSpecError(f"unknown strategy {spec.strategy!r} (expected one of {', '.join(STRATEGIES)})")
    if not spec.run_id:
        raise LaunchSpecError("run_id must not be empty")
    if spec.nodes < 1:
        raise LaunchSpecError(f"nodes must be >= 1, got {spec.nodes}")
    if spec.gpus_per_node < 1:
        raise LaunchSpecError(f"gpus_per_node must be >= 1, got {spec.gpus_per_node}")
    if not is_valid_hostname(spec.rdzv_host):
        raise LaunchSpecError(f"invalid rendezvous host {spec.rdzv_host!r}")
    if not 1 <= spec.rdzv_port <= 65535:
        raise LaunchSpecError(f"rdzv_port must be in 1..65535, got {spec.rdzv_port}")
    if spec.max_restarts < 0:
        raise LaunchSpecError(f"max_restarts must be >= 0, got {spec.max_restarts}")
    if spec.strategy == "zero" and not spec.deepspeed_config:
        raise LaunchSpecError("zero strategy needs a deepspeed_config path")
    if spec.strategy == "megatron":
        _validate_megatron(spec)


def _validate_megatron(spec: LaunchSpec) -> None:
    """Megatron needs tp*pp to tile the world, and tensor parallel groups inside one node."""
    tp, pp = spec.tensor_parallel, spec.pipeline_parallel
    if tp < 1 or pp < 1:
        raise LaunchSpecError(
            f"megatron: tensor_parallel and pipeline_parallel must be >= 1, got {tp} and {pp}"
        )
    world = spec.nodes * spec.gpus_per_node
    if world % (tp * pp):
        raise LaunchSpecError(
            f"megatron: tensor_parallel*pipeline_parallel ({tp}*{pp}={tp * pp}) must divide "
            f"nodes*gpus_per_node ({spec.nodes}*{spec.gpus_per_node}={world})"
        )
    if tp > spec.gpus_per_node:
        raise LaunchSpecError(
            f"megatron: tensor_parallel {tp} exceeds gpus_per_node {spec.gpus_per_node} "
            "(tensor parallel groups must stay inside one node)"
        )
