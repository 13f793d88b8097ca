"""`python -m ftrain.supervise.node_ready`: run on a node an elastic relaunch dropped, the way an attempt reaches
it (`node_return.node_probe`). It exits 0 once the node reaches a server of the event log, which every node of
a run needs: a node that is up but still cut off from the others is not taken back. A bad setting is exit 2.
Nothing here imports torch."""

import os
import socket
import sys
from collections.abc import Mapping
from typing import Final

from ftrain import settings

CONNECT_SECONDS: Final = 3.0


def reaches_log(env: Mapping[str, str], timeout: float = CONNECT_SECONDS) -> bool:
    """Whether one of the log's servers accepts a TCP connection from here (the embedded one: no network)."""
    addresses = settings.nats_addresses(env)
    for address in addresses:
        try:
            socket.create_connection(address, timeout).close()
        except OSError:
            continue
        return True
    return not addresses


def main() -> None:
    try:
        ready = reaches_log(os.environ)
    except settings.InvalidSetting as exc:
        sys.stderr.write(f"node_ready: {exc}\n")
        sys.exit(2)
    sys.exit(0 if ready else 1)


if __name__ == "__main__":
    main()
