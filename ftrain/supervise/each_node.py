"""One attempt's command on every node, through the `--node-exec` template, held together as one srun step is.

    python -m ftrain.supervise.each_node --template 'ssh {host}' --host a --host b -- torchrun …

Each node's command starts in a session of its own. The first to exit with a failure (non-zero, or killed by a
signal) ends the others — SIGTERM, then SIGKILL after the grace period — and its status is this process's
(128 + N for signal N, as a shell reports it); it is named on stderr in one line (`NodeExit.line`), from which
the supervisor tells a lost node from a failed training. When all succeed this exits 0. SIGTERM, SIGINT and the
save signals (FTRAIN_SAVE_SIGNALS: a node's relay hands them to its workers) are passed on to every node's
command, and the runner then waits for them all.
"""

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Final

import structlog

from ftrain import settings
from ftrain.supervise.node_exec import NodeExit, TemplateError, node_argv, parse_template
from ftrain.supervise.relay import stop_signals

GRACE_SECONDS: Final = 10.0
POLL_SECONDS: Final = 0.1
log = structlog.get_logger(__name__)


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def _signal_all(procs: Sequence["subprocess.Popen[bytes]"], signum: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)


def run_each(template: Sequence[str], hosts: Sequence[str], command: Sequence[str]) -> int:
    """Run `command` on every host; the attempt's exit status."""
    procs = [
        subprocess.Popen(node_argv(template, host, command, os.environ), start_new_session=True)
        for host in hosts
    ]

    def forward(signum: int, _: FrameType | None) -> None:
        _signal_all(procs, signum)

    for sig in stop_signals(settings.save_signals()):
        signal.signal(sig, forward)
    failed: NodeExit | None = None
    deadline: float | None = None
    while True:
        running = [proc.poll() for proc in procs].count(None)  # every one polled, so each exit is seen
        if failed is None and (bad := next((p for p in procs if p.returncode not in (None, 0)), None)):
            failed = NodeExit(hosts[procs.index(bad)], _status(bad.returncode))
            log.warning("node_failed", host=failed.host, status=failed.status)
            print(failed.line(), file=sys.stderr, flush=True)  # also when no other node is left to end
            _signal_all(procs, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_SECONDS
        if not running:
            return 0 if failed is None else failed.status
        if deadline is not None and time.monotonic() > deadline:
            _signal_all(procs, signal.SIGKILL)
            deadline = None
        time.sleep(POLL_SECONDS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="each_node", description=__doc__.split("\n\n")[0])
    parser.add_argument("--template", required=True)
    parser.add_argument("--host", action="append", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        template = parse_template(args.template)
    except TemplateError as exc:
        print(f"each_node: {exc}", file=sys.stderr)
        return 2
    if not command:
        print("each_node: no command to run", file=sys.stderr)
        return 2
    return run_each(template, args.host, command)


if __name__ == "__main__":
    sys.exit(main())
