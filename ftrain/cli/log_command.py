"""A command that reads or appends to the log, in two halves: `prepare` checks the input before anything
connects or writes (a usage error leaves no trace), `run` executes it against the service and prints the
result. Both are loaded when the command runs, never when the parser is built."""

import argparse
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ftrain.service import RunService


class Command(NamedTuple):
    """The two halves of a command."""

    prepare: Callable[[argparse.Namespace], Any]
    run: Callable[["RunService", argparse.Namespace, Any], Awaitable[int]]


def nothing(args: argparse.Namespace) -> None:
    """A `prepare` for a command whose arguments the parser checked whole."""
    return None


def on_the_log(
    args: argparse.Namespace, load: Callable[[], Command], *, auditing: bool = False, leases: bool = False
) -> int:
    """Run the command `load` imports: prepare it, make sure the log is there, open the service and run it.
    `auditing`: a stream that is not the one anchored is reported, not refused; `leases`: the supervisor
    leases too."""
    import asyncio

    return asyncio.run(_on_the_log(args, load, auditing, leases))


async def _on_the_log(
    args: argparse.Namespace, load: Callable[[], Command], auditing: bool, leases: bool
) -> int:
    from ftrain.cli.log_server import log_ready
    from ftrain.service import RunService

    command = load()
    prepared = command.prepare(args)
    log_ready(args.command, os.environ)
    async with RunService.open(auditing=auditing, leases=leases) as app:
        return await command.run(app, args, prepared)
