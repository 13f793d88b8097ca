"""`ftrain metrics`: every run's Prometheus metrics over HTTP, read-only, behind a bearer token.

Other users of a login node reach 127.0.0.1 too, so the listener (127.0.0.1 by default) answers only a
request carrying `Authorization: Bearer <token>`; the token lives in a file only its owner can read (made
on first use), the file Prometheus's `authorization: {credentials_file: …}` names. Everything else gets
401 and nothing else: no run id, no count. Each scrape catches the read model up to the log first, as
every query does. The parser is built for every command: the HTTP server and `prometheus_client` are
imported only when this one runs.
"""

import argparse
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ftrain.cli.arguments import Subparsers, command, json_flag
from ftrain.console.output import emit, emit_json, emit_text
from ftrain.errors import Refused, UsageError

DEFAULT_LISTEN = "127.0.0.1:9478"
TOKEN_FILE = "metrics.token"
MIN_TOKEN, MAX_TOKEN = 16, 4096
RULES, DASHBOARD = "ftrain.rules.yml", "grafana-dashboard.json"


def add_parser(sub: Subparsers) -> None:
    """The `metrics` subcommand."""
    p = command(sub, "metrics", "serve every run's Prometheus metrics (read-only, token required)", [
        "ftrain metrics", "ftrain metrics --listen 127.0.0.1:9478 --token-file ~/.config/ftrain-metrics.token",
        "ftrain metrics --rules > ftrain.rules.yml", "ftrain metrics --dashboard > ftrain-dashboard.json",
    ], "Prometheus scrapes /metrics with the token: `authorization: {credentials_file: FILE}` "
       "(docs/metrics.md has the scrape config, the alert rules and the dashboard).")  # fmt: skip
    p.add_argument(
        "--listen", type=_address, default=DEFAULT_LISTEN, metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_LISTEN}; port 0: a free one, printed)",
    )  # fmt: skip
    p.add_argument(
        "--token-file", type=Path, metavar="FILE",
        help=f"the bearer token scrapers send, made (0600) when missing (default $FTRAIN_HOME/{TOKEN_FILE})",
    )  # fmt: skip
    shipped = p.add_mutually_exclusive_group()
    shipped.add_argument(
        "--rules", action="store_true", help="print the shipped Prometheus alert rules, and exit"
    )
    shipped.add_argument(
        "--dashboard", action="store_true", help="print the shipped Grafana dashboard, and exit"
    )
    json_flag(p, "where it serves and the token file, once listening")
    p.set_defaults(entry=lambda args: metrics_command(args, os.environ))


def _address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:PORT` for IPv6) as (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN})")
    return host, int(port)


def token_at(path: Path) -> str:
    """The token in `path`, made (random, 0600) when the file is missing. A file others may read, or that is
    not this user's regular file, or holds no usable token, is refused (UsageError: exit 2)."""
    import secrets

    from ftrain.host.private_files import open_private

    try:
        fd = open_private(path, os.O_WRONLY | os.O_EXCL)
    except FileExistsError:
        return _read_token(path)
    except OSError as exc:
        raise UsageError(f"--token-file {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return _read_token(path)


def _read_token(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # non-blocking: a FIFO must not hang
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            data = f.read(MAX_TOKEN + 1) if stat.S_ISREG(info.st_mode) else b""
    except OSError as exc:
        raise UsageError(f"--token-file {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        raise UsageError(f"--token-file {path}: not a regular file of this user's")
    if info.st_mode & 0o077:
        raise UsageError(
            f"--token-file {path}: readable or writable by others (mode {info.st_mode & 0o777:o}): chmod 600 it"
        )
    text = data.decode("latin-1").strip()  # one byte a character: anything outside ASCII is refused below
    if not MIN_TOKEN <= len(text) <= MAX_TOKEN or not (text.isascii() and text.isprintable()) or " " in text:
        raise UsageError(
            f"--token-file {path}: holds no token (one line of {MIN_TOKEN}-{MAX_TOKEN} printable characters)"
        )
    return text


def metrics_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Serve until SIGINT or SIGTERM (exit 0). The token file is read (or made) before anything connects.
    `--rules`, `--dashboard`: print the file shipped in the package instead (as installed: no repository)."""
    if args.rules or args.dashboard:
        from importlib.resources import files

        emit_text(files("ftrain.metrics").joinpath(RULES if args.rules else DASHBOARD).read_text())
        return 0
    import asyncio

    from ftrain import settings
    from ftrain.cli.log_server import log_ready

    # a reader: it never starts the embedded server, and without one it writes nothing (no token file)
    log_ready("metrics", env)
    path = args.token_file or settings.home(env) / TOKEN_FILE
    if args.token_file is None:
        from ftrain.host.private_files import private_dir

        private_dir(path.parent)
    token = token_at(path)
    return asyncio.run(_serve(args, env, path, token))


async def _serve(args: argparse.Namespace, env: Mapping[str, str], token_file: Path, token: str) -> int:
    import asyncio
    import signal
    import threading

    from ftrain.cli.metrics_http import MetricsServer
    from ftrain.metrics.scrape import Scraper
    from ftrain.service import RunService

    async with RunService.open(env) as app:
        lock, scrape = asyncio.Lock(), Scraper(app)

        async def one(accept: str | None) -> tuple[bytes, str]:
            async with lock:  # one scrape at a time: one read-model connection, one walk of the log
                return await scrape(accept)

        loop = asyncio.get_running_loop()
        try:
            server = MetricsServer(args.listen, token, one, loop)
        except OSError as exc:
            raise Refused(
                f"cannot listen on {args.listen[0]}:{args.listen[1]}: {exc.strerror or exc}"
            ) from exc
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        try:
            _announce(args, server.server_port, token_file)
            await stop.wait()
        finally:
            await asyncio.to_thread(server.shutdown)
            server.server_close()
    return 0


def _announce(args: argparse.Namespace, port: int, token_file: Path) -> None:
    host = args.listen[0]
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    url = f"http://{target}/metrics"
    if args.json:
        emit_json({"url": url, "target": target, "token_file": str(token_file)})
        return
    emit([
        f"serving {url} (bearer token in {token_file}); stop with Ctrl-C",
        "Prometheus scrape config (prometheus.yml):",
        "  scrape_configs:",
        "    - job_name: ftrain",
        f"      authorization: {{credentials_file: {token_file}}}",
        f"      static_configs: [{{targets: ['{target}']}}]",
    ])  # fmt: skip
