"""`ftrain server start|stop|status|repair|credentials`: manage the embedded nats-server under $FTRAIN_HOME,
accept, on record, a stream that is no longer the one anchored, and issue the read-only key auditors and
stream consumers sign in with."""

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftrain.cli.arguments import Subparsers, command, json_flag
from ftrain.console.output import emit, emit_json
from ftrain.errors import NOT_RUNNING, Refused, UsageError

if TYPE_CHECKING:
    from ftrain.events.jetstream.connection import NatsSettings


def server_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run one server action; the embedded server only exists when FTRAIN_NATS_URL is unset."""
    from ftrain import settings
    from ftrain.events.jetstream.nats_server import NatsServerError, ensure_server, server_status, stop_server

    action = args.action
    if action != "credentials" and (args.read_only or args.out):
        raise UsageError("--read-only and --out go with `ftrain server credentials`")
    nats = settings.nats(env)
    if action == "repair":
        import asyncio

        return asyncio.run(_repair(nats, args.json))
    if nats.url is not None:
        hint = " (give a reader on it the permissions the README lists)" if action == "credentials" else ""
        raise UsageError(f"{settings.NATS_URL} is set: ftrain does not manage that server{hint}")
    home = nats.home
    try:
        if action == "credentials":
            return _credentials(home, args.read_only, args.out, args.json)
        if action == "stop":
            stopped = stop_server(home)
            return _say(args.json, {"running": False, "stopped": stopped, "home": str(home)},
                        "nats-server stopped" if stopped else "nats-server was not running")  # fmt: skip
        running = ensure_server(home) if action == "start" else server_status(home)
    except NatsServerError as exc:
        raise Refused(str(exc)) from exc
    if running is None:
        _say(args.json, {"running": False, "home": str(home)}, f"nats-server not running (home {home})")
        return NOT_RUNNING
    doc = {
        "running": True,
        "url": running.url,
        "pid": running.pid,
        "store_dir": running.store_dir,
        "home": str(home),
    }
    return _say(
        args.json, doc, f"nats-server running at {running.url} (pid {running.pid}, store {running.store_dir})"
    )


def _say(json: bool, doc: dict[str, Any], line: str) -> int:
    """`start`/`status` --json: `{"running", "url", "pid", "store_dir", "home"}` (`running` false: `home`
    only); `stop`: `{"running": false, "stopped", "home"}` (`stopped`: whether one was running)."""
    if json:
        emit_json(doc)
    else:
        emit(line)
    return 0


def _credentials(home: Path, read_only: bool, out: Path | None, json: bool) -> int:
    """Issue the read-only key (the same one every time) and say how a reader signs in with it; `out`: a
    private copy to hand over, never written over a file that holds anything else. --json: `{"public_key",
    "seed_file", "url", "env"}` (`env`: the variables a reader sets)."""
    from ftrain import settings

    if not read_only:
        raise UsageError(
            f"only a read-only key is issued: add --read-only (writers sign in with {home}/nats/user.nk)"
        )
    from ftrain.events.jetstream.nats_server import issue_reader
    from ftrain.events.jetstream.server_files import nats_dir, reader_seed_path

    if out is not None:
        _check_out(out, reader_seed_path(nats_dir(home, create=False)))
    reader = issue_reader(home)
    handed = reader.seed_file
    if out is not None:
        _copy(reader.seed_file, out)
        handed = out.absolute()
    if json:
        emit_json({"public_key": reader.public_key, "seed_file": str(handed), "url": reader.server.url,
                   "env": {settings.NATS_URL: reader.server.url, settings.NATS_NKEY: str(handed)}})  # fmt: skip
        return 0
    emit(f"read-only key {reader.public_key} (read, tail, audit; never append): {handed}")
    emit(f"a reader signs in with {settings.NATS_URL}={reader.server.url} {settings.NATS_NKEY}={handed}")
    return 0


def _check_out(out: Path, kept: Path) -> None:
    """Refuse, before anything is made, an `--out` with no directory to go in or that holds another file."""
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: no such directory {out.parent}")
    if out.exists() and not (kept.exists() and out.read_bytes() == kept.read_bytes()):
        raise UsageError(f"--out {out}: exists; not overwritten")


def _copy(seed: Path, out: Path) -> None:
    """Write the seed to `out`, 0600 from its first byte; a copy already there is left as it is."""
    from ftrain.host.private_files import open_private

    try:
        fd = open_private(out, os.O_WRONLY | os.O_EXCL)
    except FileExistsError:
        return  # `_check_out` found it holds this very seed
    with os.fdopen(fd, "wb") as f:
        f.write(seed.read_bytes())


async def _repair(nats: "NatsSettings", json: bool) -> int:
    """Re-create a vanished stream, restore ftrain's retention settings, and anchor the stream as it is,
    with what differed: later opens accept it, and `audit verify` lists it as accepted. --json: `{"stream",
    "created", "last_seq", "change" (null: nothing differed), "ignored"}`."""
    from ftrain.events.jetstream.connection import open_store

    async with open_store(nats) as store:
        change, facts, ignored = await store.repair()
    if json:
        emit_json({"stream": facts.stream, "created": facts.created, "last_seq": facts.last_seq,
                   "change": change or None, "ignored": ignored})  # fmt: skip
        return 0
    for line in ignored:
        emit(f"ignored: {line}")
    emit(f"stream {facts.stream} (created {facts.created}, last seq {facts.last_seq}) accepted and anchored")
    emit(f"what differed: {change}" if change else "nothing differed from the newest anchor")
    return 0


def add_parser(sub: Subparsers) -> None:
    """`server` and its actions."""
    p = command(sub, "server", "the embedded nats-server that holds the log", [
        "ftrain server start", "ftrain server status --json", "ftrain server credentials --read-only --out r.nk",
    ], "repair: accept a changed stream, on record; credentials --read-only: the key auditors and stream "
       "consumers sign in with.")  # fmt: skip
    p.add_argument(
        "action", choices=("start", "stop", "status", "repair", "credentials"), help="what to do with it"
    )
    p.add_argument(
        "--read-only", action="store_true", help="credentials: a key that may read and tail, never append"
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="credentials: also write the seed to FILE (0600)")
    json_flag(p, "what the action found or did")
    p.set_defaults(entry=lambda args: server_command(args, os.environ))
