"""`ftrain server start|stop|status|repair|credentials`: manage the embedded nats-server under $FTRAIN_HOME,
accept, on record, a stream that is no longer the one anchored, and issue the read-only key auditors and
stream consumers sign in with."""

import argparse
import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

from ftrain import settings
from ftrain.cli.render import emit
from ftrain.errors import Refused, UsageError
from ftrain.events.jetstream.connection import NatsSettings, open_store
from ftrain.events.jetstream.server import (
    NatsServerError,
    ensure_server,
    issue_reader,
    server_status,
    stop_server,
)
from ftrain.events.jetstream.server_files import nats_dir, reader_seed_path
from ftrain.events.private import open_private


def server_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run one server action; the embedded server only exists when FTRAIN_NATS_URL is unset."""
    action = args.action
    if action != "credentials" and (args.read_only or args.out):
        raise UsageError("--read-only and --out go with `ftrain server credentials`")
    nats = settings.nats(env)
    if action == "repair":
        return asyncio.run(_repair(nats))
    if nats.url is not None:
        hint = " (give a reader on it the permissions the README lists)" if action == "credentials" else ""
        raise UsageError(f"{settings.NATS_URL} is set: ftrain does not manage that server{hint}")
    home = nats.home
    try:
        if action == "credentials":
            return _credentials(home, args.read_only, args.out)
        if action == "start":
            proc = ensure_server(home)
            emit(f"nats-server running at {proc.url} (pid {proc.pid}, store {proc.store_dir})")
        elif action == "stop":
            emit("nats-server stopped" if stop_server(home) else "nats-server was not running")
        else:
            running = server_status(home)
            if running is None:
                emit(f"nats-server not running (home {home})")
                return 3
            emit(f"nats-server running at {running.url} (pid {running.pid}, store {running.store_dir})")
    except NatsServerError as exc:
        raise Refused(str(exc)) from exc
    return 0


def _credentials(home: Path, read_only: bool, out: Path | None) -> int:
    """Issue the read-only key (the same one every time) and say how a reader signs in with it; `out`: a
    private copy to hand over, never written over a file that holds anything else."""
    if not read_only:
        raise UsageError(
            f"only a read-only key is issued: add --read-only (writers sign in with {home}/nats/user.nk)"
        )
    if out is not None:
        _check_out(out, reader_seed_path(nats_dir(home, create=False)))
    reader = issue_reader(home)
    handed = reader.seed_file
    if out is not None:
        _copy(reader.seed_file, out)
        handed = out.absolute()
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
    try:
        fd = open_private(out, os.O_WRONLY | os.O_EXCL)
    except FileExistsError:
        return  # `_check_out` found it holds this very seed
    with os.fdopen(fd, "wb") as f:
        f.write(seed.read_bytes())


async def _repair(nats: NatsSettings) -> int:
    """Re-create a vanished stream, restore ftrain's retention settings, and anchor the stream as it is,
    with what differed: later opens accept it, and `audit verify` lists it as accepted."""
    async with open_store(nats) as store:
        change, facts, ignored = await store.repair()
    for line in ignored:
        emit(f"ignored: {line}")
    emit(f"stream {facts.stream} (created {facts.created}, last seq {facts.last_seq}) accepted and anchored")
    emit(f"what differed: {change}" if change else "nothing differed from the newest anchor")
    return 0
