"""`ftrain ui`: serve a read-only web view of the log to this user, until SIGINT or SIGTERM.

The parser is built for every command; the web package (`ftrain.web`: the standard library's HTTP server,
the pages) is imported only when `ui` runs, so no other command loads it. It never imports torch.
"""

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from ftrain.cli.arguments import Subparsers, command

DEFAULT_PORT = 8265


def add_parser(sub: Subparsers) -> None:
    """The `ui` subcommand."""
    p = command(sub, "ui", "a read-only web view of the log, private to you (127.0.0.1 and a token)", [
        "ftrain ui", "ftrain ui --port 0", "ftrain ui --socket ~/.ftrain/ui.sock",
        "ssh -N -L 8265:127.0.0.1:8265 login-node   # on the laptop, then open the URL it printed",
    ], "It prints the URL to open, with its token; a request without the token is refused (401).")  # fmt: skip
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"the port on 127.0.0.1 (default {DEFAULT_PORT}; 0: any)",
    )
    where.add_argument("--socket", type=Path, metavar="PATH", help="listen on this Unix socket (made 0600)")
    p.set_defaults(entry=lambda args: ui_command(args, os.environ))


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return int(text)


def ui_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Serve until stopped; exit 0. A reader: it never starts the embedded server."""
    if args.socket is not None and args.socket.exists():
        from ftrain.errors import UsageError

        raise UsageError(f"--socket {args.socket}: exists (remove it if no `ftrain ui` uses it)")
    import asyncio

    from ftrain.cli.log_server import log_ready

    log_ready("ui", env)

    return asyncio.run(_serve(args, env))


async def _serve(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    import asyncio
    import secrets
    import signal
    import sys
    import threading

    from ftrain.console.output import emit
    from ftrain.service import RunService
    from ftrain.web.reader import Reader
    from ftrain.web.server import Served, UiServer, UnixUiServer, cookie_name

    token = secrets.token_urlsafe(32)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with RunService.open(env) as app:
        if args.socket is not None:
            served = Served(loop, Reader(app), token, cookie_name(str(args.socket)))
            server: UiServer | UnixUiServer = UnixUiServer(args.socket, served)
            url = f"http://localhost:PORT/?token={token}"
            said = (f"ftrain ui: serving the log read-only on {args.socket}; from a laptop: ssh -N -L "
                    f"PORT:{args.socket} HOST, then open the URL with PORT filled in")  # fmt: skip
        else:
            served = Served(loop, Reader(app), token, "")
            server = UiServer(("127.0.0.1", args.port), served)
            port = server.server_address[1]
            served.cookie = cookie_name(f"127.0.0.1:{port}")
            url = f"http://127.0.0.1:{port}/?token={token}"
            said = (f"ftrain ui: serving the log read-only on 127.0.0.1:{port}; from a laptop: ssh -N -L "
                    f"{port}:127.0.0.1:{port} HOST, then open the URL")  # fmt: skip
        thread = threading.Thread(target=server.serve_forever, name="ftrain-ui", daemon=True)
        thread.start()
        emit(url)
        sys.stderr.write(said + "; Ctrl-C stops it\n")
        sys.stderr.flush()
        try:
            await stop.wait()
        finally:
            served.stopping.set()
            await asyncio.to_thread(server.shutdown)
            server.server_close()
            if args.socket is not None:
                args.socket.unlink(missing_ok=True)
    return 0
