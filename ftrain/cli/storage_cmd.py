"""`ftrain storage start|stop|status`: the embedded SeaweedFS (S3-compatible) server under $FTRAIN_HOME, for
development and tests. Clients reach it through the standard AWS chain: `start` and `status` print the three
variables that select its profile (the key itself stays in 0600 files).

`--json`: `start` and `status` print `{"running": true, "endpoint", "pid", "data_dir", "bucket", "env",
"exports"}` (`env`: the variables to set, FTRAIN_STORAGE included; `exports`: them as one shell line), or
`{"running": false, "home"}`; `stop` prints `{"running": false, "stopped", "home"}`.
"""

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ftrain.cli.arguments import Subparsers, command, json_flag
from ftrain.console.output import emit, emit_json
from ftrain.errors import NOT_RUNNING, Refused

if TYPE_CHECKING:
    from ftrain.workers.s3.seaweed_server import SeaweedProcess


def storage_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run one action; `status` exits 3 when no server runs."""
    from ftrain import settings
    from ftrain.workers.s3.seaweed_server import (
        SeaweedError,
        ensure_storage_server,
        stop_storage_server,
        storage_server_status,
    )

    home = settings.home(env)
    try:
        if args.action == "stop":
            stopped = stop_storage_server(home)
            doc: dict[str, Any] = {"running": False, "stopped": stopped, "home": str(home)}
            return _say(args.json, doc, ["SeaweedFS stopped" if stopped else "SeaweedFS was not running"])
        running = ensure_storage_server(home) if args.action == "start" else storage_server_status(home)
    except SeaweedError as exc:
        raise Refused(str(exc)) from exc
    if running is None:
        _say(args.json, {"running": False, "home": str(home)}, [f"SeaweedFS not running (home {home})"])
        return NOT_RUNNING
    return _say(args.json, *_described(running))


def _described(proc: "SeaweedProcess") -> tuple[dict[str, Any], list[str]]:
    from ftrain import settings
    from ftrain.workers.s3.seaweed_server import DEFAULT_BUCKET

    variables = {**proc.env(), settings.STORAGE: f"s3://{DEFAULT_BUCKET}/checkpoints"}
    exports = " ".join(f"export {k}={v};" for k, v in variables.items())
    doc = {"running": True, "endpoint": proc.endpoint, "pid": proc.pid, "data_dir": str(proc.data_dir),
           "bucket": DEFAULT_BUCKET, "env": variables, "exports": exports}  # fmt: skip
    line = f"SeaweedFS S3 running at {proc.endpoint} (pid {proc.pid}, data {proc.data_dir}), bucket {DEFAULT_BUCKET}"
    return doc, [line, exports]


def _say(json: bool, doc: dict[str, Any], lines: list[str]) -> int:
    if json:
        emit_json(doc)
    else:
        emit(lines)
    return 0


def add_parser(sub: Subparsers) -> None:
    """`storage` and its actions."""
    p = command(sub, "storage", "the embedded SeaweedFS S3 server, for development and tests", [
        "ftrain storage start", "eval \"$(ftrain storage status --json | jq -r .exports)\"",
    ])  # fmt: skip
    p.add_argument("action", choices=("start", "stop", "status"), help="what to do with it")
    json_flag(p, "what the action found or did")
    p.set_defaults(entry=lambda args: storage_command(args, os.environ))
