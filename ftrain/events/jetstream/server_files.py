"""What the embedded server keeps under ``<home>/nats``: its config, its record, its key, the lock, its store.

``server.conf``, ``server.json`` (the :class:`ServerProcess` record), ``server.log`` (appended to by every
start), ``server.pid`` (nats-server's own pid file), ``user.nk`` (the nkey seed every ftrain client signs in
with: other users on the machine can reach 127.0.0.1 too), ``reader.nk`` (once issued: the seed of a user that
may read the log but not append to it or change the stream), ``lock`` (flock serialising check-and-start/stop)
and ``store/`` (JetStream ``store_dir``). All of it is private (0700 directories, 0600 files). The port is kept
across restarts when it is still free, so the URL is too.
"""

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Final

import msgspec
import nkeys

from ftrain.events.lease_record import BUCKET, LEASE_STREAM
from ftrain.events.record import STREAM, SUBJECT_ROOT
from ftrain.host.atomic_file import write_atomic
from ftrain.host.private_files import open_private, private_dir
from ftrain.host.processes import HOST, exclusive, free_port, port_free

SERVER_NAME: Final = "ftrain-embedded"


class ServerProcess(msgspec.Struct, frozen=True):
    """A running nats-server, as recorded in ``<home>/nats/server.json``."""

    pid: int
    port: int
    url: str
    store_dir: str
    started_at: float
    nkey_file: str = ""
    """The nkey seed file clients sign in with; empty in records of older, unauthenticated servers."""


def nats_dir(home: Path, *, create: bool = True) -> Path:
    """Absolute, so the config path in the server's cmdline is stable whatever the caller's cwd. Creating it
    also makes the home and this directory 0700, or refuses either when it is not this user's alone
    (`host.private_files.UnsafeDirectory`)."""
    d = (Path(home) / "nats").absolute()
    if create:
        private_dir(d.parent)
        private_dir(d)
    return d


def conf_path(directory: Path) -> Path:
    """The config every start rewrites; the server's pid file sits beside it."""
    return directory / "server.conf"


def store_path(directory: Path) -> Path:
    """JetStream's ``store_dir``: the log itself."""
    return directory / "store"


def _record_path(directory: Path) -> Path:
    return directory / "server.json"


def seed_path(directory: Path) -> Path:
    """The user nkey seed: whoever can read it can use the log, so it is 0600 like everything here."""
    return directory / "user.nk"


def reader_seed_path(directory: Path) -> Path:
    """The read-only user's nkey seed, kept here (0600) so that issuing it again hands out the same key."""
    return directory / "reader.nk"


def user_key(directory: Path) -> str:
    """The public key of the user nkey, made (seed written 0600, atomically) on first use and kept after,
    so clients that hold the seed file keep working across restarts."""
    return _public_key(seed_path(directory))


def reader_key(directory: Path) -> str | None:
    """The read-only user's public key; None while none was issued."""
    return issue_reader_key(directory) if reader_seed_path(directory).exists() else None


def issue_reader_key(directory: Path) -> str:
    """The read-only user's public key, made on first use and kept like the writer's, so a reader's copy of
    the seed keeps working across restarts."""
    return _public_key(reader_seed_path(directory))


def _public_key(path: Path) -> str:
    """The public key of the user nkey seed at `path`, made on first use."""
    try:
        seed = path.read_bytes().strip()
    except FileNotFoundError:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        write_atomic(path, seed + b"\n")
    os.chmod(path, 0o600)  # a seed file of ours found looser is tightened
    try:
        pair = nkeys.from_seed(bytearray(seed))
        public: bytes = pair.public_key
        pair.wipe()
    except (nkeys.NkeysError, ValueError) as exc:
        raise ValueError(f"{path} is not an nkey seed; remove it to have a new one made") from exc
    if not public.startswith(b"U"):
        raise ValueError(f"{path} is not a user nkey seed; remove it to have a new one made")
    return public.decode()


def reader_permissions(stream: str = STREAM, indent: str = "  ") -> str:
    """The NATS `permissions` of a user that reads the log every way ftrain and nats-py read it, and changes
    nothing: the events' subjects live, stream info, stored and last messages (direct or not), ephemeral
    consumers (ordered, push or pull; create, info, next, acks, flow control), the supervisor leases' last
    messages (what `status` shows) and replies to its own inboxes. Everything else is refused by the allow
    lists; the deny list names what must never be allowed: appends, taking or breaking a lease, deleting,
    purging, updating or creating streams and messages, deleting consumers, and creating a named or durable
    one (it would outlive the reader, and the weakest key could fill the server's consumer limit). Only the
    unnamed create is allowed, on which the server refuses a durable name.

    Written for the embedded server and quoted, as is, for a cluster of the user's own (README)."""
    api = "$JS.API"
    publish = [
        f"{api}.INFO",
        f"{api}.STREAM.NAMES",
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.INFO.{stream}.*",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
        f"{api}.STREAM.MSG.GET.{LEASE_STREAM}",
    ]
    deny = [
        f"{SUBJECT_ROOT}.>",
        f"$KV.{BUCKET}.>",
        f"{api}.STREAM.CREATE.>",
        f"{api}.STREAM.UPDATE.>",
        f"{api}.STREAM.DELETE.>",
        f"{api}.STREAM.PURGE.>",
        f"{api}.STREAM.MSG.DELETE.>",
        f"{api}.CONSUMER.DELETE.>",
        f"{api}.CONSUMER.CREATE.*.>",
        f"{api}.CONSUMER.DURABLE.CREATE.>",
    ]
    subscribe = [f"{SUBJECT_ROOT}.>", "_INBOX.>"]

    def subjects(key: str, names: list[str], depth: int) -> list[str]:
        items = [f"{indent * (depth + 1)}{json.dumps(n)}," for n in names]
        return [f"{indent * depth}{key}: [", *items, f"{indent * depth}]"]

    return "\n".join(
        [
            "permissions: {",
            f"{indent}publish: {{",
            *subjects("allow", publish, 2),
            *subjects("deny", deny, 2),
            f"{indent}}}",
            f"{indent}subscribe: {{",
            *subjects("allow", subscribe, 2),
            f"{indent}}}",
            "}",
        ]
    )


def write_config(
    path: Path, *, port: int, store_dir: Path, user: str, reader: str | None = None, host: str = HOST
) -> None:
    """Write a local JetStream config that admits only the nkey `user` (and `reader`, read-only) and fsyncs
    every write before the ack.

    Only the public keys are in it. ``sync_interval: always`` is what backs the promise that no acknowledged
    event is lost even on power loss (measured ~0.2-0.4 ms extra per publish). No ``http`` monitoring port:
    nothing else listens. The pid file sits next to the config (``<stem>.pid``).
    """
    q = json.dumps  # nats conf accepts JSON-style double-quoted strings
    text = "\n".join(
        [
            "# Written by ftrain (events/jetstream/server_files.py); rewritten on every start.",
            f"server_name: {q(SERVER_NAME)}",
            f"listen: {q(f'{host}:{port}')}",
            f"pid_file: {q(str(path.with_suffix('.pid')))}",
            "max_payload: 1048576  # the nats default (1 MiB), pinned",
            f"authorization {{ users = [ {{ nkey: {q(user)} }}{_reader_entry(reader)} ] }}",
            "jetstream {",
            f"  store_dir: {q(str(store_dir))}",
            "  sync_interval: always",
            "}",
            "",
        ]
    )
    write_atomic(path, text.encode())


def _reader_entry(reader: str | None) -> str:
    """The read-only user's entry in the config's user list, after the writer's; nothing while none."""
    if reader is None:
        return ""
    permissions = reader_permissions().replace("\n", "\n  ")
    return f",\n  {{ nkey: {json.dumps(reader)}\n  {permissions} }}\n"


def read_record(directory: Path) -> ServerProcess | None:
    """The recorded server, or None when there is no readable record."""
    try:
        return msgspec.json.decode(_record_path(directory).read_bytes(), type=ServerProcess)
    except (OSError, msgspec.DecodeError):
        return None


def write_record(directory: Path, proc: ServerProcess) -> None:
    """Record a started server, atomically, for the commands (other processes) that reuse it."""
    write_atomic(_record_path(directory), msgspec.json.encode(proc))


def remove_record(directory: Path) -> None:
    """Forget the server (it was stopped)."""
    _record_path(directory).unlink(missing_ok=True)


def locked(directory: Path) -> contextlib.AbstractContextManager[None]:
    """Exclusive flock on ``<directory>/lock``: one check-and-start (or stop) at a time, across processes."""
    return exclusive(open_private(directory / "lock", os.O_RDWR))


def pick_port(directory: Path) -> int:
    """The previously used port when free (stable URL across restarts), else any free one."""
    last = _last_port(directory)
    if last is not None and 0 < last < 65536 and port_free(last):
        return last
    return free_port()


def _last_port(directory: Path) -> int | None:
    """The port last used: from server.json, else from the config left by a cleanly stopped server."""
    rec = read_record(directory)
    if rec is not None:
        return rec.port
    try:
        m = re.search(r'^listen: "[^"]*:(\d+)"$', conf_path(directory).read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None
