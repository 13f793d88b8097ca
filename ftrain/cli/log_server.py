"""Whether a command may start the embedded nats-server. A command that writes to the log starts it, as it
always has, and says so on stderr; one that only reads never does: on a shared login node, `ftrain list` after
`ftrain server stop` must not leave a server running behind the user's back. It says where the log is and how
to start it instead (exit 1). A log set by FTRAIN_NATS_URL is someone else's to run: nothing is checked here.
"""

import sys
from collections.abc import Mapping

from ftrain import settings
from ftrain.errors import Refused

READ_ONLY = frozenset({"status", "list", "cost", "audit", "replay", "events", "metrics", "export", "ui"})
"""Commands that never append (`replay --rebuild` rewrites the local read model only)."""


class NoServer(Refused):
    """A read-only command found no embedded server running."""


def log_ready(command: str, env: Mapping[str, str]) -> None:
    """Make sure the embedded server runs before `command` connects: start it for a writer (one line on
    stderr), refuse a reader (NoServer), or leave it alone when it runs or the log is elsewhere."""
    nats = settings.nats(env)
    if nats.url is not None:
        return
    from ftrain.events.jetstream.nats_server import ensure_server, server_status
    from ftrain.events.jetstream.server_files import nats_dir, store_path

    home = nats.home
    if command in READ_ONLY:
        if home.exists():
            from ftrain.host.private_files import safe_dir

            safe_dir(home)  # a home that is not this user's is refused as a writer would refuse it
        if server_status(home) is None:
            raise NoServer(
                f"the embedded nats-server is not running (its log: {store_path(nats_dir(home, create=False))}); "
                f"start it with `ftrain server start`, or point {settings.NATS_URL} at a running one"
            )
        return
    if server_status(home) is None:
        proc = ensure_server(home)
        sys.stderr.write(
            f"ftrain: started the embedded nats-server at {proc.url} (log {proc.store_dir}; "
            "`ftrain server stop` stops it)\n"
        )
